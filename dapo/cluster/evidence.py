"""Evidence that outlives the cluster: a Ray pod's logs copied to the run's volume as the pod is deleted -- the
preStop hook of the training RayJob's Ray containers, before ``ray stop``.

    python -m dapo.cluster.evidence --log-dir /shared/checkpoints/P/E/logs --max-bytes 67108864 --seconds 20

KubeRay deletes every pod of an attempt's RayCluster when it retries (and after the run), and ``/tmp/ray`` goes with
them: the raylet's and GCS's logs, every worker's output (verl's prints, NCCL's own lines), the job driver's log.
The hook copies ``/tmp/ray/session_latest/logs`` to ``<run dir>/evidence/attempt-<N>/<pod>/`` -- N the newest
attempt log's number (:mod:`dapo.train.runlog`), the pod's name from ``DAPO_POD_NAME`` -- beside what the driver
writes there itself (stacks, the NCCL flight recorder's dumps). Newest files first, within a byte cap per pod; a
file that no longer fits is copied as its last bytes (the end of a log is where it failed); and within a time limit,
since the pod's ``terminationGracePeriodSeconds`` must also hold ``ray stop``. ``COPIED.json`` in the directory says
what was copied, cut and left out, and from which node (``DAPO_NODE_NAME``).

Nothing is copied when the attempt completed (its end record's cause is ``complete``). A pod that is not deleted --
its node lost, its container killed for memory -- runs no preStop hook: its logs are gone with it. The hook always
exits 0 (a failing preStop hook only delays the pod's end). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Optional

from dapo.train.attempts import evidence_dir, read_end
from dapo.train.runlog import attempt_numbers

RAY_LOGS = Path("/tmp/ray/session_latest/logs")
CHUNK = 1 << 20


def _tail(src: Path, dest: Path, size: int, keep: int) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        fin.seek(max(0, size - keep))
        left = keep
        while left > 0:
            data = fin.read(min(CHUNK, left))
            if not data:
                break
            fout.write(data)
            left -= len(data)


def copy_logs(src: Path, dest: Path, max_bytes: int, seconds: float) -> dict:
    """Copy the files under ``src`` to ``dest`` (same relative paths), newest first, at most ``max_bytes`` in all
    and for at most ``seconds`` (module doc); returns the manifest."""
    end = time.monotonic() + seconds
    files = []
    for path in src.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                st = path.stat()
                files.append((st.st_mtime, st.st_size, path))
        except OSError:
            continue
    files.sort(key=lambda f: (-f[0], str(f[2])))
    copied, cut, left_out, budget = [], [], [], max_bytes
    for mtime, size, path in files:
        rel = str(path.relative_to(src))
        if budget <= 0 or time.monotonic() > end:
            left_out.append(rel)
            continue
        keep = min(size, budget)
        try:
            _tail(path, dest / rel, size, keep)
        except OSError as exc:
            left_out.append(f"{rel} ({exc})")
            continue
        budget -= keep
        if keep < size:
            cut.append(f"{rel} (last {keep} of {size} bytes)")
        else:
            copied.append(rel)
    return {"source": str(src), "bytes": max_bytes - budget, "max_bytes": max_bytes, "copied": copied, "cut": cut,
            "left_out": left_out}


def save(log_dir: Path, ray_logs: Path, pod: str, node: Optional[str], max_bytes: int, seconds: float) -> str:
    """The hook: one line saying what it did."""
    numbers = attempt_numbers(log_dir) if log_dir.is_dir() else []
    if not numbers:
        return f"no attempt log in {log_dir}: nothing to file the logs under"
    n = numbers[-1]
    end = read_end(log_dir, n)
    if end is not None and end.get("cause") == "complete":
        return f"attempt {n} completed: no evidence kept"
    if not ray_logs.is_dir():
        return f"no Ray logs at {ray_logs}"
    dest = evidence_dir(log_dir.parent, n) / pod
    if dest.exists():  # a second hook run of the same pod: keep the first copy
        return f"{dest} exists already"
    src = ray_logs.resolve()
    manifest = copy_logs(src, dest, max_bytes, seconds)
    manifest.update(pod=pod, node=node, attempt=n, time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    (dest / "COPIED.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return (f"attempt {n}: {len(manifest['copied'])} files ({manifest['bytes']} bytes) of {src} copied to {dest}, "
            f"{len(manifest['cut'])} cut, {len(manifest['left_out'])} left out")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dapo.cluster.evidence", description=__doc__.split("\n\n")[0])
    p.add_argument("--log-dir", required=True, type=Path, help="the run's attempt logs (<run dir>/logs)")
    p.add_argument("--ray-logs", type=Path, default=RAY_LOGS)
    p.add_argument("--pod", default=os.environ.get("DAPO_POD_NAME") or socket.gethostname())
    p.add_argument("--node", default=os.environ.get("DAPO_NODE_NAME"))
    p.add_argument("--max-bytes", type=int, default=64 << 20, help="bytes copied per pod at most")
    p.add_argument("--seconds", type=float, default=20.0, help="time the copy may take at most")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        line = save(a.log_dir, a.ray_logs, a.pod, a.node, a.max_bytes, a.seconds)
    except Exception as exc:  # a preStop hook never fails the pod's end: say why and go on to `ray stop`
        line = f"could not copy the logs: {type(exc).__name__}: {exc}"
    print(f"dapo evidence: {line}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

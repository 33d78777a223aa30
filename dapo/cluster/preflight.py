"""The preflight's checks: what must hold before any RayJob holds a GPU, each with a short deadline and a message that
names the cause and the fix. The chart runs them in one pod of its ``<release>-preflight`` Job (a Helm pre-install
hook, docs/chart.md#the-preflight), on a node of the GPU pool, in the training image, as the image's user:

    python -m dapo.cluster.preflight storage --dir /shared --uid 1000 --gid 100 --write-bytes 4294967296 \\
        --streams 128 --min-bytes-per-second 730117853 --checkpoint-bytes 393166516224 --seconds-between-saves 4846
    python -m dapo.cluster.preflight driver --min-driver 580

- That the pod runs at all shows the training image can be pulled onto a node a GPU worker can use (when it cannot,
  the Job's deadline fails the install and ``kubectl describe pod -l job-name=<release>-preflight`` shows the
  registry's message).
- ``driver``: the node's NVIDIA kernel module is new enough for the image's CUDA (:mod:`dapo.cluster.gpu_check`),
  read from ``/proc/driver/nvidia/version``, which every container on the node sees.
- ``storage``: with ``--claim``, the claim is ReadWriteMany (read from the API with the pod's token); its root is
  writable by the image's uid/gid; and ``--streams`` writers at once -- the ranks of one checkpoint save, nodes x GPUs
  per node from ``dapo plan`` -- write ``--write-bytes`` in all, each its own file, fsync'd, fast enough for the
  preset's checkpoints: a checkpoint of ``--checkpoint-bytes`` every ``--seconds-between-saves`` may take at most
  10 % of the wall time, which is ``--min-bytes-per-second`` aggregate (``charts/dapo/files/requirements.yaml``).
  What one pod shows: the volume's aggregate rate for that many concurrent writers from one client; what it does not:
  how the rate scales with 16 clients (a parallel file system gives each client its own bandwidth, an NFS server
  does not), nor the save's metadata traffic (verl writes a few files per rank).

Exit 0 with one line per check passed; 1 with ``preflight: <check>: <message>`` and the next step on stderr.
Standard library only.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from dapo.cluster.gpu_check import GpuCheckError, check_proc_driver
from dapo.cluster.rayjob_api import ApiUnavailable, RayJobApi

CHUNK = 8 << 20
FAST_CLASSES = ("FSx for Lustre (EKS), GKE Managed Lustre, Filestore Zonal or Regional (GKE), or another parallel "
                "file system; GKE's standard-rwx is Filestore Basic HDD (~100 MiB/s), EFS bursting far less")


class PreflightError(RuntimeError):
    """A failed check; the message names the cause and the fix."""


def writable(directory: Path, uid: int, gid: int) -> Path:
    """A fresh file in ``directory``, created as this process (the image's user); raises when it cannot be."""
    who = f"uid {os.getuid()} gid {os.getgid()}"
    if (os.getuid(), os.getgid()) != (uid, gid):
        who += f" (the image's user is {uid}:{gid})"
    path = directory / f".dapo-preflight-{os.getpid()}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exc:
        raise PreflightError(
            f"the claim's root {directory} is not writable by {who}: {exc.strerror}. A root-owned NFS-like export: "
            "storage.fixOwnership.enabled=true (not on EFS access points, which refuse chown: give the access point "
            f"the owner {uid}:{gid} instead); a block or most CSI volumes: podSecurityContext.fsGroup: {gid}"
        ) from None
    os.close(fd)
    return path


def write_rate(directory: Path, nbytes: int, streams: int = 1) -> float:
    """Aggregate bytes per second of ``streams`` writers at once (threads of this process: a write and an fsync
    release the GIL), each writing its share of ``nbytes`` to a file of its own and fsyncing it (the page cache alone
    would measure memory), from the first write to the last fsync -- as the ranks of one checkpoint save write their
    shards together. The files are removed."""
    streams = max(1, int(streams))
    share = max(nbytes // streams, 1)
    block = os.urandom(min(CHUNK, share))  # one buffer, read by every writer: memory stays flat
    paths = [directory / f".dapo-preflight-{os.getpid()}-{i}" for i in range(streams)]
    ready = threading.Barrier(streams + 1)
    errors: list[OSError] = []

    def writer(path: Path) -> None:
        try:
            with open(path, "wb", buffering=0) as f:
                ready.wait()
                left = share
                while left > 0:
                    left -= f.write(block[: min(len(block), left)])
                os.fsync(f.fileno())
        except OSError as exc:
            errors.append(exc)
        except threading.BrokenBarrierError:
            pass

    threads = [threading.Thread(target=writer, args=(p,), daemon=True) for p in paths]
    try:
        for t in threads:
            t.start()
        try:
            ready.wait(timeout=120)
        except threading.BrokenBarrierError:
            raise OSError(f"{streams} writers could not all open their files in {directory}: "
                          f"{errors[0] if errors else 'timeout'}") from None
        start = time.monotonic()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - start
    finally:
        for p in paths:
            p.unlink(missing_ok=True)
    if errors:
        raise errors[0]
    return share * streams / max(elapsed, 1e-9)


def throughput_message(rate: float, need: float, ckpt: float, between: float, streams: int = 1) -> str:
    mb, gib = 1e6, 1 << 30
    return (f"measured {rate / mb:.0f} MB/s aggregate with {streams} parallel writer(s) (fsync'd); the preset's "
            f"checkpoint of {ckpt / gib:.1f} GiB, written by {streams} ranks at once every {between / 60:.0f} min (dapo "
            f"plan), needs at least {need / mb:.0f} MB/s for its write to take at most 10% of the run's wall time (at "
            f"{rate / mb:.0f} MB/s one checkpoint takes {ckpt / rate / 60:.0f} min). Use a faster class: "
            f"{FAST_CLASSES}; this pod is one client, so a volume that scales with clients (Lustre) may reach more "
            "from 16 nodes: then switch the check off with preflight.storage.throughput=false")


def access_modes(claim: str, namespace: Optional[str]) -> list[str]:
    """The claim's access modes (``status.accessModes`` once bound, else ``spec.accessModes``), read with the pod's
    token (the chart's Role ``<release>-preflight``: ``get`` on this claim); raises :class:`PreflightError` when it
    cannot be read."""
    try:
        api = RayJobApi.in_cluster("-", namespace)
        obj = api.get_json(f"{api.server}/api/v1/namespaces/{api.namespace}/persistentvolumeclaims/{claim}",
                           "get this claim")
    except (ApiUnavailable, OSError) as exc:
        raise PreflightError(f"cannot read the claim {claim}'s access modes ({exc}); the chart's Role "
                             "<release>-preflight allows it") from None
    if obj is None:
        raise PreflightError(f"the claim {claim} does not exist (storage.existingClaim)")
    return list((obj.get("status") or {}).get("accessModes") or (obj.get("spec") or {}).get("accessModes") or [])


def check_storage(a: argparse.Namespace) -> list[str]:
    lines = []
    if a.claim:
        modes = access_modes(a.claim, a.namespace)
        if "ReadWriteMany" not in modes:
            raise PreflightError(f"the claim {a.claim} is {', '.join(modes) or 'without access modes'}, not "
                                 "ReadWriteMany: every Ray pod mounts it; use a claim of a ReadWriteMany class "
                                 "(storage.existingClaim), or let the chart create one (storage.storageClassName)")
        lines.append(f"claim {a.claim}: {', '.join(modes)}")
    path = writable(a.dir, a.uid, a.gid)
    path.unlink(missing_ok=True)
    lines.append(f"{a.dir} is writable by uid {os.getuid()} gid {os.getgid()}")
    if a.write_bytes > 0 and a.min_bytes_per_second > 0:
        rate = write_rate(a.dir, a.write_bytes, a.streams)
        if rate < a.min_bytes_per_second:
            raise PreflightError(throughput_message(rate, a.min_bytes_per_second, a.checkpoint_bytes,
                                                    a.seconds_between_saves, a.streams))
        lines.append(f"{a.streams} parallel writer(s): {rate / 1e6:.0f} MB/s aggregate >= "
                     f"{a.min_bytes_per_second / 1e6:.0f} MB/s")
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dapo.cluster.preflight", description=__doc__.split("\n\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--job", default="<release>-preflight", help="the preflight Job's name (for the next step)")
    common.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE") or None)
    sub = p.add_subparsers(dest="check", required=True)
    s = sub.add_parser("storage", parents=[common],
                       help="the claim: ReadWriteMany, writable by the image's user, fast enough")
    s.add_argument("--dir", type=Path, required=True, help="the claim's mount path")
    s.add_argument("--uid", type=int, default=1000)
    s.add_argument("--gid", type=int, default=100)
    s.add_argument("--write-bytes", type=int, default=4 << 30, help="bytes written in all to measure (0: none)")
    s.add_argument("--streams", type=int, default=1,
                   help="parallel writers, each a file of its own (the save's ranks: nodes x GPUs per node)")
    s.add_argument("--min-bytes-per-second", type=float, default=0.0, help="the floor (0: no floor)")
    s.add_argument("--checkpoint-bytes", type=float, default=0.0, help="one checkpoint (for the message)")
    s.add_argument("--seconds-between-saves", type=float, default=0.0, help="save_freq x step time (the message)")
    s.add_argument("--claim", default=None, help="the claim's name: its access modes are read from the API")
    d = sub.add_parser("driver", parents=[common], help="the node's NVIDIA driver")
    d.add_argument("--min-driver", type=int, default=580)
    d.add_argument("--proc-version", type=Path, default=Path("/proc/driver/nvidia/version"))
    return p


def main(argv: Optional[list[str]] = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        lines = check_storage(a) if a.check == "storage" else [check_proc_driver(a.min_driver, a.proc_version)]
    except (PreflightError, GpuCheckError, OSError) as exc:
        print(f"preflight: {a.check}: {exc}", file=sys.stderr, flush=True)
        print(f"preflight: next: fix this, then run the same `helm upgrade --install` again (it runs the preflight "
              f"again); every check's output: kubectl -n {a.namespace or '<namespace>'} logs job/{a.job} "
              "--all-containers", file=sys.stderr, flush=True)
        return 1
    for line in lines:
        print(f"preflight: {a.check}: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

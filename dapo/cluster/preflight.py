"""The preflight's checks: what must hold before any RayJob holds a GPU, each with a short deadline and a message that
names the cause and the fix. The chart runs them in one pod of its ``<release>-preflight`` Job (a Helm pre-install
hook, docs/deploy.md "Preflight"), on a node of the GPU pool, in the training image, as the image's user:

    python -m dapo.cluster.preflight storage --dir /shared --uid 1000 --gid 100 --write-bytes 4294967296 \\
        --min-bytes-per-second 973490470 --checkpoint-bytes 524222021632 --seconds-between-saves 4846 --claim dapo-shared
    python -m dapo.cluster.preflight driver --min-driver 580

- That the pod runs at all shows the training image can be pulled onto a GPU-pool node (when it cannot, the Job's
  deadline fails the install and ``kubectl describe pod -l job-name=<release>-preflight`` shows the registry's
  message).
- ``driver``: the node's NVIDIA kernel module is new enough for the image's CUDA (:mod:`dapo.cluster.gpu_check`),
  read from ``/proc/driver/nvidia/version``, which every container on the node sees, so the pod requests no GPU.
- ``storage``: the claim is ReadWriteMany (its status, read with the pod's token when ``--claim`` is given), its root
  is writable by the image's uid/gid, and a sequential write of ``--write-bytes`` (fsync'd) is fast enough for the
  preset's checkpoints: from ``dapo plan`` (``charts/dapo/files/requirements.yaml``), a checkpoint of
  ``--checkpoint-bytes`` every ``--seconds-between-saves`` may take at most 10 % of the wall time, which is
  ``--min-bytes-per-second``.

Exit 0 with one line per check passed, 1 with ``preflight: <check>: <message>`` on stderr. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import sys
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


def write_rate(path: Path, nbytes: int) -> float:
    """Bytes per second of one sequential write of ``nbytes`` to ``path``, fsync included (the page cache alone
    would measure memory)."""
    block = os.urandom(min(CHUNK, max(nbytes, 1)))
    start = time.monotonic()
    with open(path, "wb", buffering=0) as f:
        left = nbytes
        while left > 0:
            left -= f.write(block[: min(len(block), left)])
        os.fsync(f.fileno())
    return nbytes / max(time.monotonic() - start, 1e-9)


def throughput_message(rate: float, need: float, ckpt: float, between: float) -> str:
    mb, gib = 1e6, 1 << 30
    return (f"measured {rate / mb:.0f} MB/s of sequential write; the preset's checkpoint of {ckpt / gib:.1f} GiB every "
            f"{between / 60:.0f} min (dapo plan) needs at least {need / mb:.0f} MB/s for its write to take at most 10% "
            f"of the run's wall time (at {rate / mb:.0f} MB/s one checkpoint takes {ckpt / rate / 60:.0f} min). Use a "
            f"faster class: {FAST_CLASSES}; or switch the check off with preflight.storage.throughput=false")


def access_modes(claim: str, namespace: Optional[str]) -> Optional[list[str]]:
    """The bound claim's access modes, read with the pod's token; None when the API cannot be read here."""
    try:
        api = RayJobApi.in_cluster("-", namespace)
        obj = api.get_json(f"{api.server}/api/v1/namespaces/{api.namespace}/persistentvolumeclaims/{claim}",
                           "get this claim")
    except (ApiUnavailable, OSError):
        return None
    return list(((obj or {}).get("status") or {}).get("accessModes") or []) or None


def check_storage(a: argparse.Namespace) -> list[str]:
    lines = []
    if a.claim:
        modes = access_modes(a.claim, a.namespace)
        if modes is not None and "ReadWriteMany" not in modes:
            raise PreflightError(f"the claim {a.claim} is {', '.join(modes)}, not ReadWriteMany: every Ray pod mounts "
                                 "it; use a ReadWriteMany StorageClass (storage.storageClassName)")
        lines.append(f"claim {a.claim}: " + (", ".join(modes) if modes else "access modes not readable here"))
    path = writable(a.dir, a.uid, a.gid)
    try:
        lines.append(f"{a.dir} is writable by uid {os.getuid()} gid {os.getgid()}")
        if a.write_bytes > 0 and a.min_bytes_per_second > 0:
            rate = write_rate(path, a.write_bytes)
            if rate < a.min_bytes_per_second:
                raise PreflightError(throughput_message(rate, a.min_bytes_per_second, a.checkpoint_bytes,
                                                        a.seconds_between_saves))
            lines.append(f"sequential write {rate / 1e6:.0f} MB/s >= {a.min_bytes_per_second / 1e6:.0f} MB/s")
    finally:
        path.unlink(missing_ok=True)
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dapo.cluster.preflight", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="check", required=True)
    s = sub.add_parser("storage", help="the claim: ReadWriteMany, writable by the image's user, fast enough")
    s.add_argument("--dir", type=Path, required=True, help="the claim's mount path")
    s.add_argument("--uid", type=int, default=1000)
    s.add_argument("--gid", type=int, default=100)
    s.add_argument("--write-bytes", type=int, default=4 << 30, help="bytes written to measure (0: no measurement)")
    s.add_argument("--min-bytes-per-second", type=float, default=0.0, help="the floor (0: no floor)")
    s.add_argument("--checkpoint-bytes", type=float, default=0.0, help="one checkpoint (for the message)")
    s.add_argument("--seconds-between-saves", type=float, default=0.0, help="save_freq x step time (the message)")
    s.add_argument("--claim", default=None, help="the claim's name: its access modes are read from the API")
    s.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE") or None)
    d = sub.add_parser("driver", help="the node's NVIDIA driver, without a GPU")
    d.add_argument("--min-driver", type=int, default=580)
    d.add_argument("--proc-version", type=Path, default=Path("/proc/driver/nvidia/version"))
    return p


def main(argv: Optional[list[str]] = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        lines = check_storage(a) if a.check == "storage" else [check_proc_driver(a.min_driver, a.proc_version)]
    except (PreflightError, GpuCheckError, OSError) as exc:
        print(f"preflight: {a.check}: {exc}", file=sys.stderr, flush=True)
        return 1
    for line in lines:
        print(f"preflight: {a.check}: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

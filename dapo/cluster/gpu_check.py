"""Start-up check of a GPU pod: the NVIDIA driver is new enough for the image's CUDA, and the GPUs are visible.

    python -m dapo.cluster.gpu_check --min-driver 580                   # GPU workers, as a postStart hook (chart)
    python -m dapo.cluster.gpu_check --min-driver 580 --gpus 8 --torch  # the chart's `helm test` GPU pod

:func:`check_proc_driver` reads the driver without a GPU (the preflight, :mod:`dapo.cluster.preflight`).

The training and evaluation images are built on CUDA 13, which needs an NVIDIA driver of the 580 series or newer; an
older driver otherwise shows up much later as a cryptic ``CUDA driver version is insufficient`` inside vLLM or NCCL.
Exit status 0 when every check passes, 1 with a one-line reason on stderr otherwise (the kubelet copies a failed
postStart hook's output into the pod's events).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

PROC_VERSION = Path("/proc/driver/nvidia/version")


class GpuCheckError(RuntimeError):
    """A failed check; the message says what is wrong and what to change."""


def driver_major(version: str) -> int:
    """``580.65.06`` -> 580."""
    head = version.strip().split(".", 1)[0]
    if not head.isdigit():
        raise GpuCheckError(f"nvidia-smi reported a driver version {version!r} that is not <major>.<minor>[.<patch>]")
    return int(head)


def query_gpus(nvidia_smi: Optional[str] = None) -> list[tuple[str, str]]:
    """(driver version, GPU name) per visible GPU, from ``nvidia-smi``."""
    exe = nvidia_smi or shutil.which("nvidia-smi")
    if not exe:
        raise GpuCheckError(
            "nvidia-smi not found: the NVIDIA driver is not mounted into this container (no nvidia.com/gpu "
            "request, or the NVIDIA container runtime is not used: set worker.runtimeClassName, e.g. nvidia)"
        )
    proc = subprocess.run([exe, "--query-gpu=driver_version,name", "--format=csv,noheader"], capture_output=True,
                          text=True, timeout=60)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise GpuCheckError(f"nvidia-smi failed (exit {proc.returncode}): {detail[-1] if detail else 'no output'}")
    rows = []
    for line in proc.stdout.splitlines():
        if line.strip():
            version, _, name = line.partition(",")
            rows.append((version.strip(), name.strip()))
    return rows


def check(min_driver: int, gpus: Optional[int] = None, torch_check: bool = False,
          nvidia_smi: Optional[str] = None) -> str:
    """Run the checks; return the success line or raise :class:`GpuCheckError`."""
    rows = query_gpus(nvidia_smi)
    if not rows:
        raise GpuCheckError("nvidia-smi lists no GPU: the pod got no device (check the nvidia.com/gpu request)")
    version = rows[0][0]
    if driver_major(version) < min_driver:
        raise GpuCheckError(
            f"NVIDIA driver {version} is too old: this image's CUDA 13 needs driver >= {min_driver} "
            "(upgrade the node's driver, e.g. the GPU operator's driver.version, or use an image for older CUDA)"
        )
    if gpus is not None and len(rows) != gpus:
        raise GpuCheckError(f"nvidia-smi sees {len(rows)} GPU(s), expected {gpus} (gpusPerNode)")
    line = f"NVIDIA driver {version} (>= {min_driver}), {len(rows)} x {rows[0][1]}"
    if torch_check:
        import torch

        if not torch.cuda.is_available():
            raise GpuCheckError("torch.cuda.is_available() is False although nvidia-smi sees the GPUs "
                                "(CUDA runtime / driver mismatch)")
        seen = torch.cuda.device_count()
        if gpus is not None and seen != gpus:
            raise GpuCheckError(f"torch sees {seen} GPU(s), expected {gpus}")
        line += f"; torch {torch.__version__} sees {seen} GPU(s)"
    return line


def check_proc_driver(min_driver: int, proc_version: Path = PROC_VERSION) -> str:
    """The node's NVIDIA kernel module from ``/proc/driver/nvidia/version`` (``NVRM version: NVIDIA UNIX [Open Kernel
    Module for] x86_64 Kernel Module  580.65.06 ...``): a container sees it without requesting a GPU, so the preflight
    checks the driver before any GPU is held. Raises :class:`GpuCheckError` like :func:`check`."""
    try:
        text = proc_version.read_text()
    except OSError:
        raise GpuCheckError(f"{proc_version} not found: no NVIDIA driver is loaded on this node (is it a GPU node? "
                            "the preflight runs where the workers' GPUs (preflight.requestGpus), worker.nodeSelector "
                            "and worker.affinity place it)") from None
    m = re.search(r"Kernel Module(?: for \S+)?\s+([0-9]+\.[0-9.]+)", text)
    if not m:
        raise GpuCheckError(f"{proc_version} names no driver version: {text.strip()[:200]!r}")
    if driver_major(m.group(1)) < min_driver:
        raise GpuCheckError(
            f"NVIDIA driver {m.group(1)} is too old: this image's CUDA 13 needs driver >= {min_driver} "
            "(upgrade the node's driver, e.g. the GPU operator's driver.version, or use an image for older CUDA)"
        )
    return f"NVIDIA driver {m.group(1)} (>= {min_driver}) on this node"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dapo.cluster.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-driver", type=int, default=580, help="lowest NVIDIA driver major version (CUDA 13: 580)")
    ap.add_argument("--gpus", type=int, default=None, help="number of GPUs the pod must see")
    ap.add_argument("--torch", action="store_true", help="also check torch.cuda sees them")
    args = ap.parse_args(argv)
    try:
        print(f"gpu_check: {check(args.min_driver, args.gpus, args.torch)}", flush=True)
    except (GpuCheckError, subprocess.TimeoutExpired, OSError) as exc:
        print(f"gpu_check: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

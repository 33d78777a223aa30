"""Start-up check of a GPU pod: the NVIDIA driver is new enough for the image's CUDA, the GPUs are visible, and none
has a memory fault that NVIDIA says to act on.

    python -m dapo.cluster.gpu_check --min-driver 580                   # GPU workers, as a postStart hook (chart)
    python -m dapo.cluster.gpu_check --min-driver 580 --gpus 8 --torch  # the chart's `helm test` GPU pod

:func:`check_proc_driver` reads the driver without a GPU (the preflight, :mod:`dapo.cluster.preflight`).

The training and evaluation images are built on CUDA 13, which needs an NVIDIA driver of the 580 series or newer; an
older driver otherwise shows up much later as a cryptic ``CUDA driver version is insufficient`` inside vLLM or NCCL.

The memory check (:func:`memory_faults`) reads ``nvidia-smi -q -d ROW_REMAPPER,ECC,PAGE_RETIREMENT`` (one call for all
GPUs; the GPUs' index and UUID come from the ``--query-gpu`` call the driver check makes) and refuses a GPU with a row
remap pending or failed, uncorrectable ECC errors since the driver loaded, the SRAM error threshold exceeded, or --
GPUs before Ampere -- retired pages pending or at their limit (:data:`FAULTS`: each rule, the field it reads, its
source). A fault found when a run starts would otherwise surface days into it, on every retry that lands there.

Exit status 0 when every check passes, 1 with a one-line reason on stderr otherwise (the kubelet copies a failed
postStart hook's output into the pod's events, which the follower reads as the node's fault: :mod:`dapo.cluster.nodes`).
Standard library only.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Gpu:
    """One GPU as ``nvidia-smi --query-gpu`` lists it."""

    index: str
    uuid: str
    bus_id: str
    driver: str
    name: str

    def label(self) -> str:
        return f"GPU {self.index} ({self.uuid}, {self.bus_id})"


QUERY_FIELDS = "index,uuid,pci.bus_id,driver_version,name"
MEMORY_QUERY = ["-q", "-d", "ROW_REMAPPER,ECC,PAGE_RETIREMENT"]  # nvidia-smi(1): -d, --display=TYPE


def _nvidia_smi(exe: Optional[str]) -> str:
    found = exe or shutil.which("nvidia-smi")
    if not found:
        raise GpuCheckError(
            "nvidia-smi not found: the NVIDIA driver is not mounted into this container (no nvidia.com/gpu "
            "request, or the NVIDIA container runtime is not used: set worker.runtimeClassName, e.g. nvidia)"
        )
    return found


def _run(exe: str, args: list[str]) -> str:
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise GpuCheckError(f"nvidia-smi {' '.join(args)} failed (exit {proc.returncode}): "
                            f"{detail[-1] if detail else 'no output'}")
    return proc.stdout


def query_gpus(nvidia_smi: Optional[str] = None) -> list[Gpu]:
    """Every visible GPU, from ``nvidia-smi --query-gpu=index,uuid,pci.bus_id,driver_version,name``."""
    out = _run(_nvidia_smi(nvidia_smi), [f"--query-gpu={QUERY_FIELDS}", "--format=csv,noheader"])
    rows = []
    for line in out.splitlines():
        if line.strip():
            cells = [c.strip() for c in line.split(",", 4)]
            if len(cells) != 5:
                raise GpuCheckError(f"nvidia-smi --query-gpu={QUERY_FIELDS} printed {line.strip()!r}, not 5 fields")
            rows.append(Gpu(*cells))
    return rows


# -- GPU memory faults ------------------------------------------------------------------------------------------------
# What each rule reads of `nvidia-smi -q` and why it refuses the GPU. Sources, read 2026-12-02:
#   [smi]  nvidia-smi(1), nvidia-smi 535.261 (NVIDIA, 2025/6/14): "Page Retirement", "Row Remapper", "ECC Errors";
#   [rma]  NVIDIA GPU Memory Error Management, "RMA Policy" (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/
#          rma-policy-thresholds-for-row-remapping.html; the page names no version, earlier editions vR450 2020-10-04,
#          vR520 2022-12-14);
#   [rr]   the same note, "Row Remapping" (row-remapping.html): legacy GPUs retire at most 64 pages of frame buffer.
# kind -> (what the fault is, what to do). A kind's text says "row remap", "ECC" or "retired page": the words the
# follower reads as a node's hardware fault (dapo.cluster.nodes.HARDWARE_TEXT).
FAULTS: dict[str, tuple[str, str]] = {
    # [rma] "the RMA criteria is met when the row-remapping failure flag is set and validated by the field diagnostic"
    "remap_failed": ("row remapping failed", "a failed row remap is NVIDIA's RMA criterion: drain the node, run "
                     "NVIDIA's field diagnostic, replace the GPU"),
    # [smi] Pending: "a row is pending remapping. The GPU must be reset for the remapping to go into effect"
    "remap_pending": ("row remap pending", "a pending row remap is applied at the next GPU reset: drain the node, reset "
                      "the GPU (nvidia-smi -r -i <index>) or reboot the node"),
    # [smi] volatile counts are "errors detected since the last driver load"; double bit errors "are uncorrectable"
    "ecc_uncorrectable": ("uncorrectable ECC errors since the driver loaded", "after uncorrectable ECC errors: drain "
                          "the node, reset the GPU or reboot the node; if they recur, replace the GPU"),
    # [rma] GPU L2 Memory RMA Policy: the "SRAM Threshold Exceeded flag" meets the RMA criteria
    "sram_threshold": ("SRAM ECC error threshold exceeded", "the SRAM threshold is NVIDIA's RMA criterion: drain the "
                       "node, run NVIDIA's field diagnostic, replace the GPU"),
    # [smi] Pending: "pages that are retired but not yet blacklisted can still be allocated, and may cause further
    # reliability issues"; the blacklist takes effect "on the next reboot"
    "pages_pending": ("retired pages pending", "pending retired pages are applied at the next reboot: drain the node "
                      "and reboot it"),
    # [rr] "Supported a maximum of 64 retirements for the frame buffer"
    "pages_exhausted": ("retired pages at the 64 a GPU before Ampere can retire", "with no page left to retire: drain "
                        "the node, replace the GPU"),
}
MAX_RETIRED_PAGES = 64  # [rr]
_GPU_BLOCK = re.compile(r"^GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")


def parse_query(text: str) -> dict[str, dict[tuple[str, ...], str]]:
    """``nvidia-smi -q`` (whole, or the sections ``-d`` selects) as bus id -> {(section, ..., field): value}: each GPU's
    block starts ``GPU 00000000:53:00.0``, its lines nest by four spaces (``ECC Errors`` > ``Volatile`` > ``DRAM
    Uncorrectable : 0``); a section with a value of its own (``Remapped Rows : N/A``) is a field too."""
    gpus: dict[str, dict[tuple[str, ...], str]] = {}
    fields: Optional[dict[tuple[str, ...], str]] = None
    path: list[str] = []
    for line in text.splitlines():
        m = _GPU_BLOCK.match(line)
        if m:
            fields, path = gpus.setdefault(m.group(1).upper(), {}), []
            continue
        if fields is None or not line.strip():
            continue
        depth = max((len(line) - len(line.lstrip(" "))) // 4 - 1, 0)
        key, sep, value = line.strip().partition(":")
        path = path[:depth] + [key.strip()]
        if sep:
            fields[tuple(path)] = value.strip()
    return gpus


def _count(value: Optional[str]) -> int:
    return int(value) if value is not None and value.isdigit() else 0


def memory_faults(fields: dict[tuple[str, ...], str]) -> list[tuple[str, str]]:
    """(kind of :data:`FAULTS`, the fields and values that show it) for one GPU's :func:`parse_query` block; "N/A"
    (a GPU without the feature) is no fault."""
    get, out = fields.get, []
    if get(("Remapped Rows", "Remapping Failure Occurred")) == "Yes":
        out.append(("remap_failed", "Remapped Rows: Remapping Failure Occurred: Yes"))
    if get(("Remapped Rows", "Pending")) == "Yes":
        out.append(("remap_pending", f"Remapped Rows: Pending: Yes; rows remapped: "
                    f"{get(('Remapped Rows', 'Uncorrectable Error'))} uncorrectable, "
                    f"{get(('Remapped Rows', 'Correctable Error'))} correctable"))
    volatile = [f"{' '.join(p[2:])}: {v}" for p, v in fields.items() if p[:2] == ("ECC Errors", "Volatile") and _count(v)
                and ("Uncorrectable" in p[-1] or (p[2:3] == ("Double Bit",) and p[-1] == "Total"))]
    if volatile:
        out.append(("ecc_uncorrectable", "ECC Errors: Volatile: " + ", ".join(volatile)))
    if get(("ECC Errors", "Aggregate", "SRAM Threshold Exceeded")) == "Yes":
        out.append(("sram_threshold", "ECC Errors: Aggregate: SRAM Threshold Exceeded: Yes"))
    for p, v in fields.items():
        if p[:1] == ("Retired Pages",) and len(p) == 2 and p[1].startswith("Pending") and v == "Yes":
            out.append(("pages_pending", f"Retired Pages: {p[1]}: Yes"))
    sbe, dbe = get(("Retired Pages", "Single Bit ECC")), get(("Retired Pages", "Double Bit ECC"))
    if _count(sbe) + _count(dbe) >= MAX_RETIRED_PAGES:
        out.append(("pages_exhausted", f"Retired Pages: Single Bit ECC: {sbe}, Double Bit ECC: {dbe}"))
    return out


def memory_refusal(gpus: list[Gpu], query: str) -> Optional[str]:
    """Why this node's GPUs must not start a run (None: none has a fault): each faulty GPU by index, UUID and bus id
    with the fields that show it, then what to do about each kind of fault found."""
    blocks = parse_query(query)
    if not blocks:
        raise GpuCheckError(f"nvidia-smi {' '.join(MEMORY_QUERY)} printed no GPU block: {query.strip()[:200]!r}")
    by_bus = {g.bus_id.upper(): g for g in gpus}
    found, kinds = [], []
    for bus, fields in blocks.items():
        gpu = by_bus.get(bus) or Gpu("?", "?", bus, "", "")
        faults = memory_faults(fields)
        if faults:
            found.append(f"{gpu.label()}: " + "; ".join(f"{FAULTS[k][0]} ({shown})" for k, shown in faults))
            kinds += [k for k, _ in faults if k not in kinds]
    if not found:
        return None
    return "GPU memory fault: " + " | ".join(found) + " -- " + "; ".join(FAULTS[k][1] for k in kinds)


def check(min_driver: int, gpus: Optional[int] = None, torch_check: bool = False,
          nvidia_smi: Optional[str] = None) -> str:
    """Run the checks; return the success line or raise :class:`GpuCheckError`."""
    rows = query_gpus(nvidia_smi)
    if not rows:
        raise GpuCheckError("nvidia-smi lists no GPU: the pod got no device (check the nvidia.com/gpu request)")
    version = rows[0].driver
    if driver_major(version) < min_driver:
        raise GpuCheckError(
            f"NVIDIA driver {version} is too old: this image's CUDA 13 needs driver >= {min_driver} "
            "(upgrade the node's driver, e.g. the GPU operator's driver.version, or use an image for older CUDA)"
        )
    if gpus is not None and len(rows) != gpus:
        raise GpuCheckError(f"nvidia-smi sees {len(rows)} GPU(s), expected {gpus} (gpusPerNode)")
    fault = memory_refusal(rows, _run(_nvidia_smi(nvidia_smi), MEMORY_QUERY))
    if fault:
        raise GpuCheckError(fault)
    line = f"NVIDIA driver {version} (>= {min_driver}), {len(rows)} x {rows[0].name}, no GPU memory fault"
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

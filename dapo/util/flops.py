"""Accelerator peaks and model FLOPs, for model-FLOPs utilisation (MFU): :data:`GPUS` (datasheet peaks; the planner's
accelerators too), :func:`peak_flops` (a device name -> its dense BF16 peak, None when unknown) and
:func:`train_flops` (the FLOPs of a forward + backward pass over sequences, verl 0.9.1's estimate for dense decoders,
``verl.utils.flops_counter._estimate_qwen2_flops``).

MFU = :func:`train_flops` / (seconds x :func:`peak_flops`), divided by 3 for a forward-only pass, as verl's workers
compute ``perf/mfu/actor`` and ``perf/mfu/actor_infer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional


@dataclass(frozen=True)
class GPU:
    name: str
    bf16_tflops: float  # dense BF16 tensor-core peak
    hbm_tbps: float  # HBM bandwidth, TB/s
    memory_gib: float  # usable device memory

    @property
    def flops(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def bandwidth(self) -> float:
        return self.hbm_tbps * 1e12


# NVIDIA datasheet peaks (dense BF16, no sparsity). A800/H800 are the export variants of A100/H100: same compute and
# HBM, reduced NVLink (not modelled).
GPUS: dict[str, GPU] = {
    "h100": GPU("H100 SXM 80GB", 989.0, 3.35, 79.6),
    "h800": GPU("H800 SXM 80GB", 989.0, 3.35, 79.6),
    "h200": GPU("H200 SXM 141GB", 989.0, 4.8, 140.4),
    "a100": GPU("A100 SXM 80GB", 312.0, 2.0, 80.0),
    "a800": GPU("A800 SXM 80GB", 312.0, 2.0, 80.0),
    "h20": GPU("H20 96GB", 148.0, 4.0, 95.6),
}


def peak_flops(device_name: str) -> Optional[float]:
    """The dense BF16 peak (FLOP/s) of a device named like ``torch.cuda.get_device_name()`` ("NVIDIA H100 80GB
    HBM3"), matching the longest :data:`GPUS` key it contains ("h200" before "h20"); None for any other device (a
    CPU, an unlisted GPU): no MFU is better than one against a made-up peak."""
    name = device_name.lower()
    for key in sorted(GPUS, key=len, reverse=True):
        if key in name:
            return GPUS[key].flops
    return None


def _cfg(config: Any, key: str, default: Any = None) -> Any:
    return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)


def train_flops(config: Any, seqlens: Iterable[int]) -> float:
    """FLOPs of one forward + backward pass over sequences of ``seqlens`` tokens through the dense decoder of a HF
    ``config`` (object or dict): ``6 x dense_N x tokens + 6 x sum(L^2) x head_dim x heads x layers`` with
    ``dense_N`` = the MLP (SwiGLU: 3 matrices), attention projections and embedding + LM head parameters -- verl's
    ``_estimate_qwen2_flops`` (also its estimate for Llama-style models)."""
    h, layers = int(_cfg(config, "hidden_size")), int(_cfg(config, "num_hidden_layers"))
    heads = int(_cfg(config, "num_attention_heads"))
    kv = int(_cfg(config, "num_key_value_heads") or heads)
    head_dim = int(_cfg(config, "head_dim") or h // heads)
    mlp_n = h * int(_cfg(config, "intermediate_size")) * 3
    attn_n = h * (heads * head_dim + 2 * kv * head_dim + heads * head_dim)
    dense_n = (mlp_n + attn_n) * layers + int(_cfg(config, "vocab_size")) * h * 2
    lens = [int(n) for n in seqlens]
    return 6.0 * dense_n * sum(lens) + 6.0 * sum(n * n for n in lens) * head_dim * heads * layers

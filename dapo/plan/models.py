"""Model architectures and accelerators the plan is computed for: :class:`Arch` (a dense decoder, from a HF
``config.json`` or the built-in ``ARCHS`` table; :func:`resolve_arch`) and :class:`GPU` (``GPUS``, datasheet peaks),
and :class:`PlanError`, raised by every plan module when a plan cannot be made.

The bottom of :mod:`dapo.plan`: imports only :mod:`dapo.util.flops` (``GPU``, ``GPUS``; the same table gives the
local backend's MFU its peak).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from dapo.util.flops import GPU, GPUS  # noqa: F401  (re-exported: the plan's accelerators)


class PlanError(ValueError):
    """The plan cannot be made (unknown model, local preset, ...); the message says what to pass instead."""


# --------------------------------------------------------------------------------------------------------------------
# Architectures
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arch:
    """A dense decoder (Qwen2 family: GQA attention with q/k/v biases, SwiGLU MLP, RMSNorm)."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    head_dim_: Optional[int] = None

    @property
    def head_dim(self) -> int:
        return self.head_dim_ or self.hidden_size // self.num_heads

    @property
    def attn_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        h = self.hidden_size
        attn = h * self.attn_dim + self.attn_dim + 2 * (h * self.kv_dim + self.kv_dim) + self.attn_dim * h
        return attn + 3 * h * self.intermediate_size + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        emb = self.embedding_params * (1 if self.tie_word_embeddings else 2)
        return emb + self.num_layers * self.layer_params + self.hidden_size

    @property
    def matmul_params(self) -> int:
        """Parameters used in matmuls per token (the input embedding is a lookup unless tied to the LM head)."""
        return self.params - (0 if self.tie_word_embeddings else self.embedding_params)

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.num_layers * self.kv_dim * dtype_bytes

    def fwd_flops(self, tokens: float, sum_sq_len: float) -> float:
        """Forward FLOPs: 2 * matmul params per token + causal attention (QK^T and AV) 2 * layers * d_attn * L^2."""
        return 2.0 * self.matmul_params * tokens + 2.0 * self.num_layers * self.attn_dim * sum_sq_len


# Values from each model's config.json on the Hugging Face hub.
ARCHS: dict[str, Arch] = {
    "qwen2.5-32b": Arch("Qwen2.5-32B", 5120, 64, 40, 8, 27648, 152064, False, 131072),
    "qwen2.5-7b": Arch("Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064, False, 131072),
    # Qwen2.5-Math-7B: the 7B architecture with a 4k context (rope_theta 1e4); the DAPO 7B scripts override
    # max_position_embeddings to 32768.
    "qwen2.5-math-7b": Arch("Qwen2.5-Math-7B", 3584, 28, 28, 4, 18944, 152064, False, 4096),
    "qwen2.5-1.5b": Arch("Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936, True, 32768),
    "qwen2.5-math-1.5b": Arch("Qwen2.5-Math-1.5B", 1536, 28, 12, 2, 8960, 151936, True, 4096),
    "qwen2.5-0.5b": Arch("Qwen2.5-0.5B", 896, 24, 14, 2, 4864, 151936, True, 32768),
}


def arch_from_config(config: dict[str, Any], name: str) -> Arch:
    """An :class:`Arch` from a HF ``config.json`` mapping."""
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in required if k not in config]
    if missing:
        raise PlanError(f"{name}: config.json lacks {', '.join(missing)} (a dense decoder config is expected)")
    return Arch(
        name=name,
        hidden_size=int(config["hidden_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=int(config["num_attention_heads"]),
        num_kv_heads=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
        head_dim_=int(config["head_dim"]) if config.get("head_dim") else None,
    )


def resolve_arch(model_path: str, model_config: Optional[str] = None) -> Arch:
    """Architecture of ``model_path``: an explicit config.json, a local model directory, or the known table."""
    if model_config:
        p = Path(model_config)
        p = p / "config.json" if p.is_dir() else p
        if not p.is_file():
            raise PlanError(f"--model-config {model_config}: no config.json there")
        try:
            return arch_from_config(json.loads(p.read_text()), str(p.parent.name or p))
        except json.JSONDecodeError as exc:
            raise PlanError(f"{p}: not valid JSON ({exc})") from exc
    local = Path(model_path) / "config.json"
    if local.is_file():
        return arch_from_config(json.loads(local.read_text()), Path(model_path).name)
    key = model_path.rstrip("/").split("/")[-1].lower()
    key = key.removesuffix("-instruct")
    if key in ARCHS:
        return ARCHS[key]
    raise PlanError(
        f"unknown model architecture for {model_path!r}: pass --model-config PATH (the model's config.json or a "
        f"directory holding it). Known: {', '.join(a.name for a in ARCHS.values())}"
    )


# --------------------------------------------------------------------------------------------------------------------
# Accelerators
# --------------------------------------------------------------------------------------------------------------------


# the accelerators (dense BF16 datasheet peaks, HBM, memory): dapo.util.flops, shared with the local backend's MFU

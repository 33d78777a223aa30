"""A small Qwen2-architecture causal LM built from a config (random init, no download)."""

from __future__ import annotations

from pathlib import Path


def qwen2_config(spec, vocab_size: int, eos_token_id: int, pad_token_id: int):
    """``transformers.Qwen2Config`` for ``spec`` (a :class:`dapo.config.TinyModelSpec`)."""
    from transformers import Qwen2Config

    if spec.hidden_size % spec.num_attention_heads:
        raise ValueError(
            f"local.model.hidden_size ({spec.hidden_size}) must be a multiple of num_attention_heads "
            f"({spec.num_attention_heads})"
        )
    head_dim = spec.hidden_size // spec.num_attention_heads
    if head_dim < 32:
        raise ValueError(f"local.model: head_dim = hidden_size / num_attention_heads = {head_dim}; vLLM needs >= 32")
    if spec.num_attention_heads % spec.num_key_value_heads:
        raise ValueError("local.model.num_attention_heads must be a multiple of num_key_value_heads")
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        torch_dtype="float32",
    )


def build_model(spec, vocab_size: int, eos_token_id: int, pad_token_id: int, out_dir: Path | None = None):
    """A freshly initialised ``Qwen2ForCausalLM`` (seeded by ``spec.seed``); saved to ``out_dir`` when given."""
    import torch
    from transformers import Qwen2ForCausalLM

    cfg = qwen2_config(spec, vocab_size, eos_token_id, pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen2ForCausalLM(cfg)
    if out_dir is not None:
        model.save_pretrained(str(out_dir))
    return model

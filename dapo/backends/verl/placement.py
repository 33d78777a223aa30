"""Placement and budget checks of a composed verl config, and the model facts they need (head counts, context).

Rules a composed config must satisfy (:func:`check_placement`; each a :class:`~dapo.config.ConfigError` naming the
preset key):

- world = ``placement.nodes * placement.gpus_per_node``; the actor's data-parallel size is ``dp = world / ulysses_sp``;
- ``ulysses_sp`` divides world, the model's attention heads, and its KV heads divide ``ulysses_sp`` or vice versa
  (verl's Ulysses patch);
- ``rollout_tp`` divides ``gpus_per_node`` (a vLLM replica lives on one node) and the attention heads;
- ``ppo_mini_batch_size * n`` (responses per optimizer step) and ``train_batch_size * n`` are multiples of ``dp``;
- with dynamic batching, ``ppo_max_token_len_per_gpu * ulysses_sp`` (and the log-prob budget) holds one whole
  sequence (``max_prompt_length + max_response_length``);
- without chunked prefill, vLLM's ``max_num_batched_tokens`` holds one whole sequence;
- the model's context (``max_position_embeddings``, after ``override_config``) holds one whole sequence;
- the overlong buffer is shorter than ``max_response_length``.

Head counts come from ``config.json`` when ``recipe.model.path`` is a local directory, else from
:data:`KNOWN_MODELS` (:func:`model_info`); an unknown remote model skips the head checks (and says so in the notes
:func:`check_placement` returns).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from dapo.config import ConfigError, Preset


@dataclass(frozen=True)
class ModelInfo:
    """What the placement checks need to know about a model architecture (from its HF ``config.json``)."""

    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: Optional[int] = None


# Values of the public config.json files of the models the presets name (and their siblings).
KNOWN_MODELS: dict[str, ModelInfo] = {
    "Qwen/Qwen2.5-0.5B": ModelInfo(14, 2, 32768),
    "Qwen/Qwen2.5-1.5B": ModelInfo(12, 2, 131072),
    "Qwen/Qwen2.5-3B": ModelInfo(16, 2, 32768),
    "Qwen/Qwen2.5-7B": ModelInfo(28, 4, 131072),
    "Qwen/Qwen2.5-14B": ModelInfo(40, 8, 131072),
    "Qwen/Qwen2.5-32B": ModelInfo(40, 8, 131072),
    "Qwen/Qwen2.5-72B": ModelInfo(64, 8, 131072),
    "Qwen/Qwen2.5-Math-1.5B": ModelInfo(12, 2, 4096),
    "Qwen/Qwen2.5-Math-7B": ModelInfo(28, 4, 4096),
}


def model_info(path: str) -> Optional[ModelInfo]:
    """Head counts and context length of ``path``: its ``config.json`` when local, else :data:`KNOWN_MODELS`."""
    cfg_file = Path(path).expanduser() / "config.json"
    if cfg_file.is_file():
        try:
            raw = json.loads(cfg_file.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"recipe.model.path: cannot read {cfg_file}: {exc}") from exc
        raw = raw.get("text_config", raw)
        if "num_attention_heads" not in raw:
            return None
        heads = int(raw["num_attention_heads"])
        return ModelInfo(heads, int(raw.get("num_key_value_heads", heads)), raw.get("max_position_embeddings"))
    return KNOWN_MODELS.get(path)


def check_placement(preset: Preset, cfg: Any, info: Optional[ModelInfo]) -> list[str]:
    """Placement and budget rules of the module docstring on the composed ``cfg``. Returns notes (skipped checks)."""
    notes: list[str] = []
    name = preset.name
    arr = cfg.actor_rollout_ref
    nodes, gpn = int(cfg.trainer.nnodes), int(cfg.trainer.n_gpus_per_node)
    world = nodes * gpn
    sp = int(arr.actor.ulysses_sequence_parallel_size)
    tp = int(arr.rollout.tensor_model_parallel_size)
    n = int(arr.rollout.n)
    seq_len = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)

    def bad(key: str, msg: str) -> None:
        raise ConfigError(f"preset {name!r}: '{key}' {msg}")

    if sp < 1 or world % sp:
        bad("placement.parallel.ulysses_sp", f"({sp}) must divide the {world} GPUs (placement.nodes x gpus_per_node)")
    if tp < 1 or gpn % tp:
        bad("placement.parallel.rollout_tp", f"({tp}) must divide placement.gpus_per_node ({gpn}): a vLLM replica "
            "runs on one node")
    dp = world // sp
    mini = int(arr.actor.ppo_mini_batch_size) * n
    if mini % dp:
        bad("recipe.actor.ppo_mini_batch_size", f"x recipe.rollout.n = {mini} responses per optimizer step must be a "
            f"multiple of the data-parallel size {dp} (= {world} GPUs / ulysses_sp {sp})")
    total = int(cfg.data.train_batch_size) * n
    if total % dp:
        bad("recipe.data.train_batch_size", f"x recipe.rollout.n = {total} responses per step must be a multiple of "
            f"the data-parallel size {dp}")
    if bool(arr.actor.use_dynamic_bsz):
        for key, budget in (
            ("placement.parallel.ppo_max_token_len_per_gpu", int(arr.actor.ppo_max_token_len_per_gpu)),
            ("placement.parallel.log_prob_max_token_len_per_gpu", int(arr.rollout.log_prob_max_token_len_per_gpu)),
        ):
            if budget * sp < seq_len:
                bad(key, f"({budget}) x ulysses_sp ({sp}) = {budget * sp} tokens cannot hold one sequence of "
                    f"max_prompt_length + max_response_length = {seq_len} tokens")
    if not bool(arr.rollout.enable_chunked_prefill) and int(arr.rollout.max_num_batched_tokens) < seq_len:
        bad("placement.parallel.max_num_batched_tokens", f"({arr.rollout.max_num_batched_tokens}) must be >= "
            f"{seq_len} (max_prompt_length + max_response_length) without chunked prefill")
    rk = cfg.reward.get("reward_kwargs", {}) or {}
    ob = rk.get("overlong_buffer_cfg", {}) or {}
    if ob.get("enable", False):
        if not 0 < int(ob.get("len", 0)) < int(cfg.data.max_response_length):
            bad("recipe.reward.overlong_buffer.len", f"({ob.get('len')}) must be > 0 and below "
                f"recipe.data.max_response_length ({cfg.data.max_response_length})")
        if int(rk.get("max_resp_len", -1)) != int(cfg.data.max_response_length):
            bad("recipe.data.max_response_length", "differs from reward.reward_kwargs.max_resp_len")
    if info is None:
        notes.append(f"model {arr.model.path!r} is neither a local directory with config.json nor in "
                     "dapo.backends.verl.placement.KNOWN_MODELS: attention-head and context-length checks skipped")
        return notes
    heads, kv = info.num_attention_heads, info.num_key_value_heads
    if heads % sp:
        bad("placement.parallel.ulysses_sp", f"({sp}) must divide the model's {heads} attention heads "
            f"({arr.model.path})")
    if kv % sp and sp % kv:
        bad("placement.parallel.ulysses_sp", f"({sp}) and the model's {kv} KV heads must divide one another "
            f"({arr.model.path})")
    if heads % tp:
        bad("placement.parallel.rollout_tp", f"({tp}) must divide the model's {heads} attention heads "
            f"({arr.model.path})")
    ctx = arr.model.override_config.get("max_position_embeddings", info.max_position_embeddings)
    if ctx is not None and int(ctx) < seq_len:
        bad("recipe.model.override_config.max_position_embeddings", f"the model's context is {ctx} tokens, below "
            f"max_prompt_length + max_response_length = {seq_len}; raise it with "
            f"recipe.model.override_config.max_position_embeddings={seq_len if seq_len > 32768 else 32768}")
    return notes

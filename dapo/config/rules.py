"""Cross-field rules of a preset, checked after loading and before anything is scheduled: what a single field's type
cannot say (clip ranges, KL settings the loop does not implement, batch divisibility, placement against the model).
"""

from __future__ import annotations

from functools import partial
from typing import NoReturn

from dapo.config.schema import KL_PENALTIES, LOSS_AGG_MODES, ConfigError, Preset


def validate(preset: Preset) -> None:
    """Cross-field rules that must hold before anything is scheduled; :class:`ConfigError` names the first broken one
    (in order: the loss, the reward, batch sizes, sampling, optimizer and placement, the health guards, the local
    backend)."""
    _check_loss(preset)
    _check_reward(preset)
    _check_batches(preset)
    _check_sampling_optimizer_placement(preset)
    _check_health(preset)
    if preset.local is not None:
        _check_local(preset)


def _bad(preset: Preset, key: str, msg: str) -> NoReturn:
    raise ConfigError(f"preset {preset.name!r}: '{key}' {msg}")


def _check_loss(preset: Preset) -> None:
    """Clip ranges, KL terms and the loss aggregation."""
    r = preset.recipe
    a = r.actor
    bad = partial(_bad, preset)
    if not 0.0 <= a.clip_ratio_low < 1.0:
        bad("recipe.actor.clip_ratio_low", f"must be in [0, 1), got {a.clip_ratio_low}")
    if not a.clip_ratio_high >= 0.0:
        bad("recipe.actor.clip_ratio_high", f"must be >= 0, got {a.clip_ratio_high}")
    if not a.clip_ratio_c > 1.0:
        bad("recipe.actor.clip_ratio_c", f"must be > 1 (dual-clip bound), got {a.clip_ratio_c}")
    if r.algorithm.use_kl_in_reward or r.algorithm.kl_coef:
        bad("recipe.algorithm.use_kl_in_reward", "(and kl_coef) is not implemented by the DAPO loop: a KL penalty in "
            "the token rewards would change every group's advantages and the dynamic-sampling metrics; use "
            "recipe.actor.use_kl_loss / kl_loss_coef for a KL term (DAPO itself uses none)")
    kl_base = a.kl_loss_type[:-1] if a.kl_loss_type.endswith("+") else a.kl_loss_type
    if kl_base not in KL_PENALTIES:
        bad("recipe.actor.kl_loss_type", f"must be one of {list(KL_PENALTIES)} (optionally with '+'), got "
            f"{a.kl_loss_type!r}")
    if a.kl_loss_coef < 0:
        bad("recipe.actor.kl_loss_coef", f"must be >= 0, got {a.kl_loss_coef}")
    if r.trainer.log_val_generations < 0:
        bad("recipe.trainer.log_val_generations", f"must be >= 0, got {r.trainer.log_val_generations}")
    if a.loss_agg_mode not in LOSS_AGG_MODES:
        bad("recipe.actor.loss_agg_mode", f"must be one of {list(LOSS_AGG_MODES)}, got {a.loss_agg_mode!r}")


def _check_reward(preset: Preset) -> None:
    """The soft overlong punishment."""
    r = preset.recipe
    bad = partial(_bad, preset)
    ob = r.reward.overlong_buffer
    if ob.enable and not 0 < ob.len < r.data.max_response_length:
        bad(
            "recipe.reward.overlong_buffer.len",
            f"must satisfy 0 < len < recipe.data.max_response_length ({r.data.max_response_length}), got {ob.len}",
        )
    if ob.penalty_factor < 0:
        bad("recipe.reward.overlong_buffer.penalty_factor", f"must be >= 0, got {ob.penalty_factor}")


def _check_batches(preset: Preset) -> None:
    """Batch sizes, lengths and responses per prompt, and how they divide."""
    r = preset.recipe
    a = r.actor
    bad = partial(_bad, preset)
    for key in ("train_batch_size", "max_prompt_length", "max_response_length"):
        if getattr(r.data, key) < 1:
            bad(f"recipe.data.{key}", f"must be >= 1, got {getattr(r.data, key)}")
    if r.data.gen_batch_size is not None and r.data.gen_batch_size < 1:
        bad("recipe.data.gen_batch_size", f"must be >= 1, got {r.data.gen_batch_size}")
    if r.rollout.n < 1:
        bad("recipe.rollout.n", f"must be >= 1, got {r.rollout.n}")
    fg = r.filter_groups
    if fg.enable and r.rollout.n < 2:
        bad("recipe.filter_groups.enable", f"needs recipe.rollout.n >= 2 (one response cannot vary), n={r.rollout.n}")
    if not fg.enable and r.data.gen_batch_size not in (None, r.data.train_batch_size):
        bad(
            "recipe.data.gen_batch_size",
            f"({r.data.gen_batch_size}) must be null or equal recipe.data.train_batch_size ({r.data.train_batch_size}) "
            "when recipe.filter_groups.enable is false: without dynamic sampling the generation batch is the training "
            "batch",
        )
    if a.ppo_mini_batch_size < 1 or r.data.train_batch_size % a.ppo_mini_batch_size:
        bad(
            "recipe.actor.ppo_mini_batch_size",
            f"({a.ppo_mini_batch_size}) must divide recipe.data.train_batch_size ({r.data.train_batch_size})",
        )
    if a.ppo_epochs < 1:
        bad("recipe.actor.ppo_epochs", f"must be >= 1, got {a.ppo_epochs}")


def _check_sampling_optimizer_placement(preset: Preset) -> None:
    """Sampling ranges, the learning rate and its warm-up, nodes and GPUs, a built-in model's local section."""
    r, p = preset.recipe, preset.placement
    a = r.actor
    bad = partial(_bad, preset)
    if not 0 < r.rollout.top_p <= 1 or not 0 < r.rollout.val.top_p <= 1:
        bad("recipe.rollout.top_p", "top_p must be in (0, 1]")
    if r.rollout.temperature < 0 or r.rollout.val.temperature < 0:
        bad("recipe.rollout.temperature", "must be >= 0")
    if a.optim.lr <= 0:
        bad("recipe.actor.optim.lr", f"must be > 0, got {a.optim.lr}")
    if a.optim.lr_warmup_steps < 0:
        bad("recipe.actor.optim.lr_warmup_steps", f"must be >= 0, got {a.optim.lr_warmup_steps}")
    if p.nodes < 1:
        bad("placement.nodes", f"must be >= 1, got {p.nodes}")
    if p.backend == "verl" and p.gpus_per_node < 1:
        bad("placement.gpus_per_node", f"must be >= 1 for the verl backend, got {p.gpus_per_node}")
    if preset.recipe.model.path.startswith("builtin:") and preset.local is None:
        bad("local", "is required when recipe.model.path is builtin:*")


def _check_health(preset: Preset) -> None:
    """The health guards' thresholds and the watchdog's budgets."""
    r = preset.recipe
    bad = partial(_bad, preset)
    h = r.trainer.health
    if h.patience < 1:
        bad("recipe.trainer.health.patience", f"must be >= 1, got {h.patience}")
    if not 0.0 <= h.clip_ratio_max <= 1.0:
        bad("recipe.trainer.health.clip_ratio_max", f"must be in [0, 1], got {h.clip_ratio_max}")
    if h.starving_gen_batches < 1:
        bad("recipe.trainer.health.starving_gen_batches", f"must be >= 1, got {h.starving_gen_batches}")
    w = r.trainer.watchdog
    for key in ("startup_s", "first_s", "floor_s", "save_s", "poll_s", "evidence_wait_s"):
        if not getattr(w, key) > 0:
            bad(f"recipe.trainer.watchdog.{key}", f"must be > 0 seconds, got {getattr(w, key)}")
    if w.multiple < 1.5:
        bad("recipe.trainer.watchdog.multiple", f"must be >= 1.5 (a step at twice its usual time must not end the "
            f"attempt: 3 is the default), got {w.multiple}")
    if w.window < 1 or w.slow_steps < 1:
        bad("recipe.trainer.watchdog.window" if w.window < 1 else "recipe.trainer.watchdog.slow_steps",
            f"must be >= 1, got {w.window if w.window < 1 else w.slow_steps}")
    if w.slow_ratio <= 1:
        bad("recipe.trainer.watchdog.slow_ratio", f"must be > 1, got {w.slow_ratio}")
    if w.poll_s > w.floor_s / 2:
        bad("recipe.trainer.watchdog.poll_s", f"must be at most half of floor_s ({w.floor_s}), got {w.poll_s}")


def _check_local(preset: Preset) -> None:
    """The local backend's section: micro-batches, the built model's shape, the task and the warm start."""
    r = preset.recipe
    bad = partial(_bad, preset)
    lc = preset.local
    if lc.micro_batch_size < 1:
        bad("local.micro_batch_size", f"must be >= 1, got {lc.micro_batch_size}")
    m = lc.model
    if m.hidden_size % m.num_attention_heads or m.hidden_size // m.num_attention_heads < 32:
        bad("local.model.hidden_size", f"/ num_attention_heads must be an integer head_dim >= 32 (vLLM), got "
            f"{m.hidden_size} / {m.num_attention_heads}")
    if m.num_attention_heads % m.num_key_value_heads:
        bad("local.model.num_key_value_heads", "must divide num_attention_heads")
    if lc.task.n_train < r.data.train_batch_size:
        bad("local.task.n_train", f"({lc.task.n_train}) must be >= recipe.data.train_batch_size")
    if not 0.0 <= lc.warm_start.mistake_rate <= 1.0:
        bad("local.warm_start.mistake_rate", f"must be in [0, 1], got {lc.warm_start.mistake_rate}")
    for key in ("recheck_rate", "guess_rate", "swap_rate", "recheck_mistake_rate"):
        if key == "recheck_mistake_rate" and lc.warm_start.recheck_mistake_rate is None:
            continue
        if not 0.0 <= getattr(lc.warm_start, key) <= 1.0:
            bad(f"local.warm_start.{key}", f"must be in [0, 1], got {getattr(lc.warm_start, key)}")

"""Preset -> verl 0.9.1 configuration: Hydra overrides, composition, placement checks, verl's own validation.

The preset (:mod:`dapo.config`) is the single source of truth. :func:`settings` turns it into a list of verl keys
and values, each one naming the preset key it comes from (or why it is a fixed recipe constant);
:func:`hydra_overrides` writes them as Hydra command-line overrides; :func:`resolve` composes verl's own
``ppo_trainer`` config with them (``hydra.initialize_config_module("verl.trainer.config")`` + ``compose``), applies
the user's passthrough overrides, runs the placement checks of this module and then verl's
``verl.utils.config.validate_config`` -- all before any Ray cluster or GPU is touched.

Rules a composed config must satisfy (each a :class:`~dapo.config.ConfigError` naming the preset key):

- world = ``placement.nodes * placement.gpus_per_node``; the actor's data-parallel size is ``dp = world / ulysses_sp``;
- ``ulysses_sp`` divides world, the model's attention heads, and its KV heads divide ``ulysses_sp`` or vice versa
  (verl's Ulysses patch);
- ``rollout_tp`` divides ``gpus_per_node`` (a vLLM replica lives on one node) and the attention heads;
- ``ppo_mini_batch_size * n`` (responses per optimizer step) and ``train_batch_size * n`` are multiples of ``dp``;
- with dynamic batching, ``ppo_max_token_len_per_gpu * ulysses_sp`` (and the log-prob budget) holds one whole
  sequence (``max_prompt_length + max_response_length``);
- without chunked prefill, vLLM's ``max_num_batched_tokens`` holds one whole sequence;
- the model's context (``max_position_embeddings``, after ``override_config``) holds one whole sequence;
- the overlong buffer is shorter than ``max_response_length``;
- passthrough Hydra overrides may not touch a key the preset owns (one source of truth): the error names the
  preset key to use instead.

Head counts come from ``config.json`` when ``recipe.model.path`` is a local directory, else from
:data:`KNOWN_MODELS`; an unknown remote model skips the head checks (and says so in :func:`resolve`'s notes).
"""

from __future__ import annotations

import copy
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from dapo.config import ConfigError, Preset

VERL_CONFIG_MODULE = "verl.trainer.config"
VERL_CONFIG_NAME = "ppo_trainer"
# The module that registers our policy losses in verl's registry; Ray workers import it through
# VERL_USE_EXTERNAL_MODULES (verl/__init__.py imports the listed modules in every process).
LOSS_MODULE = "dapo.backends.verl.loss"
# recipe.actor.token_mean_scope -> the verl loss_mode name registered by LOSS_MODULE.
LOSS_MODES = {"minibatch": "dapo", "microbatch": "dapo_microbatch"}


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


@dataclass(frozen=True)
class Setting:
    """One verl config value derived from the preset."""

    key: str  # dotted verl key, without Hydra's '+'
    value: Any
    source: str  # the preset key it comes from, or "fixed: <why>" for a recipe constant
    append: bool = False  # the key is not in verl's schema: Hydra needs '+key=value'

    @property
    def owned(self) -> bool:
        """Preset-derived (not overridable through passthrough Hydra overrides)."""
        return not self.source.startswith("fixed")

    def override(self) -> str:
        return f"{'+' if self.append else ''}{self.key}={format_value(self.value)}"


# --------------------------------------------------------------------------------------------------------------------
# Preset -> verl keys
# --------------------------------------------------------------------------------------------------------------------


def settings(preset: Preset) -> list[Setting]:
    """Every verl key this bundle sets, in a stable order, with its value and provenance."""
    r, p = preset.recipe, preset.placement
    par = p.parallel
    a, m, d, ro = r.actor, r.model, r.data, r.rollout
    out: list[Setting] = []

    def put(key: str, value: Any, source: str, append: bool = False) -> None:
        out.append(Setting(key, value, source, append))

    # model
    put("actor_rollout_ref.model.path", m.path, "recipe.model.path")
    if m.tokenizer_path is not None:
        put("actor_rollout_ref.model.tokenizer_path", m.tokenizer_path, "recipe.model.tokenizer_path")
    put("actor_rollout_ref.model.enable_gradient_checkpointing", m.enable_gradient_checkpointing,
        "recipe.model.enable_gradient_checkpointing")
    put("actor_rollout_ref.model.use_remove_padding", m.use_remove_padding, "recipe.model.use_remove_padding")
    put("actor_rollout_ref.model.trust_remote_code", m.trust_remote_code, "recipe.model.trust_remote_code")
    for k, v in sorted(m.override_config.items()):
        put(f"actor_rollout_ref.model.override_config.{k}", v, f"recipe.model.override_config.{k}", append=True)
    # data
    put("data.train_files", list(d.train_files), "recipe.data.train_files")
    put("data.val_files", list(d.val_files), "recipe.data.val_files")
    put("data.prompt_key", d.prompt_key, "recipe.data.prompt_key")
    put("data.train_batch_size", d.train_batch_size, "recipe.data.train_batch_size")
    put("data.gen_batch_size", d.gen_batch_size if d.gen_batch_size is not None else d.train_batch_size,
        "recipe.data.gen_batch_size")
    put("data.max_prompt_length", d.max_prompt_length, "recipe.data.max_prompt_length")
    put("data.max_response_length", d.max_response_length, "recipe.data.max_response_length")
    put("data.truncation", d.truncation, "recipe.data.truncation")
    put("data.shuffle", d.shuffle, "recipe.data.shuffle")
    put("data.seed", r.trainer.seed, "recipe.trainer.seed")
    # sampling
    put("actor_rollout_ref.rollout.n", ro.n, "recipe.rollout.n")
    put("actor_rollout_ref.rollout.temperature", ro.temperature, "recipe.rollout.temperature")
    put("actor_rollout_ref.rollout.top_p", ro.top_p, "recipe.rollout.top_p")
    put("actor_rollout_ref.rollout.top_k", ro.top_k, "recipe.rollout.top_k")
    for k in ("temperature", "top_p", "top_k", "n", "do_sample"):
        if k == "temperature" and not ro.val.do_sample:
            # verl's agent loop reads only temperature / top_p / top_k: greedy validation is temperature 0
            put("actor_rollout_ref.rollout.val_kwargs.temperature", 0.0, "recipe.rollout.val.do_sample (false: greedy)")
            continue
        put(f"actor_rollout_ref.rollout.val_kwargs.{k}", getattr(ro.val, k), f"recipe.rollout.val.{k}")
    # algorithm
    put("algorithm.adv_estimator", r.algorithm.adv_estimator, "recipe.algorithm.adv_estimator")
    put("algorithm.norm_adv_by_std_in_grpo", r.algorithm.norm_adv_by_std, "recipe.algorithm.norm_adv_by_std")
    put("algorithm.use_kl_in_reward", r.algorithm.use_kl_in_reward, "recipe.algorithm.use_kl_in_reward")
    put("algorithm.kl_ctrl.kl_coef", r.algorithm.kl_coef, "recipe.algorithm.kl_coef")
    fg = r.filter_groups
    put("algorithm.filter_groups.enable", fg.enable, "recipe.filter_groups.enable")
    put("algorithm.filter_groups.metric", fg.metric, "recipe.filter_groups.metric")
    put("algorithm.filter_groups.max_num_gen_batches", fg.max_num_gen_batches, "recipe.filter_groups.max_num_gen_batches")
    # actor loss + optimizer
    put("actor_rollout_ref.actor.policy_loss.loss_mode", LOSS_MODES[a.token_mean_scope], "recipe.actor.token_mean_scope")
    put("actor_rollout_ref.actor.clip_ratio_low", a.clip_ratio_low, "recipe.actor.clip_ratio_low")
    put("actor_rollout_ref.actor.clip_ratio_high", a.clip_ratio_high, "recipe.actor.clip_ratio_high")
    put("actor_rollout_ref.actor.clip_ratio_c", a.clip_ratio_c, "recipe.actor.clip_ratio_c")
    put("actor_rollout_ref.actor.loss_agg_mode", a.loss_agg_mode, "recipe.actor.loss_agg_mode")
    put("actor_rollout_ref.actor.entropy_coeff", a.entropy_coeff, "recipe.actor.entropy_coeff")
    put("actor_rollout_ref.actor.use_kl_loss", a.use_kl_loss, "recipe.actor.use_kl_loss")
    put("actor_rollout_ref.actor.kl_loss_coef", a.kl_loss_coef, "recipe.actor.kl_loss_coef")
    put("actor_rollout_ref.actor.kl_loss_type", a.kl_loss_type, "recipe.actor.kl_loss_type")
    put("actor_rollout_ref.actor.ppo_mini_batch_size", a.ppo_mini_batch_size, "recipe.actor.ppo_mini_batch_size")
    put("actor_rollout_ref.actor.ppo_epochs", a.ppo_epochs, "recipe.actor.ppo_epochs")
    o = a.optim
    put("actor_rollout_ref.actor.optim.lr", o.lr, "recipe.actor.optim.lr")
    put("actor_rollout_ref.actor.optim.lr_warmup_steps", o.lr_warmup_steps, "recipe.actor.optim.lr_warmup_steps")
    put("actor_rollout_ref.actor.optim.weight_decay", o.weight_decay, "recipe.actor.optim.weight_decay")
    put("actor_rollout_ref.actor.optim.clip_grad", o.clip_grad, "recipe.actor.optim.clip_grad")
    # verl 0.9.1 still accepts (and ignores) the old key; keep it equal so the printed config does not contradict
    put("actor_rollout_ref.actor.grad_clip", o.clip_grad, "recipe.actor.optim.clip_grad")
    put("actor_rollout_ref.actor.optim.betas", list(o.betas), "recipe.actor.optim.betas")
    # reward: verl's DAPO reward manager (its numbers equal dapo.reward's; the loop uses ours)
    ob = r.reward.overlong_buffer
    put("reward.reward_manager.name", "dapo", "fixed: the DAPO reward manager (rule-based verifier + overlong shaping)")
    put("reward.reward_kwargs.overlong_buffer_cfg.enable", ob.enable, "recipe.reward.overlong_buffer.enable", True)
    put("reward.reward_kwargs.overlong_buffer_cfg.len", ob.len, "recipe.reward.overlong_buffer.len", True)
    put("reward.reward_kwargs.overlong_buffer_cfg.penalty_factor", ob.penalty_factor,
        "recipe.reward.overlong_buffer.penalty_factor", True)
    put("reward.reward_kwargs.overlong_buffer_cfg.log", False, "fixed: reference value", True)
    put("reward.reward_kwargs.max_resp_len", d.max_response_length, "recipe.data.max_response_length", True)
    # trainer
    t = r.trainer
    put("trainer.total_epochs", t.total_epochs, "recipe.trainer.total_epochs")
    put("trainer.total_training_steps", t.total_training_steps, "recipe.trainer.total_training_steps")
    put("trainer.save_freq", t.save_freq, "recipe.trainer.save_freq")
    put("trainer.test_freq", t.test_freq, "recipe.trainer.test_freq")
    put("trainer.val_before_train", t.val_before_train, "recipe.trainer.val_before_train")
    put("trainer.project_name", t.project_name, "recipe.trainer.project_name")
    put("trainer.experiment_name", t.experiment_name, "recipe.trainer.experiment_name")
    put("trainer.default_local_dir", t.default_local_dir, "recipe.trainer.default_local_dir")
    put("trainer.resume_mode", t.resume_mode, "recipe.trainer.resume_mode")
    put("trainer.logger", list(t.logger), "recipe.trainer.logger")
    put("trainer.max_actor_ckpt_to_keep", t.max_ckpt_to_keep, "recipe.trainer.max_ckpt_to_keep")
    put("trainer.log_val_generations", t.log_val_generations, "recipe.trainer.log_val_generations")
    put("trainer.rollout_data_dir", t.rollout_data_dir, "recipe.trainer.rollout_data_dir")
    put("trainer.validation_data_dir", t.validation_data_dir, "recipe.trainer.validation_data_dir")
    # placement
    put("trainer.nnodes", p.nodes, "placement.nodes")
    put("trainer.n_gpus_per_node", p.gpus_per_node, "placement.gpus_per_node")
    put("actor_rollout_ref.actor.ulysses_sequence_parallel_size", par.ulysses_sp, "placement.parallel.ulysses_sp")
    put("actor_rollout_ref.ref.ulysses_sequence_parallel_size", par.ulysses_sp, "placement.parallel.ulysses_sp")
    put("actor_rollout_ref.rollout.tensor_model_parallel_size", par.rollout_tp, "placement.parallel.rollout_tp")
    put("actor_rollout_ref.rollout.gpu_memory_utilization", par.gpu_memory_utilization,
        "placement.parallel.gpu_memory_utilization")
    put("actor_rollout_ref.rollout.enable_chunked_prefill", par.enable_chunked_prefill,
        "placement.parallel.enable_chunked_prefill")
    put("actor_rollout_ref.rollout.max_num_batched_tokens", par.max_num_batched_tokens,
        "placement.parallel.max_num_batched_tokens")
    put("actor_rollout_ref.actor.use_dynamic_bsz", par.use_dynamic_bsz, "placement.parallel.use_dynamic_bsz")
    put("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", par.use_dynamic_bsz, "placement.parallel.use_dynamic_bsz")
    put("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", par.use_dynamic_bsz, "placement.parallel.use_dynamic_bsz")
    infer_len = par.log_prob_max_token_len_per_gpu or par.ppo_max_token_len_per_gpu
    put("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", par.ppo_max_token_len_per_gpu,
        "placement.parallel.ppo_max_token_len_per_gpu")
    put("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", infer_len, "placement.parallel.log_prob_max_token_len_per_gpu")
    put("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", infer_len,
        "placement.parallel.log_prob_max_token_len_per_gpu")
    if not par.use_dynamic_bsz:
        mbs = par.ppo_micro_batch_size_per_gpu
        put("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", mbs, "placement.parallel.ppo_micro_batch_size_per_gpu")
        put("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", mbs,
            "placement.parallel.ppo_micro_batch_size_per_gpu")
        put("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", mbs,
            "placement.parallel.ppo_micro_batch_size_per_gpu")
    put("actor_rollout_ref.actor.fsdp_config.param_offload", par.param_offload, "placement.parallel.param_offload")
    put("actor_rollout_ref.actor.fsdp_config.optimizer_offload", par.optimizer_offload,
        "placement.parallel.optimizer_offload")
    put("actor_rollout_ref.ref.fsdp_config.param_offload", par.param_offload, "placement.parallel.param_offload")
    put("actor_rollout_ref.actor.fsdp_config.fsdp_size", par.fsdp_size, "placement.parallel.fsdp_size")
    # fixed recipe constants: the reference commit's defaults where verl 0.9.1 changed them, and 0.9.1 requirements
    put("actor_rollout_ref.rollout.name", "vllm", "fixed: the reference rollout engine (0.9.1 has no default)")
    put("actor_rollout_ref.rollout.enforce_eager", True,
        "fixed: reference default (the DAPO README: CUDA graphs may degrade model performance)")
    put("actor_rollout_ref.rollout.max_num_seqs", 1024, "fixed: reference default (0.9.1 default 256)")
    put("actor_rollout_ref.rollout.seed", 0, "fixed: reference engine_seed")
    put("actor_rollout_ref.actor.checkpoint.save_contents", ["model", "hf_model", "optimizer", "extra"],
        "fixed: reference default (hf_model: a HuggingFace copy to evaluate each checkpoint)")
    put("trainer.balance_batch", True, "fixed: reference default")
    put("trainer.use_v1", False, "fixed: the non-v1 worker groups; DAPO's loop is dapo.train.loop")
    # every training process (Ray runtime env): the preset's env + our loss registration
    env = {**p.env, "VERL_USE_EXTERNAL_MODULES": LOSS_MODULE}
    for k, v in env.items():
        src = "fixed: registers the DAPO loss in Ray workers" if k == "VERL_USE_EXTERNAL_MODULES" else f"placement.env.{k}"
        put(f"ray_kwargs.ray_init.runtime_env.env_vars.{k}", str(v), src, True)
    return out


_PLAIN = re.compile(r"^[A-Za-z_/~][\w./~-]*$")
_INTERP = re.compile(r"^[\w./-]*(\$\{[\w.:,/ -]+\}[\w./-]*)+$")


def format_value(value: Any) -> str:
    """A Python value as a Hydra override value (strings quoted unless plainly a word or a path)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if value.lower() in ("true", "false", "null", "none", "nan", "inf") or not (
            _PLAIN.match(value) or _INTERP.match(value)
        ):
            return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
        return value
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{format_value(v)}" for k, v in value.items()) + "}"
    raise ConfigError(f"cannot express {value!r} ({type(value).__name__}) as a Hydra override")


def hydra_overrides(preset: Preset) -> list[str]:
    """The preset as verl Hydra overrides (what ``python -m verl.trainer.main_ppo ...`` would take)."""
    return [s.override() for s in settings(preset)]


# --------------------------------------------------------------------------------------------------------------------
# Passthrough overrides
# --------------------------------------------------------------------------------------------------------------------


def _override_key(text: str) -> str:
    if "=" not in text:
        raise ConfigError(f"verl override {text!r} is not of the form key=value")
    return text.split("=", 1)[0].lstrip("+~").strip()


# verl keys outside the preset that a passthrough override may set: read by code the DAPO loop runs -- verl's
# workers (FSDP actor, reference), the vLLM servers and agent loop, verl's reward loop, Ray.
PASSTHROUGH_ALLOWED = ("actor_rollout_ref", "model_engine", "ray_kwargs", "reward", "trainer.device",
                       "trainer.ray_wait_register_center_timeout")  # fmt: skip
_FIT_ONLY = "read only by verl's RayPPOTrainer.fit() / main_ppo, which the DAPO loop (dapo.train.loop) replaces"
# Refused, most specific prefix first, each with the reason (the loop would accept and silently skip them).
PASSTHROUGH_REFUSED: dict[str, str] = {
    "actor_rollout_ref.rollout.full_determinism": f"{_FIT_ONLY}: main_ppo turns it into VERL_FULL_DETERMINISM / "
    "VLLM_BATCH_INVARIANT / PYTHONHASHSEED before ray.init; set those in placement.env instead",
    "algorithm.rollout_correction": f"{_FIT_ONLY}: rollout correction (importance weights / rejection sampling "
    "against pi_rollout) is computed in fit(); the DAPO loop recomputes pi_old instead",
    "global_profiler": f"{_FIT_ONLY}: the profiler is started and stopped around fit()'s steps",
    "skip": f"{_FIT_ONLY}: verl's SkipManager is driven by fit()",
    "trainer.esi_redundant_time": f"{_FIT_ONLY}: the expiry-driven save is decided in fit(); use "
    "recipe.trainer.save_freq",
    "data.filter_overlong_prompts": "verl's dataset filter: the loop reads recipe.data.train_files itself and "
    "verl's agent loop left-truncates prompts longer than recipe.data.max_prompt_length",
    "data": "verl's dataset and dataloader are not used: the loop reads recipe.data.* itself",
    "algorithm": f"{_FIT_ONLY}: advantages, filtering and KL are the loop's (recipe.algorithm.*, "
    "recipe.filter_groups.*, recipe.actor.use_kl_loss)",
    "trainer": f"{_FIT_ONLY} (the loop's trainer settings are recipe.trainer.*)",
    "critic": "GRPO advantages need no critic: verl builds none for this config",
    "reward_model": "verl 0.9.1's main_ppo ignores the legacy reward_model.* keys (the reward is the loop's)",
    "custom_reward_function": "the reward is the loop's (dapo.reward), not a custom verl reward function",
    "sandbox_fusion": "the reward is the loop's (dapo.reward): no sandbox",
    "distillation": f"{_FIT_ONLY}: no teacher model in the DAPO loop",
    "transfer_queue": "TransferQueue belongs to verl's v1 trainer (trainer.use_v1 is false here)",
}


def _under(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(prefix + ".")


def passthrough_refusal(key: str) -> Optional[str]:
    """Why a passthrough verl key is refused (None when the loop honours it). ``key`` has no Hydra prefix."""
    for prefix in sorted(PASSTHROUGH_REFUSED, key=len, reverse=True):
        if _under(key, prefix):
            return PASSTHROUGH_REFUSED[prefix]
    if any(_under(key, p) for p in PASSTHROUGH_ALLOWED):
        return None
    return f"'{key}' is no key the DAPO loop or verl's workers read (allowed: {', '.join(PASSTHROUGH_ALLOWED)})"


def check_passthrough(preset: Preset, overrides: list[str] | tuple[str, ...]) -> None:
    """Reject passthrough Hydra overrides of preset-owned keys (naming the preset key to set instead) and of keys
    the loop does not honour (:data:`PASSTHROUGH_REFUSED`, with the reason)."""
    owned = {s.key: s.source for s in settings(preset) if s.owned}
    for text in overrides:
        key = _override_key(text)
        for verl_key, source in owned.items():
            if key == verl_key or verl_key.startswith(key + ".") or key.startswith(verl_key + "."):
                raise ConfigError(
                    f"verl override {text!r} sets '{verl_key}', which the preset owns: override '{source}' instead "
                    f"(e.g. {source}=...), so the loop, the manifests and verl agree"
                )
        why = passthrough_refusal(key)
        if why is not None:
            raise ConfigError(f"verl override {text!r} is refused: {why}")


# --------------------------------------------------------------------------------------------------------------------
# Composition and checks
# --------------------------------------------------------------------------------------------------------------------


_BASE: dict[str, Any] = {}  # verl's ppo_trainer composed without overrides, and its config-group names


def _hydra_compose(overrides: list[str], return_hydra_config: bool = False) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_module(VERL_CONFIG_MODULE, version_base=None):
        return hydra_compose(VERL_CONFIG_NAME, overrides=overrides, return_hydra_config=return_hydra_config)


def _config_error(exc: Exception) -> ConfigError:
    cause = f" ({' '.join(str(exc.__cause__).split())})" if exc.__cause__ else ""
    msg = " ".join(str(exc).split())
    return ConfigError(f"verl config: {msg}{cause}")


def compose(overrides: list[str] | tuple[str, ...]) -> Any:
    """verl's ``ppo_trainer`` config with ``overrides`` (Hydra errors become :class:`ConfigError`).

    Hydra composes in two stages: the defaults list (config-group choices) is loaded and merged, then the root is
    put in struct mode and the value overrides are applied (``ConfigLoaderImpl._apply_overrides_to_config``). When
    no override selects a config group -- always the case for the preset's own overrides -- the first stage is the
    same for every call, so it is done once per process and only the second stage runs per call, with Hydra's own
    parser and override application (same semantics and error messages; ~20x faster than a full compose). An
    override that selects a config group takes the full ``compose`` path.
    """
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf, open_dict

    overrides = list(overrides)
    try:
        if not _BASE:
            full = _hydra_compose([], return_hydra_config=True)
            groups = set(OmegaConf.to_container(full.hydra.runtime.choices).keys())
            with open_dict(full):
                del full["hydra"]
            _BASE.update(cfg=full, groups=groups)
        parsed = OverridesParser.create().parse_overrides(overrides=overrides)
        if any(o.key_or_group in _BASE["groups"] or "/" in o.key_or_group for o in parsed):
            return _hydra_compose(overrides)
        cfg = copy.deepcopy(_BASE["cfg"])
        ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
        return cfg
    except ConfigError:
        raise
    except Exception as exc:  # hydra raises ConfigCompositionException / OverrideParseException
        raise _config_error(exc) from exc


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
                     "dapo.backends.verl.config.KNOWN_MODELS: attention-head and context-length checks skipped")
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


def verl_validate(cfg: Any) -> None:
    """verl's own ``validate_config`` with the reference policy / critic needs verl derives from ``cfg``."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    try:
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    except (AssertionError, ValueError, TypeError) as exc:
        raise ConfigError(f"verl validate_config rejected the config: {exc}") from exc


@dataclass
class Resolved:
    """A composed, checked, validated verl config and what produced it."""

    cfg: Any  # omegaconf.DictConfig
    overrides: list[str]  # preset-derived + passthrough, in the order applied
    notes: list[str]


def resolve(preset: Preset, passthrough: list[str] | tuple[str, ...] = ()) -> Resolved:
    """Compose verl's config from the preset plus passthrough overrides, check placement, run verl's validation."""
    if preset.placement.backend != "verl":
        raise ConfigError(f"preset {preset.name!r} has placement.backend={preset.placement.backend!r}, not 'verl'")
    check_passthrough(preset, passthrough)
    if preset.recipe.data.truncation != "left":
        raise ConfigError(
            f"preset {preset.name!r}: 'recipe.data.truncation' is {preset.recipe.data.truncation!r}, but on the verl "
            "backend verl's agent loop tokenizes the prompts and always left-truncates those longer than "
            "recipe.data.max_prompt_length ('right' / 'error' are verl dataset options the loop does not use); "
            "set recipe.data.truncation: left"
        )
    overrides = hydra_overrides(preset) + list(passthrough)
    cfg = compose(overrides)
    notes = check_placement(preset, cfg, model_info(str(cfg.actor_rollout_ref.model.path)))
    import contextlib
    import io
    import warnings

    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        # validate_config prints a success line and warns that a GRPO run has no critic (intended)
        warnings.filterwarnings("ignore", message="Disabled critic")
        verl_validate(cfg)
    return Resolved(cfg=cfg, overrides=overrides, notes=notes)


def to_yaml(cfg: Any) -> str:
    """The complete config with every interpolation resolved."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(cfg, resolve=True)


def runtime_env(cfg: Any, environ: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """The runtime env for ``ray.init``: verl's PPO defaults merged with ``ray_kwargs.ray_init.runtime_env``.

    Inside a Ray job (a KubeRay RayJob) the job's own runtime env is already in ``environ`` and Ray refuses a driver
    runtime env that repeats any of its variables (even with the same value). Variables the job already sets are
    therefore left out; one it sets to a *different* value than this config wants is a :class:`ConfigError`.
    """
    from omegaconf import OmegaConf

    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    environ = dict(os.environ) if environ is None else environ
    merged = OmegaConf.merge(get_ppo_ray_runtime_env(cfg), cfg.ray_kwargs.ray_init.get("runtime_env", {}))
    out = {k: v for k, v in OmegaConf.to_container(merged, resolve=True).items() if v is not None}
    wanted = dict(OmegaConf.to_container(cfg.ray_kwargs.ray_init.get("runtime_env", {}) or {}).get("env_vars") or {})
    env_vars = dict(out.get("env_vars") or {})
    for key in list(env_vars):
        if key in environ:
            if key in wanted and str(environ[key]) != str(wanted[key]):
                raise ConfigError(
                    f"the Ray job's environment sets {key}={environ[key]!r} but this run needs {key}={wanted[key]!r} "
                    f"(placement.env / the DAPO loss registration); drop it from the job's runtime env"
                )
            env_vars.pop(key)
    out["env_vars"] = env_vars
    return out

"""Preset -> the command line of the upstream DAPO recipe at verl commit 4f80e46 (the reference runs).

The reference runs (AIME-2024 44 / 50) were ``python3 -m recipe.dapo.src.main_dapo KEY=VALUE ...`` at verl commit
:data:`REFERENCE_COMMIT`, submitted with ``recipe/dapo/runtime_env.yaml``. :func:`translate` writes a preset
(:mod:`dapo.config`, the one source of hyperparameters) as that command's Hydra arguments, in that commit's key
names and in the order of ``recipe/dapo/run_dapo_qwen2.5_32b.sh``. The values and the preset keys they come from are
the verl 0.9.1 table's (:func:`dapo.backends.verl.settings.settings`), taken under the same key where the two commits
agree and under the key 0.9.1 renamed it to where they do not (``reward.reward_manager.name`` ->
``reward_model.reward_manager``, ``reward.reward_kwargs.overlong_buffer_cfg.*`` -> ``reward_model.overlong_buffer.*``:
:data:`SCRIPT_ARGS_AFTER_FILTERING`).

Every leaf key of a preset is handled in exactly one way (tests enumerate them):

- **passed**: written as an argument. Keys the reference scripts set are always written; keys they leave at the
  commit's default (``recipe/dapo/src/config/dapo_trainer.yaml``, or the ``config.get(key, default)`` of the code
  that reads them: :data:`REFERENCE_DEFAULTS`) are written only when the preset differs from that default, so the
  ``full`` and ``early`` presets give exactly the scripts' keys.
- **refused**: a value the reference code cannot express (``recipe.reward.overlong_filter: true``, a
  ``loss_agg_mode`` 4f80e46 lacks, the local backend, ...) raises :class:`ReferenceError` naming the key. Nothing is
  dropped silently.
- **not passed, with the reason** (:attr:`Translation.not_passed`): keys that configure *our* stack rather than the
  recipe -- how our loop implements the token-mean (the reference stack has its own: its per-micro-batch mean, see
  docs/fidelity.md), our health warnings, settings the reference trainer does not read in this configuration
  (``filter_groups.metric`` with filtering off, micro-batch sizes with dynamic batch sizes). The generated chart
  file lists them.

Values must survive the shells the entrypoint passes through (KubeRay's submitter, then Ray's job supervisor):
letters, digits and ``_.,:/@%+=-`` (plus ``[ ]`` of lists). Anything else is refused naming the key.

``trainer.nnodes`` / ``trainer.n_gpus_per_node`` come from the placement; :func:`dapo.reference.command.apply_overrides`
replaces them (and any user override of a generated key) in place, and appends overrides of other keys -- Helm does
the same with the generated file (``charts/dapo/reference/<preset>.yaml``). :mod:`dapo.reference.command` builds the
command line (overrides, entrypoint, ``python -m dapo.reference``) from this translation.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from typing import Any

from dapo.config import ConfigError, Preset, resolve_trainer_refs

REFERENCE_REPO = "volcengine/verl"
REFERENCE_COMMIT = "4f80e465c2ec79ab9c3c30ec74b9745de61d0490"
# `python3 -m` module of the recipe inside the verl source tree of the reproduction image.
MODULE = "recipe.dapo.src.main_dapo"
# recipe/dapo/src/dapo_ray_trainer.py at 4f80e46 runs these loss aggregations (core_algos.agg_loss).
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
# Characters a value may hold: they mean nothing to bash or sh, so the argument is the same after two shells.
SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.,:/@%+=-]+$")

# Defaults at 4f80e46 of the keys the reference scripts leave unset (dapo_trainer.yaml, or the `.get(key, default)`
# of the code that reads them) -> (default, the key is in dapo_trainer.yaml; else Hydra needs `+key=`).
REFERENCE_DEFAULTS: dict[str, tuple[Any, bool]] = {
    "data.shuffle": (True, True),
    # ray_trainer: train_dataloader_generator.manual_seed(self.config.data.get("seed", 1))
    "data.seed": (1, False),
    "actor_rollout_ref.actor.ppo_epochs": (1, True),
    # fsdp_workers: optim.AdamW(..., betas=optim_config.get('betas', (0.9, 0.999)), ...)
    "actor_rollout_ref.actor.optim.betas": ([0.9, 0.999], False),
    # fsdp_workers: trust_remote_code=self.config.model.get('trust_remote_code', False)
    "actor_rollout_ref.model.trust_remote_code": (False, False),
    "trainer.total_training_steps": (None, True),
    "trainer.max_actor_ckpt_to_keep": (None, True),
}


class ReferenceError(ConfigError):
    """A preset value the reference recipe cannot express; the message starts with the preset key."""


@dataclass(frozen=True)
class Arg:
    """One Hydra argument of the reference command."""

    key: str  # the 4f80e46 key, without Hydra's '+'
    value: Any
    source: str  # the preset key it comes from, or "fixed: <why>"
    append: bool = False  # not in dapo_trainer.yaml: Hydra needs '+key=value'

    def text(self) -> str:
        return f"{'+' if self.append else ''}{self.key}={format_value(self.value, self.source)}"


@dataclass
class Translation:
    preset: str
    args: list[Arg] = field(default_factory=list)
    # (preset key, value, why it is not an argument of the reference command)
    not_passed: list[tuple[str, Any, str]] = field(default_factory=list)
    # every preset leaf key looked at (passed, checked against a fixed reference behaviour, or not passed)
    handled: set[str] = field(default_factory=set)

    def texts(self) -> list[str]:
        return [a.text() for a in self.args]


def format_value(value: Any, source: str = "") -> str:
    """A value as the reference scripts would pass it to Hydra, shell-safe; :class:`ReferenceError` otherwise."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v, source) for v in value) + "]"
    if isinstance(value, str):
        if not SAFE_VALUE.match(value) or value.lower() in ("true", "false", "null", "none", "nan", "inf"):
            raise ReferenceError(
                f"{source or 'value'}: {value!r} cannot be passed to the reference command (only letters, digits "
                "and _.,:/@%+=- survive the shells of the RayJob entrypoint unchanged)"
            )
        return value
    raise ReferenceError(f"{source or 'value'}: cannot express {value!r} ({type(value).__name__}) as a Hydra value")


def leaf_keys(cls: type = Preset, prefix: str = "") -> list[str]:
    """Every leaf key of a preset (mappings, lists and the optional ``local`` section are leaves; the metadata
    fields ``name``, ``description``, ``target_aime`` are not keys of a run)."""
    hints = typing.get_type_hints(cls)
    out: list[str] = []
    for f in dataclasses.fields(cls):
        if not prefix and f.name in ("name", "description", "target_aime"):
            continue
        path = f"{prefix}{f.name}"
        sub = hints[f.name]
        out += leaf_keys(sub, path + ".") if dataclasses.is_dataclass(sub) else [path]
    return out


class _Writer:
    """Writes a preset into a :class:`Translation`, each key handled one way (module docstring): passed (``put``;
    ``put_if_not_default`` for keys the scripts leave at the commit's default), refused unless the preset asks for
    what the reference stack fixes (``fixed``), or not passed, with the reason (``not_passed``)."""

    def __init__(self, preset: Preset):
        self.preset = preset
        self.out = Translation(preset.name)

    def put(self, key: str, value: Any, source: str, append: bool = False) -> None:
        arg = Arg(key, value, source, append)
        arg.text()  # refuses a value that cannot be passed, naming the preset key
        self.out.args.append(arg)
        self.out.handled.add(source)

    def put_if_not_default(self, key: str, value: Any, source: str) -> None:
        default, in_yaml = REFERENCE_DEFAULTS[key]
        if _norm(value) != _norm(default):
            self.put(key, value, source, append=not in_yaml)
        else:
            self.out.handled.add(source)

    def fixed(self, key: str, ok: bool, message: str) -> None:
        if not ok:
            raise ReferenceError(f"{key}: {message} (preset {self.preset.name!r}; verl {REFERENCE_COMMIT[:7]}'s DAPO "
                                 "recipe)")
        self.out.handled.add(key)

    def not_passed(self, key: str, value: Any, why: str) -> None:
        self.out.not_passed.append((key, value, why))
        self.out.handled.add(key)


def translate(preset: Preset) -> Translation:
    """The reference command's Hydra arguments for a (validated) preset. Raises :class:`ReferenceError`.

    In order: what the reference stack fixes, the reference scripts' arguments in their order, the keys the scripts
    leave at the commit's default, our stack's settings."""
    from dapo.backends.verl.settings import settings

    w = _Writer(preset)
    _what_the_reference_fixes(w, preset)
    rows = {s.key: s for s in settings(preset)}
    _script_arguments(w, rows)
    _arguments_at_default(w, preset, rows)
    _our_settings(w, preset)
    return w.out


def _what_the_reference_fixes(w: _Writer, preset: Preset) -> None:
    """Refused unless the preset asks for the behaviour the reference stack has."""
    r, p = preset.recipe, preset.placement
    a, m, fg, t = r.actor, r.model, r.filter_groups, r.trainer
    fixed = w.fixed
    fixed("placement.backend", p.backend == "verl",
          f"is {p.backend!r}; the reference recipe runs only on verl worker groups (placement.backend: verl)")
    fixed("placement.accelerator", p.accelerator != "cpu",
          "is 'cpu'; the reference stack (verl 4f80e46, CUDA) has no CPU platform -- verl's workers on CPU are our "
          "loop's rehearsal (dapo.backends.verl.cpu)")
    fixed("local", preset.local is None, "is set; the reference recipe has no local backend")
    fixed("recipe.model.path", not m.path.startswith("builtin:"),
          f"{m.path!r} is a model built by our local backend; the reference loads a Hugging Face model")
    fixed("recipe.model.tokenizer_path", m.tokenizer_path is None,
          "is set; the reference recipe loads the tokenizer from actor_rollout_ref.model.path")
    fixed("recipe.algorithm.norm_adv_by_std", r.algorithm.norm_adv_by_std,
          "is false; the reference GRPO advantage always divides by the group std")
    fixed("recipe.actor.loss_agg_mode", a.loss_agg_mode in LOSS_AGG_MODES,
          f"{a.loss_agg_mode!r} is not one of the reference's {list(LOSS_AGG_MODES)}")
    fixed("recipe.reward.overlong_filter", not r.reward.overlong_filter,
          "is true; the reference recipe has no overlong filtering (only the soft overlong punishment)")
    fixed("recipe.reward.math_verify", not r.reward.math_verify,
          "is true; the reference recipe has no math-verify second opinion")
    fixed("recipe.filter_groups.mode", fg.mode == "reference",
          f"is {fg.mode!r}; the reference trainer truncates surplus kept groups (mode: reference)")
    fixed("recipe.trainer.health.stop_on", not t.health.stop_on,
          f"{list(t.health.stop_on)} would stop the run on a health guard; the reference trainer has none")


# The reference scripts' arguments, in their order. Each takes its value and its preset key from the verl 0.9.1 table
# (dapo.backends.verl.settings) under the same key, or -- (4f80e46 key, 0.9.1 key) -- under the key 0.9.1 renamed it to.
AR, ACTOR, REF, ROLLOUT = "actor_rollout_ref", "actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout"
SCRIPT_ARGS_BEFORE_FILTERING = [
    "data.train_files", "data.val_files", "data.prompt_key", "data.truncation", "data.max_prompt_length",
    "data.max_response_length", "data.gen_batch_size", "data.train_batch_size", f"{ROLLOUT}.n",
    "algorithm.adv_estimator", "algorithm.use_kl_in_reward", "algorithm.kl_ctrl.kl_coef", f"{ACTOR}.use_kl_loss",
    f"{ACTOR}.kl_loss_coef", f"{ACTOR}.clip_ratio_low", f"{ACTOR}.clip_ratio_high", f"{ACTOR}.clip_ratio_c",
    "algorithm.filter_groups.enable",
]
FILTERING_ARGS = ["algorithm.filter_groups.max_num_gen_batches", "algorithm.filter_groups.metric"]
SCRIPT_ARGS_AFTER_FILTERING = [
    f"{AR}.model.use_remove_padding", f"{ACTOR}.use_dynamic_bsz", f"{REF}.log_prob_use_dynamic_bsz",
    f"{ROLLOUT}.log_prob_use_dynamic_bsz", f"{ACTOR}.ppo_max_token_len_per_gpu", f"{REF}.log_prob_max_token_len_per_gpu",
    f"{ROLLOUT}.log_prob_max_token_len_per_gpu", f"{AR}.model.path", f"{AR}.model.enable_gradient_checkpointing",
    f"{ACTOR}.optim.lr", f"{ACTOR}.optim.lr_warmup_steps", f"{ACTOR}.optim.weight_decay", f"{ACTOR}.ppo_mini_batch_size",
    f"{ACTOR}.fsdp_config.param_offload", f"{ACTOR}.fsdp_config.optimizer_offload", f"{ACTOR}.entropy_coeff",
    f"{ACTOR}.grad_clip", f"{ACTOR}.loss_agg_mode", f"{ACTOR}.ulysses_sequence_parallel_size",
    f"{ROLLOUT}.gpu_memory_utilization", f"{ROLLOUT}.tensor_model_parallel_size", f"{ROLLOUT}.enable_chunked_prefill",
    f"{ROLLOUT}.max_num_batched_tokens", f"{ROLLOUT}.temperature", f"{ROLLOUT}.top_p", f"{ROLLOUT}.top_k",
    *(f"{ROLLOUT}.val_kwargs.{k}" for k in ("temperature", "top_p", "top_k", "do_sample", "n")),
    f"{REF}.fsdp_config.param_offload", f"{REF}.ulysses_sequence_parallel_size", f"{ACTOR}.fsdp_config.fsdp_size",
    ("reward_model.reward_manager", "reward.reward_manager.name"),
    *((f"reward_model.overlong_buffer.{k}", f"reward.reward_kwargs.overlong_buffer_cfg.{k}")
      for k in ("enable", "len", "penalty_factor")),
    "trainer.logger", "trainer.project_name", "trainer.experiment_name", "trainer.n_gpus_per_node", "trainer.nnodes",
    "trainer.val_before_train", "trainer.test_freq", "trainer.save_freq", "trainer.total_epochs",
    "trainer.default_local_dir", "trainer.resume_mode",
]
# 4f80e46 values that differ from the 0.9.1 row: one file as a plain string (the scripts pass one path, RLHFDataset
# takes either), the run directory resolved, and validation's own temperature (0.9.1 writes greedy as temperature 0;
# 4f80e46 reads do_sample, which the scripts pass too)
_ADAPT = {
    "data.train_files": lambda row, p: _files(row.value),
    "data.val_files": lambda row, p: _files(row.value),
    "trainer.default_local_dir": lambda row, p: _resolve_trainer(row.value, p.recipe.trainer),
    f"{ROLLOUT}.val_kwargs.temperature": lambda row, p: p.recipe.rollout.val.temperature,
}
_ADAPT_SOURCE = {f"{ROLLOUT}.val_kwargs.temperature": "recipe.rollout.val.temperature"}


def _put_rows(w: _Writer, rows: dict[str, Any], keys: list) -> None:
    """Pass each 4f80e46 key of ``keys`` with the value and preset key of its 0.9.1 row."""
    for entry in keys:
        key, verl_key = entry if isinstance(entry, tuple) else (entry, entry)
        row = rows[verl_key]
        value = _ADAPT[key](row, w.preset) if key in _ADAPT else row.value
        w.put(key, value, _ADAPT_SOURCE.get(key, row.source))


def _script_arguments(w: _Writer, rows: dict[str, Any]) -> None:
    """The reference scripts' arguments, in their order (filtering's own two only with filtering on)."""
    fg = w.preset.recipe.filter_groups
    _put_rows(w, rows, SCRIPT_ARGS_BEFORE_FILTERING)
    if fg.enable:
        _put_rows(w, rows, FILTERING_ARGS)
    else:
        why = "the reference trainer reads it only when algorithm.filter_groups.enable is true"
        w.not_passed("recipe.filter_groups.max_num_gen_batches", fg.max_num_gen_batches, why)
        w.not_passed("recipe.filter_groups.metric", fg.metric, why)
    _put_rows(w, rows, SCRIPT_ARGS_AFTER_FILTERING)


def _arguments_at_default(w: _Writer, preset: Preset, rows: dict[str, Any]) -> None:
    """Keys the scripts leave at the commit's default: written only when the preset differs."""
    par = preset.placement.parallel
    for key in REFERENCE_DEFAULTS:
        w.put_if_not_default(key, rows[key].value, rows[key].source)
    for key, row in rows.items():  # an empty mapping in dapo_trainer.yaml: '+' adds a key
        if key.startswith(f"{AR}.model.override_config."):
            w.put(key, row.value, row.source, append=True)
    w.out.handled.add("recipe.model.override_config")
    if par.use_dynamic_bsz:
        w.not_passed("placement.parallel.ppo_micro_batch_size_per_gpu", par.ppo_micro_batch_size_per_gpu,
                     "not read with dynamic batch sizes (placement.parallel.use_dynamic_bsz: true)")
    else:
        _put_rows(w, rows, [f"{ACTOR}.ppo_micro_batch_size_per_gpu", f"{REF}.log_prob_micro_batch_size_per_gpu",
                            f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu"])


def _our_settings(w: _Writer, preset: Preset) -> None:
    """Our stack's settings: not arguments of the reference command (with the reason), or refused."""
    r, p = preset.recipe, preset.placement
    a, t = r.actor, r.trainer
    put, fixed, not_passed = w.put, w.fixed, w.not_passed
    not_passed("recipe.actor.token_mean_scope", a.token_mean_scope,
               "chooses how OUR loop normalises the token-mean; the reference stack always uses its own "
               "per-micro-batch mean (docs/fidelity.md, deviations beyond config keys)")
    for key in ("entropy_min", "starving_gen_batches", "clip_ratio_max", "patience"):
        not_passed(f"recipe.trainer.health.{key}", getattr(t.health, key),
                   "a threshold of our loop's health warnings; the reference trainer has no health guards")
    for f in dataclasses.fields(t.watchdog):  # the reference trainer has no watchdog (dapo.train.watchdog)
        not_passed(f"recipe.trainer.watchdog.{f.name}", getattr(t.watchdog, f.name), "a budget of our loop's watchdog")
    if a.use_kl_loss:
        put("actor_rollout_ref.actor.kl_loss_type", a.kl_loss_type, "recipe.actor.kl_loss_type")
    else:
        not_passed("recipe.actor.kl_loss_type", a.kl_loss_type,
                   "read only with recipe.actor.use_kl_loss: true (the reference default is low_var_kl)")
    not_passed("recipe.reward.verl_agreement", r.reward.verl_agreement,
               "a cross-check of OUR loop's reward against verl's reward loop; the reference scores once, with verl")
    fixed("recipe.trainer.log_val_generations", t.log_val_generations == 0,
          f"is {t.log_val_generations}; pass trainer.log_val_generations=N in overrides (4f80e46 key names) instead")
    for key in ("rollout_data_dir", "validation_data_dir"):
        fixed(f"recipe.trainer.{key}", getattr(t, key) is None,
              f"is set; pass trainer.{key}=DIR in overrides (4f80e46 key names) if that commit's DAPO trainer "
              "honours it: our generation dumps are not the reference's")
    not_passed("placement.accelerator", p.accelerator, "used by `dapo plan` only")
    not_passed("placement.device", p.device, "the local backend's device; not used on verl worker groups")
    w.out.handled.add("placement.env")  # the job's runtime env (recipe/dapo/runtime_env.yaml), see runtime_env()


def runtime_env(preset: Preset) -> dict[str, str]:
    """The reference job's env vars from the preset: ``placement.env`` (= ``recipe/dapo/runtime_env.yaml``)."""
    return {k: str(v) for k, v in preset.placement.env.items()}


def _files(files: list[str]) -> Any:
    # the scripts pass one path as a plain string; 4f80e46's RLHFDataset accepts a string or a list
    return files[0] if len(files) == 1 else list(files)


def _resolve_trainer(path: str, trainer: Any) -> str:
    try:
        return resolve_trainer_refs(path, dataclasses.asdict(trainer))
    except ConfigError:
        raise ReferenceError(f"recipe.trainer.default_local_dir: cannot resolve {path!r} for the reference command"
                             ) from None


def _norm(v: Any) -> Any:
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    return v


__all__ = ["MODULE", "REFERENCE_COMMIT", "REFERENCE_DEFAULTS", "Arg", "ReferenceError", "Translation",
           "format_value", "leaf_keys", "runtime_env", "translate"]

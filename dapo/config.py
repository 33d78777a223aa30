"""Typed, strict configuration for DAPO runs: one preset = a *recipe* (what to train) + a *placement* (where).

A preset is a YAML file (``dapo/presets/NAME.yaml``) that may ``extends:`` another one (a file name without
extension, resolved in the same directory; underscore-prefixed files are shared bases, not runnable presets).
Everything else in the bundle -- verl overrides, Helm values, rendered manifests, the fidelity document -- is
derived from these objects.

Strictness: every mapping is checked against the dataclass it fills -- by pydantic in strict mode, the dataclasses
staying plain ``dataclasses`` -- and an unknown key is a :class:`ConfigError` that names the full dotted path and the
file it came from, with a close-match suggestion. Types are checked too (``int`` where an ``int`` is expected, no
silent string -> number conversion; ``--set`` overrides are parsed as YAML scalars, and YAML 1.2 floats such as
``1e-6`` are numbers). ``extends:``, the deep merge and the overrides stay here: a few dozen lines on plain
mappings (OmegaConf would also do them, but it cannot hold ``Literal`` fields and would resolve the ``${...}``
placeholders that are meant for verl).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Sequence, Union

import yaml

PRESET_DIR = Path(__file__).resolve().parent / "presets"

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_PENALTIES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")  # dapo.loss.kl_penalty (torch-free copy)


class ConfigError(ValueError):
    """A configuration problem; the message names the offending key and, where known, the file."""


# --------------------------------------------------------------------------------------------------------------------
# Recipe: what to train
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    # HF hub id or local directory of the policy; ``builtin:<name>`` builds a tiny model locally (no download).
    path: str = "Qwen/Qwen2.5-32B"
    # Tokenizer location when it differs from ``path``.
    tokenizer_path: Optional[str] = None
    # Keys merged into the HF model config before loading (e.g. ``max_position_embeddings: 32768``).
    override_config: dict[str, Any] = field(default_factory=dict)
    enable_gradient_checkpointing: bool = True
    use_remove_padding: bool = True
    trust_remote_code: bool = False


@dataclass
class DataConfig:
    # Parquet files in the DAPO-Math-17k schema (data_source, prompt [chat], ability, reward_model, extra_info).
    train_files: list[str] = field(default_factory=lambda: ["/data/dapo-math-17k.parquet"])
    val_files: list[str] = field(default_factory=lambda: ["/data/aime-2024.parquet"])
    prompt_key: str = "prompt"
    # Prompts per training step (after dynamic sampling).
    train_batch_size: int = 512
    # Prompts per generation round; null = train_batch_size.
    gen_batch_size: Optional[int] = None
    max_prompt_length: int = 2048
    max_response_length: int = 20480
    truncation: Literal["left", "right", "error"] = "left"
    shuffle: bool = True


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    # -1 = disabled (vLLM convention).
    top_k: int = -1
    # Samples per prompt.
    n: int = 1
    do_sample: bool = True


@dataclass
class RolloutConfig:
    # Samples per prompt (the group size G of the paper).
    n: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    # Sampling for validation (the DAPO recipe: T=1.0, top_p=0.7, one sample per row).
    val: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=1.0, top_p=0.7, top_k=-1, n=1))


@dataclass
class AlgorithmConfig:
    adv_estimator: Literal["grpo"] = "grpo"
    # Divide by the group std (GRPO); false gives Dr.GRPO-style centred rewards.
    norm_adv_by_std: bool = True
    # KL penalty in the token rewards (verl's apply_kl_penalty): not implemented by the DAPO loop -> must stay false/0
    # (use recipe.actor.use_kl_loss for a KL term).
    use_kl_in_reward: bool = False
    kl_coef: float = 0.0


@dataclass
class OptimConfig:
    lr: float = 1e-6
    # Linear warm-up steps, then constant (the recipe's schedule).
    lr_warmup_steps: int = 10
    weight_decay: float = 0.1
    # Max global grad norm.
    clip_grad: float = 1.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])


@dataclass
class ActorConfig:
    # Decoupled clip (Clip-Higher, paper eq. 10): ratio clipped to [1 - low, 1 + high].
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    # Dual-clip bound for negative advantages.
    clip_ratio_c: float = 10.0
    loss_agg_mode: str = "token-mean"
    # "minibatch": token-mean normalised over the whole mini-batch (correct token-level loss under gradient
    # accumulation / data parallel); "microbatch": the reference commit's per-micro-batch mean.
    token_mean_scope: Literal["minibatch", "microbatch"] = "minibatch"
    entropy_coeff: float = 0.0
    # KL loss against a frozen copy of the initial policy (verl's ppo_loss): + kl_loss_coef * agg(kl, mask).
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    # KL estimator (verl's kl_penalty): kl|k1, abs, mse|k2, low_var_kl|k3, each optionally with '+' (k2 gradient).
    kl_loss_type: str = "low_var_kl"
    # Prompts per optimizer mini-batch (x n responses).
    ppo_mini_batch_size: int = 32
    ppo_epochs: int = 1
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass
class OverlongBufferConfig:
    enable: bool = True
    # L_cache of the paper (eq. 13): the last ``len`` tokens before max_response_length are penalised linearly.
    len: int = 4096
    penalty_factor: float = 1.0


@dataclass
class RewardConfig:
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    # Overlong filtering: mask the loss of truncated responses (off in the DAPO recipes).
    overlong_filter: bool = False
    # Second opinion with math-verify, logged as its own metric; never changes the reward.
    math_verify: bool = False
    # verl backend: verl's reward loop also scores every rollout on the workers and reward/verl_agreement logs how
    # often it agrees with the loop's reward (a check that costs a second scoring pass; off: scored once).
    verl_agreement: bool = False


@dataclass
class FilterGroupsConfig:
    # Dynamic sampling (paper eq. 11): keep groups whose metric varies.
    enable: bool = False
    metric: Literal["acc", "score", "seq_reward", "seq_final_reward"] = "acc"
    # Generation rounds per step before giving up (<= 0: unlimited).
    max_num_gen_batches: int = 10
    # "reference": truncate surplus kept groups (paper); "carry": keep surplus for the next step and adapt the
    # over-sampling factor (off-paper).
    mode: Literal["reference", "carry"] = "reference"


HEALTH_GUARDS = ("entropy_collapse", "sampler_starving", "length_clip")


@dataclass
class HealthConfig:
    """DAPO health guards (:mod:`dapo.train.health`): warn -- or checkpoint and stop with exit code 3 -- when a run derails."""

    # entropy_collapse: actor/entropy below this for `patience` consecutive steps.
    entropy_min: float = 0.02
    # sampler_starving: train/num_gen_batches at its limit (filter_groups.max_num_gen_batches, or this value when
    # that is unlimited) for `patience` consecutive steps.
    starving_gen_batches: int = 10
    # length_clip: response_length/clip_ratio (responses at max_response_length) above this for `patience` steps.
    clip_ratio_max: float = 0.2
    # Consecutive steps a condition must hold before it fires.
    patience: int = 5
    # Guards that checkpoint and stop the run (exit code 3) instead of only warning.
    stop_on: list[Literal["entropy_collapse", "sampler_starving", "length_clip"]] = field(default_factory=list)


@dataclass
class TrainerConfig:
    total_epochs: int = 1
    # Rollout steps; null = derived from epochs and data size.
    total_training_steps: Optional[int] = None
    save_freq: int = 5
    test_freq: int = 5
    val_before_train: bool = True
    seed: int = 1
    project_name: str = "DAPO"
    experiment_name: str = "DAPO-Qwen2.5-32B"
    # Where checkpoints go (on the shared volume on a cluster).
    default_local_dir: str = "/shared/ckpts/${trainer.project_name}/${trainer.experiment_name}"
    resume_mode: Literal["auto", "disable"] = "auto"
    logger: list[str] = field(default_factory=lambda: ["console", "wandb"])
    # Keep at most this many checkpoints (null: all).
    max_ckpt_to_keep: Optional[int] = None
    # Generation dumps (verl's trainer.* keys, same JSONL format): every step's training rollouts to
    # <rollout_data_dir>/<step>.jsonl, every validation to <validation_data_dir>/<step>.jsonl (null: off), and
    # log_val_generations validation samples per validation (chosen like verl) to <run dir>/val_generations.jsonl.
    rollout_data_dir: Optional[str] = None
    validation_data_dir: Optional[str] = None
    log_val_generations: int = 0
    # Health guards (entropy collapse, sampler starvation, responses piling up at the length cap).
    health: HealthConfig = field(default_factory=HealthConfig)


@dataclass
class RecipeConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


# --------------------------------------------------------------------------------------------------------------------
# Placement: where it runs
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class ParallelConfig:
    # Ulysses sequence parallel size for the actor.
    ulysses_sp: int = 1
    # vLLM tensor parallel size for the rollout.
    rollout_tp: int = 1
    gpu_memory_utilization: float = 0.7
    enable_chunked_prefill: bool = True
    max_num_batched_tokens: int = 8192
    use_dynamic_bsz: bool = True
    # Token budget per GPU for actor forward/backward with dynamic batching.
    ppo_max_token_len_per_gpu: int = 22528
    # Token budget per GPU for log-prob recomputation (null: same as ppo_max_token_len_per_gpu).
    log_prob_max_token_len_per_gpu: Optional[int] = None
    # Sequences per GPU per micro-batch when dynamic batching is off.
    ppo_micro_batch_size_per_gpu: int = 1
    param_offload: bool = False
    optimizer_offload: bool = False
    # FSDP shard group size (-1: shard over all GPUs; N < world: HSDP, replicas of N-GPU shard groups).
    fsdp_size: int = -1


@dataclass
class PlacementConfig:
    # "verl": verl worker groups on Ray (cluster); "local": one process, HF transformers (CPU or one GPU).
    backend: Literal["verl", "local"] = "verl"
    nodes: int = 1
    gpus_per_node: int = 8
    # Accelerator the preset was sized for (used by `dapo plan`).
    accelerator: str = "h100"
    # Local backend device: "cpu", "cuda", "cuda:N" or "auto".
    device: str = "auto"
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    # Environment for every training process (runtime env on Ray).
    env: dict[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------------------------
# Local / tiny specifics
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class TinyModelSpec:
    """A Qwen2-architecture model built locally from scratch (``model.path: builtin:tiny``)."""

    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 256
    tie_word_embeddings: bool = True
    # Size of the byte-level BPE vocabulary trained locally on the task corpus (= the embedding rows).
    vocab_size: int = 400
    # Seed of the random initialisation (and of the warm start's batches).
    seed: int = 0


@dataclass
class TaskSpec:
    """Synthetic math task written in the DAPO-Math-17k schema."""

    kind: Literal["addition"] = "addition"
    digits: int = 2
    # 0: operands with up to ``digits`` digits each (the tiny task). >= 1: each problem first draws its length d
    # uniformly from [min_digits, digits], then two d-digit operands, so the worked responses (one line per digit)
    # vary widely in length (the tiny-long task).
    min_digits: int = 0
    n_train: int = 4000
    n_val: int = 256
    seed: int = 1234


@dataclass
class WarmStartSpec:
    """Supervised warm start before RL so the policy starts with partial accuracy."""

    enable: bool = True
    steps: int = 300
    batch_size: int = 128
    lr: float = 3e-3
    # Fraction of carrying problems whose SFT label carries a plausible systematic mistake ("forgot the carry").
    mistake_rate: float = 0.5


@dataclass
class LocalConfig:
    model: TinyModelSpec = field(default_factory=TinyModelSpec)
    task: TaskSpec = field(default_factory=TaskSpec)
    warm_start: WarmStartSpec = field(default_factory=WarmStartSpec)
    # Optimizer steps per rollout step are derived from ppo_mini_batch_size; this caps update micro-batches.
    micro_batch_size: int = 64


# --------------------------------------------------------------------------------------------------------------------
# Preset
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Preset:
    name: str = ""
    description: str = ""
    # AIME-2024 avg@32 the preset is expected to reach (documentation only).
    target_aime: Optional[float] = None
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    local: Optional[LocalConfig] = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def get(self, dotted: str) -> Any:
        """Value at a dotted path, e.g. ``recipe.actor.optim.lr``."""
        obj: Any = self
        for part in dotted.split("."):
            if dataclasses.is_dataclass(obj):
                if part not in {f.name for f in dataclasses.fields(obj)}:
                    raise ConfigError(f"unknown key '{dotted}'")
                obj = getattr(obj, part)
            elif isinstance(obj, dict):
                if part not in obj:
                    raise ConfigError(f"unknown key '{dotted}'")
                obj = obj[part]
            else:
                raise ConfigError(f"unknown key '{dotted}'")
        return obj


# --------------------------------------------------------------------------------------------------------------------
# Strict dataclass loading: pydantic validates (types, unknown keys); this module words the errors
# --------------------------------------------------------------------------------------------------------------------


class _YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 floats: ``1e-6`` is a number (YAML 1.1 reads exponents without a dot as
    strings; Helm's YAML reader and OmegaConf read them as numbers)."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 -- a SafeLoader subclass


def _set_strict(schema: Any, strict: bool) -> None:
    """Let dataclasses be filled from mappings while every scalar stays strict (pydantic's strict mode would also
    require dataclass *instances*)."""
    if isinstance(schema, dict):
        if schema.get("type") == "dataclass":
            schema["strict"] = strict
        for value in schema.values():
            _set_strict(value, strict)
    elif isinstance(schema, list):
        for value in schema:
            _set_strict(value, strict)


@functools.lru_cache(maxsize=None)
def _validator(cls: type) -> Any:
    """A strict pydantic validator for the dataclass ``cls``: no string -> number, number -> bool or number -> string
    conversion, ints accepted as floats. (The config sits on a ``list[cls]`` wrapper: pydantic takes a plain
    dataclass's config from the type that holds it.)"""
    import pydantic  # on first use: building the schema costs ~0.2 s once per process, importing it ~0.05 s
    import pydantic_core

    adapter = pydantic.TypeAdapter(list[cls], config=pydantic.ConfigDict(strict=True, extra="forbid"))
    schema = copy.deepcopy(adapter.core_schema)
    _set_strict(schema, False)
    return pydantic_core.SchemaValidator(schema)


def _type_at(cls: type, loc: tuple[Any, ...]) -> Any:
    """The annotation at ``loc`` (a pydantic error location) inside dataclass ``cls``; None where unknown."""
    tp: Any = cls
    for part in loc:
        while typing.get_origin(tp) in (Union, types.UnionType):  # Optional[X] -> X
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            tp = args[0] if len(args) == 1 else None
        if dataclasses.is_dataclass(tp) and isinstance(part, str):
            tp = typing.get_type_hints(tp).get(part)
        elif typing.get_origin(tp) is list and isinstance(part, int):
            tp = (typing.get_args(tp) or (Any,))[0]
        elif typing.get_origin(tp) is dict:
            tp = (typing.get_args(tp) or (Any, Any))[1]
        else:
            return None
    return tp


def _loc_path(loc: tuple[Any, ...], prefix: str) -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "bool_type": "true/false", "bool_parsing": "true/false",
    "float_type": "a number", "float_parsing": "a number",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping", "dataclass_type": "a mapping", "dataclass_args_type": "a mapping",
}


def _error_message(cls: type, err: Any, prefix: str, where: str) -> str:
    """One pydantic error, worded like the rest of the bundle: the dotted key, the file, and what was expected."""
    loc, kind, value = tuple(err["loc"][1:]), err["type"], err.get("input")
    path = _loc_path(loc, prefix)
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        parent = _type_at(cls, loc[:-1])
        names = sorted(f.name for f in dataclasses.fields(parent)) if dataclasses.is_dataclass(parent) else []
        close = difflib.get_close_matches(str(loc[-1]), names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else f" (known keys: {', '.join(names)})"
        return f"unknown key '{path}'{where}{hint}"
    if kind == "literal_error":
        allowed = list(typing.get_args(_type_at(cls, loc))) or err.get("ctx", {}).get("expected")
        return f"'{path}'{where}: {value!r} is not one of {allowed}"
    if kind in ("list_type", "dict_type", "dataclass_type", "dataclass_args_type"):
        return f"'{path}'{where}: expected {_EXPECTED[kind]}, got {type(value).__name__} {value!r}"
    if kind in _EXPECTED:
        return f"'{path}'{where}: expected {_EXPECTED[kind]}, got {value!r}"
    return f"'{path}'{where}: {err['msg']}, got {value!r}"


def _stringify_env(data: dict[str, Any], cls: type) -> dict[str, Any]:
    """``placement.env`` values are often written unquoted in YAML (``1``, ``true``): read scalars as strings."""
    placement = data.get("placement") if cls is Preset else data if cls is PlacementConfig else None
    env = placement.get("env") if isinstance(placement, dict) else None
    if not isinstance(env, dict):
        return data
    env = {k: (str(v).lower() if isinstance(v, bool) else str(v)) if isinstance(v, (int, float)) else v
           for k, v in env.items()}
    if cls is Preset:
        return {**data, "placement": {**placement, "env": env}}
    return {**data, "env": env}


def from_dict(cls: type, data: dict[str, Any], *, source: str | Callable[[tuple], str] = "", path: str = "") -> Any:
    """Build dataclass ``cls`` from a plain mapping, rejecting unknown keys and wrong types (validated by pydantic in
    strict mode). The :class:`ConfigError` names the dotted key path, the file (``source``, or ``source(loc)``: where
    the key at that location was written), and the closest known key; when several keys are wrong, one line each
    (unknown keys first)."""
    origin = source if callable(source) else (lambda loc: source)
    if not isinstance(data, dict):
        raise ConfigError(f"{origin(()) or 'config'}: expected a mapping at the top level, got {type(data).__name__}")
    import pydantic_core

    try:
        return _validator(cls).validate_python([_stringify_env(data, cls)])[0]
    except pydantic_core.ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda e: e["type"] not in ("unexpected_keyword_argument", "extra_forbidden"))
        lines = []
        for e in errors:
            where = origin(tuple(e["loc"][1:]))
            lines.append(_error_message(cls, e, path, f" in {where}" if where else ""))
        raise ConfigError("\n".join(lines)) from None


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Recursive merge: mappings merge, everything else (lists included) is replaced by ``over``."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=VALUE`` -> (["a","b","c"], yaml-parsed VALUE)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"override {text!r}: empty key")
    try:
        value = _yaml_load(raw) if raw.strip() != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({exc})") from exc
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides to a raw preset mapping (validated later by :func:`from_dict`)."""
    out = copy.deepcopy(data)
    for text in overrides:
        parts, value = parse_override(text)
        node = out
        for part in parts[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {text!r}: '{part}' is not a mapping")
            node = nxt
        node[parts[-1]] = value
    return out


def preset_path(name: str) -> Path:
    """Resolve a preset name (``full``) or a path to a YAML file."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    candidate = PRESET_DIR / f"{name}.yaml"
    if candidate.exists() and not name.startswith("_"):
        return candidate
    raise ConfigError(f"unknown preset {name!r}; available: {', '.join(list_presets())} (or a path to a YAML file)")


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml") if not p.stem.startswith("_"))


def _load_raw(path: Path, seen: tuple[Path, ...] = (), docs: Optional[list] = None) -> dict[str, Any]:
    """The merged mapping of ``path`` and what it ``extends``; ``docs`` (when given) receives ``(file, mapping)`` of
    each file, the preset first."""
    if path in seen:
        raise ConfigError(f"{path}: circular 'extends' chain {' -> '.join(str(s) for s in seen + (path,))}")
    try:
        data = _yaml_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    parent = data.pop("extends", None)
    if docs is not None:
        docs.append((path, copy.deepcopy(data)))
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: 'extends' must be a preset file name, got {parent!r}")
    parent_path = path.parent / f"{parent}.yaml"
    if not parent_path.exists():
        raise ConfigError(f"{path}: 'extends: {parent}' names no file {parent_path}")
    # the shared base must itself be a valid (strict) preset fragment
    return deep_merge(_load_raw(parent_path, seen + (path,), docs), data)


def load_raw_preset(name: str) -> dict[str, Any]:
    """The merged (``extends`` resolved) mapping of a preset, before validation."""
    path = preset_path(name)
    data = _load_raw(path)
    data.setdefault("name", path.stem)
    return data


def load_preset(name: str, overrides: list[str] | tuple[str, ...] = ()) -> Preset:
    """Load, merge, override and validate a preset. Raises :class:`ConfigError` naming the offending key."""
    path = preset_path(name)
    docs: list[tuple[Path, dict[str, Any]]] = []
    raw = _load_raw(path, docs=docs)
    raw.setdefault("name", path.stem)
    raw = apply_overrides(raw, overrides)
    preset = from_dict(Preset, raw, source=lambda loc: _origin(loc, path, docs, overrides))
    validate(preset)
    return preset


def _origin(loc: tuple, path: Path, docs: list[tuple[Path, dict[str, Any]]], overrides: Sequence[str]) -> str:
    """Where the key at ``loc`` was written: the last override that sets it (or a mapping above it), else the first
    file of the ``extends`` chain that holds it (the preset first), else the preset."""
    keys = []
    for part in loc:
        if not isinstance(part, str):
            break
        keys.append(part)
    for text in reversed(overrides):
        parts = text.split("=", 1)[0].strip().split(".")
        n = min(len(parts), len(keys))
        if parts[:n] == keys[:n]:
            return f"{path} + override {text!r}"
    for file, doc in docs:
        node: Any = doc
        for key in keys:
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            return str(file) if file == path else f"{file} (extended by {path.name})"
    return str(path)


def validate(preset: Preset) -> None:
    """Cross-field rules that must hold before anything is scheduled."""
    r, p = preset.recipe, preset.placement
    a = r.actor

    def bad(key: str, msg: str) -> None:
        raise ConfigError(f"preset {preset.name!r}: '{key}' {msg}")

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
    ob = r.reward.overlong_buffer
    if ob.enable and not 0 < ob.len < r.data.max_response_length:
        bad(
            "recipe.reward.overlong_buffer.len",
            f"must satisfy 0 < len < recipe.data.max_response_length ({r.data.max_response_length}), got {ob.len}",
        )
    if ob.penalty_factor < 0:
        bad("recipe.reward.overlong_buffer.penalty_factor", f"must be >= 0, got {ob.penalty_factor}")
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
    if p.backend == "local" and preset.recipe.model.path.startswith("builtin:") and preset.local is None:
        bad("local", "is required when recipe.model.path is builtin:*")
    h = r.trainer.health
    if h.patience < 1:
        bad("recipe.trainer.health.patience", f"must be >= 1, got {h.patience}")
    if not 0.0 <= h.clip_ratio_max <= 1.0:
        bad("recipe.trainer.health.clip_ratio_max", f"must be in [0, 1], got {h.clip_ratio_max}")
    if h.starving_gen_batches < 1:
        bad("recipe.trainer.health.starving_gen_batches", f"must be >= 1, got {h.starving_gen_batches}")
    if preset.local is not None:
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

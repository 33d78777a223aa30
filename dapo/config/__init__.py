"""Typed, strict configuration for DAPO runs: one preset = a *recipe* (what to train) + a *placement* (where).

Everything else in the bundle -- verl overrides, Helm values, rendered manifests, the fidelity document -- is
derived from these objects. Four modules, each importing only the ones before it (and ``dapo.util``'s Go formatting):

- :mod:`dapo.config.schema`: the dataclasses (:class:`Preset` and its parts) and :class:`ConfigError`.
- :mod:`dapo.config.rules`: the cross-field rules (:func:`validate`).
- :mod:`dapo.config.chain`: the preset chain every reader shares -- files with ``extends:``, read as Helm reads YAML,
  the deep merge, overrides, ``${trainer.<key>}`` references (:func:`run_dir`).
- :mod:`dapo.config.loader`: strict loading into the dataclasses (:func:`load_preset`).

This ``__init__`` is the package's one public face (``from dapo.config import load_preset, Preset``): the names
below are re-exported so that forty importers need not know which of the three files holds them.
"""

from dapo.config.chain import (
    PRESET_DIR,
    PRESET_ROOTS,
    apply_overrides,
    deep_merge,
    list_presets,
    merged_preset,
    parse_override,
    preset_path,
    resolve_trainer_refs,
    run_dir,
    split_overrides,
)
from dapo.config.loader import from_dict, load_preset, load_raw_preset
from dapo.config.rules import validate
from dapo.config.schema import (
    HEALTH_GUARDS,
    KL_PENALTIES,
    LOSS_AGG_MODES,
    ActorConfig,
    AlgorithmConfig,
    ConfigError,
    DataConfig,
    FilterGroupsConfig,
    HealthConfig,
    LocalConfig,
    ModelConfig,
    OptimConfig,
    OverlongBufferConfig,
    ParallelConfig,
    PlacementConfig,
    Preset,
    RecipeConfig,
    RewardConfig,
    RolloutConfig,
    SamplingConfig,
    TaskSpec,
    TinyModelSpec,
    TrainerConfig,
    WarmStartSpec,
    WatchdogConfig,
)

__all__ = [
    "PRESET_DIR", "PRESET_ROOTS", "apply_overrides", "deep_merge", "from_dict", "list_presets", "load_preset",
    "load_raw_preset", "merged_preset", "parse_override", "preset_path", "resolve_trainer_refs", "run_dir",
    "split_overrides", "validate",
    "HEALTH_GUARDS", "KL_PENALTIES", "LOSS_AGG_MODES", "ActorConfig", "AlgorithmConfig", "ConfigError", "DataConfig",
    "FilterGroupsConfig", "HealthConfig", "LocalConfig", "ModelConfig", "OptimConfig", "OverlongBufferConfig",
    "ParallelConfig", "PlacementConfig", "Preset", "RecipeConfig", "RewardConfig", "RolloutConfig", "SamplingConfig",
    "TaskSpec", "TinyModelSpec", "TrainerConfig", "WarmStartSpec", "WatchdogConfig",
]

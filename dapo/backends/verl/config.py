"""Preset -> verl 0.9.1 configuration: Hydra composition, the checks, verl's own validation, the Ray runtime env.

:func:`resolve` composes verl's own ``ppo_trainer`` config (``hydra.initialize_config_module("verl.trainer.config")``
+ ``compose``) with the preset's overrides (:func:`dapo.backends.verl.settings.hydra_overrides`), applies the user's
passthrough overrides (checked by :mod:`dapo.backends.verl.passthrough`), runs the placement checks
(:mod:`dapo.backends.verl.placement`) and then verl's ``verl.utils.config.validate_config`` -- all before any Ray
cluster or GPU is touched. :func:`to_yaml` prints the result; :func:`runtime_env` is the env for ``ray.init``.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any, Optional

from dapo.backends.verl.passthrough import check_passthrough
from dapo.backends.verl.placement import check_placement, model_info
from dapo.backends.verl.settings import hydra_overrides
from dapo.config import ConfigError, Preset

VERL_CONFIG_MODULE = "verl.trainer.config"
VERL_CONFIG_NAME = "ppo_trainer"


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

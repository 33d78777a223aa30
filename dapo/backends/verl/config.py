"""Preset -> verl 0.9.1 configuration, composed once: Hydra's public compose, the preset's typed values, the checks,
verl's own validation, the Ray runtime env.

:func:`resolve` composes verl's own ``ppo_trainer`` config with Hydra's public API
(``hydra.initialize_config_module("verl.trainer.config")`` + ``compose``), the user's passthrough overrides -- Hydra
command-line strings by nature, checked by :mod:`dapo.backends.verl.passthrough` -- going to ``compose``. The
preset's values (:func:`dapo.backends.verl.settings.settings`) are then merged as the typed values they are
(OmegaConf), never written as strings and parsed back. The placement checks (:mod:`dapo.backends.verl.placement`)
and verl's ``verl.utils.config.validate_config`` run last, on the config the workers get, before any Ray cluster or
GPU is touched. :func:`to_yaml` prints the result; :func:`runtime_env` is the env for ``ray.init``.
"""

from __future__ import annotations

import copy
import functools
import os
from dataclasses import dataclass
from typing import Any, Optional

from dapo.backends.verl.passthrough import check_passthrough, override_key
from dapo.backends.verl.placement import check_placement, model_info
from dapo.backends.verl.settings import Setting, settings
from dapo.config import ConfigError, Preset

VERL_CONFIG_MODULE = "verl.trainer.config"
VERL_CONFIG_NAME = "ppo_trainer"


@functools.lru_cache(maxsize=16)
def _composed(overrides: tuple[str, ...]) -> Any:
    """verl's ``ppo_trainer`` as Hydra's public ``compose`` builds it with ``overrides``, once per process for each
    set (a composition takes about a second; callers get a copy)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_module(VERL_CONFIG_MODULE, version_base=None):
        return hydra_compose(VERL_CONFIG_NAME, overrides=list(overrides))


def _config_error(exc: Exception) -> ConfigError:
    cause = f" ({' '.join(str(exc.__cause__).split())})" if exc.__cause__ else ""
    msg = " ".join(str(exc).split())
    return ConfigError(f"verl config: {msg}{cause}")


def compose(overrides: list[str] | tuple[str, ...] = ()) -> Any:
    """verl's ``ppo_trainer`` config with Hydra command-line ``overrides`` (Hydra errors become
    :class:`ConfigError`)."""
    try:
        return copy.deepcopy(_composed(tuple(overrides)))
    except Exception as exc:  # hydra raises ConfigCompositionException / OverrideParseException
        raise _config_error(exc) from exc


def _nested(rows: list[Setting]) -> dict[str, Any]:
    """``a.b.c = v`` rows as the nested mapping ``{a: {b: {c: v}}}``, in row order."""
    out: dict[str, Any] = {}
    for row in rows:
        *parents, leaf = row.key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = row.value
    return out


def apply_settings(cfg: Any, rows: list[Setting]) -> Any:
    """``cfg`` with the table's typed values merged in (OmegaConf): keys of verl's schema in struct mode, so a key
    verl does not have is an error, then the keys the table adds (``Setting.append``)."""
    from omegaconf import OmegaConf, open_dict

    try:
        cfg = OmegaConf.merge(cfg, _nested([r for r in rows if not r.append]))
        with open_dict(cfg):
            cfg = OmegaConf.merge(cfg, _nested([r for r in rows if r.append]))
    except Exception as exc:  # omegaconf's ConfigKeyError / ValidationError
        raise _config_error(exc) from exc
    return cfg


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
    settings: list[Setting]  # the preset's rows merged in (a passthrough override of a recipe constant wins)
    passthrough: list[str]  # the user's Hydra overrides, composed first
    notes: list[str]


def resolve(preset: Preset, passthrough: list[str] | tuple[str, ...] = (), resume_step: int = 0) -> Resolved:
    """verl's config for the preset: verl's own ``ppo_trainer`` composed with the user's passthrough overrides, the
    preset's settings merged in as typed values (a recipe constant a passthrough override sets is the user's), the
    vLLM seed moved on by ``resume_step`` (:func:`resume_seed`), then the placement checks and verl's validation."""
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
    users = [override_key(o) for o in passthrough]
    rows = [s for s in settings(preset) if not any(s.key == k or s.key.startswith(k + ".") for k in users)]
    cfg = apply_settings(compose(passthrough), rows)
    notes = []
    if resume_step > 0:
        seed = resume_seed(cfg, resume_step)
        notes.append(f"resumed at step {resume_step}: the vLLM engines are seeded {seed} (rollout.seed + the step)")
    notes += check_placement(preset, cfg, model_info(str(cfg.actor_rollout_ref.model.path)))
    import contextlib
    import io
    import warnings

    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        # validate_config prints a success line and warns that a GRPO run has no critic (intended)
        warnings.filterwarnings("ignore", message="Disabled critic")
        verl_validate(cfg)
    return Resolved(cfg=cfg, settings=rows, passthrough=list(passthrough), notes=notes)


def resume_seed(cfg: Any, step: int) -> int:
    """Seed the vLLM engines of a run resumed at ``step`` with ``rollout.seed + step`` (in ``cfg``; returns it).

    vLLM's sampling generator lives in the engines and is not checkpointable: a restarted engine starts its stream
    from ``rollout.seed`` again, so a resumed run would replay the random stream of step 1. A resume from step ``s``
    always draws the same stream (reproducible per resume point), though not the uninterrupted run's (docs/verl.md,
    Resume)."""
    from omegaconf import open_dict

    with open_dict(cfg):
        cfg.actor_rollout_ref.rollout.seed = int(cfg.actor_rollout_ref.rollout.seed) + int(step)
    return int(cfg.actor_rollout_ref.rollout.seed)


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

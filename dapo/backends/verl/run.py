"""``dapo train`` for ``placement.backend: verl``: resolve and validate verl's config, print it, train.

:func:`run` takes the run directory ``dapo train`` worked out, makes it absolute once (the workers write checkpoints
there), resolves and validates verl's config (:mod:`dapo.backends.verl.config`, the vLLM seed of a resumed run
included: :func:`resume_step`) before anything touches Ray, prints it under :func:`describe`'s header, and (unless
``--dry-run``) starts Ray, builds the worker groups (:class:`dapo.backends.verl.workers.RayWorkers`) and the backend
(:class:`dapo.backends.verl.backend.VerlBackend`) and runs the DAPO loop (:mod:`dapo.train.loop`) for the steps it
counted once (:func:`dapo.train.stream.rollout_steps`). The config is not changed after verl validated it. Its steps
are reusable (``dapo bench verl-fit`` builds on them): :func:`prepare` readies this process (:func:`on_this_machine`:
the preset with the run directory and, for ``builtin:tiny``, the tiny model and task; for ``placement.accelerator:
cpu`` the CPU platform of :mod:`dapo.backends.verl.cpu`), :func:`connect` joins or starts Ray with the run's runtime
env (:func:`ray_init_kwargs`).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Optional

from dapo.backends.verl.backend import VerlBackend
from dapo.backends.verl.settings import CPU_ACCELERATOR, CPU_ENV
from dapo.backends.verl.workers import RayWorkers
from dapo.config import ConfigError, Preset, run_dir
from dapo.data.files import read_rows

__all__ = ["describe", "run", "prepare", "connect", "on_this_machine", "run_dir_of", "resume_step"]


def describe(preset: Preset, resolved: Any) -> str:
    """The header printed above the resolved config: what verl runs and what our loop does on top."""
    r = preset.recipe
    fg = r.filter_groups
    lines = [
        f"# dapo train --preset {preset.name}: verl 0.9.1 configuration (resolved; validated by verl.utils.config."
        "validate_config)",
        f"# world: {preset.placement.nodes} nodes x {preset.placement.gpus_per_node} GPUs; the DAPO loop (dapo.train.loop) "
        "drives verl's worker groups",
        "# dynamic sampling (dapo.train.loop, not verl's trainer): "
        + (f"on, metric {fg.metric}, max_num_gen_batches {fg.max_num_gen_batches}, mode {fg.mode}, "
           f"gen_batch_size {r.data.gen_batch_size or r.data.train_batch_size}" if fg.enable else "off"),
        f"# policy loss: actor_rollout_ref.actor.policy_loss.loss_mode="
        f"{resolved.cfg.actor_rollout_ref.actor.policy_loss.loss_mode} (token_mean_scope {r.actor.token_mean_scope})",
    ]
    ro = resolved.cfg.actor_rollout_ref.rollout
    over = (ro.engine_kwargs.get("vllm") or {}).get("hf_overrides") or {}
    lines.append(f"# vLLM context: max_model_len {ro.max_model_len} (prompt + response)"
                 + (f", model positions raised by hf_overrides {dict(over)}" if over else ""))
    lines += [f"# note: {n}" for n in resolved.notes]
    return "\n".join(lines)


def run(preset: Preset, args: Any, verl_overrides: list[str], run_dir: str) -> int:
    """Resolve + validate verl's config (before Ray) for the run in ``run_dir``, print it; unless ``--dry-run``,
    train with the DAPO loop. The config printed is the one the workers get."""
    from dapo.backends.verl import config as verl_config

    if getattr(args, "run_dir", None):
        raise ConfigError("--run-dir is for the local backend; on verl set recipe.trainer.default_local_dir=...")
    environ = dict(os.environ)  # the job's own environment, before this process adds the run's
    where = os.path.abspath(run_dir)  # the driver and every worker (their working directories differ) write here
    placed = prepare(preset, where, build=False)  # where the tiny model and task will be; built after the fabric check
    resolved = verl_config.resolve(placed, verl_overrides, resume_step=resume_step(placed, where))
    print(describe(placed, resolved))
    print(verl_config.to_yaml(resolved.cfg), flush=True)
    if getattr(args, "dry_run", False):
        return 0

    from dapo.train.loop import DAPOLoop
    from dapo.train.stream import rollout_steps

    cfg = resolved.cfg
    ending = getattr(args, "attempt_end", None)
    attempt = ending.attempt if ending is not None else None
    wandb_extra: dict[str, Any] = {}
    if getattr(args, "fabric_check", None):  # first, before any model or data is touched
        from dapo.backends.verl.fabric import gate
        from dapo.train.fabric import EXIT_FABRIC, PLACEMENT_TIMEOUT_S

        passed, wandb_extra = gate(placed, args.fabric_check, getattr(args, "fabric_min_busbw", None),
                                   getattr(args, "fabric_recheck", None) or "", environ, where,
                                   lambda: connect(cfg, environ, attempt), log=lambda m: print(m, flush=True),
                                   placement_timeout=getattr(args, "fabric_placement_timeout", PLACEMENT_TIMEOUT_S))
        if not passed:
            print(f"dapo train: the fabric check did not pass; nothing trained (exit code {EXIT_FABRIC})", flush=True)
            return EXIT_FABRIC
    else:
        connect(cfg, environ, attempt)
    on_this_machine(preset, where, build=True)  # builds builtin:tiny's model and task where `placed` points
    train_rows = read_rows(list(placed.recipe.data.train_files), "recipe.data.train_files")
    val_rows = read_rows(list(placed.recipe.data.val_files), "recipe.data.val_files")
    total_steps = rollout_steps(placed.recipe, len(train_rows))  # verl's LR schedule and the loop's bound
    workers = RayWorkers(cfg, total_steps, verl_agreement=placed.recipe.reward.verl_agreement)
    backend = VerlBackend(cfg, placed, workers, workers.tokenizer, eos_token_ids=workers.eos_token_ids)
    if attempt is not None:
        from dapo.backends.verl.ranks import RankWatch

        backend.ranks = RankWatch(where, attempt, backend.n_gpus, placed.recipe.trainer.watchdog,
                                  log=lambda m: print(m, flush=True))
    loop = DAPOLoop(placed, backend, train_rows, val_rows, where, progress=not getattr(args, "no_progress", False),
                    ending=ending, watchdog=getattr(args, "watchdog", None), total_steps=total_steps)
    loop.wandb_extra = wandb_extra
    try:
        return int(loop.fit() or 0)
    finally:
        backend.close()


def prepare(preset: Preset, run_dir: str, build: bool = True) -> Preset:
    """This process, before it resolves verl's config: the preset :func:`on_this_machine` for the run in ``run_dir``,
    and for ``placement.accelerator: cpu`` the CPU platform's environment set and the platform active (verl picks its
    platform per process from ``VERL_PLATFORM``; the workers get the same variables from the runtime env)."""
    preset = on_this_machine(preset, run_dir, build=build)
    if preset.placement.accelerator == CPU_ACCELERATOR:
        from dapo.backends.verl.cpu import plugin

        os.environ.update(CPU_ENV)
        plugin.activate()
    return preset


def connect(cfg: Any, environ: dict[str, str], attempt: Optional[int] = None) -> None:
    """Join (or start) the Ray cluster with the run's runtime env -- computed against ``environ``, the job's own
    environment from before this process changed it -- and register the DAPO loss in the driver too. With
    ``attempt``, the workers also get the attempt's hooks (:func:`dapo.backends.verl.worker_hooks.env_for`: the
    process-group timeout from ``actor_rollout_ref.nccl_timeout``, stacks on request, the flight recorder)."""
    import ray

    from dapo.backends.verl import config as verl_config
    from dapo.backends.verl.worker_hooks import env_for

    env = verl_config.runtime_env(cfg, environ)
    if attempt is not None:
        timeout = cfg.actor_rollout_ref.get("nccl_timeout")
        hooks = env_for(str(cfg.trainer.default_local_dir), attempt, timeout, os.getpid())
        env["env_vars"] = {**env.get("env_vars", {}), **{k: v for k, v in hooks.items() if k not in environ}}
    os.environ.update({k: str(v) for k, v in env.get("env_vars", {}).items()})
    if not ray.is_initialized():
        ray.init(runtime_env=env, **ray_init_kwargs(cfg, environ))
    import dapo.backends.verl.loss  # noqa: F401  (the driver resolves loss names too)


def run_dir_of(preset: Preset) -> str:
    """Where a verl run of ``preset`` runs: ``recipe.trainer.default_local_dir`` with its ``${trainer.*}`` references
    resolved (:func:`dapo.config.run_dir`), made absolute (the driver and every worker write checkpoints there)."""
    return os.path.abspath(run_dir(preset))


def on_this_machine(preset: Preset, run_dir: str, build: bool) -> Preset:
    """The preset for the run in ``run_dir``: ``recipe.trainer.default_local_dir`` set to it and, for
    ``recipe.model.path: builtin:tiny``, the locally built tiny model and task in ``<run dir>/assets``
    (:mod:`dapo.tiny.assets`, as the local backend builds them; built unless ``build`` is false -- ``--dry-run``
    shows where they would be)."""
    out = copy.deepcopy(preset)
    r = out.recipe
    r.trainer.default_local_dir = run_dir
    path = r.model.path
    if path.startswith("builtin:"):
        from dapo.tiny.assets import layout, prepare

        if path != "builtin:tiny":
            raise ConfigError(f"recipe.model.path: unknown built-in model {path!r} (known: builtin:tiny)")
        cache = Path(run_dir) / "assets"
        assets = prepare(preset.local, cache) if build else layout(preset.local, cache)
        r.model.path = r.model.tokenizer_path = str(assets.policy_dir)
        r.data.train_files = list(r.data.train_files) or [str(assets.train_file)]
        r.data.val_files = list(r.data.val_files) or [str(assets.val_file)]
    return out


def ray_init_kwargs(cfg: Any, environ: dict[str, str]) -> dict[str, Any]:
    """``ray_kwargs.ray_init`` for ``ray.init`` (runtime env apart). Connecting to a running cluster (a RayJob's
    driver: ``RAY_ADDRESS`` is set), Ray refuses ``num_cpus`` / ``num_gpus``: the nodes declared theirs when they
    started, so both are left out there."""
    kwargs = {k: v for k, v in dict(cfg.ray_kwargs.ray_init).items() if k != "runtime_env" and v is not None}
    if environ.get("RAY_ADDRESS") or kwargs.get("address"):
        kwargs.pop("num_cpus", None)
        kwargs.pop("num_gpus", None)
    return kwargs


def resume_step(preset: Preset, run_dir: str) -> int:
    """The step the loop will resume from (``resume_mode: auto`` and a complete checkpoint), else 0."""
    if preset.recipe.trainer.resume_mode != "auto":
        return 0
    from dapo.train import checkpoint as ckpt

    latest = ckpt.latest(ckpt.checkpoint_root(run_dir))
    return int(ckpt.load_loop_state(latest)["step"]) if latest is not None else 0

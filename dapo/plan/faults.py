"""What faults cost a run (``dapo plan``'s "Faults" lines): the time one fault takes from training, and the share of
the run's wall time that trains, at a stated fault rate.

Time lost per fault = detection + restart + the steps since the last checkpoint (half the checkpoint interval on
average), for the two kinds of fault:

- a **hang** (a wedged vLLM engine, a collective that never returns): detected by the watchdog
  (:mod:`dapo.train.watchdog`) when the stuck phase passes its budget, at worst the budget of the step's longest
  phase, a generation batch: ``max(floor_s, multiple x generation / batches per step)``;
- a **crash** (a GPU or node that fails, a process killed): the job fails when Ray or NCCL notice -- at worst the
  process-group timeout (verl's ``actor_rollout_ref.nccl_timeout``, 600 s by default) for a peer stuck in a
  collective with the dead rank.

``restart_s`` (the next attempt's cluster, images on the nodes, model and checkpoint load, engine start) and the fault
rate are :class:`dapo.plan.assumptions.Assumptions`; neither can be measured without the cluster. The default rate is
the Llama 3 405B pre-training's: 419 unexpected interruptions in 54 days on 16,384 H100 GPUs (Llama 3 team, "The
Llama 3 Herd of Models", arXiv 2407.21783, 2024, Table 5), per GPU and day. Effective training time is
``1 - faults per day x time lost per fault / 1 day``, the measure that paper reports (above 90 % for its run).
"""

from __future__ import annotations

from typing import Any

# verl 0.9.1's default actor_rollout_ref.nccl_timeout (its ppo_trainer.yaml), which the run's process groups get
DEFAULT_PG_TIMEOUT_S = 600.0
DAY_S = 86400.0


def fault_costs(preset: Any, time_s: dict[str, float], world: int, restart_s: float,
                faults_per_gpu_day: float, gen_rounds_per_step: float = 1.0) -> dict[str, float]:
    """Seconds lost per hang and per crash, faults per day on ``world`` GPUs, and the effective training time share
    (module docstring; the share counts hangs and crashes in the proportion of none: the worse, hangs)."""
    w, t = preset.recipe.trainer.watchdog, preset.recipe.trainer
    since_ckpt = (max(t.save_freq, 1) / 2.0) * time_s["wall_per_step"]
    gen_batch = time_s["generation"] / max(gen_rounds_per_step, 1.0)  # the watchdog times each generation batch
    detect_hang = max(w.floor_s, w.multiple * gen_batch) if w.enable else None
    lost_hang = None if detect_hang is None else detect_hang + restart_s + since_ckpt
    lost_crash = DEFAULT_PG_TIMEOUT_S + restart_s + since_ckpt
    per_day = faults_per_gpu_day * world
    worst = lost_hang if lost_hang is not None else lost_crash
    return {"detect_hang_s": detect_hang, "detect_crash_s": DEFAULT_PG_TIMEOUT_S, "restart_s": restart_s,
            "since_checkpoint_s": since_ckpt, "lost_per_hang_s": lost_hang, "lost_per_crash_s": lost_crash,
            "faults_per_day": per_day, "effective_share": max(0.0, 1.0 - per_day * worst / DAY_S)}

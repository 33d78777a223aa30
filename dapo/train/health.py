"""DAPO health guards: notice when a run derails in one of the ways the paper's curves warn about.

Each guard watches one metric of every step and fires when its condition holds for ``patience`` consecutive steps
(``recipe.trainer.health``):

- ``entropy_collapse``: ``actor/entropy < entropy_min`` -- the policy is collapsing to deterministic outputs, so
  exploration (and the group variance dynamic sampling needs) dies (the paper's Fig. 2b; Clip-Higher is its fix).
- ``sampler_starving``: ``train/num_gen_batches >= limit`` (``filter_groups.max_num_gen_batches``, or
  ``starving_gen_batches`` when that is unlimited) -- almost every prompt group is all-correct or all-wrong, so
  each step burns generation to fill the batch, and the next step may fail outright.
- ``length_clip``: ``response_length/clip_ratio > clip_ratio_max`` -- responses pile up at the length cap
  (truncated answers score -1 and the overlong penalty dominates the reward).

A guard warns once when it fires and re-arms after its condition clears. Guards listed in ``stop_on`` make the loop
checkpoint and exit with :data:`EXIT_HEALTH_STOP` (3) and a message saying what to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from dapo.train.attempts import EXIT_HEALTH_STOP, EXIT_SAMPLER_EXHAUSTED  # noqa: E402,F401  (one table of exit codes)

from dapo.config import HEALTH_GUARDS as GUARDS  # noqa: E402


@dataclass
class HealthEvent:
    guard: str
    step: int
    value: float
    stop: bool
    message: str


class HealthGuard:
    """Feed it every step's metrics with :meth:`observe`; it returns the guards that fired at that step."""

    def __init__(self, cfg, max_num_gen_batches: int = 0, filter_enabled: bool = True, max_response_length: int = 0):
        unknown = set(cfg.stop_on) - set(GUARDS)
        if unknown:
            raise ValueError(f"recipe.trainer.health.stop_on: unknown guards {sorted(unknown)} (known: {list(GUARDS)})")
        if cfg.patience < 1:
            raise ValueError(f"recipe.trainer.health.patience must be >= 1, got {cfg.patience}")
        self.cfg = cfg
        self.filter_enabled = filter_enabled
        self.gen_batch_limit = max_num_gen_batches if max_num_gen_batches > 0 else cfg.starving_gen_batches
        self.max_response_length = max_response_length
        self.streak = {g: 0 for g in GUARDS}
        self.fired = {g: False for g in GUARDS}

    def _condition(self, guard: str, m: dict[str, Any]) -> Optional[tuple[bool, float]]:
        c = self.cfg
        if guard == "entropy_collapse":
            v = m.get("actor/entropy")
            return None if v is None else (v < c.entropy_min, v)
        if guard == "sampler_starving":
            v = m.get("train/num_gen_batches")
            if v is None or not self.filter_enabled:
                return None
            return v >= self.gen_batch_limit, v
        v = m.get("response_length/clip_ratio")
        return None if v is None else (v > c.clip_ratio_max, v)

    def _message(self, guard: str, step: int, value: float) -> str:
        c, n = self.cfg, self.cfg.patience
        if guard == "entropy_collapse":
            return (
                f"entropy collapse: actor/entropy = {value:.4f} < {c.entropy_min} for {n} steps (step {step}). The "
                "policy is turning deterministic and exploration is dying. Change: raise "
                "recipe.actor.clip_ratio_high (Clip-Higher; DAPO uses 0.28), lower recipe.actor.optim.lr, or "
                "raise recipe.rollout.temperature; if the task is solved, this is expected -- stop or lower "
                "recipe.trainer.health.entropy_min."
            )
        if guard == "sampler_starving":
            return (
                f"sampler starving: dynamic sampling needed {value:.0f} generation batches (limit "
                f"{self.gen_batch_limit}) for {n} steps (step {step}); almost every prompt group is all-correct or "
                "all-wrong. Change: raise recipe.data.gen_batch_size (more prompts per generation batch) or "
                "recipe.filter_groups.max_num_gen_batches, or move to harder (all-correct) / easier (all-wrong) "
                "training data."
            )
        return (
            f"length clip: {value:.0%} of responses hit max_response_length={self.max_response_length} for {n} steps "
            f"(step {step}; threshold {c.clip_ratio_max:.0%}). Truncated answers score -1 and the overlong penalty "
            "dominates the reward. Change: raise recipe.data.max_response_length (with "
            "recipe.reward.overlong_buffer.len), or look for repetition loops in the responses (lower the "
            "learning rate)."
        )

    def observe(self, step: int, metrics: dict[str, Any]) -> list[HealthEvent]:
        events = []
        for g in GUARDS:
            cond = self._condition(g, metrics)
            if cond is None:
                continue
            bad, value = cond
            if not bad:
                self.streak[g] = 0
                self.fired[g] = False
                continue
            self.streak[g] += 1
            if self.streak[g] >= self.cfg.patience and not self.fired[g]:
                self.fired[g] = True
                events.append(HealthEvent(g, step, float(value), g in self.cfg.stop_on, self._message(g, step, value)))
        return events

    def state_dict(self) -> dict[str, Any]:
        return {"streak": dict(self.streak), "fired": dict(self.fired)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak.update({k: int(v) for k, v in state.get("streak", {}).items() if k in self.streak})
        self.fired.update({k: bool(v) for k, v in state.get("fired", {}).items() if k in self.fired})

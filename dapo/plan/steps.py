"""Step semantics of a run: generation rounds, rollout steps, gradient steps and epochs of a preset
(:func:`step_semantics`), the carry sampler's prompts per step (:func:`carry_prompts_per_step`), the paper's run
length and the row counts of the files ``dapo data prepare`` writes.

Step semantics (the #1 source of confusion when reproducing DAPO)
-----------------------------------------------------------------
* a **generation round** samples ``gen_batch_size`` prompts x ``n`` responses;
* a **rollout step** trains on ``train_batch_size`` prompt groups. With dynamic sampling (``filter_groups``) it takes
  ``ceil(train_batch_size / (gen_batch_size * keep_rate))`` rounds, ``keep_rate`` = fraction of groups whose
  responses are not all right or all wrong; without it, one round. With the carry sampler
  (``filter_groups.mode: carry``) surplus kept groups are trained on in the next step and the generation batch follows
  the observed keep rate, so in steady state ``train_batch_size / keep_rate`` prompts are generated per step
  (:func:`carry_prompts_per_step`; checked against a simulation of :class:`dapo.sampler.DynamicSampler` in
  tests/test_plan.py, measured with ``dapo bench sampler``);
* a **gradient step** is one optimizer update on ``ppo_mini_batch_size`` prompt groups:
  ``gradient steps = rollout steps * train_batch_size / ppo_mini_batch_size * ppo_epochs`` (16 for the DAPO recipe).
  The paper's training-step axis counts gradient steps (verl issues #795, #1643).
* an **epoch** is one pass of the dataloader (batches of ``gen_batch_size`` prompts, last partial batch dropped).
  The hub DAPO-Math-17k file is ~17.9k problems repeated ~100x (1,791,700 rows), so one epoch of ``full`` is 1,166
  generation rounds -- months of compute -- while the paper stopped after ~320 rollout steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from dapo.config import Preset
from dapo.plan.assumptions import Assumptions

# The DAPO paper's 32B run: ~320 rollout steps (= ~5,100 gradient steps at 16 per rollout step); a DAPO author in
# https://github.com/verl-project/verl/issues/795 ("the 6k steps in the paper correspond to gradient steps ... the
# total number of rollout steps is around 320").
PAPER_ROLLOUT_STEPS = 320

# Row counts of the files `dapo data prepare` writes (hub DAPO-Math-17k: 17,917 problems x 100 copies).
KNOWN_DATASET_ROWS = {
    "dapo-math-17k.parquet": 1_791_700,
    "dapo-math-17k-dedup.parquet": 17_917,
    "aime-2024.parquet": 960,
}


@dataclass
class StepSemantics:
    dataset_rows: Optional[int]
    train_batch_size: int
    gen_batch_size: int
    n: int
    ppo_mini_batch_size: int
    ppo_epochs: int
    dynamic_sampling: bool
    keep_rate: float
    gen_rounds_per_step: int
    prompts_trained_per_step: int
    gradient_steps_per_rollout_step: int
    gen_rounds_per_epoch: Optional[int]
    rollout_steps_per_epoch: Optional[int]
    gradient_steps_per_epoch: Optional[int]
    epochs_for_paper: Optional[float]

    @property
    def overgeneration(self) -> float:
        """Generated prompts per trained prompt (1.0 without dynamic sampling)."""
        return self.gen_rounds_per_step * self.gen_batch_size / self.prompts_trained_per_step


def step_semantics(preset: Preset, dataset_rows: Optional[int], keep_rate: float = Assumptions.keep_rate
                   ) -> StepSemantics:
    """Rollout steps, generation rounds and gradient steps per epoch for ``preset`` over ``dataset_rows`` prompts."""
    d, a, fg = preset.recipe.data, preset.recipe.actor, preset.recipe.filter_groups
    gen_bs = d.gen_batch_size or d.train_batch_size
    if fg.enable:
        rounds = max(1, math.ceil(d.train_batch_size / (gen_bs * keep_rate)))
        trained = d.train_batch_size
    else:
        # without filtering every generated prompt is trained on (the reference trainer's behaviour)
        rounds, trained = 1, gen_bs
    grad_per_step = trained // a.ppo_mini_batch_size * a.ppo_epochs
    if dataset_rows is None:
        per_epoch = steps = grads = epochs = None
    else:
        per_epoch = dataset_rows // gen_bs
        steps = per_epoch // rounds
        grads = steps * grad_per_step
        epochs = PAPER_ROLLOUT_STEPS / steps if steps else None
    return StepSemantics(dataset_rows, d.train_batch_size, gen_bs, preset.recipe.rollout.n, a.ppo_mini_batch_size,
                         a.ppo_epochs, fg.enable, keep_rate, rounds, trained, grad_per_step, per_epoch, steps,
                         grads, epochs)


def carry_prompts_per_step(train_batch_size: int, keep_rate: float) -> float:
    """Prompts generated per rollout step by the carry sampler in steady state: ``train_batch_size / keep_rate``.

    Every kept group is trained on (surplus groups in the next step), so the expected number of generation batches
    per step is ``train_batch_size / (keep_rate * g)`` for an adapted batch of ``g`` prompts, against
    ``ceil(train_batch_size / (keep_rate * gen_batch_size))`` whole batches of the reference sampler, whose surplus is
    discarded.
    """
    return train_batch_size / keep_rate

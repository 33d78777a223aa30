"""The one DAPO training loop (paper arXiv 2503.14476, Algorithm 1), framework-free.

It drives any :class:`dapo.backends.base.Backend`: :mod:`dapo.backends.local.backend` (one process, CPU or one GPU)
and :mod:`dapo.backends.verl.backend` (verl worker groups on Ray) run this same code. One rollout step
(:meth:`DAPOLoop.train_step`, one named call per line)::

    repeat                                                     # dynamic sampling (eq. 11), DynamicSampler
        prompts <- next gen_batch_size rows of the training data   (DAPO-Math-17k schema; epochs, shuffled by seed)
        o_1..o_G ~ pi_old(. | q) for every prompt q               generate: backend.generate  (G = rollout.n)
        R_i = verifier(o_i, a) + R_length(|o_i|)                  score: dapo.reward.score_responses (eq. 1 + 13)
        keep groups with 0 < #correct < G                         filter_groups (filter_groups.metric; off: all)
    until train_batch_size groups kept (surplus cut), or fail    kept_batch (after max_num_gen_batches: fail)
    A_i = (R_i - mean_group R) / (std_group R + eps)              advantages: dapo.advantage.group_advantages (eq. 9)
    log pi_old recomputed for the batch                           backend.compute_old_log_probs
    ppo_epochs x mini-batches of the DAPO loss (eq. 10, 12)       backend.update (dapo.loss.policy_loss)

then its metrics (:mod:`dapo.train.step_metrics`, plus the backend's ``fit_metrics``; names in
:mod:`dapo.train.metric_names`), validation every ``test_freq`` steps (avg@k over the validation split with
``rollout.val`` sampling; also before training with ``val_before_train``), a checkpoint every ``save_freq`` steps
(:mod:`dapo.train.checkpoint`, atomic), the health guards (:mod:`dapo.train.health`), and at the end a summary
(validation accuracy before -> after RL) and the health plot (:mod:`dapo.train.report`).
``total_training_steps`` (or epochs x generation batches per epoch) bounds the run; ``resume_mode: auto`` continues
from the newest complete checkpoint with the same data order, sampler state and RNG states, so an interrupted run
ends exactly where an uninterrupted one would (on CPU; see docs/tiny.md). Here: the step and the run; the prompt
order is :mod:`dapo.train.stream`'s, validation and the summary :mod:`dapo.train.validation`'s, the checkpointed
state and resume :mod:`dapo.train.resume`'s.

Overlong *filtering* (``reward.overlong_filter``) drops truncated responses from the loss (``loss_mask``); the soft
overlong *punishment* is part of the reward. The learning-rate schedule (warm-up then constant) is the backend's
(verl's ``constant`` schedule with ``lr_warmup_steps``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

from dapo.train import attempts, runlog
from dapo.train import checkpoint as ckpt
from dapo.advantage import group_advantages
from dapo.backends.base import Backend, Rollout, Sampling
from dapo.train.ending import NONFINITE_REWARDS, AttemptEnd
from dapo.train.fit import Fit
from dapo.train.generations import dump_generations, prompt_text
from dapo.train.health import EXIT_HEALTH_STOP, EXIT_SAMPLER_EXHAUSTED, HealthGuard
from dapo.train.step_metrics import batch_metrics, generation_metrics, timing_metrics
from dapo.train.resume import Resumable
from dapo.train.stream import PromptStream, rollout_steps
from dapo.train.validation import Validation, cpu_seconds
from dapo.train.watchdog import Watchdog
from dapo.reward import score_responses
from dapo.sampler import DynamicSampler, DynamicSamplingError

__all__ = ["DAPOLoop", "EXIT_HEALTH_STOP", "EXIT_SAMPLER_EXHAUSTED"]


@contextmanager
def _timed(timing: dict[str, float], phase: str, watchdog: Optional[Watchdog] = None) -> Iterator[None]:
    """Adds the seconds of the ``with`` block to ``timing[phase]``; the block runs under the watchdog's budget of
    ``phase`` when there is one."""
    t0 = time.perf_counter()
    with watchdog.phase(phase) if watchdog is not None else nullcontext():
        yield
    timing[phase] += time.perf_counter() - t0


class DAPOLoop(Fit, Validation, Resumable):
    """The DAPO loop over a backend (module docstring). ``fit()`` runs it and returns the process exit code."""

    def __init__(
        self,
        preset,
        backend: Backend,
        train_rows: list[dict[str, Any]],
        val_rows: list[dict[str, Any]],
        run_dir: str | Path,
        *,
        progress: bool = True,
        log: Optional[Callable[[str], None]] = None,
        ending: Optional[AttemptEnd] = None,
        watchdog: Optional[Watchdog] = None,
        total_steps: Optional[int] = None,
    ):
        self.preset = preset
        r = self.recipe = preset.recipe
        self.backend = backend
        self.train_rows, self.val_rows = train_rows, val_rows
        self.run_dir = Path(run_dir)
        self.ckpt_root = ckpt.checkpoint_root(self.run_dir)
        self.progress = progress
        self._log = log
        d, fg, t = r.data, r.filter_groups, r.trainer
        self.gen_batch_size = d.gen_batch_size or d.train_batch_size
        # the caller's count when it has one (the verl backend sizes its LR schedule by it): stream.rollout_steps
        self.total_steps = rollout_steps(r, len(train_rows)) if total_steps is None else int(total_steps)
        if self.gen_batch_size > len(train_rows):
            raise ValueError(
                f"recipe.data.gen_batch_size ({self.gen_batch_size}) exceeds the {len(train_rows)} training prompts"
            )
        self.sampler = DynamicSampler(
            train_batch_size=d.train_batch_size,
            n=r.rollout.n,
            enable=fg.enable,
            metric=fg.metric,
            max_num_gen_batches=fg.max_num_gen_batches,
            mode=fg.mode,
            gen_batch_size=self.gen_batch_size,
        )
        ro = r.rollout
        self.train_sampling = Sampling(
            n=ro.n, temperature=ro.temperature, top_p=ro.top_p, top_k=ro.top_k, do_sample=True,
            max_tokens=d.max_response_length,
        )
        v = ro.val
        self.val_sampling = Sampling(
            n=v.n, temperature=v.temperature, top_p=v.top_p, top_k=v.top_k, do_sample=v.do_sample,
            max_tokens=d.max_response_length, validation=True,
        )
        self.health = HealthGuard(
            t.health,
            max_num_gen_batches=fg.max_num_gen_batches,
            filter_enabled=fg.enable,
            max_response_length=d.max_response_length,
        )
        self.stream = PromptStream(len(train_rows), seed=t.seed, shuffle=d.shuffle)
        self.step = 0
        self.next_gid = 0
        self.gen_samples_total = 0
        self.val_history: list[tuple[int, dict[str, float]]] = []
        self._pending_metrics: Optional[dict[str, float]] = None  # a step's record not yet logged when it was saved
        self.wandb_extra: dict[str, Any] = {}  # run facts for the wandb config besides the preset (the fabric check)
        self._bar = None
        # how this attempt ends on purpose, and the watchdog of its phases (dapo train makes both; a loop built
        # directly -- benchmarks, tests -- gets its ends recorded and no watchdog)
        log_obj = runlog.active()
        self.ending = ending or AttemptEnd(self.run_dir, log_obj.number if log_obj else None,
                                           attempts.preset_key(preset.to_dict()), log=self.log)
        self.ending.attach(backend, lambda: self.step, self.log)
        self.watchdog = watchdog
        self._t0 = time.time()
        self._cpu0 = cpu_seconds()

    # ---------------------------------------------------------------------------------------------------------------
    def log(self, msg: str) -> None:
        if self._log is not None:
            self._log(msg)
        elif self._bar is not None:
            # on the bar's console only (tqdm.write defaults to stdout, which the attempt log already copies)
            self._bar.write(msg, file=self._bar.fp)
            runlog.note(msg)  # ... so the attempt log gets it here, once
        else:
            print(msg, flush=True)

    def score(self, rollout: Rollout) -> dict[str, np.ndarray]:
        """Verifier + soft overlong punishment for every response (DAPO eq. 1 + eq. 13)."""
        ob = self.recipe.reward.overlong_buffer
        scored = score_responses(
            rollout.response_text,
            [row["reward_model"]["ground_truth"] for row in rollout.prompt_rows],
            rollout.response_length,
            max_response_length=self.recipe.data.max_response_length,
            overlong_buffer_len=ob.len,
            overlong_penalty_factor=ob.penalty_factor,
            overlong_enable=ob.enable,
            math_verify=self.recipe.reward.math_verify,
        )
        # the one scoring pass: the scores travel with the responses (select/concat keep them), so a backend places
        # these numbers (verl's token_level_scores) instead of scoring again
        for k in ("reward", "score", "acc"):
            rollout.stats[k] = np.asarray(scored[k])
        return scored

    def _dump(self, directory: Optional[str], rollout: Rollout, scored: dict[str, np.ndarray], step: int) -> None:
        """verl's generation dump (``trainer.rollout_data_dir`` / ``validation_data_dir``): ``<dir>/<step>.jsonl``."""
        if not directory:
            return
        # verl's extra columns: its DAPO reward manager's reward_extra_info (score, acc, pred)
        extra = {k: scored[k] for k in ("score", "acc", "pred", "overlong_reward") if k in scored}
        dump_generations(
            directory, step, [prompt_text(r, self.recipe.data.prompt_key) for r in rollout.prompt_rows],
            rollout.response_text, [r["reward_model"]["ground_truth"] for r in rollout.prompt_rows],
            scored["reward"], extra,
        )

    def _take(self, batch: tuple[Rollout, dict[str, np.ndarray]], index: np.ndarray
              ) -> tuple[Rollout, dict[str, np.ndarray]]:
        """The rows at ``index`` of a (rollout, scores) generation batch: what the sampler holds (dapo.sampler)."""
        rollout, scored = batch
        return self.backend.select(rollout, index), {k: np.asarray(v)[index] for k, v in scored.items()}

    # ---------------------------------------------------------------------------------------------------------------
    def train_step(self, step: int) -> dict[str, float]:
        """One rollout step, paper Algorithm 1 (module docstring); returns its metrics.

        Each phase is one call, timed into ``timing`` (``timing_s/<phase>``); ``generated`` collects the statistics
        of every generated response, kept or not (``train/gen_*``)."""
        timing: dict[str, float] = defaultdict(float)
        t_step = time.perf_counter()
        generated: dict[str, list[np.ndarray]] = defaultdict(list)
        bad_rewards = 0
        while not self.sampler.is_full():  # dynamic sampling (eq. 11): until train_batch_size groups are kept
            with _timed(timing, "gen", self.watchdog):
                rollout = self.generate()
            with _timed(timing, "reward", self.watchdog):
                scored = self.score(rollout)
                bad_rewards += int(np.count_nonzero(~np.isfinite(np.asarray(scored["reward"], dtype=np.float64))))
            with _timed(timing, "filter", self.watchdog):
                self.filter_groups(step, rollout, scored, generated)
                # the sampler keeps only the rows of groups it may still train on (a copy); the generation batch
                # itself is dropped right here, before the next one is generated
                del rollout, scored
        with _timed(timing, "filter", self.watchdog):
            batch, scores, sampler_stats = self.kept_batch()
        with _timed(timing, "adv", self.watchdog):
            adv, loss_mask = self.advantages(batch, scores)
        metrics: dict[str, float] = {NONFINITE_REWARDS: float(bad_rewards)}
        with _timed(timing, "old_log_prob", self.watchdog):
            metrics.update(self.backend.compute_old_log_probs(batch))
        with _timed(timing, "update_actor", self.watchdog):
            metrics.update(self.backend.update(batch, adv, loss_mask))
        self._dump(self.recipe.trainer.rollout_data_dir, batch, scores, step)
        metrics.update(self.step_metrics(step, batch, scores, adv, loss_mask, generated, sampler_stats))
        step_s = time.perf_counter() - t_step
        prompts = batch.stats.get("prompt_length")  # token counts of the training batch: per-token timing, throughput
        metrics.update(timing_metrics(timing, step_s, None if prompts is None else float(np.sum(prompts)),
                                      float(np.sum(batch.response_length)), self.backend.n_gpus))
        metrics.update(self.backend.fit_metrics(batch, adv, {**timing, "step": step_s}))  # verl's own functions
        metrics.update(self.backend.rank_metrics(step))  # the ranks' compute probe: a slow node shows here
        return metrics

    def generate(self) -> Rollout:
        """The next generation batch: ``gen_batch_size`` prompts (the sampler's suggestion in carry mode) from the
        stream, ``rollout.n`` responses each, one new group id per prompt (``backend.generate``)."""
        rows = [self.train_rows[i] for i in self.stream.take(self.sampler.suggested_gen_batch_size())]
        gids = list(range(self.next_gid, self.next_gid + len(rows)))
        self.next_gid += len(rows)
        return self.backend.generate(rows, self.train_sampling, group_ids=gids)

    def filter_groups(self, step: int, rollout: Rollout, scored: dict[str, np.ndarray],
                      generated: dict[str, list[np.ndarray]]) -> None:
        """Dynamic sampling (eq. 11): the sampler keeps the groups with ``0 < #correct < G`` (``filter_groups.metric``;
        all of them when off); every response's statistics go to ``generated`` first. Raises
        :class:`DynamicSamplingError` after ``max_num_gen_batches`` (the sampler's step is finished)."""
        fg = self.recipe.filter_groups
        for k in ("score", "reward", "acc", "overlong"):
            generated[k].append(np.asarray(scored[k], dtype=np.float64))
        generated["truncated"].append(np.asarray(rollout.truncated, dtype=np.float64))
        for k in ("entropy", "mean_prob"):
            if k in rollout.stats:
                generated[f"rollout_{k}"].append(np.asarray(rollout.stats[k], dtype=np.float64))
        try:
            self.sampler.add(rollout.group_ids, scored[fg.metric], batch=(rollout, scored), take=self._take)
        except DynamicSamplingError:
            self.sampler.finish_step()
            raise
        nb = self.sampler.num_gen_batches
        if fg.enable and not self.sampler.is_full() and nb % 10 == 0:
            limit = fg.max_num_gen_batches if fg.max_num_gen_batches > 0 else "unlimited"
            self.log(f"step {step}: dynamic sampling has {self.sampler.num_kept_groups} of "
                     f"{self.recipe.data.train_batch_size} groups after {nb} generation batches (max_num_gen_batches: "
                     f"{limit}); most groups are all-correct or all-wrong")

    def kept_batch(self) -> tuple[Rollout, dict[str, np.ndarray], dict[str, float]]:
        """The training batch: the kept groups joined (exactly ``train_batch_size`` x n responses), their scores,
        and the sampler's statistics of the step (which it ends)."""
        selection = self.sampler.selection()
        batch = self.backend.concat([self.backend.select(s.batch[0], s.indices) for s in selection])
        scores = {
            k: np.concatenate([np.asarray(s.batch[1][k])[s.indices] for s in selection])
            for k in ("reward", "score", "acc", "pred", "overlong_reward")
        }
        return batch, scores, self.sampler.finish_step()

    def advantages(self, batch: Rollout, scores: dict[str, np.ndarray]) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """Group advantages (eq. 9, ``dapo.advantage.group_advantages``) and the loss mask of overlong filtering
        (``reward.overlong_filter``: truncated responses leave the loss; None when off)."""
        r = self.recipe
        adv = np.asarray(
            group_advantages(scores["reward"], batch.group_ids, norm_by_std=r.algorithm.norm_adv_by_std),
            dtype=np.float64,
        )
        loss_mask = ~np.asarray(batch.truncated, dtype=bool) if r.reward.overlong_filter else None
        return adv, loss_mask

    def step_metrics(self, step: int, batch: Rollout, scores: dict[str, np.ndarray], adv: np.ndarray,
                     loss_mask: Optional[np.ndarray], generated: dict[str, list[np.ndarray]],
                     sampler_stats: dict[str, float]) -> dict[str, float]:
        """The step's metrics (verl's names, :data:`dapo.train.metrics.METRICS`): the training batch, dynamic
        sampling over every generated response, the counters."""
        fg = self.recipe.filter_groups
        d = self.recipe.data
        metrics = batch_metrics(scores["reward"], adv, batch.response_length, d.max_response_length,
                                batch.stats.get("prompt_length"), d.max_prompt_length)
        all_gen = {k: np.concatenate(v) for k, v in generated.items()}
        # 0 when carried-in groups alone filled the step (filter_groups.mode: carry): no generation statistics then
        n_generated = int(all_gen["score"].size) if "score" in all_gen else 0
        self.gen_samples_total += n_generated
        metrics["train/num_gen_batches"] = sampler_stats["num_gen_batches"]
        metrics["train/kept_group_ratio"] = sampler_stats["kept_ratio"] if fg.enable else 1.0
        metrics["train/num_gen_samples"] = float(n_generated)
        if fg.enable and fg.mode == "carry":
            metrics["train/num_groups_carried_in"] = sampler_stats["num_groups_carried_in"]
        metrics["train/gen_samples_total"] = float(self.gen_samples_total)
        metrics.update(generation_metrics(all_gen))
        if loss_mask is not None:
            metrics["train/num_filtered_responses"] = float((~loss_mask).sum())
        metrics["training/global_step"] = float(step)
        metrics["training/epoch"] = float(self.stream.epoch)
        return metrics

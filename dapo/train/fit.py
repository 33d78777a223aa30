"""The run around the DAPO step: :class:`Fit`, the mixin of :class:`dapo.train.loop.DAPOLoop` that runs it to its end.

``fit()`` resumes (or starts), then for every step: train it (:meth:`DAPOLoop.train_step`), check it -- a non-finite
loss, gradient norm, entropy, reward or weight ends the attempt before anything of the step is saved
(:mod:`dapo.train.ending`) --, feed the health guards, save when due (after checking that the volume can hold the
checkpoint), validate when due, log. Every phase runs under the watchdog's budget when ``dapo train`` gave the loop
one (:mod:`dapo.train.watchdog`). Each way the run stops on purpose -- done, a health stop, an exhausted sampler, a
non-finite value, a full volume, Ctrl-C / SIGTERM -- returns its exit code (:data:`dapo.train.attempts.CAUSES`)
after :class:`dapo.train.ending.AttemptEnd` recorded it.

It uses the loop's ``recipe``, ``backend``, ``health``, ``ending``, ``watchdog``, ``step``, ``total_steps``,
``val_rows``, ``ckpt_root`` and the methods of the other mixins (``save``, ``validate``, ``_resume_or_start``, ...).
"""

from __future__ import annotations

import errno
from contextlib import nullcontext
from typing import Optional

from dapo.train import checkpoint as ckpt
from dapo.train import runlog
from dapo.train.attempts import NONFINITE_WEIGHTS_MARK
from dapo.train.ending import NONFINITE_METRIC, nonfinite
from dapo.train.health import EXIT_HEALTH_STOP, EXIT_SAMPLER_EXHAUSTED
from dapo.train.metrics import MetricsLogger, format_step_line, val_accuracy
from dapo.sampler import DynamicSamplingError

__all__ = ["Fit"]


class Fit:
    """The run to its end (module docstring)."""

    def _cadence(self, freq: int, step: int) -> bool:
        return freq > 0 and (step % freq == 0 or step == self.total_steps)

    def fit(self) -> int:
        """Run to ``total_steps``; returns the exit code (0, or a code of :data:`dapo.train.attempts.CAUSES`)."""
        t = self.recipe.trainer
        resumed = self._resume_or_start()
        if self.watchdog is not None:
            self.watchdog.leave("startup")
        logger = MetricsLogger(
            self.run_dir, t.logger, project=t.project_name, experiment=t.experiment_name,
            config={**self.preset.to_dict(), **self.wandb_extra}, resume=resumed, warn=self.log,
        )
        try:
            return self._fit(logger)
        except KeyboardInterrupt:
            last = ckpt.latest(self.ckpt_root)
            self.log(f"interrupted during step {self.step + 1}; newest checkpoint: {last or 'none'}. Rerun the same "
                     "command to resume.")
            return self.ending.finish("interrupted", "interrupted (Ctrl-C or SIGTERM)", step=self.step + 1)
        finally:
            logger.close()
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def _phase(self, name: str):
        return self.watchdog.phase(name) if self.watchdog is not None else nullcontext()

    def _fit(self, logger: MetricsLogger) -> int:
        t = self.recipe.trainer
        with self._phase("log_pending"):  # its own phase: the first validation keeps first_s as its budget
            self._log_pending(logger)
        if self.step >= self.total_steps:
            self.log(f"run already complete ({self.step}/{self.total_steps} steps; checkpoints in {self.ckpt_root}). "
                     "Use --resume disable (or another --run-dir) to train again.")
            self._finish()
            return 0
        if (short := self._space_shortfall()) is not None:
            return self._no_space(short, self.step + 1)
        if self.step == 0 and t.val_before_train and self.val_rows and not any(s == 0 for s, _ in self.val_history):
            with self._phase("validate"):
                m = self.validate()
            self.val_history.append((0, m))
            logger.log(m, 0)
            self.log(f"step 0/{self.total_steps} | validation before RL | val_acc {val_accuracy(m):.3f} "
                     f"({len(self.val_rows)} prompts x {self.val_sampling.n}) | {m['timing_s/testing']:.1f}s")
        console = runlog.console()  # an interactive stderr, around the attempt log's pipe
        if self.progress and console is not None:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total_steps, initial=self.step, desc="DAPO", unit="step", dynamic_ncols=True,
                             file=console)
        while self.step < self.total_steps:
            code = self._one_step(logger)
            if code is not None:
                return code
        self._finish()
        return 0

    def _one_step(self, logger: MetricsLogger) -> Optional[int]:
        """Train, check, save, validate and log step ``self.step + 1``; an exit code when the attempt ends there."""
        t = self.recipe.trainer
        step = self.step + 1
        if self.watchdog is not None:
            self.watchdog.step = self.step
        try:
            metrics = self.train_step(step)
        except DynamicSamplingError as exc:
            with self._phase("save"):
                self.save()  # the state after the last completed step (no update happened in the failed one)
            self.log(f"stopped at step {step}: {exc}\ncheckpoint of step {self.step} saved in {self.ckpt_root}; "
                     f"exit code {EXIT_SAMPLER_EXHAUSTED}")
            return self.ending.finish("sampler_exhausted", str(exc), step=step, final=True)
        bad = nonfinite(metrics)
        if self.backend.weights_finite() is False:  # before anything of the step is saved
            bad["weights"] = float("nan")
        metrics[NONFINITE_METRIC] = float(len(bad))  # recorded, not dropped: the step's record says what broke
        if bad:
            logger.log(metrics, step)
            return self.ending.nonfinite(step, bad)
        self.step = step
        events = self.health.observe(step, metrics)  # the guards read training metrics only
        stop = [e for e in events if e.stop]
        # save before validating, as verl's fit() does: the weights reach the rollout engine once per step
        # (validation syncs them; a save after it would put the replicas to sleep and force a second sync)
        if self._cadence(t.save_freq, step) or stop:
            if (short := self._space_shortfall()) is not None:
                return self._no_space(short, step)
            self._pending_metrics = dict(metrics)
            try:
                with self._phase("save"):
                    self.save()
            except Exception as exc:  # a full volume mid-write, or a worker's refusal to save non-finite weights
                if NONFINITE_WEIGHTS_MARK in str(exc):
                    metrics[NONFINITE_METRIC] = 1.0
                    logger.log(metrics, step)
                    where = str(exc)[str(exc).index(NONFINITE_WEIGHTS_MARK):].splitlines()[0]
                    return self.ending.nonfinite(step, {"weights": float("nan")}, detail=where)
                if "No space left on device" not in str(exc) and getattr(exc, "errno", None) != errno.ENOSPC:
                    raise
                return self._no_space(f"the checkpoint of step {step} did not fit ({exc})", step)
            self._pending_metrics = None
            metrics["timing_s/save_checkpoint"] = self.last_save_seconds
        if self._cadence(t.test_freq, step) and self.val_rows:
            with self._phase("validate"):
                vm = self.validate()
            self._record_validation(step, vm)
            metrics.update(vm)
        logger.log(metrics, step)
        self.log(format_step_line(step, self.total_steps, metrics))
        if self._bar is not None:
            self._bar.update(1)
        for e in events:
            self.log(("HEALTH STOP: " if e.stop else "HEALTH WARNING: ") + e.message)
        if stop:
            self.log(f"stopped by recipe.trainer.health.stop_on={list(t.health.stop_on)}; checkpoint of step "
                     f"{step} saved in {self.ckpt_root}; exit code {EXIT_HEALTH_STOP}")
            return self.ending.finish("health_stop", "; ".join(e.message for e in stop), step=step, final=True)
        return None

"""Checkpoint and resume of the DAPO loop: :class:`Resumable`, a mixin of :class:`dapo.train.loop.DAPOLoop`.

- ``state_dict`` / ``load_state_dict``: what a checkpoint stores of the loop -- step, prompt cursor, the dynamic
  sampler (its carried groups compacted), health guards, RNG states, counters, validation history, and the record of
  a step saved before it was logged;
- ``save``: the backend's weights and this state, atomically, with retention (:mod:`dapo.train.checkpoint`);
- ``_resume_or_start``: ``resume_mode: auto`` continues from the newest complete checkpoint (``metrics.jsonl`` cut
  back to it); ``disable`` moves an earlier run's files aside;
- ``_log_pending``: the log record of a step whose checkpoint was written just before a kill.

It uses the loop's ``backend``, ``recipe``, ``run_dir``, ``ckpt_root``, ``stream``, ``sampler``, ``health``, ``step``,
``total_steps``, ``val_rows``, ``log``, ``validate`` and ``_cadence``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

from dapo.backends.base import Rollout
from dapo.train import checkpoint as ckpt
from dapo.train.ending import directory_bytes, space_shortfall
from dapo.train.metrics import MetricsLogger, format_step_line, read_jsonl, truncate_jsonl, val_accuracy

__all__ = ["Resumable"]


class Resumable:
    """The loop's checkpointed state, save and resume (module docstring)."""

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "stream": self.stream.state_dict(),
            "sampler": self.sampler.state_dict(compact=self._compact_carried),
            "health": self.health.state_dict(),
            "rng": ckpt.rng_state(),
            "next_gid": self.next_gid,
            "gen_samples_total": self.gen_samples_total,
            "val_history": list(self.val_history),
            "pending_metrics": self._pending_metrics,
        }

    def _compact_carried(self, batch: tuple[Rollout, dict], indices: np.ndarray) -> tuple[tuple, np.ndarray]:
        """A carried generation batch reduced to its carried responses (what a checkpoint stores)."""
        rollout, scored = batch
        small = self.backend.select(rollout, indices)
        return (small, {k: np.asarray(v)[indices] for k, v in scored.items()}), np.arange(len(indices))

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.step = int(s["step"])
        self.stream.load_state_dict(s["stream"])
        self.sampler.load_state_dict(s["sampler"])
        self.health.load_state_dict(s.get("health", {}))
        ckpt.set_rng_state(s["rng"])
        self.next_gid = int(s["next_gid"])
        self.gen_samples_total = int(s.get("gen_samples_total", 0))
        self.val_history = [(int(a), dict(b)) for a, b in s.get("val_history", [])]
        self._pending_metrics = s.get("pending_metrics")

    def save(self) -> Path:
        t0 = time.perf_counter()
        path = ckpt.save(
            self.ckpt_root, self.step, self.backend.save_checkpoint, self.state_dict(),
            max_to_keep=self.recipe.trainer.max_ckpt_to_keep,
        )
        self.last_save_seconds = time.perf_counter() - t0
        return path

    def _record_validation(self, step: int, vm: dict[str, float]) -> None:
        """A validation's result: in the history, and as the best checkpoint when it beats the recorded best
        (retention never deletes that one; :func:`dapo.train.checkpoint.record_validation`)."""
        self.val_history.append((step, vm))
        before = ckpt.best_step(self.ckpt_root)
        best = ckpt.record_validation(self.ckpt_root, step, val_accuracy(vm))
        if best is not None and best != before:
            self.log(f"best checkpoint so far: global_step_{best} (val_acc {val_accuracy(vm):.4f}); kept by retention")
            if before is not None:  # the old best is now one more old checkpoint: retention applies to it at once
                ckpt.prune(self.ckpt_root, self.recipe.trainer.max_ckpt_to_keep)

    def _resume_or_start(self) -> bool:
        """Resume from the newest complete checkpoint (``resume_mode: auto``); returns True when resumed."""
        metrics_file = self.run_dir / "metrics.jsonl"
        if self.recipe.trainer.resume_mode == "auto":
            # free the space of a deletion a killed attempt left half done (and apply a lowered retention) now,
            # before the first save of this attempt needs it
            ckpt.prune(self.ckpt_root, self.recipe.trainer.max_ckpt_to_keep)
            latest = self._load_newest_finite()
            if latest is not None:
                self.load_state_dict(ckpt.load_loop_state(latest))
                truncate_jsonl(metrics_file, self.step)
                self.log(f"resumed from {latest} (step {self.step}/{self.total_steps})")
                return True
            if metrics_file.exists():  # a run killed before its first checkpoint: start over cleanly
                truncate_jsonl(metrics_file, -1)
            return False
        # resume disabled: keep what an earlier run left, out of the way
        old = [p for p in (self.ckpt_root, metrics_file) if p.exists()]
        if old:
            dest = self.run_dir / f"previous-{time.strftime('%Y%m%d-%H%M%S')}"
            dest.mkdir(parents=True, exist_ok=True)
            for p in old:
                shutil.move(str(p), str(dest / p.name))
            self.log(f"resume disabled: moved the earlier run's {', '.join(p.name for p in old)} to {dest}")
        return False

    def _load_newest_finite(self) -> Optional[Path]:
        """Load the newest complete checkpoint whose weights are finite into the backend; one that is not (the
        backend can tell: :meth:`dapo.backends.base.Backend.weights_finite`) is quarantined and the next older one
        tried. Returns the checkpoint loaded, or None."""
        while (latest := ckpt.latest(self.ckpt_root)) is not None:
            self.backend.load_checkpoint(str(latest))
            if self.backend.weights_finite() is not False:
                return latest
            step = int(latest.name.rpartition("_")[2])
            dest = ckpt.quarantine(self.ckpt_root, step, "non-finite weights after loading it")
            self.log(f"checkpoint {latest} holds non-finite weights: moved to {dest}; trying the one before it")
        return None

    def _space_shortfall(self) -> Optional[str]:
        """Why the volume cannot hold the next checkpoint (:func:`dapo.train.ending.space_shortfall`), or None. The
        newest checkpoint on disk sizes it (the backend's estimate before there is one); what retention deletes
        before the write counts as free."""
        newest = ckpt.latest(self.ckpt_root)
        if newest is not None:
            if getattr(self, "_sized", (None, 0))[0] != newest:
                self._sized = (newest, directory_bytes(newest))
            needed = self._sized[1]
        else:
            needed = self.backend.checkpoint_bytes() or 0
        if needed <= 0:
            return None
        keep = self.recipe.trainer.max_ckpt_to_keep
        reclaim = sum(directory_bytes(self.ckpt_root / f"global_step_{s}") for s in ckpt.victims(self.ckpt_root, keep)
                      ) if self.ckpt_root.is_dir() else 0  # fmt: skip
        return space_shortfall(self.ckpt_root, needed, reclaim)

    def _no_space(self, shortfall: str, step: int) -> int:
        """End the attempt before a checkpoint that cannot fit is written (exit code 9)."""
        message = (f"{shortfall}: nothing was written. Grow the volume, or lower recipe.trainer.max_ckpt_to_keep "
                   f"({self.recipe.trainer.max_ckpt_to_keep}), or delete old checkpoints under {self.ckpt_root}; the "
                   "next attempt resumes from the newest checkpoint")
        self.log(f"NO SPACE: {message}")
        return self.ending.finish("no_space", message, step=step)

    def _log_pending(self, logger: MetricsLogger) -> None:
        """A checkpoint is written before its step's validation and log record (verl's order); after a kill in
        between, the resumed run logs that record from the checkpoint, validating first when it was due."""
        pending, self._pending_metrics = self._pending_metrics, None
        if pending is None or any(int(r.get("step", -1)) == self.step and "timing_s/step" in r
                                  for r in read_jsonl(self.run_dir / "metrics.jsonl")):  # fmt: skip
            return
        m = dict(pending)
        if self._cadence(self.recipe.trainer.test_freq, self.step) and self.val_rows:
            vm = self.validate()
            self._record_validation(self.step, vm)
            m.update(vm)
        logger.log(m, self.step)
        self.log(format_step_line(self.step, self.total_steps, m))

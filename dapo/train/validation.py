"""Validation passes of the DAPO loop and the run's summary: :class:`Validation`, a mixin of
:class:`dapo.train.loop.DAPOLoop`.

- ``validate``: avg@k over the validation split (``rollout.val`` sampling) per data source
  (``val-core/<ds>/acc/mean@k``), with verl's validation-generations table (``trainer.log_val_generations``) and
  generation dump (``trainer.validation_data_dir``).
- ``summary`` / ``_finish``: validation accuracy before -> after RL, per data source, and the run's cost
  (:func:`cpu_seconds`) into ``summary.json`` and the log; then the health plots (:mod:`dapo.train.report`).

It uses the loop's ``backend``, ``recipe``, ``val_rows``, ``val_sampling``, ``run_dir``, ``step``, ``total_steps``,
``val_history``, ``gen_samples_total``, ``score``, ``_dump`` and ``log``.
"""

from __future__ import annotations

import json
import resource
import time
from typing import Any

import numpy as np

from dapo.train.generations import pick_val_generations, prompt_text
from dapo.train.metrics import read_jsonl, val_acc_key, val_accuracy

__all__ = ["Validation", "cpu_seconds"]


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class Validation:
    """Validation and the run's summary (module docstring)."""

    def validate(self) -> dict[str, float]:
        """avg@k over the validation split (k = rollout.val.n) per data_source: ``val-core/<ds>/acc/mean@k``."""
        if not self.val_rows:
            return {}
        t0 = time.perf_counter()
        rollout = self.backend.generate(self.val_rows, self.val_sampling)
        scored = self.score(rollout)
        t = self.recipe.trainer
        self._dump(t.validation_data_dir, rollout, scored, self.step)
        if t.log_val_generations > 0:  # verl's validation-generations table, as JSONL in the run directory
            inputs = [prompt_text(r, self.recipe.data.prompt_key) for r in rollout.prompt_rows]
            picked = pick_val_generations(inputs, rollout.response_text, scored["reward"], t.log_val_generations)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with open(self.run_dir / "val_generations.jsonl", "a", encoding="utf-8") as f:
                for inp, out, sc in picked:
                    f.write(json.dumps({"step": self.step, "input": inp, "output": out, "score": sc},
                                       ensure_ascii=False) + "\n")
        k = self.val_sampling.n
        sources = np.asarray([row.get("data_source", "unknown") for row in rollout.prompt_rows], dtype=object)
        lengths = np.asarray(rollout.response_length, dtype=np.float64)
        out: dict[str, float] = {}
        for ds in sorted(set(sources.tolist())):
            sel = sources == ds
            out[val_acc_key(ds, k)] = float(np.mean(scored["acc"][sel]))
            out[f"val-aux/{ds}/score/mean@{k}"] = float(np.mean(scored["score"][sel]))
            out[f"val-aux/{ds}/response_length/mean"] = float(np.mean(lengths[sel]))
        out["timing_s/testing"] = time.perf_counter() - t0
        return out

    def summary(self) -> dict[str, Any]:
        """Validation accuracy before and after RL (from this run's history and metrics.jsonl) and the run's cost."""
        hist = {s: val_accuracy(m) for s, m in self.val_history}
        for rec in read_jsonl(self.run_dir / "metrics.jsonl"):
            acc = val_accuracy(rec)
            if acc is not None:
                hist.setdefault(int(rec["step"]), acc)
        hist = {s: a for s, a in hist.items() if a is not None}
        out: dict[str, Any] = {
            "steps": self.step, "total_steps": self.total_steps, "val_acc": dict(sorted(hist.items()))
        }
        if 0 in hist:
            out["val_acc_before"] = hist[0]
        finals = [s for s in hist if s > 0]
        if finals:
            out["val_acc_after"] = hist[max(finals)]
            out["val_acc_best"] = max(hist[s] for s in finals)
        # one curve per validation data source (several recipe.data.val_files): val-core/<ds>/acc/mean@k -> {step: acc}
        by_source: dict[str, dict[int, float]] = {}
        for s, m in self.val_history:
            for key, v in m.items():
                if key.startswith("val-core/") and "/acc/mean@" in key:
                    by_source.setdefault(key, {})[int(s)] = float(v)
        if by_source:
            out["val_acc_by_source"] = {k: dict(sorted(v.items())) for k, v in sorted(by_source.items())}
        out["gen_samples_total"] = self.gen_samples_total
        out["wall_seconds_this_process"] = time.time() - self._t0
        out["cpu_seconds_this_process"] = cpu_seconds() - self._cpu0
        return out

    def _finish(self) -> None:
        import json

        s = self.summary()
        (self.run_dir / "summary.json").write_text(json.dumps(s, indent=2, sort_keys=True))
        ds = sorted({row.get("data_source", "unknown") for row in self.val_rows})
        what = f"val-core/{'|'.join(ds)}/acc/mean@{self.val_sampling.n}, {len(self.val_rows)} held-out prompts"
        if "val_acc_before" in s and "val_acc_after" in s:
            b, a = s["val_acc_before"], s["val_acc_after"]
            best_step = max((k for k in s["val_acc"] if k > 0), key=lambda k: s["val_acc"][k])
            self.log(f"validation accuracy ({what}): before RL {b:.3f} -> after RL {a:.3f} ({a - b:+.3f}; best "
                     f"{s['val_acc_best']:.3f} at step {best_step}) after {s['steps']} steps, "
                     f"{s['gen_samples_total']} generated responses")
        elif "val_acc_after" in s:
            self.log(f"validation accuracy ({what}): {s['val_acc_after']:.3f} after {s['steps']} steps")
        if len(s.get("val_acc_by_source", {})) > 1:  # several validation files: each data source on its own
            self.log("validation per data source: " + "; ".join(
                f"{k}: " + " -> ".join(f"{a:.3f}" for a in v.values()) for k, v in s["val_acc_by_source"].items()))
        self.log(f"time: wall {s['wall_seconds_this_process']:.0f}s, CPU {s['cpu_seconds_this_process']:.0f}s "
                 f"(this process) | metrics {self.run_dir / 'metrics.jsonl'}")
        try:
            from dapo.train.report import plot_run

            png = plot_run(self.run_dir)
            self.log(f"health plots: {png}")
        except Exception as exc:  # plotting must never fail a finished run
            self.log(f"health plots skipped ({type(exc).__name__}: {exc}); rerun: dapo report {self.run_dir}")

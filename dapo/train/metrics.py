"""Where a step's metrics go: the logging sinks (JSONL, wandb, TensorBoard, console) and the one-line-per-step
progress line; the names and their meanings are :mod:`dapo.train.metric_names`', the step's values
:mod:`dapo.train.step_metrics`' (both re-exported here).

Sinks: every record goes to ``<run_dir>/metrics.jsonl`` (one JSON object per line: ``{"step": int, "ts": float,
<name>: float, ...}``); wandb when listed in ``trainer.logger`` (offline unless ``WANDB_API_KEY`` is set;
``WANDB_MODE`` is respected; any wandb failure is reported once and logging continues without it); TensorBoard when
``tensorboard`` is listed and installed. :func:`format_step_line` renders the console line. The saved wandb workspace
for a run's metrics is :mod:`dapo.train.dashboard`'s.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Optional

from dapo.train.metric_names import (BACKEND_ONLY, METRICS, backend_only, describe, val_acc_key,  # noqa: F401
                                     val_score_key)
from dapo.train.step_metrics import STEP_PHASES, batch_metrics, generation_metrics, timing_metrics  # noqa: F401


def val_accuracy(metrics: dict[str, float]) -> Optional[float]:
    """The mean of the ``val-core/*/acc/mean@k`` entries of a record (None when it holds none)."""
    vals = [v for k, v in metrics.items() if k.startswith("val-core/") and "/acc/mean@" in k]
    return float(sum(vals) / len(vals)) if vals else None


def _fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def format_step_line(step: int, total: int, m: dict[str, float]) -> str:
    """The one readable line per step (grep/kubectl-logs friendly)."""
    g = m.get
    parts = [
        f"step {step}/{total}",
        f"score {_fmt(g('train/gen_score/mean'), '.2f')}",
        f"acc {_fmt(g('train/gen_acc/mean'), '.2f')}",
        f"len {_fmt(g('response_length/mean'), '.1f')}",
        f"gen_batches {_fmt(g('train/num_gen_batches'), '.0f')}",
        f"kept {_fmt(g('train/kept_group_ratio'), '.2f')}",
        f"entropy {_fmt(g('actor/entropy'), '.3f')}",
        f"prob {_fmt(g('actor/mean_prob'), '.3f')}",
        f"clip {_fmt(g('actor/pg_clipfrac'), '.3f')}/{_fmt(g('actor/pg_clipfrac_lower'), '.3f')}",
        f"lr {_fmt(g('actor/lr'), '.1e')}",
        f"{_fmt(g('timing_s/step'), '.1f')}s",
    ]
    acc = val_accuracy(m)
    if acc is not None:
        parts.append(f"val_acc {acc:.3f}")
    return " | ".join(parts)


def _jsonable(v: Any) -> Any:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl; a torn last line (a killed writer) is skipped."""
    out = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def truncate_jsonl(path: Path | str, max_step: int) -> int:
    """Keep only records with ``step <= max_step`` (a resume redoes the later steps); returns records kept."""
    p = Path(path)
    if not p.exists():
        return 0
    keep = [r for r in read_jsonl(p) if int(r.get("step", -1)) <= max_step]
    tmp = p.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in keep))
    os.replace(tmp, p)
    return len(keep)


class MetricsLogger:
    """Fan-out of step metrics to JSONL (always), wandb and TensorBoard (when in ``loggers``)."""

    def __init__(
        self,
        run_dir: Path | str,
        loggers: Iterable[str] = ("console",),
        *,
        project: str = "DAPO",
        experiment: str = "run",
        config: Optional[dict] = None,
        resume: bool = False,
        warn=None,
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._fh = open(self.path, "a", buffering=1)
        self.loggers = set(loggers)
        self._warn = warn or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._wandb = None
        self._tb = None
        if "wandb" in self.loggers:
            self._wandb = self._init_wandb(project, experiment, config, resume)
        if "tensorboard" in self.loggers:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
            except Exception as exc:  # tensorboard is an optional extra
                self._warn(f"tensorboard logging off ({type(exc).__name__}: {exc}); "
                           "pip install 'dapo-k8s[tensorboard]'")

    def _init_wandb(self, project, experiment, config, resume):
        try:
            import wandb

            mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
            run_id_file = self.run_dir / "wandb_run_id"
            run_id = run_id_file.read_text().strip() if (resume and run_id_file.exists()) else None
            run = wandb.init(
                project=project,
                name=experiment,
                config=config or {},
                dir=str(self.run_dir),
                mode=mode,
                id=run_id,
                resume="allow" if run_id else None,
                settings=wandb.Settings(silent=True, console="off"),
            )
            run_id_file.write_text(run.id)
            return run
        except Exception as exc:
            self._warn(f"wandb logging off ({type(exc).__name__}: {exc}); training continues")
            return None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        rec = {"step": int(step), "ts": time.time()}
        rec.update({k: _jsonable(v) for k, v in metrics.items()})
        self._fh.write(json.dumps(rec, sort_keys=True) + "\n")
        self._fh.flush()
        if self._wandb is not None:
            try:
                values = {k: v for k, v in rec.items() if k not in ("step", "ts") and v is not None}
                self._wandb.log(values, step=int(step))
            except Exception as exc:
                self._warn(f"wandb logging off after an error ({type(exc).__name__}: {exc}); training continues")
                self._wandb = None
        if self._tb is not None:
            try:
                for k, v in rec.items():
                    if k not in ("step", "ts") and v is not None:
                        self._tb.add_scalar(k, v, int(step))
            except Exception as exc:
                self._warn(f"tensorboard logging off after an error ({exc}); training continues")
                self._tb = None

    def close(self) -> None:
        try:
            self._fh.close()
        except Exception:
            pass
        if self._wandb is not None:
            try:
                self._wandb.finish(quiet=True)
            except Exception:
                pass
        if self._tb is not None:
            try:
                self._tb.close()
            except Exception:
                pass

"""Metric names, a step's metrics, logging sinks (JSONL, wandb, TensorBoard, console) and the one-line-per-step
progress line.

:data:`METRICS` is the single table of the metric names both backends log. Names follow verl 0.9.1 where verl has
one (``response_length/mean``, ``critic/score/mean``, ``actor/pg_clipfrac``, ``timing_s/gen`` ...); the extra
DAPO health metrics are ``actor/mean_prob``, ``train/kept_group_ratio`` and the ``train/gen_*`` statistics of *all*
generated responses (before dynamic sampling filters them; verl's ``critic/score/mean`` is over the filtered
training batch, which dynamic sampling biases towards 0). The loop computes a step's metrics with
:func:`batch_metrics` (the training batch), :func:`generation_metrics` (every generated response) and
:func:`timing_metrics` (seconds per phase).

Sinks: every record goes to ``<run_dir>/metrics.jsonl`` (one JSON object per line: ``{"step": int, "ts": float,
<name>: float, ...}``); wandb when listed in ``trainer.logger`` (offline unless ``WANDB_API_KEY`` is set;
``WANDB_MODE`` is respected; any wandb failure is reported once and logging continues without it); TensorBoard when
``tensorboard`` is listed and installed. :func:`format_step_line` renders the console line.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np

# name -> meaning. "{ds}" stands for a data_source, "{k}" for the number of validation samples per prompt.
METRICS: dict[str, str] = {
    # rollout / reward (verl names)
    "critic/score/mean": (
        "mean outcome reward of the training batch (verifier +-1 plus overlong penalty), after filtering"
    ),
    "critic/score/max": "max outcome reward of the training batch",
    "critic/score/min": "min outcome reward of the training batch",
    "critic/rewards/mean": "mean reward used for the advantages (= score: DAPO has no KL-in-reward)",
    "critic/rewards/max": "max reward used for the advantages",
    "critic/rewards/min": "min reward used for the advantages",
    "critic/advantages/mean": "token-mean of the advantages over response tokens",
    "critic/advantages/max": "max advantage",
    "critic/advantages/min": "min advantage",
    "response_length/mean": "mean response length (tokens, EOS included) of the training batch",
    "response_length/max": "max response length",
    "response_length/min": "min response length",
    "response_length/clip_ratio": "fraction of training responses that hit max_response_length",
    "prompt_length/mean": "mean prompt length (tokens)",
    "prompt_length/max": "max prompt length",
    "prompt_length/min": "min prompt length",
    # actor (verl names, plus actor/mean_prob)
    "actor/entropy": (
        "mean per-token entropy of the policy on the training responses (at pi_old; aggregated with "
        "loss_agg_mode)"
    ),
    "actor/mean_prob": "mean probability pi_old assigns to the sampled response tokens",
    "actor/pg_loss": "policy-gradient loss (DAPO eq. 10/12), mean over mini-batches",
    "actor/pg_clipfrac": (
        "fraction of response tokens where the clipped term is active (ratio clipped at 1-eps_low or "
        "1+eps_high)"
    ),
    "actor/pg_clipfrac_lower": "fraction of response tokens hit by the dual clip (A < 0, ratio > c)",
    "actor/ppo_kl": "mean of log pi_old - log pi_theta over response tokens (approximate KL between updates)",
    "actor/grad_norm": "global gradient norm before clipping, mean over mini-batches",
    "actor/lr": "learning rate the update used",
    "actor/num_optimizer_steps": "optimizer steps taken this rollout step",
    "actor/loss_tokens": (
        "response tokens the token-mean loss divides by: the whole optimizer mini-batch over all data-parallel "
        "ranks (token_mean_scope minibatch) or the micro-batch (microbatch); mean over micro-batches"
    ),
    # dynamic sampling
    "train/num_gen_batches": "generation batches needed to fill the training batch (verl name)",
    "train/kept_group_ratio": "fraction of generated prompt groups kept by dynamic sampling (outcomes not all equal)",
    "train/num_gen_samples": "responses generated this step (all generation batches)",
    "train/num_groups_carried_in": "kept groups carried over from the previous step (filter_groups.mode: carry)",
    "train/gen_samples_total": "responses generated since the start of RL",
    "train/gen_score/mean": "mean outcome reward over all responses generated this step (before filtering)",
    "train/gen_acc/mean": "fraction of all responses generated this step that are correct (before filtering)",
    "train/gen_overlong_ratio": "fraction of generated responses penalised by the soft overlong punishment",
    "train/gen_truncated_ratio": "fraction of generated responses that hit max_response_length (no EOS)",
    "rollout/entropy": (
        "mean per-token entropy of the sampling distribution over all generated responses "
        "(backend-reported)"
    ),
    "rollout/mean_prob": (
        "mean probability of the sampled tokens under the sampling distribution, all generated responses"
    ),
    "train/num_filtered_responses": "responses dropped from the loss by overlong filtering (when enabled)",
    "training/global_step": "rollout step (verl name)",
    "training/epoch": "pass over the training prompts (verl name)",
    # validation (verl names)
    "val-core/{ds}/acc/mean@{k}": (
        "validation accuracy avg@k: mean correctness over k samples of every validation prompt"
    ),
    "val-aux/{ds}/score/mean@{k}": "validation mean verifier score (+-1)",
    "val-aux/{ds}/response_length/mean": "validation mean response length",
    # timing (verl names where verl has them; plus filter)
    "timing_s/gen": "seconds generating (all generation batches of the step)",
    "timing_s/reward": "seconds in the verifier and overlong shaping",
    "timing_s/filter": "seconds in dynamic sampling (group filtering and batch assembly)",
    "timing_s/adv": "seconds computing group advantages",
    "timing_s/old_log_prob": "seconds recomputing pi_old log-probs",
    "timing_s/update_actor": "seconds in the policy update",
    "timing_s/step": "seconds for the whole rollout step",
    "timing_s/testing": "seconds validating",
    "timing_s/save_checkpoint": "seconds writing the checkpoint",
    "timing_s/other": "step seconds outside the phases above (loop overhead, logging)",
}

# Diagnostics only one backend has (everything else in METRICS is logged by both for the same recipe; the verl-on-CPU
# test compares the two runs' keys): name or prefix (ending in "/" or "_") -> what it is.
BACKEND_ONLY: dict[str, dict[str, str]] = {
    "verl": {
        "actor/loss": "verl's total actor loss (policy loss + entropy and KL terms), mean over micro-batches",
        "actor/perf/": "verl's per-worker memory readings (GPU allocator, host memory)",
        "perf/mfu/": "verl's model-FLOPs utilisation estimates",
        "global_seqlen/": "verl's balance_batch statistics (tokens per data-parallel rank before/after balancing)",
        "timing_s/agent_loop/": "verl's agent-loop timings per request (generate, score, preemptions)",
        "timing_s/update_weights": "seconds pushing the actor's weights into the vLLM replicas (one push per step)",
        "training/rollout_": "verl's check of the weight push: vLLM's vs the actor's probabilities of the sampled "
                             "tokens (|diff| max/mean/std, Pearson correlation; calculate_debug_metrics)",
        "reward/verl_agreement": "share of responses verl's reward loop scores like ours (recipe.reward.verl_agreement)",
    },
    "local": {
        "rollout/entropy": "entropy of the sampling distribution (the local backend has the full logits; vLLM returns "
                           "only the sampled tokens' log-probs)",
        "actor/pg_clip_high_old_prob/": "tokens stopped by the upper clip (A > 0, ratio > 1 + eps_high) in this update, "
                                        "per pi_old bin of width 0.2 named by its lower edge (the paper's Fig. 3)",
    },
}


def backend_only(name: str) -> Optional[str]:
    """The backend whose own diagnostic ``name`` is (:data:`BACKEND_ONLY`), or None for a metric both log."""
    for backend, table in BACKEND_ONLY.items():
        if any(name == k or (k.endswith(("/", "_")) and name.startswith(k)) for k in table):
            return backend
    return None


STEP_PHASES = ("gen", "reward", "filter", "adv", "old_log_prob", "update_actor")


def _stats(prefix: str, values: Any) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {}
    return {f"{prefix}/mean": float(v.mean()), f"{prefix}/max": float(v.max()), f"{prefix}/min": float(v.min())}


def batch_metrics(rewards: Any, adv: np.ndarray, response_length: Any, max_response_length: int,
                  prompt_length: Any = None) -> dict[str, float]:
    """``critic/*``, ``response_length/*`` and ``prompt_length/*`` of the training batch (after dynamic sampling);
    ``critic/advantages/mean`` is the token-mean (each response weighs by its length)."""
    lengths = np.asarray(response_length, dtype=np.float64)
    metrics = {**_stats("critic/score", rewards), **_stats("critic/rewards", rewards)}
    tok_w = np.maximum(lengths, 0)
    metrics["critic/advantages/mean"] = float((adv * tok_w).sum() / max(tok_w.sum(), 1.0))
    metrics["critic/advantages/max"] = float(adv.max())
    metrics["critic/advantages/min"] = float(adv.min())
    metrics.update(_stats("response_length", lengths))
    metrics["response_length/clip_ratio"] = float(np.mean(lengths >= max_response_length))
    if prompt_length is not None:
        metrics.update(_stats("prompt_length", prompt_length))
    return metrics


def generation_metrics(generated: dict[str, np.ndarray]) -> dict[str, float]:
    """``train/gen_*`` over every response generated in the step, kept or not, and the backend's ``rollout/*``
    statistics; ``generated`` maps score, reward, acc, overlong, truncated (and rollout_entropy, rollout_mean_prob
    when the backend has them) to one value per response."""
    metrics: dict[str, float] = {}
    if "score" in generated and generated["score"].size:
        metrics["train/gen_score/mean"] = float(generated["reward"].mean())
        metrics["train/gen_acc/mean"] = float(generated["acc"].mean())
        metrics["train/gen_overlong_ratio"] = float(generated["overlong"].mean())
        metrics["train/gen_truncated_ratio"] = float(generated["truncated"].mean())
    for k in ("entropy", "mean_prob"):
        if f"rollout_{k}" in generated:
            metrics[f"rollout/{k}"] = float(generated[f"rollout_{k}"].mean())
    return metrics


def timing_metrics(timing: dict[str, float], step_seconds: float) -> dict[str, float]:
    """``timing_s/<phase>`` (:data:`STEP_PHASES`), ``timing_s/step`` and the rest of the step, ``timing_s/other``."""
    metrics = {f"timing_s/{k}": v for k, v in timing.items()}
    metrics["timing_s/step"] = step_seconds
    metrics["timing_s/other"] = max(0.0, step_seconds - sum(timing.values()))
    return metrics


def val_acc_key(data_source: str, k: int) -> str:
    return f"val-core/{data_source}/acc/mean@{k}"


def val_score_key(data_source: str, k: int) -> str:
    return f"val-aux/{data_source}/score/mean@{k}"


def describe(name: str) -> Optional[str]:
    """The meaning of a metric name (templated names included; a backend's own diagnostics from
    :data:`BACKEND_ONLY`), or None when it is in neither table."""
    if name in METRICS:
        return METRICS[name]
    backend = backend_only(name)
    if backend is not None:
        table = BACKEND_ONLY[backend]
        return table.get(name) or next(v for k, v in table.items() if k.endswith(("/", "_")) and name.startswith(k))
    parts = name.split("/")

    def fits(a: str, b: str) -> bool:  # template part a vs name part b
        return a == b or a == "{ds}" or ("{k}" in a and b.startswith(a.split("{")[0]))

    for tmpl, text in METRICS.items():
        t = tmpl.split("/")
        if len(t) == len(parts) and all(fits(a, b) for a, b in zip(t, parts)):
            return text
    return None


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

"""``dapo bench ablation``: the paper's ablation ladder (Table 1) on the tiny task, every rung from the same warm
start, several seeds::

    naive GRPO            clip 0.2/0.2, sample-level loss (seq-mean-token-mean), no overlong shaping, no filtering
    + overlong filtering  truncated responses dropped from the loss
    + clip-higher         eps_high 0.28
    + soft overlong       soft overlong punishment (eq. 13) instead of filtering, as the DAPO recipe does
    + token-level loss    token-mean (eq. 12)
    + dynamic sampling    filter groups (eq. 11) = DAPO (the tiny preset)
    DAPO + carry          off-paper: surplus kept groups carried into the next step, generation batch adapted
                          to the kept-group ratio (filter_groups.mode: carry; dapo.sampler)

Every rung trains on ``train_batch_size`` prompts per step; without dynamic sampling the generation batch is
the training batch, with it generation batches of ``gen_batch_size`` are added until the batch is full. Prints,
per rung (mean over seeds), the rollout steps and generated responses to first reach each target validation
accuracy, and the final accuracy; writes ``ablation.{md,json,png}`` in ``--out``. Runs are resumable: a finished
(rung, seed) keeps its ``summary.json`` and is not rerun.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Optional

from dapo.bench.runs import _slug, cached_run, run_meta

LADDER: list[tuple[str, list[str]]] = [
    ("naive GRPO", [
        "recipe.actor.clip_ratio_high=0.2", "recipe.actor.loss_agg_mode=seq-mean-token-mean",
        "recipe.reward.overlong_buffer.enable=false", "recipe.reward.overlong_filter=false",
        "recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=null",
    ]),
    ("+ overlong filtering", [
        "recipe.actor.clip_ratio_high=0.2", "recipe.actor.loss_agg_mode=seq-mean-token-mean",
        "recipe.reward.overlong_buffer.enable=false", "recipe.reward.overlong_filter=true",
        "recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=null",
    ]),
    ("+ clip-higher", [
        "recipe.actor.clip_ratio_high=0.28", "recipe.actor.loss_agg_mode=seq-mean-token-mean",
        "recipe.reward.overlong_buffer.enable=false", "recipe.reward.overlong_filter=true",
        "recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=null",
    ]),
    ("+ soft overlong punishment", [
        "recipe.actor.clip_ratio_high=0.28", "recipe.actor.loss_agg_mode=seq-mean-token-mean",
        "recipe.reward.overlong_buffer.enable=true", "recipe.reward.overlong_filter=false",
        "recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=null",
    ]),
    ("+ token-level loss", [
        "recipe.actor.clip_ratio_high=0.28", "recipe.actor.loss_agg_mode=token-mean",
        "recipe.reward.overlong_buffer.enable=true", "recipe.reward.overlong_filter=false",
        "recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=null",
    ]),
    ("+ dynamic sampling (DAPO)", [
        "recipe.actor.clip_ratio_high=0.28", "recipe.actor.loss_agg_mode=token-mean",
        "recipe.reward.overlong_buffer.enable=true", "recipe.reward.overlong_filter=false",
        "recipe.filter_groups.enable=true",
    ]),
    ("DAPO + carry", [
        "recipe.actor.clip_ratio_high=0.28", "recipe.actor.loss_agg_mode=token-mean",
        "recipe.reward.overlong_buffer.enable=true", "recipe.reward.overlong_filter=false",
        "recipe.filter_groups.enable=true", "recipe.filter_groups.mode=carry",
    ]),
]  # fmt: skip


def _train_acc_last(run_dir: Path, k: int) -> Optional[float]:
    """Mean of ``train/gen_acc/mean`` (all responses sampled at the training temperature) over the last k steps."""
    from dapo.train.metrics import read_jsonl

    key = "train/gen_acc/mean"
    vals = [r[key] for r in read_jsonl(run_dir / "metrics.jsonl") if r.get(key) is not None]
    return float(sum(vals[-k:]) / len(vals[-k:])) if vals else None


def _second_half_mean(curve: list) -> Optional[float]:
    """Mean validation accuracy over the evaluations in the second half of the run (steps > last step / 2)."""
    last = max((s for s, a, _ in curve if a is not None), default=0)
    vals = [a for s, a, _ in curve if a is not None and s > last / 2]
    return float(sum(vals) / len(vals)) if vals else None


def _first_reach(curve: list, target: float) -> tuple[Optional[int], Optional[float]]:
    for step, acc, samples in curve:
        if step > 0 and acc is not None and acc >= target:
            return step, samples
    return None, None


def _fmt_mean(values: list[Optional[float]], spec: str, n: int) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "not reached"
    import numpy as np

    s = format(float(np.mean(got)), spec)
    return s if len(got) == n else f"{s} ({len(got)}/{n} seeds)"


def ablation_table(results: dict[str, list[dict]], targets: list[float]) -> str:
    import numpy as np

    head = ["rung"] + [f"steps to {t:.2f}" for t in targets] + [f"samples to {t:.2f}" for t in targets]
    head += ["val acc before", "final val acc (mean ± sd)", "val acc, 2nd half of the run", "train acc, last 10 steps",
             "CPU s / run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, runs in results.items():
        n = len(runs)
        row = [name]
        reach = {t: [_first_reach(r["curve"], t) for r in runs] for t in targets}
        row += [_fmt_mean([s for s, _ in reach[t]], ".1f", n) for t in targets]
        row += [_fmt_mean([x for _, x in reach[t]], ".0f", n) for t in targets]
        before = [r.get("val_acc_before") for r in runs]
        final = [r.get("val_acc_after") for r in runs if r.get("val_acc_after") is not None]
        tr = [r.get("train_acc_last10") for r in runs if r.get("train_acc_last10") is not None]
        row.append(_fmt_mean(before, ".3f", n))
        row.append(f"{np.mean(final):.3f} ± {np.std(final):.3f}" if final else "-")
        half = [_second_half_mean(r["curve"]) for r in runs]
        half = [h for h in half if h is not None]
        row.append(f"{np.mean(half):.3f} ± {np.std(half):.3f}" if half else "-")
        row.append(f"{np.mean(tr):.3f} ± {np.std(tr):.3f}" if tr else "-")
        row.append(f"{np.mean([r['cpu_seconds'] for r in runs]):.0f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def ablation_plot(results: dict[str, list[dict]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5))
    for name, runs in results.items():
        steps = sorted({s for r in runs for s, a, _ in r["curve"] if a is not None})
        mean = [np.mean([a for r in runs for s2, a, _ in r["curve"] if s2 == s]) for s in steps]
        ax1.plot(steps, mean, marker="o", markersize=3, label=name)
        xs = [
            np.mean([x for r in runs for s2, a, x in r["curve"] if s2 == s and x is not None] or [np.nan])
            for s in steps
        ]
        ax2.plot(xs, mean, marker="o", markersize=3, label=name)
    ax1.set_xlabel("rollout step")
    ax2.set_xlabel("generated responses")
    for ax in (ax1, ax2):
        ax.set_ylabel("validation accuracy (mean over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("DAPO ablation ladder on the tiny task")
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def cmd_ablation(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="dapo bench ablation", description="the DAPO ablation ladder on the tiny task")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated recipe.trainer.seed values")
    p.add_argument("--targets", default="0.95,0.99", help="validation accuracies to reach")
    p.add_argument("--out", default="runs/bench-ablation")
    p.add_argument("--rungs", default=None, help="comma-separated rung indices (default: all)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run")
    p.add_argument("overrides", nargs="*", help="preset overrides applied to every rung (e.g. shorter runs)")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    targets = [float(t) for t in args.targets.split(",")]
    out = Path(args.out)
    assets = out / "assets"
    rungs = LADDER if args.rungs is None else [LADDER[int(i)] for i in args.rungs.split(",")]
    results: dict[str, list[dict]] = {}
    t_start = time.time()
    load0 = os.getloadavg()[0]
    for name, rung in rungs:
        results[name] = []
        for seed in seeds:
            run_dir = out / _slug(name) / f"seed{seed}"
            fresh, t0 = not (run_dir / "bench_result.json").exists(), time.time()
            res = cached_run(args.preset, rung + [f"recipe.trainer.seed={seed}"] + args.overrides, run_dir, assets,
                             threads=args.threads)  # fmt: skip
            if fresh:
                nan = float("nan")
                print(f"[{time.time() - t_start:.0f}s] {name} seed {seed}: final val acc "
                      f"{res.get('val_acc_after', nan):.3f} (before {res.get('val_acc_before', nan):.3f})"
                      f", {res.get('gen_samples_total')} samples, {time.time() - t0:.0f}s wall, "
                      f"{res['cpu_seconds']:.0f}s CPU", flush=True)  # fmt: skip
            res["train_acc_last10"] = _train_acc_last(run_dir, 10)
            results[name].append(res)
    table = ablation_table(results, targets)
    out.mkdir(parents=True, exist_ok=True)
    png = ablation_plot(results, out / "ablation.png")
    meta = run_meta("dapo bench ablation " + " ".join(argv), results, load0, t_start)
    (out / "ablation.md").write_text(meta + "\n" + table + "\n")
    (out / "ablation.json").write_text(json.dumps({"targets": targets, "seeds": seeds, "results": results}, indent=2))
    print(table)
    print(f"\n{meta}\nplot: {png}")
    return 0

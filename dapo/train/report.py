"""``dapo report RUN``: the DAPO health plots of a run, regenerated from its ``metrics.jsonl``.

Panels (the curves the DAPO paper watches, Fig. 2-7): mean response length, reward score (training batch after
filtering, and all generated responses), generation entropy, mean token probability, ``num_gen_batches``, clip
fractions (upper = the clipped term active, lower = dual clip), kept-group ratio, validation accuracy, and the share
of responses at the length cap / penalised by the overlong shaping. Also prints a one-screen text summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional

from dapo.train.metrics import read_jsonl, val_accuracy
from dapo.train.verl_log import attempt_logs, read_console_logs

PANELS: list[tuple[str, list[tuple[str, str]]]] = [
    ("mean response length (tokens)", [("response_length/mean", "training batch")]),
    ("reward score", [
        ("critic/score/mean", "training batch (after filtering)"), ("train/gen_score/mean", "all generated"),
    ]),
    ("generation entropy", [("actor/entropy", "actor/entropy")]),
    ("mean token probability", [("actor/mean_prob", "actor/mean_prob")]),
    ("generation batches per step", [("train/num_gen_batches", "train/num_gen_batches")]),
    ("clip fractions", [
        ("actor/pg_clipfrac", "pg_clipfrac (upper/lower clip)"),
        ("actor/pg_clipfrac_lower", "pg_clipfrac_lower (dual clip)"),
    ]),
    ("kept-group ratio (dynamic sampling)", [("train/kept_group_ratio", "kept / generated groups")]),
    ("validation accuracy", []),  # filled with every val-core/*/acc/mean@k
    ("length cap", [
        ("response_length/clip_ratio", "at max_response_length"),
        ("train/gen_overlong_ratio", "overlong-penalised"),
    ]),
]  # fmt: skip


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if v is not None:
            xs.append(int(r["step"]))
            ys.append(float(v))
    return xs, ys


def plot_records(records: list[dict[str, Any]], out: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 3, figsize=(15, 11))
    val_keys = sorted({k for r in records for k in r if k.startswith("val-core/") and "/acc/mean@" in k})
    for ax, (name, series) in zip(axes.flat, PANELS):
        if name == "validation accuracy":
            series = [(k, k.removeprefix("val-core/")) for k in val_keys]
        drawn = False
        for key, label in series:
            xs, ys = _series(records, key)
            if xs:
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
                drawn = True
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")
    fig.suptitle(title or "DAPO health")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.stem + ".tmp.png")
    fig.savefig(tmp, dpi=80)
    plt.close(fig)
    tmp.replace(out)
    return out


def plot_run(run_dir: Path | str, out: Optional[Path | str] = None) -> Path:
    """Write ``<run_dir>/health.png`` (or ``out``) from ``<run_dir>/metrics.jsonl``."""
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    records = read_jsonl(path)
    if not records:
        raise FileNotFoundError(f"{path}: no metrics (is {run_dir} a run directory?)")
    return plot_records(records, Path(out) if out else run_dir / "health.png", title=f"DAPO health: {run_dir.name}")


def plot_eval(eval_dir: Path | str, out: Optional[Path | str] = None) -> Path:
    """``<eval_dir>/accuracy.png``: accuracy against training step, one panel per benchmark, from the evaluation
    directory's ``results.csv`` (``dapo eval run --step all``): avg@k (the DAPO verifier; MATH-500 also math-verify),
    pass@k and cons@k, beside the published DAPO points (:data:`dapo.data.benchmarks.PUBLISHED`: AIME-2024 avg@32 at the
    end of training, drawn as horizontal reference lines: the paper prints no per-step values)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dapo.data.benchmarks import BENCHMARKS, PUBLISHED
    from dapo.eval.results import collect

    eval_dir = Path(eval_dir)
    rows = [r for r in collect(eval_dir) if r["step"] is not None and r["complete"]]
    if not rows:
        raise FileNotFoundError(f"{eval_dir}: no complete evaluation of a global_step_N (run dapo eval run --step all)")
    names = sorted({r["benchmark"] for r in rows}, key=lambda n: list(BENCHMARKS).index(n) if n in BENCHMARKS else 99)
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        mine = sorted((r for r in rows if r["benchmark"] == name), key=lambda r: r["step"])
        steps = [r["step"] for r in mine]
        k = mine[-1]["k"]
        series = [("avg", f"avg@{k} (DAPO verifier)", "-"), ("avg_math_verify", f"avg@{k} (math-verify)", "-"),
                  ("pass", f"pass@{k}", ":"), ("cons", f"cons@{k}", "--")]  # fmt: skip
        for key, label, style in series:
            pts = [(s, 100 * r[key]) for s, r in zip(steps, mine) if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), style, marker="o", markersize=3, label=label)
        for ref in PUBLISHED.get(name, []):
            ax.axhline(100 * ref["avg"], color="gray", linestyle="-.", linewidth=1)
            ax.annotate(ref["label"], (0.01, 100 * ref["avg"]), xycoords=("axes fraction", "data"), fontsize=7,
                        color="gray", va="bottom")
        title = BENCHMARKS[name].title if name in BENCHMARKS else name
        ax.set_title(f"{title} ({mine[-1]['problems']} problems x {k})")
        ax.set_xlabel("training step")
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle(f"accuracy over training: {eval_dir}")
    fig.tight_layout()
    out = Path(out) if out else eval_dir / "accuracy.png"
    tmp = out.with_name(out.stem + ".tmp.png")
    fig.savefig(tmp, dpi=80)
    plt.close(fig)
    tmp.replace(out)
    return out


def is_eval_dir(path: Path) -> bool:
    """An evaluation output directory (``dapo eval run --output``), not a training run."""
    return (path / "results.csv").exists() or (
        not (path / "metrics.jsonl").exists() and any(path.glob("global_step_*/**/summary.json"))
    )


def text_summary(records: list[dict[str, Any]]) -> str:
    steps = [r for r in records if int(r.get("step", 0)) > 0 and "timing_s/step" in r]
    vals = [(int(r["step"]), val_accuracy(r)) for r in records if val_accuracy(r) is not None]
    lines = [f"{len(steps)} training steps recorded"]
    if vals:
        lines.append("validation accuracy: " + ", ".join(f"step {s}: {a:.3f}" for s, a in vals))
    if steps:
        last = steps[-1]
        for k in ("train/gen_acc/mean", "response_length/mean", "actor/entropy", "actor/mean_prob",
                  "train/num_gen_batches", "train/kept_group_ratio", "train/gen_samples_total"):  # fmt: skip
            if last.get(k) is not None:
                lines.append(f"last step {k} = {last[k]:.4g}")
        tot = sum(r.get("timing_s/step", 0.0) or 0.0 for r in steps)
        lines.append(f"step time total {tot:.0f}s, mean {tot / len(steps):.2f}s")
    return "\n".join(lines)


def attempts_summary(run: Path) -> list[str]:
    """How the run's attempts ended (their end records), where their evidence is, and what the log follower did
    (``failures.json``: failures counted, nodes left out, why it stopped the run); no line when there is none."""
    from dapo.train import attempts

    lines = []
    ends = attempts.end_records(run / "logs")
    if ends:
        lines.append("attempts: " + "; ".join(f"{e['attempt']} {e.get('cause')} at step {e.get('step')}"
                                              for e in ends[-10:]))
    root = attempts.evidence_dir(run, 0).parent
    kept = sorted((d.name for d in root.iterdir() if d.is_dir()), key=lambda x: (len(x), x)) if root.is_dir() else []
    if kept:
        lines.append(f"evidence: {root} ({', '.join(kept)})")
    record = attempts.read_json(run / attempts.FAILURES_FILE)
    if record:
        out = ", ".join(e["node"] for e in record.get("left_out") or []) or "none"
        lines.append(f"the follower counted {len(record.get('failures') or [])} failed attempt(s); nodes left out: {out}"
                     + (f"; it stopped the run: {record['stopped']['why']}" if record.get("stopped") else ""))
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="dapo report", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="run directory (holds metrics.jsonl), e.g. runs/tiny; an evaluation directory "
                   "(dapo eval run --output): accuracy against training step per benchmark; or a verl console log "
                   "(the reference runner's <ckpt>/logs/attempt-N.log) or the directory of those logs")
    p.add_argument("--out", default=None, help="PNG path (default RUN/health.png)")
    p.add_argument("--json", action="store_true", help="print the last record as JSON too")
    args = p.parse_args(argv)
    run = Path(args.run)
    if is_eval_dir(run):  # an evaluation directory: accuracy against step per benchmark
        from dapo.eval.results import collect, format_table

        try:
            png = plot_eval(run, args.out)
        except FileNotFoundError as exc:
            print(f"dapo report: {exc}", file=sys.stderr)
            return 1
        rows = collect(run)
        for step in sorted({r["step"] for r in rows if r["step"] is not None}):
            print(format_table([r for r in rows if r["step"] == step]))
        print(f"plot: {png}")
        return 0
    logs = attempt_logs(run) if not (run / "metrics.jsonl").exists() else []
    if logs:  # verl's console lines (the reference runner): the same panels
        records = read_console_logs(logs)
        if not records:
            print(f"dapo report: no verl console metric lines (step:N - key:value) in {run}", file=sys.stderr)
            return 1
        out = Path(args.out) if args.out else (run if run.is_dir() else run.parent) / "health.png"
        print(text_summary(records))
        print(f"plots: {plot_records(records, out, title=f'DAPO health: {run.name}')}")
        return 0
    try:
        png = plot_run(run, args.out)
    except FileNotFoundError as exc:
        print(f"dapo report: {exc}", file=sys.stderr)
        return 1
    records = read_jsonl(run / "metrics.jsonl")
    print(text_summary(records))
    for line in attempts_summary(run):
        print(line)
    if args.json and records:
        print(json.dumps(records[-1], indent=2, sort_keys=True))
    print(f"plots: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

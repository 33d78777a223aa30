"""The report of ``dapo bench mechanisms``: the summary table, the effect sizes, the steps-to-target ratio and the
figures (one per mechanism, mean ± seed sd per step), from the cached runs (:mod:`dapo.bench.mechanisms`).

Rules, fixed before the runs:

- an outcome is a run's mean over the second half of its steps (steps > last / 2); for validation accuracy, over the
  validations in that half;
- effect size d = (mean with - mean without) / sqrt((sd_with^2 + sd_without^2) / 2) over the seeds (sd with ddof 1);
  the effect "matches the paper" when its sign is the paper's and |d| >= 2, is "same direction, within noise" when the
  sign is right and |d| < 2, and "opposite" otherwise;
- the headline target is naive GRPO's validation accuracy averaged over its seeds and its validations at steps
  20-24 (``dapo.bench.mechanisms.TARGET_WINDOW``); steps (and generated responses) to the first validation at or
  above it, per seed.

Imports numpy, matplotlib (lazily) and :mod:`dapo.train.metrics`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import numpy as np

from dapo.backends.local.update import CLIP_HIGH_BINS, clip_high_key
from dapo.bench.precondition import THRESHOLDS


def _records(run: dict) -> list[dict]:
    from dapo.train.metrics import read_jsonl

    return [r for r in read_jsonl(Path(run["run_dir"]) / "metrics.jsonl") if int(r.get("step", 0)) > 0]


def series(run: dict, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of ``key`` in one run; ``val`` is the validation curve, ``val_per_sample`` the same against
    generated responses."""
    if key in ("val", "val_per_sample"):
        pts = [(s, a, x) for s, a, x in run["curve"] if a is not None and (x is not None or key == "val")]
        xs = [s if key == "val" else x for s, a, x in pts]
        return np.asarray(xs, dtype=float), np.asarray([a for _, a, _ in pts], dtype=float)
    recs = [r for r in _records(run) if r.get(key) is not None]
    return np.asarray([r["step"] for r in recs], dtype=float), np.asarray([r[key] for r in recs], dtype=float)


def second_half(run: dict, key: str) -> Optional[float]:
    x, y = series(run, "val" if key == "val" else key)
    if not len(y):
        return None
    return float(y[x > x.max() / 2].mean())


def effect(with_vals: list[float], without_vals: list[float], sign: int) -> dict:
    w, wo = np.asarray(with_vals, dtype=float), np.asarray(without_vals, dtype=float)
    sd = math.sqrt((w.std(ddof=1) ** 2 + wo.std(ddof=1) ** 2) / 2) if len(w) > 1 and len(wo) > 1 else float("nan")
    d = (w.mean() - wo.mean()) / sd if sd and sd > 0 else float("nan")
    if math.isnan(d):
        verdict = "undetermined (fewer than 2 seeds)"
    elif np.sign(d) == sign and abs(d) >= 2:
        verdict = "yes"
    elif np.sign(d) == sign:
        verdict = "same direction, within noise"
    else:
        verdict = "opposite"
    return {"with": [float(v) for v in w], "without": [float(v) for v in wo], "d": float(d), "verdict": verdict}


def clip_high_hist(runs: list[dict], max_step: Optional[int] = None) -> np.ndarray:
    """[seeds, bins] counts of up-clipped tokens per pi_old bin, summed over the steps (<= max_step)."""
    out = []
    for run in runs:
        recs = [r for r in _records(run) if max_step is None or r["step"] <= max_step]
        out.append([sum(r.get(clip_high_key(k), 0.0) for r in recs) for k in range(len(CLIP_HIGH_BINS) - 1)])
    return np.asarray(out, dtype=float)


def steps_to(run: dict, target: float) -> tuple[Optional[float], Optional[float]]:
    for s, a, x in run["curve"]:
        if s > 0 and a is not None and a >= target - 1e-9:  # the target is a mean of such accuracies: no rounding miss
            return float(s), (None if x is None else float(x))
    return None, None


def headline(results: dict[str, list[dict]], window: tuple[int, int]) -> Optional[dict]:
    if "naive GRPO" not in results or "DAPO" not in results:
        return None
    lo, hi = window
    vals = [a for r in results["naive GRPO"] for s, a, _ in r["curve"] if a is not None and lo <= s <= hi]
    if not vals:
        return None
    target = float(np.mean(vals))
    out = {"target": target, "window": [lo, hi]}
    for name in ("naive GRPO", "DAPO"):
        reach = [steps_to(r, target) for r in results[name]]
        out[name] = {"steps": [s for s, _ in reach], "samples": [x for _, x in reach]}
    means = {}
    for name in ("naive GRPO", "DAPO"):
        st = [s for s in out[name]["steps"] if s is not None]
        sa = [x for x in out[name]["samples"] if x is not None]
        means[name] = (np.mean(st) if st else None, np.mean(sa) if sa else None, len(st))
    n0, d0 = means["naive GRPO"], means["DAPO"]
    out["ratio_steps"] = float(d0[0] / n0[0]) if n0[0] and d0[0] else None
    out["ratio_samples"] = float(d0[1] / n0[1]) if n0[1] and d0[1] else None
    out["reached"] = {k: v[2] for k, v in means.items()}
    return out


def _band(ax, runs: list[dict], key: str, label: str) -> None:
    curves = [series(r, key) for r in runs]
    if not curves or not all(len(x) for x, _ in curves):
        return
    if key == "val_per_sample":  # the x values differ per seed: one thin line per seed, one colour per rung
        color = None
        for i, (x, y) in enumerate(curves):
            color = ax.plot(x, y, alpha=0.7, lw=1, color=color, label=f"{label} (each seed)" if i == 0 else None
                            )[0].get_color()  # fmt: skip
        return
    steps = sorted(set.intersection(*[set(x.tolist()) for x, _ in curves]))
    ys = np.asarray([[y[list(x).index(s)] for s in steps] for x, y in curves])
    m, sd = ys.mean(0), ys.std(0, ddof=1) if len(ys) > 1 else np.zeros(len(steps))
    line = ax.plot(steps, m, label=f"{label} (n={len(ys)})")[0]
    ax.fill_between(steps, m - sd, m + sd, color=line.get_color(), alpha=0.2)


LABELS = {"actor/entropy": "policy entropy (actor/entropy)",
          "rollout/entropy": "sampling entropy (rollout/entropy)", "response_length/mean": "mean response length (tokens)",
          "response_length/clip_ratio": "share of responses cut by the cap", "val": "validation accuracy",
          "val_per_sample": "validation accuracy"}  # fmt: skip


def mechanism_figure(mech: str, spec: dict, results: dict[str, list[dict]], out: Path) -> Path:
    """One row of panels: each of the mechanism's diagnostic curves, with / without, mean ± seed sd per step (for
    clip-higher a last panel: the pi_old histogram of the up-clipped tokens, the paper's Fig. 3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(spec["curves"]) + (["clip-hist"] if mech == "clip-higher" else [])
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.8), squeeze=False)
    pair = [("DAPO", "with (DAPO)"), (spec["without"], f"without ({spec['without']})")]
    for ax, key in zip(axes[0], keys):
        if key == "clip-hist":
            width = 0.08
            for i, (name, label) in enumerate(pair):
                h = clip_high_hist(results.get(name, []))
                if not len(h):
                    continue
                frac = h / np.maximum(h.sum(1, keepdims=True), 1)
                x = np.asarray(CLIP_HIGH_BINS[:-1]) + 0.1 + (i - 0.5) * width
                ax.bar(x, frac.mean(0), width, yerr=frac.std(0, ddof=1) if len(frac) > 1 else None, label=label)
            ax.set_xlabel("pi_old of the up-clipped tokens")
            ax.set_ylabel("share of up-clipped tokens")
            ax.set_xticks(CLIP_HIGH_BINS)
        else:
            for name, label in pair:
                _band(ax, results.get(name, []), key, label)
            ax.set_xlabel("generated responses" if key == "val_per_sample" else "rollout step")
            ax.set_ylabel(LABELS.get(key, key))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{mech} ({spec['figure']} of the DAPO paper, in miniature): mean ± seed sd")
    fig.tight_layout()
    path = out / f"mech-{mech.replace(' ', '-')}.png"
    fig.savefig(path, dpi=70)
    plt.close(fig)
    return path


def headline_figure(results: dict[str, list[dict]], target: Optional[float], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for name in ("naive GRPO", "DAPO"):
        _band(axes[0], results.get(name, []), "val", name)
        _band(axes[1], results.get(name, []), "val_per_sample", name)
    for ax, xl in zip(axes, ("rollout step", "generated responses")):
        if target is not None:
            ax.axhline(target, color="k", ls="--", lw=0.8, label=f"target {target:.3f}")
        ax.set_xlabel(xl)
        ax.set_ylabel("validation accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("DAPO vs naive GRPO on tiny-mech: mean ± seed sd")
    fig.tight_layout()
    path = out / "mech-headline.png"
    fig.savefig(path, dpi=70)
    plt.close(fig)
    return path


def _mean_sd(vals: list[float], spec: str = ".3f") -> str:
    v = [x for x in vals if x is not None]
    if not v:
        return "-"
    sd = np.std(v, ddof=1) if len(v) > 1 else 0.0
    return f"{format(float(np.mean(v)), spec)} ± {format(float(sd), spec)}"


def precondition_rows(pre: dict, results: dict[str, list[dict]]) -> dict[str, str]:
    """mechanism -> its precondition, measured (warm start; clip-higher: the first 5 steps of the DAPO runs)."""
    h = clip_high_hist(results.get("DAPO", []), max_step=5)
    low = h[:, 0].sum() / h.sum() if len(h) and h.sum() > 0 else float("nan")
    pre["clip_high_lowprob_share"] = float(low)
    pre["clip_high_tokens_first5"] = float(h.sum()) if len(h) else 0.0

    nan = float("nan")

    def row(key: str, what: str, sign: str = ">=") -> str:
        v = pre.get(key, nan)
        if math.isnan(v):
            return f"{what}: not measured"
        return f"{what} {v:.2f} (needs {sign} {THRESHOLDS[key]}: {'holds' if v >= THRESHOLDS[key] else 'FAILS'})"

    return {
        "clip-higher": row("clip_high_lowprob_share", "share of up-clipped tokens with pi_old < 0.2 (steps 1-5, "
                           f"{pre['clip_high_tokens_first5']:.0f} tokens)"),
        "token-level loss": row("length_cv", "response-length CV") + f"; {pre.get('long_wrong_share', nan):.0%} of "
                            "the longer-than-median responses wrong",
        "overlong shaping": row("cap_share", f"share cut by the {pre.get('max_response_length', '?')}-token cap"),
        "dynamic sampling": row("uniform_group_share", "share of all-correct / all-wrong groups"),
    }


def write_report(results: dict[str, list[dict]], pre: dict, out: Path, meta: str, seeds: list[int],
                 mechanisms: dict[str, dict], window: tuple[int, int]) -> str:
    """``mechanisms.md`` / ``.json`` and the figures in ``out`` (``mechanisms``: :data:`dapo.bench.mechanisms.MECHANISMS`,
    ``window``: the steps whose naive GRPO accuracy sets the headline target); returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    pre_rows = precondition_rows(pre, results)
    lines = ["| mechanism | precondition at warm start | outcome (2nd half of the run) | with | without | "
             "effect (seed sd) | figure | matches the paper? |", "|---|---|---|---|---|---|---|---|"]
    effects = {}
    for mech, spec in mechanisms.items():
        if "DAPO" not in results or spec["without"] not in results:
            lines.append(f"| {mech} | {pre_rows[mech]} | not run | | | | | |")
            continue
        key, sign = spec["outcome"]
        w = [second_half(r, key) for r in results["DAPO"]]
        wo = [second_half(r, key) for r in results[spec["without"]]]
        eff = effect(w, wo, sign)
        effects[mech] = eff
        fig = mechanism_figure(mech, spec, results, out)
        lines.append(f"| {mech} | {pre_rows[mech]} | {LABELS.get(key, key)} ({'higher' if sign > 0 else 'lower'} "
                     f"with it in the paper) | {_mean_sd(w)} | {_mean_sd(wo)} | {eff['d']:+.1f} | "
                     f"{spec['figure']}: `{fig.name}` | {eff['verdict']} |")  # fmt: skip
    hl = headline(results, window)
    text = meta + "\n" + "\n".join(lines) + "\n"
    if hl:
        headline_figure(results, hl["target"], out)

        def fmt(v: list) -> str:
            return ", ".join("-" if x is None else f"{x:.0f}" for x in v)

        text += (
            f"\nheadline: target {hl['target']:.3f} (naive GRPO's mean validation accuracy at steps "
            f"{hl['window'][0]}-{hl['window'][1]}); rollout steps to it per seed: DAPO {fmt(hl['DAPO']['steps'])}, "
            f"naive GRPO {fmt(hl['naive GRPO']['steps'])}; ratio of the means "
            f"{'-' if hl['ratio_steps'] is None else format(hl['ratio_steps'], '.2f')}x (goal <= 0.5x); generated "
            f"responses: DAPO {fmt(hl['DAPO']['samples'])}, naive {fmt(hl['naive GRPO']['samples'])}, ratio "
            f"{'-' if hl['ratio_samples'] is None else format(hl['ratio_samples'], '.2f')}x; reached by "
            f"{hl['reached']['DAPO']}/{len(results['DAPO'])} DAPO and {hl['reached']['naive GRPO']}/"
            f"{len(results['naive GRPO'])} naive seeds\n"
        )
    finals = ["| rung | final val acc | val acc, 2nd half | entropy, 2nd half | length, 2nd half | responses / run |",
              "|---|---|---|---|---|---|"]
    for name, runs in results.items():
        finals.append(f"| {name} | {_mean_sd([r.get('val_acc_after') for r in runs])} | "
                      f"{_mean_sd([second_half(r, 'val') for r in runs])} | "
                      f"{_mean_sd([second_half(r, 'actor/entropy') for r in runs])} | "
                      f"{_mean_sd([second_half(r, 'response_length/mean') for r in runs], '.1f')} | "
                      f"{_mean_sd([r.get('gen_samples_total') for r in runs], '.0f')} |")  # fmt: skip
    text += "\n" + "\n".join(finals) + "\n"
    (out / "mechanisms.md").write_text(text)
    (out / "mechanisms.json").write_text(json.dumps(
        {"seeds": seeds, "preconditions": pre, "effects": effects, "headline": hl,
         "runs": {k: [{kk: vv for kk, vv in r.items() if kk != "counters"} for r in v] for k, v in results.items()}},
        indent=2, default=str))  # fmt: skip
    return text

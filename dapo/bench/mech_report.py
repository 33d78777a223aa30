"""The report of ``dapo bench mechanisms``: the summary table (each mechanism's precondition, its effect over the
pre-registered seeds and over the held-out seeds, the verdicts), the steps-to-target headline
(:mod:`dapo.bench.target`) and the figures (one per mechanism, mean ± seed sd per step), from the cached runs
(:mod:`dapo.bench.mechanisms`).

Rules, fixed before the runs:

- an outcome is a run's mean over the second half of its steps (steps > last / 2); for validation accuracy, over the
  validations in that half;
- effect size d = (mean with - mean without) / sqrt((sd_with^2 + sd_without^2) / 2) over the seeds (sd with ddof 1);
  the effect "matches the paper" ("yes") when its sign is the paper's and |d| >= 2, is "same direction, within
  noise" when the sign is right and |d| < 2, and "opposite" otherwise -- computed for the pre-registered seeds (the
  verdict) and, apart, for the held-out seeds (its replication), over the seeds whose with and without runs both
  finished; a group with fewer than all its seeds gets its d and "n of N seeds, no verdict", never a verdict;
- a precondition holds when every statistic of :data:`dapo.bench.precondition.THRESHOLDS` reaches its level on the
  warm-started policy; a verdict on a task whose precondition fails is reported as such.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import numpy as np

from dapo.backends.local.update import CLIP_HIGH_BINS, clip_high_key
from dapo.bench.precondition import verdicts
from dapo.bench.target import headline as target_headline


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




def mechanism_figure(mech: str, spec: dict, with_runs: list[dict], without_runs: list[dict], out: Path) -> Path:
    """One row of panels: each of the mechanism's diagnostic curves, with / without, mean ± seed sd per step
    (``clip-hist``: the pi_old histogram of the up-clipped tokens over the whole runs, the paper's Fig. 3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(spec["curves"])
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.8), squeeze=False)
    pair = [(with_runs, "with (DAPO)"), (without_runs, f"without ({spec['without']})")]
    for ax, key in zip(axes[0], keys):
        if key == "clip-hist":
            width = 0.08
            for i, (runs, label) in enumerate(pair):
                h = clip_high_hist(runs)
                if not len(h):
                    continue
                frac = h / np.maximum(h.sum(1, keepdims=True), 1)
                x = np.asarray(CLIP_HIGH_BINS[:-1]) + 0.1 + (i - 0.5) * width
                ax.bar(x, frac.mean(0), width, yerr=frac.std(0, ddof=1) if len(frac) > 1 else None, label=label)
            ax.set_xlabel("pi_old of the up-clipped tokens")
            ax.set_ylabel("share of up-clipped tokens")
            ax.set_xticks(CLIP_HIGH_BINS)
        else:
            for runs, label in pair:
                _band(ax, runs, key, label)
            ax.set_xlabel("generated responses" if key == "val_per_sample" else "rollout step")
            ax.set_ylabel(LABELS.get(key, key))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{mech} on {spec['preset']} ({spec['figure']} of the DAPO paper, in miniature): mean ± seed sd")
    fig.tight_layout()
    path = out / f"mech-{mech.replace(' ', '-')}.png"
    fig.savefig(path, dpi=70)
    plt.close(fig)
    return path


def headline_figure(dapo: list[dict], naive: list[dict], target: Optional[float], out: Path, name: str, preset: str,
                    filename: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for rung, runs in (("naive GRPO", naive), ("DAPO", dapo)):
        _band(axes[0], runs, "val", rung)
        _band(axes[1], runs, "val_per_sample", rung)
    for ax, xl in zip(axes, ("rollout step", "generated responses")):
        if target is not None:
            ax.axhline(target, color="k", ls="--", lw=0.8, label=f"target {target:.3f}")
        ax.set_xlabel(xl)
        ax.set_ylabel("validation accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{name}: DAPO vs naive GRPO on {preset}: mean ± seed sd (every seed)")
    fig.tight_layout()
    path = out / filename
    fig.savefig(path, dpi=70)
    plt.close(fig)
    return path


def _mean_sd(vals: list[float], spec: str = ".3f") -> str:
    v = [x for x in vals if x is not None]
    if not v:
        return "-"
    if len(v) == 1:  # one seed has no spread: its value alone, not "± 0"
        return f"{format(float(v[0]), spec)} (1 seed)"
    return f"{format(float(np.mean(v)), spec)} ± {format(float(np.std(v, ddof=1)), spec)}"




def precondition_cell(mech: str, pre: Optional[dict]) -> str:
    """The measured precondition of ``mech`` on its task's warm start, against its thresholds."""
    if not pre:
        return "not measured"
    v = verdicts(pre)[mech]
    checks = "; ".join(f"{k} {'-' if x is None else format(x, '.3f')} (needs >= {need})" for k, x, need in v["checks"])
    return f"{'holds' if v['holds'] else 'FAILS'}: {checks}"


def seed_count_verdict(n: int, planned: int) -> Optional[str]:
    """``None`` when all ``planned`` seeds of a group finished both runs, else the verdict that stands in for the
    rule's: "n of N seeds, no verdict" (the rule was fixed for N seeds; fewer decide nothing)."""
    return None if n >= planned else f"{n} of {planned} seeds, no verdict"


def _effects(mech: str, spec: dict, results: dict, groups: dict[str, list[int]]) -> dict:
    """Per seed group: the effect over the seeds whose with *and* without runs finished (paired), its verdict only
    when that is every seed of the group."""
    key, sign = spec["outcome"]
    w_runs, wo_runs = results.get((spec["preset"], "DAPO"), {}), results.get((spec["preset"], spec["without"]), {})
    out = {}
    for gname, seeds in groups.items():
        paired = [s for s in seeds if s in w_runs and s in wo_runs]
        if not paired:
            continue
        e = effect([second_half(w_runs[s], key) for s in paired], [second_half(wo_runs[s], key) for s in paired], sign)
        e["seeds"] = paired
        e["verdict"] = seed_count_verdict(len(paired), len(seeds)) or e["verdict"]
        out[gname] = e
    return out


def _fmt_effect(e: Optional[dict]) -> list[str]:
    if e is None:
        return ["-", "-", "-", "not run"]
    d = "-" if math.isnan(e["d"]) else f"{e['d']:+.1f}"
    return [_mean_sd(e["with"]), _mean_sd(e["without"]), d, f"{e['verdict']} (seeds {', '.join(map(str, e['seeds']))})"]


def _headline_text(name: str, preset: str, hl: dict, pre: Optional[dict]) -> str:
    r = hl["rule"]
    text = (f"\n{name} ({preset}): dynamic sampling's precondition at warm start "
            f"{precondition_cell('dynamic sampling', pre)}\n"
            f"{name} ({preset}) target: a0 {r['a0']:.3f} (warm start, mean of {r['n_step0']} step-0 validations; one "
            f"validation's sd {r['sigma_val']:.4f}, the set's SE {r['se_set']:.4f}); naive GRPO's final gain "
            f"{r['gain']:+.3f}; target a0 + {r['fraction']} x gain = {r['target']:.3f}, {r['margin_sd']:.1f} sd of "
            f"the smoothed curve and {r['margin_se_set']:.1f} SE of the set above a0: "
            f"{'decidable' if r['decidable'] else 'NOT decidable (below the noise rule)'}\n\n"
            "| seeds | DAPO steps to target | naive GRPO steps | ratio (95 % interval) | verdict | generated "
            "responses, DAPO / naive |\n|---|---|---|---|---|---|\n")

    def fmt(v: list) -> str:
        return ", ".join("not reached" if x is None else f"{x:.0f}" for x in v)

    for gname, g in hl["groups"].items():
        rs = "-" if g["ratio_samples"] is None else f"{g['ratio_samples']:.2f}x"
        text += (f"| {gname} ({', '.join(map(str, g['seeds']))}) | {fmt(g['DAPO']['steps'])} | "
                 f"{fmt(g['naive GRPO']['steps'])} | {g['ratio']:.2f}x ({g['lo']:.2f}-{g['hi']:.2f}) | {g['verdict']} "
                 f"| {rs} |\n")  # fmt: skip
    return text


def write_report(results: dict[tuple[str, str], dict], pre: dict[str, dict], out: Path, meta: str,
                 groups: dict[str, list[int]], mechanisms: dict[str, dict], headlines: dict[str, dict]) -> str:
    """``mechanisms.md`` / ``.json`` and the figures in ``out``; returns the markdown. ``results``: (preset, rung) ->
    {seed: run}; ``pre``: preset -> its preconditions; ``groups``: the seed groups reported apart; ``mechanisms``:
    the selected entries of :data:`dapo.bench.mechanisms.MECHANISMS`; ``headlines``: the selected entries of
    :data:`dapo.bench.mechanisms.HEADLINES` (name -> spec), each reported when both its rungs have runs."""
    from dapo.config import load_preset

    out.mkdir(parents=True, exist_ok=True)
    groups = {k: v for k, v in groups.items() if v}
    head = ["mechanism", "task", "precondition at warm start", "outcome (2nd half)"]
    for gname in groups:
        head += [f"with ({gname})", f"without ({gname})", f"d ({gname})", f"verdict ({gname})"]
    lines = ["| " + " | ".join(head + ["figure"]) + " |", "|" + "---|" * (len(head) + 1)]
    effects = {}
    for mech, spec in mechanisms.items():
        effects[mech] = _effects(mech, spec, results, groups)
        key, sign = spec["outcome"]
        w_runs = list(results.get((spec["preset"], "DAPO"), {}).values())
        wo_runs = list(results.get((spec["preset"], spec["without"]), {}).values())
        fig = mechanism_figure(mech, spec, w_runs, wo_runs, out).name if w_runs and wo_runs else "-"
        cells = [mech, spec["preset"], precondition_cell(mech, pre.get(spec["preset"])),
                 f"{LABELS.get(key, key)} ({'higher' if sign > 0 else 'lower'} with it in the paper)"]
        for gname in groups:
            cells += _fmt_effect(effects[mech].get(gname))
        lines.append("| " + " | ".join(cells + [f"{spec['figure']}: `{fig}`"]) + " |")
    text = meta + "\n" + "\n".join(lines) + "\n"
    hls: dict[str, dict] = {}
    groups_all = {**groups, "all": [s for g in groups.values() for s in g]} if len(groups) > 1 else groups
    for name, spec in headlines.items():
        preset, (rd, rn) = spec["preset"], spec["rungs"]
        dapo, naive = results.get((preset, rd), {}), results.get((preset, rn), {})
        if not (dapo and naive):
            continue
        p = load_preset(preset)
        hl = target_headline({s: r["curve"] for s, r in dapo.items()}, {s: r["curve"] for s, r in naive.items()},
                             p.local.task.n_val if p.local else 0, p.recipe.trainer.total_training_steps, groups_all)
        headline_figure(list(dapo.values()), list(naive.values()), hl["rule"]["target"], out, name, preset,
                        spec["figure"])  # fmt: skip
        text += _headline_text(name, preset, hl, pre.get(preset))
        hls[name] = {"preset": preset, **hl}
    finals = ["| task | rung | seeds | final val acc | val acc, 2nd half | entropy, 2nd half | length, 2nd half | "
              "responses / run |", "|---|---|---|---|---|---|---|---|"]
    for (preset, rung), runs in results.items():
        rs = list(runs.values())
        finals.append(f"| {preset} | {rung} | {len(rs)} | {_mean_sd([r.get('val_acc_after') for r in rs])} | "
                      f"{_mean_sd([second_half(r, 'val') for r in rs])} | "
                      f"{_mean_sd([second_half(r, 'actor/entropy') for r in rs])} | "
                      f"{_mean_sd([second_half(r, 'response_length/mean') for r in rs], '.1f')} | "
                      f"{_mean_sd([r.get('gen_samples_total') for r in rs], '.0f')} |")  # fmt: skip
    text += "\n" + "\n".join(finals) + "\n"
    (out / "mechanisms.md").write_text(text)
    (out / "mechanisms.json").write_text(json.dumps(
        {"groups": groups, "preconditions": pre, "precondition_verdicts": {p: verdicts(v) for p, v in pre.items()},
         "effects": effects, "headlines": hls,
         "runs": {f"{k[0]}/{k[1]}": {s: {kk: vv for kk, vv in r.items() if kk != "counters"} for s, r in v.items()}
                  for k, v in results.items()}},
        indent=2, default=str))  # fmt: skip
    return text

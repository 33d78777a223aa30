"""Steps to a target that validation noise cannot decide: the headline of ``dapo bench mechanisms`` (DAPO vs naive
GRPO, docs/ablation.md), with its interval over seeds.

The rule, fixed before the runs (the constants below):

- ``a0``, the warm start's validation accuracy: the mean of every run's step-0 validation. All runs start from the
  same weights and each validates from its own sampling stream, so the spread of those step-0 accuracies,
  ``sigma_val`` (sd, ddof 1), is the noise of one validation; the validation set's standard error
  ``se_set = sqrt(a0 (1 - a0) / n_problems)`` (how far the set's accuracy may sit from the task's) is stated beside it.
- ``gain``: naive GRPO's final gain -- its validation accuracy averaged over its seeds and its last
  :data:`FINAL_VALIDATIONS` validations, minus ``a0``; the **target** is ``a0 + FRACTION * gain``.
- a run's curve is smoothed by the centred mean of :data:`SMOOTH` consecutive validations (validation every step);
  its **steps to target** are the first step >= 1 whose smoothed accuracy reaches the target. A run that never
  reaches it counts as ``total_steps + 1`` (a lower bound, flagged).
- the target is **decidable** when ``FRACTION * gain >= MIN_MARGIN * sigma_val / sqrt(SMOOTH)``: the target sits
  at least :data:`MIN_MARGIN` standard deviations of the smoothed curve above the warm start.
- the ratio ``R = mean(steps, DAPO) / mean(steps, naive GRPO)``; its 95 % interval: percentile bootstrap over seeds
  (each rung's seeds resampled with replacement, :data:`N_BOOT` draws, numpy seed 0).
- verdict against the paper's <= 0.5x: ``meets`` when the interval's upper end is <= 0.5; ``meets at the point
  estimate only`` when R <= 0.5 < upper end; otherwise ``misses by R - 0.5`` -- given only when every seed of the
  group finished both runs and the target is decidable; otherwise the ratio and its interval are reported with "n of
  N seeds, no verdict" or "target not decidable (within validation noise), no verdict".
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

FRACTION = 0.5
FINAL_VALIDATIONS = 5
SMOOTH = 3
MIN_MARGIN = 3.0
N_BOOT = 10_000
GOAL = 0.5

Curve = Sequence[tuple]  # (step, validation accuracy or None, generated responses so far or None)


def _points(curve: Curve) -> list[tuple[int, float, Optional[float]]]:
    return sorted((int(s), float(a), x) for s, a, x in curve if a is not None)


def smoothed(curve: Curve, width: int = SMOOTH) -> list[tuple[int, float]]:
    """(step, centred mean of the ``width`` validations around it) for every validated step; at either end of the
    run the window is cut to the validations there are."""
    pts = _points(curve)
    h = width // 2
    return [(s, float(np.mean([a for _, a, _ in pts[max(0, i - h): i + h + 1]]))) for i, (s, _, _) in enumerate(pts)]


def steps_to_target(curve: Curve, target: float, width: int = SMOOTH) -> tuple[Optional[int], Optional[float]]:
    """(first step >= 1 whose smoothed accuracy is >= ``target``, generated responses by then); (None, None) when
    never."""
    samples = {int(s): x for s, a, x in curve}
    for s, a in smoothed(curve, width):
        if s >= 1 and a >= target - 1e-12:  # the target is itself a mean of such accuracies: no rounding miss
            x = samples.get(s)
            return s, None if x is None else float(x)
    return None, None


def target_rule(naive_curves: list[Curve], all_curves: list[Curve], n_problems: int,
                fraction: float = FRACTION, final: int = FINAL_VALIDATIONS, width: int = SMOOTH,
                min_margin: float = MIN_MARGIN) -> dict:
    """The target of the module docstring from naive GRPO's curves (its final level) and every run's step-0
    validation (the warm start and its noise)."""
    step0 = [a for c in all_curves for s, a, _ in _points(c) if s == 0]
    if not step0 or not naive_curves:
        raise ValueError("the target needs step-0 validations and naive GRPO's curves")
    a0 = float(np.mean(step0))
    sigma = float(np.std(step0, ddof=1)) if len(step0) > 1 else float("nan")
    finals = [np.mean([a for _, a, _ in _points(c)[-final:]]) for c in naive_curves]
    gain = float(np.mean(finals)) - a0
    target = a0 + fraction * gain
    noise = sigma / math.sqrt(width)
    se_set = math.sqrt(max(a0 * (1 - a0), 0.0) / n_problems) if n_problems > 0 else float("nan")
    return {"a0": a0, "sigma_val": sigma, "se_set": se_set, "n_step0": len(step0), "gain": gain,
            "fraction": fraction, "target": target, "margin_sd": (target - a0) / noise if noise > 0 else float("nan"),
            "margin_se_set": (target - a0) / se_set if se_set > 0 else float("nan"),
            "decidable": bool(noise > 0 and target - a0 >= min_margin * noise)}  # fmt: skip


def ratio_interval(num: Sequence[float], den: Sequence[float], n_boot: int = N_BOOT, level: float = 0.95,
                   seed: int = 0) -> tuple[float, float, float]:
    """(mean(num) / mean(den), and the percentile-bootstrap interval over seeds: each sample resampled with
    replacement, independently)."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if not len(num) or not len(den) or den.mean() <= 0:
        raise ValueError("the ratio needs steps for both rungs")
    rng = np.random.default_rng(seed)
    bn = num[rng.integers(0, len(num), (n_boot, len(num)))].mean(1)
    bd = den[rng.integers(0, len(den), (n_boot, len(den)))].mean(1)
    ratios = bn / bd
    lo, hi = np.quantile(ratios, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(num.mean() / den.mean()), float(lo), float(hi)


def ratio_verdict(ratio: float, hi: float, goal: float = GOAL) -> str:
    """The verdict of the module docstring for a ratio and its interval's upper end."""
    if hi <= goal:
        return f"meets <= {goal}x"
    if ratio <= goal:
        return f"meets <= {goal}x at the point estimate only (interval up to {hi:.2f}x)"
    return f"misses {goal}x by {ratio - goal:.2f}x"


def headline(dapo: dict[int, Curve], naive: dict[int, Curve], n_problems: int, total_steps: int,
             groups: dict[str, list[int]]) -> dict:
    """The target (from every seed's runs) and, per group of seeds (e.g. the pre-registered and the held-out ones,
    and all), the steps and generated responses to it per seed, the ratio with its interval, and the verdict.
    ``dapo`` / ``naive``: seed -> validation curve."""
    rule = target_rule(list(naive.values()), list(dapo.values()) + list(naive.values()), n_problems)
    out: dict = {"rule": rule, "groups": {}}
    for gname, seeds in groups.items():
        g: dict = {"seeds": [s for s in seeds if s in dapo and s in naive]}
        if not g["seeds"]:
            continue
        for name, runs in (("DAPO", dapo), ("naive GRPO", naive)):
            reach = [steps_to_target(runs[s], rule["target"]) for s in g["seeds"]]
            g[name] = {"steps": [st for st, _ in reach], "samples": [x for _, x in reach],
                       "reached": sum(st is not None for st, _ in reach)}  # fmt: skip
        d = [total_steps + 1 if st is None else st for st in g["DAPO"]["steps"]]
        n = [total_steps + 1 if st is None else st for st in g["naive GRPO"]["steps"]]
        g["ratio"], g["lo"], g["hi"] = ratio_interval(d, n)
        g["verdict"] = (f"{len(g['seeds'])} of {len(seeds)} seeds, no verdict" if len(g["seeds"]) < len(seeds) else
                        "target not decidable (within validation noise), no verdict" if not rule["decidable"] else
                        ratio_verdict(g["ratio"], g["hi"]))  # fmt: skip
        xd = [x for x in g["DAPO"]["samples"] if x is not None]
        xn = [x for x in g["naive GRPO"]["samples"] if x]
        g["ratio_samples"] = float(np.mean(xd) / np.mean(xn)) if xd and xn else None  # over the seeds that reach it
        out["groups"][gname] = g
    return out

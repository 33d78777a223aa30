"""AIME-style evaluation metrics over k sampled answers per problem (pure functions, no I/O).

Notation: problem ``p`` has ``n_p`` sampled answers, ``c_p`` of them correct (the verifier's ``acc``), ``P`` problems,
``N = sum_p n_p`` answers in all. The DAPO test file repeats each of the 30 AIME-2024 problems 32 times
(960 rows), one sample per row.

- ``avg@k`` (``acc/mean@k``, the paper's "AIME 50"): ``sum_p c_p / N``, the mean accuracy over *all* answers.
  With the same ``k`` answers per problem this equals the mean over problems of the per-problem accuracy
  ``c_p / n_p``. It estimates pass@1 at temperature 1.0 / top_p 0.7 with ``k`` samples per problem; it is what
  the DAPO repository's ``eval_aime24.py`` prints as ``acc/mean@32`` and what verl logs as
  ``val-core/<data_source>/acc/mean@32``.
- ``pass@k``: the unbiased estimator of Chen et al. 2021 (arXiv 2107.03374, eq. 1),
  ``pass@k = mean_p [1 - C(n_p - c_p, k) / C(n_p, k)]``; with ``k = n_p`` it is the fraction of problems with at
  least one correct answer ("any correct"), with ``k = 1`` it is ``mean_p c_p / n_p``.
- ``cons@k`` (majority vote, "maj@k"): per problem, the most frequent *valid* prediction among its answers
  (the verifier's normalised ``pred``; answers without an extractable prediction abstain); ties go to the
  prediction seen first in row order; the problem counts as solved when that prediction is correct. A problem
  where every answer abstains counts as unsolved. (verl's ``maj@N`` lets the invalid marker vote and bootstraps
  subsets; this is the plain vote over all ``k`` answers.)
"""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from dapo.reward import INVALID

# Predictions that mean "no answer could be extracted": they abstain from the majority vote.
INVALID_PREDICTIONS = frozenset({"", INVALID})


@dataclass(frozen=True)
class ScoredAnswer:
    """One verified answer (one row of the test file)."""

    row: int
    problem: str
    acc: bool
    pred: Optional[str] = None
    completion_tokens: Optional[int] = None
    # "stop" (ended by itself) or "length" (cut at max_tokens), as the OpenAI API reports it.
    finish_reason: Optional[str] = None


def group_by_problem(answers: Iterable[ScoredAnswer]) -> "OrderedDict[str, list[ScoredAnswer]]":
    """Answers per problem, problems in order of first appearance, answers in row order."""
    groups: "OrderedDict[str, list[ScoredAnswer]]" = OrderedDict()
    for a in sorted(answers, key=lambda a: a.row):
        groups.setdefault(a.problem, []).append(a)
    return groups


def avg_at_k(answers: Sequence[ScoredAnswer]) -> float:
    """``sum_p c_p / N``: mean accuracy over all answers (acc/mean@k). NaN for no answers."""
    if not answers:
        return math.nan
    return sum(1 for a in answers if a.acc) / len(answers)


def pass_at_k_estimate(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``n`` samples, ``c`` correct: ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= correct <= samples, got correct={c}, samples={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= samples per problem, got k={k}, samples={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_k(answers: Sequence[ScoredAnswer], k: Optional[int] = None) -> float:
    """Mean over problems of the unbiased pass@k; ``k=None`` uses each problem's own ``n_p`` (any correct)."""
    groups = group_by_problem(answers)
    if not groups:
        return math.nan
    vals = []
    for group in groups.values():
        n, c = len(group), sum(1 for a in group if a.acc)
        vals.append(pass_at_k_estimate(n, c, n if k is None else k))
    return sum(vals) / len(vals)


def majority_vote(answers: Sequence[ScoredAnswer]) -> Optional[ScoredAnswer]:
    """The first answer carrying the most frequent valid prediction (ties: first seen in row order); None if all
    answers abstain."""
    counts: "OrderedDict[str, int]" = OrderedDict()
    first: dict[str, ScoredAnswer] = {}
    for a in sorted(answers, key=lambda a: a.row):
        if a.pred is None or a.pred.strip() in INVALID_PREDICTIONS:
            continue
        counts[a.pred] = counts.get(a.pred, 0) + 1
        first.setdefault(a.pred, a)
    if not counts:
        return None
    best = max(counts.values())
    winner = next(p for p, c in counts.items() if c == best)  # OrderedDict: first seen wins a tie
    return first[winner]


def cons_at_k(answers: Sequence[ScoredAnswer]) -> float:
    """Fraction of problems whose majority-vote prediction is correct (see module docstring)."""
    groups = group_by_problem(answers)
    if not groups:
        return math.nan
    solved = 0
    for group in groups.values():
        vote = majority_vote(group)
        solved += int(vote is not None and vote.acc)
    return solved / len(groups)


def per_problem(answers: Sequence[ScoredAnswer]) -> list[dict]:
    """One record per problem: samples, correct, accuracy, pass (any correct), the voted prediction and whether it
    is correct, the distinct predictions with counts."""
    out = []
    for problem, group in group_by_problem(answers).items():
        c = sum(1 for a in group if a.acc)
        vote = majority_vote(group)
        preds: dict[str, int] = {}
        for a in group:
            preds[str(a.pred)] = preds.get(str(a.pred), 0) + 1
        out.append(
            {
                "problem": problem,
                "samples": len(group),
                "correct": c,
                "acc": c / len(group),
                "pass": c > 0,
                "cons_pred": None if vote is None else vote.pred,
                "cons_correct": bool(vote is not None and vote.acc),
                "predictions": dict(sorted(preds.items(), key=lambda kv: -kv[1])),
            }
        )
    return out


def _percentile(sorted_vals: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of already sorted values."""
    if not sorted_vals:
        return math.nan
    pos = (len(sorted_vals) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def length_stats(answers: Sequence[ScoredAnswer]) -> dict:
    """Response length (completion tokens) statistics, overall and split by correctness, plus the clip ratio (share
    of answers cut at max_tokens, ``finish_reason == "length"``)."""

    def stats(vals: list[int]) -> dict:
        if not vals:
            return {"count": 0, "mean": math.nan, "min": math.nan, "p50": math.nan, "p90": math.nan, "max": math.nan}
        s = sorted(vals)
        return {
            "count": len(s),
            "mean": statistics.fmean(s),
            "min": s[0],
            "p50": _percentile(s, 0.5),
            "p90": _percentile(s, 0.9),
            "max": s[-1],
        }

    known = [a for a in answers if a.completion_tokens is not None]
    return {
        "all": stats([a.completion_tokens for a in known]),
        "correct": stats([a.completion_tokens for a in known if a.acc]),
        "incorrect": stats([a.completion_tokens for a in known if not a.acc]),
        "clip_ratio": (sum(1 for a in answers if a.finish_reason == "length") / len(answers)) if answers else math.nan,
    }


def samples_per_problem(answers: Sequence[ScoredAnswer]) -> int:
    """The ``k`` that names the metrics: the largest number of answers any problem has (all equal when complete)."""
    groups = group_by_problem(answers)
    return max((len(g) for g in groups.values()), default=0)


def aime_metrics(answers: Sequence[ScoredAnswer]) -> dict:
    """The headline metrics, keyed like the DAPO script / verl (``acc/mean@32``, ``pass@32``, ``cons@32``) where
    ``32`` is the number of answers per problem actually present."""
    k = samples_per_problem(answers)
    groups = group_by_problem(answers)
    return {
        f"acc/mean@{k}": avg_at_k(answers),
        f"pass@{k}": pass_at_k(answers),
        "pass@1": pass_at_k(answers, 1) if answers else math.nan,
        f"cons@{k}": cons_at_k(answers),
        "k": k,
        "problems": len(groups),
        "answers": len(answers),
        "uniform_k": len({len(g) for g in groups.values()}) <= 1,
    }

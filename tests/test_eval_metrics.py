"""AIME metrics (avg@k / pass@k / cons@k) on constructed answers with known values, and against verl 0.9.1."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from dapo.eval.metrics import (
    ScoredAnswer,
    aime_metrics,
    avg_at_k,
    cons_at_k,
    length_stats,
    majority_vote,
    pass_at_k,
    pass_at_k_estimate,
    per_problem,
)
from dapo.reward import INVALID, compute_score


def answers(spec: dict[str, list[tuple[bool, str]]], shuffle_seed: int | None = None) -> list[ScoredAnswer]:
    """{problem: [(acc, pred), ...]} -> answers with rows numbered in order (optionally listed shuffled)."""
    out, row = [], 0
    for problem, samples in spec.items():
        for acc, pred in samples:
            out.append(ScoredAnswer(row=row, problem=problem, acc=acc, pred=pred, completion_tokens=10 * (row + 1)))
            row += 1
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(out)
    return out


# P1: 4/4 correct; P2: 1/4 correct and the vote picks a wrong answer; P3: nothing extractable.
SPEC = {
    "p1": [(True, "5")] * 4,
    "p2": [(True, "7"), (False, "8"), (False, "8"), (False, INVALID)],
    "p3": [(False, INVALID)] * 4,
}


def test_known_values_avg_pass_cons():
    a = answers(SPEC)
    assert avg_at_k(a) == pytest.approx(5 / 12)
    assert pass_at_k(a) == pytest.approx(2 / 3)  # any correct: p1, p2
    assert pass_at_k(a, 1) == pytest.approx((1 + 0.25 + 0) / 3)
    assert cons_at_k(a) == pytest.approx(1 / 3)  # p1 only
    m = aime_metrics(a)
    assert m["k"] == 4 and m["problems"] == 3 and m["answers"] == 12 and m["uniform_k"]
    assert m["acc/mean@4"] == pytest.approx(5 / 12)
    assert m["pass@4"] == pytest.approx(2 / 3)
    assert m["cons@4"] == pytest.approx(1 / 3)


def test_metrics_do_not_depend_on_the_order_answers_are_listed_in():
    ref = aime_metrics(answers(SPEC))
    for seed in range(5):
        assert aime_metrics(answers(SPEC, shuffle_seed=seed)) == ref


def test_avg_is_mean_over_answers_which_equals_mean_of_problem_accuracies_when_k_is_uniform():
    a = answers(SPEC)
    per = per_problem(a)
    assert avg_at_k(a) == pytest.approx(sum(p["acc"] for p in per) / len(per))
    # unequal k: the mean over all answers weights problems by their answer count (the DAPO script's definition)
    b = answers({"x": [(True, "1")] * 3, "y": [(False, "2")]})
    assert avg_at_k(b) == pytest.approx(3 / 4)
    assert not aime_metrics(b)["uniform_k"]


def test_majority_vote_ties_go_to_the_prediction_seen_first_in_row_order():
    tie = answers({"p": [(False, "3"), (True, "4"), (True, "4"), (False, "3")]})
    assert majority_vote(tie).pred == "3"
    assert cons_at_k(tie) == 0.0
    tie_right_first = answers({"p": [(True, "4"), (False, "3"), (False, "3"), (True, "4")]})
    assert cons_at_k(tie_right_first) == 1.0
    # listing order is irrelevant, row order decides
    assert majority_vote(list(reversed(tie))).pred == "3"


def test_invalid_predictions_abstain_from_the_vote():
    a = answers({"p": [(False, INVALID)] * 3 + [(True, "9")]})
    assert majority_vote(a).pred == "9"
    assert cons_at_k(a) == 1.0
    assert majority_vote(answers({"p": [(False, INVALID)] * 2})) is None


def test_pass_at_k_estimator_matches_enumeration_of_all_k_subsets():
    for n in range(1, 7):
        for c in range(0, n + 1):
            outcomes = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(range(n), k))
                brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
                assert pass_at_k_estimate(n, c, k) == pytest.approx(brute), (n, c, k)
    with pytest.raises(ValueError, match="k"):
        pass_at_k_estimate(4, 1, 5)
    with pytest.raises(ValueError, match="correct"):
        pass_at_k_estimate(4, 5, 1)


def test_length_stats_and_clip_ratio():
    a = [
        ScoredAnswer(0, "p", True, "1", completion_tokens=10, finish_reason="stop"),
        ScoredAnswer(1, "p", False, "2", completion_tokens=30, finish_reason="length"),
        ScoredAnswer(2, "q", False, "2", completion_tokens=20, finish_reason="stop"),
        ScoredAnswer(3, "q", True, "3", completion_tokens=None, finish_reason="stop"),
    ]
    s = length_stats(a)
    assert s["all"]["count"] == 3 and s["all"]["mean"] == pytest.approx(20) and s["all"]["p50"] == 20
    assert s["all"]["min"] == 10 and s["all"]["max"] == 30
    assert s["correct"]["mean"] == pytest.approx(10) and s["incorrect"]["mean"] == pytest.approx(25)
    assert s["clip_ratio"] == pytest.approx(1 / 4)
    assert math.isnan(length_stats([])["all"]["mean"])


def test_empty_input_gives_nan_not_an_error():
    m = aime_metrics([])
    assert m["k"] == 0 and math.isnan(m["acc/mean@0"]) and math.isnan(m["cons@0"])


def test_scores_from_the_verifier_flow_into_the_metrics():
    # 2 problems x 4 answers written as a model would; the DAPO verifier decides acc/pred
    texts = {
        ("a", "540"): ["... so the maximum is 540.\nAnswer: 540", "Answer: 540", "Answer: 541", "no answer here"],
        ("b", "204"): ["Answer: 204", "Answer: 200", "Answer: 200", "Answer: \\boxed{200}"],
    }
    scored, row = [], 0
    for (problem, gt), outs in texts.items():
        for out in outs:
            res = compute_score(out, gt)
            scored.append(ScoredAnswer(row, problem, res["acc"], res["pred"]))
            row += 1
    m = aime_metrics(scored)
    assert m["acc/mean@4"] == pytest.approx(3 / 8)
    assert m["pass@4"] == 1.0
    assert m["cons@4"] == pytest.approx(1 / 2)  # a: "540" wins; b: "200" wins


def test_avg_matches_verl_validation_mean_with_32_samples_per_problem():
    """verl 0.9.1's process_validation_metrics gives acc/mean@N per prompt group, averaged over prompts; with 32
    samples per problem, shuffled like the 960-row file, it must equal our avg@32 (and the DAPO script's
    sum(acc) / len(df))."""
    metric_utils = pytest.importorskip("verl.trainer.ppo.metric_utils")
    rng = random.Random(7)
    rows = []
    for p in range(6):
        rate = rng.random()
        rows += [(str(p), rng.random() < rate) for _ in range(32)]
    rng.shuffle(rows)
    ours = [ScoredAnswer(i, p, acc, str(int(acc))) for i, (p, acc) in enumerate(rows)]
    verl = metric_utils.process_validation_metrics(
        ["math_dapo"] * len(rows), [p for p, _ in rows], {"acc": [float(acc) for _, acc in rows]}
    )
    assert avg_at_k(ours) == pytest.approx(verl["math_dapo"]["acc"]["mean@32"])
    assert avg_at_k(ours) == pytest.approx(sum(acc for _, acc in rows) / len(rows))

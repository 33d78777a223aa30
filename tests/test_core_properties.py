"""Property tests (hypothesis) of the algorithm core: the verifier is total, linear and equal to verl on generated
strings; the loss stays finite; advantages are centred; the dynamic sampler keeps its invariants."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dapo.advantage import group_advantages
from dapo.loss import LOSS_AGG_MODES, policy_loss
from dapo.reward import compute_score, normalize_final_answer
from dapo.sampler import DynamicSampler, DynamicSamplingError

math_dapo = pytest.importorskip("verl.utils.reward_score.math_dapo", reason="verl 0.9.1 is the reference")

# Pieces the verifier's rules react to, so that generated strings hit every branch (and their combinations).
TOKENS = [
    "Answer", "answer", "ANSWER", "Anſwer", ":", ": ", " ", "  ", "\n", "\t", "$", "{", "}", "\\boxed{", "\\text{",
    "\\textbf{", "\\overline{", "\\text{}", "\\text{ m}", "frac", "sqrt", "=", ",", ".", "1", "2", "42", "1,000", "a",
    "an ", "a ", "\\$", "\\ ", "\\", "degrees", "cm", "^\\circ", "{,}", ",\\!", "\\;", "[INVALID]", "é", "４", "🎉",
    "\u200b", "\r", '"', "mbox", "\\dots",
]  # fmt: skip
token_text = st.lists(st.sampled_from(TOKENS) | st.text(max_size=3), max_size=40).map("".join)

# arbitrary unicode up to 100k characters: a random unit repeated (hypothesis alone rarely builds long strings)
long_text = st.builds(
    lambda unit, reps, tail: (unit * reps)[:100_000] + tail,
    st.one_of(st.text(min_size=1, max_size=24), token_text.filter(bool)),
    st.integers(min_value=1, max_value=100_000),
    st.text(max_size=50),
)


@settings(max_examples=400, deadline=timedelta(seconds=2), suppress_health_check=[HealthCheck.too_slow])
@given(solution=token_text, gt=token_text)
def test_compute_score_equals_verl_on_generated_strings(solution, gt):
    assert compute_score(solution, gt) == math_dapo.compute_score(solution, gt)
    assert normalize_final_answer(solution) == math_dapo.normalize_final_answer(solution)


# The deadline (not a timer in the test) bounds each call: a quadratic scan of 100k characters would blow it.
@settings(max_examples=40, deadline=timedelta(milliseconds=1500), suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.data_too_large])  # fmt: skip
@given(solution=long_text, gt=long_text)
@example(solution="Answer:" + " " * 99_990, gt="\\text{\n" * 14_000 + "}")  # long \s* run; a '}' far away per line
@example(solution="\\boxed{" * 14_000 + "}", gt="\\text{a}" * 12_000)  # deep braces; many unwraps
@example(solution="$" * 100_000, gt="a$" + "b" * 99_990)  # a lone "$": quadratic for a backtracking regex
@example(solution="frac" * 25_000, gt="\\text{$\\boxed{frac=\n" * 5_000)
def test_verifier_never_raises_and_stays_linear_on_arbitrary_unicode_up_to_100k_chars(solution, gt):
    out = compute_score(solution, gt)
    assert out["score"] in (1.0, -1.0) and isinstance(out["acc"], bool) and isinstance(out["pred"], str)
    assert out["score"] == (1.0 if out["acc"] else -1.0)
    normalize_final_answer(gt)


finite = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 4),
    t=st.integers(1, 6),
    data=st.data(),
    mode=st.sampled_from(LOSS_AGG_MODES),
)
def test_policy_loss_and_its_gradient_stay_finite_for_any_finite_inputs(b, t, data, mode):
    arr = lambda lo, hi: torch.tensor(  # noqa: E731
        data.draw(st.lists(st.floats(lo, hi, allow_nan=False), min_size=b * t, max_size=b * t)), dtype=torch.float32
    ).reshape(b, t)
    log_prob = arr(-1e4, 0.0).requires_grad_(True)
    old = arr(-1e4, 0.0)
    adv = arr(-1e3, 1e3)
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=b * t, max_size=b * t))).reshape(b, t)
    loss, metrics = policy_loss(log_prob, old, adv, mask.float(), loss_agg_mode=mode)
    (grad,) = torch.autograd.grad(loss, log_prob)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert all(torch.isfinite(v) for v in metrics.values())
    assert 0.0 <= float(metrics["pg_clipfrac"]) <= 1.0 and 0.0 <= float(metrics["pg_clipfrac_lower"]) <= 1.0


@settings(max_examples=80, deadline=None)
@given(groups=st.lists(st.lists(finite, min_size=1, max_size=6), min_size=1, max_size=8), norm=st.booleans())
def test_advantages_are_centred_per_group(groups, norm):
    ids = [g for g, vals in enumerate(groups) for _ in vals]
    scores = np.array([v for vals in groups for v in vals])
    adv = group_advantages(scores, ids, norm_by_std=norm)
    assert np.all(np.isfinite(adv))
    for g, vals in enumerate(groups):
        a = adv[np.asarray(ids) == g]
        if len(vals) > 1:
            assert abs(a.mean()) <= 1e-6 * max(1.0, np.abs(scores).max())
            if norm and np.std(vals, ddof=1) > 1e-3:
                assert abs(np.std(a, ddof=1) - 1.0) < 1e-3  # unit std up to eps


@settings(max_examples=150, deadline=None)
@given(
    train_batch_size=st.integers(1, 6),
    n=st.integers(1, 4),
    limit=st.integers(0, 5),
    batches=st.lists(st.lists(st.integers(0, 15), min_size=1, max_size=6), min_size=1, max_size=8),
)
def test_sampler_invariants(train_batch_size, n, limit, batches):
    """Every kept group varies (or is a single response); the training batch is exactly train_batch_size whole,
    contiguous groups in generation order; the limit error comes exactly at the limit and never before."""
    sampler = DynamicSampler(train_batch_size=train_batch_size, n=n, max_num_gen_batches=limit)
    kept_so_far, values_of = 0, {}
    for k, patterns in enumerate(batches):
        ids, vals = [], []
        for g, bits in enumerate(patterns):  # each group's outcomes: the low n bits of an integer
            outcome = [float((bits >> j) & 1) for j in range(n)]
            ids += [(k, g)] * n
            vals += outcome
            values_of[(k, g)] = outcome
        mixed = sum(1 for g in range(len(patterns)) if n == 1 or len(set(values_of[(k, g)])) > 1)
        kept_so_far += mixed
        should_fail = kept_so_far < train_batch_size and 0 < limit <= k + 1
        try:
            kept = sampler.add(ids, vals, batch=k)
        except DynamicSamplingError:
            assert should_fail, "raised before the limit"
            return
        assert not should_fail, "not raised at the limit"
        assert len(kept) == mixed * n
        if sampler.is_full():
            break
    if not sampler.is_full():
        return
    selection = sampler.selection()
    pairs = [(s.batch, int(i)) for s in selection for i in s.indices]
    assert len(pairs) == train_batch_size * n
    assert [s.batch for s in selection] == sorted(s.batch for s in selection)  # generation order
    for start in range(0, len(pairs), n):  # contiguous whole groups
        chunk = pairs[start : start + n]
        batch_idx = chunk[0][0]
        groups = {(batch_idx, i // n) for _, i in chunk}
        assert len(groups) == 1 and sorted(i % n for _, i in chunk) == list(range(n))
        (group,) = groups
        assert n == 1 or len(set(values_of[group])) > 1  # a kept group is mixed

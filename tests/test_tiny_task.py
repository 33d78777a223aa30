"""The builtin tasks: the tiny task's problems are unchanged by the tiny-long option, and tiny-long spreads problem
lengths (and so worked-response lengths) evenly over its digit range, with the overlong limit binding for the
longest correct solutions only."""

from __future__ import annotations

import dataclasses

import pytest

from dapo.config import load_preset
from dapo.reward import compute_score
from dapo.tiny.assets import spec_key
from dapo.tiny.task import Problem, make_problems


def test_min_digits_zero_is_the_original_tiny_task_and_keeps_its_cache_key():
    a = make_problems(2, 50, 10, 1234)
    b = make_problems(2, 50, 10, 1234, 0)
    assert a == b and all(p.a < 100 and p.b < 100 for p in a[0])
    local = load_preset("tiny").local
    assert spec_key(local) != spec_key(dataclasses.replace(local, task=dataclasses.replace(local.task, min_digits=2)))


def test_tiny_long_problems_spread_over_2_to_4_digits_and_the_limit_binds_only_for_long_ones():
    t = load_preset("tiny-long").local.task
    train, val = make_problems(t.digits, t.n_train, t.n_val, t.seed, t.min_digits)
    assert len(train) == t.n_train and len(val) == t.n_val
    assert not {(p.a, p.b) for p in train} & {(p.a, p.b) for p in val}
    lengths = [len(str(p.a)) for p in train]
    assert all(len(str(p.a)) == len(str(p.b)) for p in train)
    for d in (2, 3, 4):
        assert 0.28 < lengths.count(d) / len(lengths) < 0.39
    # one line of working per digit, then the answer line; the verifier reads the DAPO answer line
    p = Problem(4785, 3916)
    text = p.response()
    assert text.count("\n") == 4 and compute_score(text, str(p.answer))["acc"]
    assert not compute_score(p.response(forget_carry=True), str(p.answer))["acc"]


def test_min_digits_errors_name_the_key():
    with pytest.raises(ValueError, match="min_digits"):
        make_problems(3, 10, 10, 0, 4)
    with pytest.raises(ValueError, match="too many distinct problems"):
        make_problems(2, 4000, 100, 0, 1)


def test_recheck_and_guess_labels_of_tiny_mech_and_unchanged_labels_without_them():
    import numpy as np

    from dapo.tiny.task import MAX_RECHECKS, sft_response

    p = Problem(47, 38)
    rechecked = p.response(rechecks=2)
    assert rechecked.count("Check:") == 2 and rechecked.count("7+8=15") == 3
    assert compute_score(rechecked, "85")["acc"]  # long, but correct in substance
    train, _ = make_problems(4, 300, 10, 1, 2)
    # rates 0: the draws (and so the labels) are those of the tiny tasks
    a = [sft_response(q, np.random.default_rng(3), 0.5) for q in train]
    b = [sft_response(q, np.random.default_rng(3), 0.5, 0.0, 0.0) for q in train]
    assert a == b
    rng = np.random.default_rng(0)
    labels = [sft_response(q, rng, 0.8, 0.4, 0.25) for q in train]
    guesses = [t for t in labels if t.startswith("Answer:")]
    checks = [t.count("Check:") for t in labels]
    assert 0.3 < np.mean([c > 0 for c in checks]) < 0.5 and max(checks) == MAX_RECHECKS
    assert 0.1 < len(guesses) / len(labels) < 0.2  # 25 % of the 60 % without rechecks
    local = load_preset("tiny-mech").local
    assert spec_key(local) != spec_key(dataclasses.replace(
        local, warm_start=dataclasses.replace(local.warm_start, recheck_rate=0.0, guess_rate=0.0)))


def test_long_wrong_and_swapped_labels_of_tiny_len_and_tiny_clip_and_old_labels_unchanged():
    import numpy as np

    from dapo.tiny.task import sft_response

    p = Problem(47, 38)
    assert p.response(swaps=(True, False)) == "8+7=15\n4+3+1=8\nAnswer: 85"
    train, _ = make_problems(3, 400, 10, 1, 2)
    # the new rates at their defaults: the draws (and so the labels) of tiny-mech are unchanged
    a = [sft_response(q, np.random.default_rng(3), 0.8, 0.4, 0.25) for q in train]
    b = [sft_response(q, np.random.default_rng(3), 0.8, 0.4, 0.25, None, 0.0) for q in train]
    assert a == b
    rng = np.random.default_rng(0)
    long_wrong = [(q, sft_response(q, rng, 0.0, 0.5, 0.0, 1.0)) for q in train]
    rechecked = [(q, t) for q, t in long_wrong if "Check:" in t]
    assert 0.4 < len(rechecked) / len(train) < 0.6
    assert all(compute_score(t, str(q.answer))["acc"] != q.carries for q, t in rechecked)  # wrong iff it carries
    assert all(compute_score(t, str(q.answer))["acc"] for q, t in long_wrong if "Check:" not in t)
    swapped = [sft_response(q, rng, 0.0, swap_rate=0.1) for q in train]
    pairs = [(a, b) for q, t in zip(train, swapped) for a, b in zip(t.splitlines(), q.response().splitlines())
             if a[0] != a[2]]  # lines whose two digits differ: a swap shows
    assert 0.05 < np.mean([a != b for a, b in pairs]) < 0.15
    assert all(compute_score(t, str(q.answer))["acc"] for q, t in zip(train, swapped))  # the reward ignores it
    local = load_preset("tiny-len").local
    assert spec_key(local) != spec_key(dataclasses.replace(
        local, warm_start=dataclasses.replace(local.warm_start, recheck_mistake_rate=None)))


def test_the_warm_start_is_the_same_bit_for_bit_whatever_the_thread_count(tmp_path):
    import torch

    from dapo.tiny.assets import prepare

    local = load_preset("tiny-mech", ["local.warm_start.steps=3", "local.task.n_train=300",
                                      "local.warm_start.batch_size=16"]).local
    before = torch.get_num_threads()
    digests = []
    try:
        for threads in (2, 1):  # a matmul split over 2 threads sums in another order: different weights unpinned
            torch.set_num_threads(threads)
            digests.append(prepare(local, tmp_path / f"t{threads}", log=lambda s: None).warm_start["weights_sha256"])
    finally:
        torch.set_num_threads(before)
    assert digests[0] == digests[1] and len(digests[0]) == 64
    assert torch.get_num_threads() == before

"""dapo.sampler.DynamicSampler: the reference dynamic-sampling loop (paper eq. 11, Algorithm 1) and its off-paper
carry mode."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.sampler import DynamicSampler, DynamicSamplingError


def make_batch(rng, num_groups: int, n: int, p_mixed: float, tag: str):
    """``num_groups`` contiguous groups of ``n`` responses; each group is mixed with probability ``p_mixed``."""
    ids, acc = [], []
    for g in range(num_groups):
        if rng.random() < p_mixed:
            vals = rng.permutation([1.0] + [0.0] + list(rng.integers(0, 2, n - 2).astype(float)))
        else:
            vals = np.full(n, float(rng.integers(0, 2)))
        ids += [f"{tag}-{g}"] * n
        acc += list(vals)
    return np.array(ids, dtype=object), np.array(acc)


def algorithm_1(batches, train_batch_size: int, n: int, max_num_gen_batches: int):
    """The reference recipe's loop, written out: per uid keep iff np.std > 0 or a single response; concatenate the
    kept responses of each generation batch; once enough prompts, cut to the first train_batch_size * n."""
    kept: list[tuple[int, int]] = []
    num_prompts = 0
    for num_gen_batches, (uids, values) in enumerate(batches, start=1):
        by_uid = defaultdict(list)
        for uid, v in zip(uids, values):
            by_uid[uid].append(v)
        keep = {uid for uid, vs in by_uid.items() if np.std(vs) > 0 or len(vs) == 1}
        num_prompts += len(keep)
        kept += [(num_gen_batches - 1, i) for i, uid in enumerate(uids) if uid in keep]
        if num_prompts < train_batch_size:
            if max_num_gen_batches <= 0 or num_gen_batches < max_num_gen_batches:
                continue
            return "error", num_gen_batches
        return kept[: train_batch_size * n], num_gen_batches
    return "incomplete", None


def flatten(selection, first_batch_index: int = 0):
    return [(s.batch_index - first_batch_index, int(i)) for s in selection for i in s.indices]


def compare_with_algorithm_1(seed: int) -> list[bool]:
    """Run 4 steps through the sampler and through algorithm_1; returns, per step, whether it was a failed step."""
    rng = np.random.default_rng(seed)
    t, n, gen, limit = 8, 4, 6, 6
    sampler = DynamicSampler(train_batch_size=t, n=n, metric="acc", max_num_gen_batches=limit, gen_batch_size=gen)
    outcomes = []
    for step, p_mixed in enumerate([0.45, 0.05, 0.6, 0.3]):  # 0.05: the limit is usually hit
        batches = [make_batch(rng, gen, n, p_mixed, tag=f"s{step}b{k}") for k in range(limit)]
        expected, used = algorithm_1(batches, t, n, limit)
        first = sampler.batches_added
        outcome = None
        for ids, acc in batches:
            try:
                sampler.add(ids, acc)
            except DynamicSamplingError:
                outcome = "error"
                break
            if sampler.is_full():
                break
        if expected == "error":
            assert outcome == "error" and sampler.num_gen_batches == used
        else:
            assert outcome is None and sampler.num_gen_batches == used
            assert flatten(sampler.selection(), first) == expected
        stats = sampler.finish_step()
        assert stats["num_gen_batches"] == used
        outcomes.append(expected == "error")
    return outcomes


def test_reference_mode_selects_exactly_what_algorithm_1_selects():
    failed_steps = [f for seed in range(6) for f in compare_with_algorithm_1(seed)]
    assert any(failed_steps) and not all(failed_steps)  # both branches were compared


def test_error_is_raised_at_the_limit_not_before_and_says_what_to_change():
    sampler = DynamicSampler(train_batch_size=4, n=2, metric="acc", max_num_gen_batches=3)
    ids = lambda k: [f"b{k}-{g}" for g in range(4) for _ in range(2)]  # noqa: E731
    one_mixed = [1, 0] + [1, 1] * 3
    sampler.add(ids(0), one_mixed)
    sampler.add(ids(1), one_mixed)  # 2 of 4 groups so far: no error yet
    with pytest.raises(DynamicSamplingError) as info:
        sampler.add(ids(2), one_mixed)
    err = info.value
    assert err.kept_per_batch == [1, 1, 1] and err.total_per_batch == [4, 4, 4]
    msg = str(err)
    for needle in ("max_num_gen_batches=3", "3 of train_batch_size=4", "gen_batch_size", "easier dataset", "'acc'"):
        assert needle in msg
    with pytest.raises(RuntimeError, match="already failed"):
        sampler.add(ids(3), one_mixed)
    assert sampler.finish_step()["num_gen_batches"] == 3  # the loop may log and start over


def test_unlimited_generation_batches_when_limit_is_not_positive():
    sampler = DynamicSampler(train_batch_size=2, n=2, max_num_gen_batches=0)
    for k in range(50):
        sampler.add([f"{k}", f"{k}"], [1, 1])
    sampler.add(["x", "x", "y", "y"], [0, 1, 1, 0])
    assert sampler.is_full() and sampler.num_gen_batches == 51


def test_disabled_sampler_passes_the_first_batch_through():
    sampler = DynamicSampler(train_batch_size=3, n=2, enable=False)
    assert sampler.suggested_gen_batch_size() == 3
    kept = sampler.add(["a", "a", "b", "b", "c", "c"], batch="R")  # no metric needed
    assert kept.tolist() == [0, 1, 2, 3, 4, 5] and sampler.is_full()
    (sel,) = sampler.selection()
    assert sel.batch == "R" and sel.indices.tolist() == [0, 1, 2, 3, 4, 5]
    stats = sampler.finish_step()
    assert stats["kept_ratio"] == 1.0 and stats["num_groups_surplus"] == 0


def test_group_of_one_is_kept_like_the_reference():
    sampler = DynamicSampler(train_batch_size=2, n=1)
    assert sampler.add(["a", "b"], [1.0, 1.0]).tolist() == [0, 1]
    assert sampler.is_full()


def test_identical_float_metrics_are_not_kept_even_when_np_std_is_not_zero():
    """np.std([0.1]*3) is 1.4e-17 > 0; an all-equal group has no signal, so we compare max > min instead."""
    assert np.std([0.1, 0.1, 0.1]) > 0
    sampler = DynamicSampler(train_batch_size=1, n=3, metric="seq_reward", max_num_gen_batches=0)
    assert sampler.add(["a"] * 3, [0.1, 0.1, 0.1]).size == 0


def test_selection_is_whole_contiguous_groups_even_for_interleaved_input():
    sampler = DynamicSampler(train_batch_size=2, n=2)
    kept = sampler.add(["a", "b", "a", "b", "c", "c"], [1, 0, 0, 1, 1, 0], batch="R")
    assert kept.tolist() == [0, 2, 1, 3, 4, 5]
    assert [s.indices.tolist() for s in sampler.selection()] == [[0, 2, 1, 3]]
    assert sampler.step_stats()["num_groups_surplus"] == 1


def test_carry_mode_uses_the_surplus_first_next_step_then_drops_it_when_stale():
    sampler = DynamicSampler(train_batch_size=2, n=2, mode="carry", carry_max_age=1, max_num_gen_batches=0)
    sampler.add(["a", "a", "b", "b", "c", "c", "d", "d"], [1, 0, 0, 1, 1, 0, 1, 0], batch="B0")
    assert [s.indices.tolist() for s in sampler.selection()] == [[0, 1, 2, 3]]
    stats = sampler.finish_step()
    assert stats["num_groups_surplus"] == 2 and stats["num_groups_carried_out"] == 2
    # step 2: the two carried groups already fill it
    assert sampler.is_full() and sampler.suggested_gen_batch_size() == 0
    (sel,) = sampler.selection()
    assert sel.batch == "B0" and sel.indices.tolist() == [4, 5, 6, 7]
    assert sampler.finish_step()["num_groups_carried_in"] == 2
    # a surplus older than carry_max_age steps is dropped
    sampler.add(["e", "e", "f", "f", "g", "g"], [1, 0, 1, 0, 1, 0], batch="B1")
    sampler.finish_step()  # g carried (age 1)
    assert sampler.step_stats()["num_groups_carried_in"] == 1
    sampler.add(["h", "h"], [0, 1], batch="B2")
    assert [s.batch for s in sampler.selection()] == ["B1", "B2"]


def test_carry_mode_oversamples_more_when_the_keep_rate_falls():
    def run(p_mixed: float) -> int:
        rng = np.random.default_rng(0)
        s = DynamicSampler(train_batch_size=16, n=4, mode="carry", max_num_gen_batches=0, gen_batch_size=16,
                           max_gen_batch_size=512)  # fmt: skip
        for step in range(4):
            k = 0
            while not s.is_full():
                ids, acc = make_batch(rng, s.suggested_gen_batch_size(), 4, p_mixed, tag=f"{step}-{k}")
                s.add(ids, acc)
                k += 1
            s.finish_step()
        resumed = DynamicSampler(train_batch_size=16, n=4, mode="carry", gen_batch_size=16, max_gen_batch_size=512)
        resumed.load_state_dict(s.state_dict())  # same keep-rate estimate and carry buffer
        return resumed.suggested_gen_batch_size()

    easy, hard = run(0.9), run(0.2)
    assert 16 <= easy < hard <= 512
    assert hard >= 16 / 0.4  # about needed / keep_rate with keep rate ~0.2
    reference = DynamicSampler(train_batch_size=16, n=4, gen_batch_size=48)
    assert reference.suggested_gen_batch_size() == 48


def test_state_dict_round_trips_through_json():
    s = DynamicSampler(train_batch_size=2, n=2, mode="carry")
    s.add(["a", "a", "b", "b", "c", "c"], [1, 0, 1, 0, 1, 1])
    s.finish_step()
    state = json.loads(json.dumps(s.state_dict()))
    fresh = DynamicSampler(train_batch_size=2, n=2, mode="carry")
    fresh.load_state_dict(state)
    assert fresh.state_dict() == s.state_dict()
    assert fresh.suggested_gen_batch_size() == s.suggested_gen_batch_size()
    with pytest.raises(ValueError, match="version"):
        fresh.load_state_dict({"steps": 1})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(train_batch_size=0, n=2), "train_batch_size"),
        (dict(train_batch_size=2, n=0), "n "),
        (dict(train_batch_size=2, n=2, mode="cache"), "mode"),
        (dict(train_batch_size=2, n=2, gen_batch_size=0), "gen_batch_size"),
    ],
)
def test_constructor_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DynamicSampler(**kwargs)


def test_add_rejects_bad_batches_with_the_offending_group():
    s = DynamicSampler(train_batch_size=4, n=2)
    with pytest.raises(ValueError, match="group 'a' has 3 responses, expected n=2"):
        s.add(["a", "a", "a", "b"], [1, 0, 1, 0])
    with pytest.raises(ValueError, match="metric_values"):
        s.add(["a", "a"])
    with pytest.raises(ValueError, match="non-finite"):
        s.add(["a", "a"], [np.nan, 1])
    with pytest.raises(ValueError, match="2 group ids but 3"):
        s.add(["a", "a"], [1, 0, 1])
    s.add(["a", "a"], [1, 0])
    with pytest.raises(ValueError, match="already used"):
        s.add(["a", "a"], [1, 0])
    with pytest.raises(RuntimeError, match="not full"):
        s.selection()
    s.add(["b", "b", "c", "c", "d", "d"], [1, 0, 1, 0, 0, 1])
    with pytest.raises(RuntimeError, match="already full"):
        s.add(["e", "e"], [1, 0])


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["recipe.rollout.n=1"], "recipe.filter_groups.enable"),
        (["recipe.filter_groups.enable=false"], "recipe.data.gen_batch_size"),  # smoke: gen 96 != train 32
    ],
)
def test_preset_rules_for_dynamic_sampling_name_the_key(overrides, key):
    from dapo.config import ConfigError, load_preset

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_preset("smoke", overrides)
    # the sampler a loop builds from a valid preset
    r = load_preset("smoke").recipe
    sampler = DynamicSampler(r.data.train_batch_size, r.rollout.n, enable=r.filter_groups.enable,
                             metric=r.filter_groups.metric, max_num_gen_batches=r.filter_groups.max_num_gen_batches,
                             mode=r.filter_groups.mode, gen_batch_size=r.data.gen_batch_size)  # fmt: skip
    assert sampler.suggested_gen_batch_size() == r.data.gen_batch_size


# ---------------------------------------------------------------------------------------------------------------------
# Memory: with take=, only rows the step may still use are held
# ---------------------------------------------------------------------------------------------------------------------


class _Batch:
    def __init__(self, rows):
        self.rows = np.asarray(rows)

    def __len__(self):
        return len(self.rows)


def _take(batch, idx):
    return _Batch(batch.rows[idx])


def _held_rows(sampler):
    held = {id(g.batch): g.batch for g in sampler._step.kept if g.batch is not None}
    return sum(len(b) for b in held.values())


@pytest.mark.parametrize("mode", ["reference", "carry"])
def test_sampler_with_take_holds_only_usable_kept_rows_and_drops_the_batch(mode):
    import gc
    import weakref

    n = 2
    s = DynamicSampler(train_batch_size=3, n=n, mode=mode, max_num_gen_batches=0)
    # batch 1: groups 0..3, only group 1 varies; batch 2: groups 4..7, groups 4, 5, 6 vary (one is surplus)
    batches = [([0, 0, 1, 1, 2, 2, 3, 3], [1, 1, 0, 1, 0, 0, 1, 1]),
               ([4, 4, 5, 5, 6, 6, 7, 7], [0, 1, 1, 0, 0, 1, 0, 0])]
    refs = []
    for gids, acc in batches:
        batch = _Batch(np.arange(len(gids)) + 100 * len(refs))
        refs.append(weakref.ref(batch))
        s.add(gids, acc, batch=batch, take=_take)
        del batch
    gc.collect()
    assert [r() for r in refs] == [None, None]  # no generation batch is referenced any more
    usable = 3 if mode == "reference" else 4  # the reference recipe never trains on the surplus group
    assert _held_rows(s) == usable * n
    rows = np.concatenate([sel.batch.rows[sel.indices] for sel in s.selection()])
    assert rows.tolist() == [2, 3, 100, 101, 102, 103]  # groups 1, 4, 5 in generation order, whole groups


def test_sampler_with_take_keeps_a_fully_kept_batch_without_copying():
    s = DynamicSampler(train_batch_size=2, n=2, enable=False)
    batch = _Batch(np.arange(4))
    s.add([0, 0, 1, 1], batch=batch, take=lambda b, i: pytest.fail("no copy when every row is kept"))
    (sel,) = s.selection()
    assert sel.batch is batch and sel.indices.tolist() == [0, 1, 2, 3]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_selection_with_take_equals_selection_without(data):
    mode = data.draw(st.sampled_from(["reference", "carry"]))
    tbs = data.draw(st.integers(1, 4))
    n = data.draw(st.integers(1, 3))
    a = DynamicSampler(train_batch_size=tbs, n=n, mode=mode, max_num_gen_batches=0)
    b = DynamicSampler(train_batch_size=tbs, n=n, mode=mode, max_num_gen_batches=0)
    gid = 0
    for step in range(data.draw(st.integers(1, 3))):
        while not a.is_full():
            groups = data.draw(st.integers(1, 4))
            gids = [g for g in range(gid, gid + groups) for _ in range(n)]
            gid += groups
            acc = data.draw(st.lists(st.integers(0, 1), min_size=len(gids), max_size=len(gids)))
            rows = np.arange(len(gids)) + 1000 * gid
            a.add(gids, acc, batch=_Batch(rows), take=_take)
            b.add(gids, acc, batch=_Batch(rows))
        assert b.is_full()
        ra = np.concatenate([sel.batch.rows[sel.indices] for sel in a.selection()])
        rb = np.concatenate([sel.batch.rows[sel.indices] for sel in b.selection()])
        assert ra.tolist() == rb.tolist()
        assert a.finish_step() == b.finish_step()


def test_carry_buffer_is_checkpointed_and_compacted_to_the_carried_responses():
    s = DynamicSampler(train_batch_size=1, n=2, mode="carry", max_num_gen_batches=0)
    batch = ["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"]  # stands for a generation batch: response i is "ri"
    s.add(["a", "a", "b", "b", "c", "c", "d", "d"], [1, 0, 1, 1, 0, 1, 1, 0], batch=batch)
    s.finish_step()  # a trained; c and d carried (b all-correct: filtered)
    seen = []

    def compact(b, idx):
        seen.append(idx.tolist())
        return [b[i] for i in idx], np.arange(len(idx))

    state = s.state_dict(compact=compact)
    assert seen == [[4, 5, 6, 7]]  # one call per generation batch, all its carried responses
    assert [(c["indices"], c["age"]) for c in state["carry"]] == [([0, 1], 1), ([2, 3], 1)]
    fresh = DynamicSampler(train_batch_size=1, n=2, mode="carry", max_num_gen_batches=0)
    fresh.load_state_dict(state)
    for sampler in (s, fresh):  # both use the carried group c first, then carry d on
        (sel,) = sampler.selection()
        assert [sel.batch[i] for i in sel.indices] == ["r4", "r5"]
        assert sampler.finish_step()["num_groups_carried_out"] == 1
    with pytest.raises(ValueError, match="mode"):
        DynamicSampler(train_batch_size=1, n=2, mode="reference").load_state_dict(state)
    with pytest.raises(RuntimeError, match="mid-step"):
        fresh.add(["e", "e"], [0, 1])
        fresh.state_dict()

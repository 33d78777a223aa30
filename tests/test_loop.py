"""The DAPO loop (dapo.train.loop) driven by a scripted backend: dynamic sampling refill, advantages, overlong
filtering, cadence, metrics, resume state, the sampler-exhausted exit. Fast: no model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dapo.advantage import group_advantages
from dapo.config import load_preset
from dapo.train.health import EXIT_SAMPLER_EXHAUSTED
from dapo.train.loop import DAPOLoop
from dapo.train.stream import PromptStream
from dapo.train.metrics import METRICS, describe, read_jsonl
from dapo.reward import compute_score
from loop_support import ScriptedBackend, make_rows, wall_clock

BASE = [
    "recipe.data.train_batch_size=4",
    "recipe.data.gen_batch_size=6",
    "recipe.rollout.n=4",
    "recipe.actor.ppo_mini_batch_size=2",
    "recipe.trainer.logger=[console]",
    "recipe.trainer.total_training_steps=3",
    "recipe.trainer.test_freq=2",
    "recipe.trainer.save_freq=0",
    "recipe.filter_groups.max_num_gen_batches=0",
    "recipe.rollout.val.n=2",
]


def _loop(tmp_path, overrides=(), p=None, backend=None, n_rows=60, val=8):
    preset = load_preset("tiny", BASE + list(overrides))
    # a third of the prompts are always right, a third always wrong, a third a coin flip
    probs = p if p is not None else [(0.0, 0.5, 1.0)[i % 3] for i in range(n_rows)]
    backend = backend or ScriptedBackend(seed=0)
    loop = DAPOLoop(preset, backend, make_rows(probs), make_rows([0.5] * val, "fake-val"), tmp_path, progress=False,
                    log=lambda s: None)  # fmt: skip
    return loop, backend


def test_dynamic_sampling_refills_to_a_full_batch_of_varying_groups(tmp_path):
    loop, be = _loop(tmp_path, ["recipe.data.shuffle=false"])
    assert loop.fit() == 0
    assert len(be.updates) == 3
    for u in be.updates:
        batch = u["batch"]
        assert len(batch) == 4 * 4  # train_batch_size prompts x n, surplus cut
        acc = np.array([compute_score(t, r["reward_model"]["ground_truth"])["acc"] for t, r in
                        zip(batch.response_text, batch.prompt_rows)])  # fmt: skip
        gids = np.asarray(batch.group_ids)
        for g in set(gids.tolist()):
            a = acc[gids == g]
            assert len(a) == 4 and 0 < a.sum() < 4, "a kept group must have both right and wrong answers"
    recs = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["step"] > 0]
    # in file order every generation batch of 6 prompts holds 2 coin-flip prompts, the only ones that can vary:
    # one batch can never fill 4 groups
    assert all(r["train/num_gen_batches"] >= 2 for r in recs)
    assert all(0 < r["train/kept_group_ratio"] < 0.5 for r in recs)
    assert recs[-1]["train/gen_samples_total"] == sum(r["train/num_gen_samples"] for r in recs)


def test_advantages_sent_to_the_update_are_group_normalised_rewards(tmp_path):
    loop, be = _loop(tmp_path, ["recipe.reward.overlong_buffer.enable=false"])
    loop.fit()
    u = be.updates[0]
    batch = u["batch"]
    rewards = np.array([compute_score(t, r["reward_model"]["ground_truth"])["score"] for t, r in
                        zip(batch.response_text, batch.prompt_rows)])  # fmt: skip
    np.testing.assert_allclose(u["advantages"], group_advantages(rewards, batch.group_ids), atol=1e-12)
    assert u["loss_mask"] is None  # overlong filtering off


def test_overlong_filtering_masks_truncated_responses_and_soft_punishment_shapes_reward(tmp_path):
    be = ScriptedBackend(seed=1, truncate_every=3)
    loop, be = _loop(tmp_path, ["recipe.reward.overlong_filter=true", "recipe.filter_groups.enable=false",
                                "recipe.data.gen_batch_size=4"], backend=be)  # fmt: skip
    loop.fit()
    u = be.updates[0]
    np.testing.assert_array_equal(u["loss_mask"], ~u["batch"].truncated)
    assert (~u["loss_mask"]).sum() > 0
    rec = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["step"] == 1][0]
    assert rec["train/num_filtered_responses"] == float((~u["loss_mask"]).sum())
    # a truncated response has length max_response_length: the soft overlong punishment gives it -1 - factor
    assert rec["critic/score/min"] == pytest.approx(-2.0)
    assert rec["response_length/clip_ratio"] == pytest.approx(float(u["batch"].truncated.mean()))


def test_validation_cadence_and_metric_names_follow_verl(tmp_path):
    loop, be = _loop(tmp_path)
    loop.fit()
    recs = read_jsonl(tmp_path / "metrics.jsonl")
    val_steps = [r["step"] for r in recs if "val-core/fake-val/acc/mean@2" in r]
    assert val_steps == [0, 2, 3]  # before training, every test_freq=2, and the last step
    val_calls = [(k, s) for k, s in be.generate_calls if s == loop.val_sampling]
    assert len(val_calls) == 3 and all(k == 8 for k, _ in val_calls)  # all 8 validation prompts, n=2 samples each
    assert loop.val_sampling.n == 2 and loop.val_sampling.top_p == loop.recipe.rollout.val.top_p
    step = [r for r in recs if r["step"] == 1][0]
    for name in ("critic/score/mean", "critic/rewards/mean", "response_length/mean", "response_length/clip_ratio",
                 "actor/entropy", "actor/mean_prob", "actor/pg_clipfrac", "actor/pg_clipfrac_lower",
                 "train/num_gen_batches", "train/kept_group_ratio", "timing_s/gen", "timing_s/update_actor",
                 "timing_s/step"):  # fmt: skip
        assert name in step, name
    for name in step:
        if name not in ("step", "ts"):
            assert describe(name) is not None, f"{name} is not in dapo.train.metrics.METRICS"
    assert "val-core/{ds}/acc/mean@{k}" in METRICS
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["val_acc"]) == {"0", "2", "3"}
    assert (tmp_path / "health.png").exists()


def test_sampler_exhausted_saves_a_checkpoint_and_exits_4(tmp_path):
    loop, be = _loop(tmp_path, ["recipe.filter_groups.max_num_gen_batches=2"], p=[1.0] * 60)
    assert loop.fit() == EXIT_SAMPLER_EXHAUSTED
    assert be.updates == []
    assert (tmp_path / "checkpoints" / "global_step_0" / "COMPLETE").exists()


def test_resume_continues_data_order_and_rng_exactly(tmp_path):
    a, be_a = _loop(tmp_path / "a", ["recipe.trainer.save_freq=1"])
    assert a.fit() == 0
    b, be_b = _loop(tmp_path / "b", ["recipe.trainer.save_freq=1", "recipe.trainer.total_training_steps=2"])
    assert b.fit() == 0
    # continue run b to 3 steps from its checkpoint with a fresh loop and backend
    c, be_c = _loop(tmp_path / "b", ["recipe.trainer.save_freq=1"], backend=ScriptedBackend(seed=99))
    assert c.fit() == 0
    assert be_c.weights == pytest.approx(be_a.weights, abs=0)
    np.testing.assert_array_equal(be_c.updates[-1]["advantages"], be_a.updates[-1]["advantages"])
    last = lambda d: [r for r in read_jsonl(d / "metrics.jsonl") if r["step"] == 3][0]  # noqa: E731
    ra, rc = last(tmp_path / "a"), last(tmp_path / "b")
    for k in ra:
        if not wall_clock(k) and k != "ts":
            assert ra[k] == rc[k], k


def test_a_kill_between_the_checkpoint_and_the_step_record_still_logs_every_step_once(tmp_path):
    """Checkpoints precede the step's validation and log record (verl's order): a resumed run logs the missing record
    (validating first when due) and ends exactly like an uninterrupted run."""
    a, _ = _loop(tmp_path / "a", ["recipe.trainer.save_freq=1"])
    assert a.fit() == 0
    b, _ = _loop(tmp_path / "b", ["recipe.trainer.save_freq=1", "recipe.trainer.total_training_steps=2"])
    assert b.fit() == 0
    path = tmp_path / "b" / "metrics.jsonl"
    recs = read_jsonl(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs if r["step"] != 2))  # killed before logging step 2
    c, _ = _loop(tmp_path / "b", ["recipe.trainer.save_freq=1"], backend=ScriptedBackend(seed=99))
    assert c.fit() == 0
    clean = lambda r: {k: v for k, v in r.items() if not wall_clock(k) and k != "ts"}  # noqa: E731
    got = [clean(r) for r in read_jsonl(path) if "timing_s/step" in r]
    want = [clean(r) for r in read_jsonl(tmp_path / "a" / "metrics.jsonl") if "timing_s/step" in r]
    assert [r["step"] for r in got] == [1, 2, 3] and got == want  # step 2's record has its validation too


def test_prompt_stream_covers_each_epoch_once_and_restores_its_cursor():
    s = PromptStream(10, seed=3)
    first = np.concatenate([s.take(3) for _ in range(3)])
    assert sorted(first.tolist()) == sorted(set(first.tolist())) and len(first) == 9
    state = s.state_dict()
    nxt = s.take(3)  # 1 left in epoch 0: dropped, epoch 1 starts
    assert s.epoch == 1
    t = PromptStream(10, seed=3)
    t.load_state_dict(state)
    np.testing.assert_array_equal(t.take(3), nxt)
    with pytest.raises(ValueError, match="exceeds"):
        t.take(11)


class _Held(dict):
    """A backend-private payload the test can take a weak reference to."""


class _TrackingBackend(ScriptedBackend):
    """Records a weak reference to every generation batch's private data, and at concat time which are alive."""

    def __init__(self, **kw):
        super().__init__(**kw)
        import weakref

        self._weakref = weakref.ref
        self.generated: list = []  # (weakref to data, responses)
        self.alive_at_concat: list[list[int]] = []
        self.held_rows_at_concat: list[int] = []

    def generate(self, prompts, sampling, group_ids=None):
        r = super().generate(prompts, sampling, group_ids)
        r.data = _Held(r.data)
        if group_ids is not None:  # training batches only
            self.generated.append((self._weakref(r.data), len(r)))
        return r

    def select(self, rollout, index):
        idx = np.asarray(index, dtype=np.int64)
        return rollout.take(idx, _Held({"row": rollout.data["row"][idx]}))

    def concat(self, rollouts):
        import gc

        gc.collect()
        self.alive_at_concat.append([i for i, (ref, _) in enumerate(self.generated) if ref() is not None])
        self.held_rows_at_concat.append(sum(len(r) for r in rollouts))
        return super().concat(rollouts)


def test_the_loop_holds_only_rows_of_kept_groups_not_generation_batches(tmp_path):
    """Once the sampler has decided, a generation batch is gone: at the end of dynamic sampling no generated batch
    (with filtered groups) is alive -- only the copies of its kept rows, train_batch_size x n of them."""
    loop, be = _loop(tmp_path, ["recipe.data.shuffle=false"], backend=_TrackingBackend(seed=0))
    assert loop.fit() == 0
    assert len(be.alive_at_concat) == 3 and len(be.generated) >= 6
    # every generation batch of this task has all-right and all-wrong groups: none may survive the sampler
    assert be.alive_at_concat == [[], [], []]
    assert be.held_rows_at_concat == [4 * 4] * 3


def test_results_are_the_same_whether_the_sampler_holds_copies_or_whole_batches(tmp_path, monkeypatch):
    """Compaction changes memory, not numbers: the same updates with the old behaviour (whole batches held)."""
    from dapo import sampler as sampler_mod

    loop, be = _loop(tmp_path / "copies", ["recipe.trainer.total_training_steps=4"])
    assert loop.fit() == 0
    real_add = sampler_mod.DynamicSampler.add
    monkeypatch.setattr(sampler_mod.DynamicSampler, "add",
                        lambda self, g, m=None, *, batch=None, take=None: real_add(self, g, m, batch=batch))
    loop2, be2 = _loop(tmp_path / "whole", ["recipe.trainer.total_training_steps=4"])
    assert loop2.fit() == 0
    assert len(be.updates) == len(be2.updates) == 4
    for a, b in zip(be.updates, be2.updates):
        assert list(a["batch"].group_ids) == list(b["batch"].group_ids)
        assert a["batch"].response_text == b["batch"].response_text
        np.testing.assert_array_equal(a["batch"].data["row"], b["batch"].data["row"])
        np.testing.assert_array_equal(a["advantages"], b["advantages"])
    ra = [json.dumps({k: v for k, v in r.items() if not wall_clock(k) and k != "ts"}, sort_keys=True)
          for r in read_jsonl(tmp_path / "copies" / "metrics.jsonl")]
    rb = [json.dumps({k: v for k, v in r.items() if not wall_clock(k) and k != "ts"}, sort_keys=True)
          for r in read_jsonl(tmp_path / "whole" / "metrics.jsonl")]
    assert ra == rb


def test_carried_groups_survive_a_resume_and_the_run_ends_as_an_uninterrupted_one(tmp_path):
    carry = ["recipe.filter_groups.enable=true", "recipe.filter_groups.mode=carry", "recipe.trainer.save_freq=1",
             "recipe.trainer.total_training_steps=6", "recipe.trainer.test_freq=3"]  # fmt: skip
    a, be_a = _loop(tmp_path / "a", carry)
    assert a.fit() == 0
    # stopped after step 3 (a validation step in both runs, so the backend's sampling RNG is in the same state)
    b, _ = _loop(tmp_path / "b", carry + ["recipe.trainer.total_training_steps=3"])
    assert b.fit() == 0
    # the checkpoint holds the carried groups, reduced to their own responses
    state = b.state_dict()["sampler"]
    assert state["carry"], "no group was carried out of step 3: the test proves nothing"
    c, be_c = _loop(tmp_path / "b", carry, backend=ScriptedBackend(seed=99))
    assert c.fit() == 0
    recs = {d: {r["step"]: r for r in read_jsonl(tmp_path / d / "metrics.jsonl")} for d in ("a", "b")}
    assert recs["b"][4]["train/num_groups_carried_in"] == len(state["carry"]) > 0
    assert be_c.weights == pytest.approx(be_a.weights, abs=0)
    assert len(be_c.updates) == 3
    for got, want in zip(be_c.updates, be_a.updates[3:]):
        np.testing.assert_array_equal(got["advantages"], want["advantages"])
        assert list(got["batch"].group_ids) == list(want["batch"].group_ids)
        assert got["batch"].response_text == want["batch"].response_text
    for step in (4, 5, 6):
        for k, v in recs["a"][step].items():
            if not wall_clock(k) and k != "ts":
                assert recs["b"][step][k] == v, (step, k)


def test_a_step_filled_by_carried_groups_alone_trains_without_generating(tmp_path):
    loop, be = _loop(tmp_path, ["recipe.filter_groups.enable=true", "recipe.filter_groups.mode=carry",
                                "recipe.data.gen_batch_size=24", "recipe.trainer.total_training_steps=2"],
                     p=[0.5] * 60)  # fmt: skip
    assert loop.fit() == 0
    recs = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "train/num_gen_samples" in r]
    assert recs[1]["train/num_gen_samples"] == 0 and recs[1]["train/num_groups_carried_in"] >= 4
    assert "train/gen_acc/mean" not in recs[1] and len(be.updates) == 2
    assert recs[1]["train/gen_samples_total"] == recs[0]["train/num_gen_samples"]

"""The local backend (dapo.backends.local) on a small randomly initialised Qwen2 model: shared-prefix forward equals the
plain forward, generation masks, mini-batch token-mean under micro-batching, verl's warm-up schedule, checkpoints."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from dapo.backends.base import Sampling
from dapo.backends.local.backend import LocalBackend
from dapo.data.files import read_rows
from dapo.config import load_preset
from dapo.tiny.assets import prepare
from dapo.util.lm_forward import prompt_forward

SMALL = [
    "local.model.hidden_size=64", "local.model.num_hidden_layers=1", "local.model.num_attention_heads=2",
    "local.model.num_key_value_heads=2", "local.model.intermediate_size=128", "local.task.n_train=200",
    "local.task.n_val=16", "local.warm_start.enable=false", "placement.device=cpu",
    "recipe.data.train_batch_size=4", "recipe.rollout.n=3", "recipe.actor.ppo_mini_batch_size=2",
]  # fmt: skip


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    preset = load_preset("tiny", SMALL)
    a = prepare(preset.local, tmp_path_factory.mktemp("assets"), log=lambda s: None)
    rows = read_rows([str(a.train_file)], "train")
    return preset, a, rows


def _backend(assets, overrides=(), **kw):
    preset, a, _ = assets
    if overrides:
        preset = load_preset("tiny", SMALL + list(overrides))
    torch.manual_seed(0)
    return LocalBackend(str(a.policy_dir), None, preset.recipe, device="cpu", seed=5, **kw)


def test_the_prompt_goes_through_the_chat_template_with_the_full_dapo_text(assets):
    be = _backend(assets)
    row = assets[2][0]
    ids = be.encode_prompt(row)
    text = be.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>user\nSolve the following math problem step by step.")
    assert text.endswith('its own line after "Answer:".<|im_end|>\n<|im_start|>assistant\n')
    assert row["prompt"][0]["content"] in text
    assert len(ids) < 80  # the BPE learnt the template: ~70 tokens for ~250 characters


def test_shared_prefix_forward_equals_the_plain_forward_in_logprobs_and_gradients(assets):
    be = _backend(assets)
    r = be.generate(assets[2][:5], Sampling(n=2, max_tokens=6))
    data = r.data
    results = {}
    for share in (False, True):
        be.model.zero_grad()
        logits, last, _, _, computed = prompt_forward(
            be.model, data["prompt_ids"], data["prompt_mask"], data["response_ids"], share_prefix=share
        )
        lp = torch.log_softmax(logits[:, last : last + data["response_ids"].shape[1]], -1)
        lp = lp.gather(-1, data["response_ids"][..., None]).squeeze(-1)
        (lp * data["response_mask"]).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in be.model.parameters()])
        results[share] = (lp.detach(), grads, computed)
    torch.testing.assert_close(results[True][0], results[False][0], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(results[True][1], results[False][1], atol=2e-5, rtol=1e-4)
    assert results[True][2] < 0.7 * results[False][2]  # the template prefix is computed once


def test_group_shared_prompt_forward_equals_the_plain_forward_in_any_row_order(assets):
    be = _backend(assets)
    r = be.generate(assets[2][:5], Sampling(n=3, max_tokens=6))
    data = r.data
    perm = torch.randperm(len(r), generator=torch.Generator().manual_seed(3))  # groups interleaved, not contiguous
    p_ids, p_mask = data["prompt_ids"][perm], data["prompt_mask"][perm]
    r_ids, r_mask = data["response_ids"][perm], data["response_mask"][perm]
    results = {}
    for share in ((False, False), (True, True), (False, True)):
        be.model.zero_grad()
        logits, last, _, _, computed = prompt_forward(
            be.model, p_ids, p_mask, r_ids, share_prefix=share[0], share_groups=share[1]
        )
        lp = torch.log_softmax(logits[:, last : last + r_ids.shape[1]], -1).gather(-1, r_ids[..., None]).squeeze(-1)
        (lp * r_mask * torch.linspace(-1, 1, len(perm))[:, None]).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in be.model.parameters()])
        results[share] = (lp.detach(), grads, computed)
    plain = results[(False, False)]
    for share in ((True, True), (False, True)):
        torch.testing.assert_close(results[share][0], plain[0], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(results[share][1], plain[1], atol=2e-5, rtol=1e-4)
    width, tail = p_mask.sum(1).max().item(), r_ids.numel()
    assert results[(False, True)][2] == 5 * width + tail  # each of the 5 prompts computed once, not 3 times
    assert results[(True, True)][2] < results[(False, True)][2]  # and the template prefix once for all


def _uneven(rows, k: int = 4) -> list[dict]:
    """``k`` task rows whose questions differ in length (the tiny task's prompts are all one length, so the left
    padding of a batch stays empty without this)."""
    import copy

    out = []
    for i, row in enumerate(rows[:k]):
        row = copy.deepcopy(row)
        row["prompt"][0]["content"] += " Think." * (3 * i)
        out.append(row)
    return out


def test_group_shared_prompt_forward_equals_the_plain_forward_with_left_padded_prompts(assets):
    """Prompts of different lengths in one batch (left padding between the template prefix and the prompt): the
    distinct prompts are told apart by their padding too, and the padding stays masked in the shared pass."""
    be = _backend(assets)
    r = be.generate(_uneven(assets[2]), Sampling(n=3, max_tokens=6))
    data = r.data
    lens = data["prompt_mask"].sum(1)
    assert len(set(lens.tolist())) == 4  # four prompt lengths: padding in all rows but the longest group's
    results = {}
    for share in (False, True):
        logits, last, _, _, computed = prompt_forward(be.model, data["prompt_ids"], data["prompt_mask"],
                                                      data["response_ids"], share_prefix=share, share_groups=share)
        lp = torch.log_softmax(logits[:, last : last + data["response_ids"].shape[1]], -1)
        results[share] = (lp.gather(-1, data["response_ids"][..., None]).squeeze(-1).detach(), computed)
    torch.testing.assert_close(results[True][0], results[False][0], atol=2e-5, rtol=1e-5)
    assert results[True][1] < results[False][1] / 2


def test_the_log_prob_pass_computes_each_groups_prompt_once(assets):
    """The backend's own pass (compute_old_log_probs -> _forward_response, shared by the update) runs with the group
    prompt shared: the positions it computes are those of prompt_forward with share_groups, fewer than without."""
    be = _backend(assets)
    batch = be.generate(_uneven(assets[2], 3), Sampling(n=4, max_tokens=6))
    data = {k: v for k, v in batch.data.items() if k not in ("gen_log_prob", "gen_entropy", "weights_tag")}
    b = batch.take(np.arange(len(batch)), data)  # every row recomputed
    computed0 = be._computed_tokens
    be.compute_old_log_probs(b)
    keep_r = int(data["response_mask"].sum(1).max())
    args = (be.model, data["prompt_ids"], data["prompt_mask"], data["response_ids"][:, :keep_r])
    with torch.no_grad():
        grouped = prompt_forward(*args, share_prefix=True, share_groups=True)[4]
        per_row = prompt_forward(*args, share_prefix=True, share_groups=False)[4]
    assert be._computed_tokens - computed0 == grouped < per_row


def test_generation_masks_after_eos_and_flags_truncated_responses(assets):
    be = _backend(assets)
    eos = be.tokenizer.eos_token_id
    real = be.model

    class EosOnEvenRowsAfter3(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.decode_calls = real, 0

        def forward(self, **kw):
            out = self.inner(**kw)
            if kw["input_ids"].shape[1] == 1:
                self.decode_calls += 1
            if self.decode_calls >= 2:
                out.logits[0::2, -1, :] = -1e4
                out.logits[0::2, -1, eos] = 1e4
            out.logits[1::2, -1, eos] = -1e4
            return out

    be.model = EosOnEvenRowsAfter3()
    r = be.generate(assets[2][:2], Sampling(n=2, max_tokens=6))
    assert r.response_length.tolist() == [3, 6, 3, 6]
    assert r.truncated.tolist() == [False, True, False, True]
    mask = r.data["response_mask"]
    assert mask.sum(1).tolist() == [3, 6, 3, 6]
    assert (r.data["response_ids"][0, 2] == eos) and (r.data["response_ids"][0, 3:] == be.pad_id).all()
    assert len(set(r.group_ids[:2].tolist())) == 1 and r.group_ids[0] != r.group_ids[2]


def test_top_k_1_and_tiny_top_p_sample_the_argmax():
    torch.manual_seed(0)
    logits = torch.randn(64, 50)
    g = torch.Generator().manual_seed(0)
    for s in (Sampling(n=1, top_k=1), Sampling(n=1, top_p=1e-6), Sampling(n=1, do_sample=False)):
        tok, ent, prob = LocalBackend._sample(logits, s, g)
        assert torch.equal(tok, logits.argmax(-1))
    tok, ent, logp = LocalBackend._sample(logits, Sampling(n=1, temperature=1.0), g)
    assert (ent > 0).all() and (logp <= 0).all()
    assert torch.allclose(logp, torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1))


def _update_after(assets, overrides, micro):
    be = _backend(assets, overrides, micro_batch_size=micro)
    be.generator.manual_seed(7)
    batch = be.generate(assets[2][:4], Sampling(n=3, max_tokens=8))
    be.compute_old_log_probs(batch)
    adv = np.linspace(-1.5, 1.5, len(batch))
    m = be.update(batch, adv)
    return torch.cat([p.detach().flatten() for p in be.model.parameters()]), m


def test_token_mean_over_the_mini_batch_does_not_depend_on_micro_batching(assets):
    over = ["recipe.actor.optim.lr_warmup_steps=0"]
    big, m_big = _update_after(assets, over, micro=64)
    small, m_small = _update_after(assets, over, micro=2)
    torch.testing.assert_close(small, big, atol=1e-6, rtol=1e-5)
    assert m_big["actor/num_optimizer_steps"] == 2.0  # 4 prompts / ppo_mini_batch_size 2
    # the reference commit's per-micro-batch mean is a different loss when micro-batches hold different token counts
    per_micro, _ = _update_after(assets, over + ["recipe.actor.token_mean_scope=microbatch"], micro=2)
    assert not torch.allclose(per_micro, big, atol=1e-7)


def test_learning_rate_warm_up_matches_verl_constant_schedule(assets):
    from verl.utils.torch_functional import get_constant_schedule_with_warmup

    be = _backend(assets, ["recipe.actor.optim.lr_warmup_steps=3", "recipe.actor.optim.lr=0.01"])
    ref_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=0.01)
    ref = get_constant_schedule_with_warmup(ref_opt, num_warmup_steps=3)
    batch = be.generate(assets[2][:4], Sampling(n=3, max_tokens=4))
    for _ in range(5):
        be.compute_old_log_probs(batch)
        used = be.update(batch, np.zeros(len(batch)))["actor/lr"]
        assert used == pytest.approx(ref_opt.param_groups[0]["lr"], abs=1e-12)
        ref_opt.step()
        ref.step()


def test_checkpoint_round_trip_restores_weights_optimizer_scheduler_and_sampling_rng(assets, tmp_path):
    a = _backend(assets)
    batch = a.generate(assets[2][:4], Sampling(n=3, max_tokens=6))
    a.compute_old_log_probs(batch)
    a.update(batch, np.linspace(-1, 1, len(batch)))
    a.save_checkpoint(str(tmp_path / "ck"))
    after_a = a.generate(assets[2][4:8], Sampling(n=3, max_tokens=6))
    b = _backend(assets)
    b.load_checkpoint(str(tmp_path / "ck"))
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)
    assert b.scheduler.state_dict() == a.scheduler.state_dict()
    after_b = b.generate(assets[2][4:8], Sampling(n=3, max_tokens=6))
    assert after_b.response_text == after_a.response_text
    assert torch.equal(after_b.data["response_ids"], after_a.data["response_ids"])
    st_a, st_b = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert all(torch.equal(st_a[k]["exp_avg"], st_b[k]["exp_avg"]) for k in st_a)


def test_bad_prompts_are_named(assets):
    be = _backend(assets, ["recipe.data.max_prompt_length=10", "recipe.data.truncation=error"])
    with pytest.raises(ValueError, match="row index 0"):
        be.encode_prompt(assets[2][0])
    with pytest.raises(ValueError, match="no 'prompt' column"):
        be.encode_prompt({"question": "x"})


def test_kl_loss_uses_a_frozen_initial_reference_and_equals_verls_kl_term(assets):
    from verl.trainer.ppo.core_algos import agg_loss as verl_agg_loss
    from verl.trainer.ppo.core_algos import kl_penalty as verl_kl_penalty

    over = ["recipe.actor.use_kl_loss=true", "recipe.actor.kl_loss_coef=0.5", "recipe.actor.kl_loss_type=k1",
            "recipe.actor.ppo_mini_batch_size=4", "recipe.actor.optim.lr_warmup_steps=0",
            "recipe.actor.optim.lr=0.05"]  # fmt: skip
    be = _backend(assets, over)
    assert be.ref_model is not None and not any(p.requires_grad for p in be.ref_model.parameters())
    batch = be.generate(assets[2][:4], Sampling(n=3, max_tokens=6))
    be.compute_old_log_probs(batch)
    mask = batch.data["response_mask"].float()
    # before any update the reference is the policy itself
    torch.testing.assert_close(batch.data["ref_log_prob"], batch.data["old_log_prob"], atol=1e-6, rtol=0)
    be.update(batch, np.linspace(-1, 1, len(batch)))  # the policy moves, the reference does not
    initial_ref = batch.data["ref_log_prob"].clone()
    be.compute_old_log_probs(batch)
    torch.testing.assert_close(batch.data["ref_log_prob"], initial_ref, atol=1e-6, rtol=0)
    old = batch.data["old_log_prob"]
    assert not torch.allclose(old * mask, initial_ref * mask, atol=1e-4)
    out = be.update(batch, np.zeros(len(batch)))
    # one mini-batch, so its first forward is pi_old: the KL term is verl's agg_loss(kl_penalty(...)) over it
    expect = verl_agg_loss(verl_kl_penalty(old, initial_ref, "k1"), mask, "token-mean")
    assert out["actor/kl_loss"] == pytest.approx(float(expect), abs=1e-5) and out["actor/kl_coef"] == 0.5


def test_a_mini_batch_with_no_valid_token_is_a_zero_gradient_optimizer_step(assets):
    be = _backend(assets, ["recipe.reward.overlong_filter=true", "recipe.actor.optim.lr_warmup_steps=0"])
    batch = be.generate(assets[2][:4], Sampling(n=3, max_tokens=4))
    be.compute_old_log_probs(batch)
    out = be.update(batch, np.linspace(-1, 1, len(batch)), loss_mask=np.zeros(len(batch), dtype=bool))
    assert out["actor/pg_loss"] == 0.0 and out["actor/grad_norm"] == 0.0
    # like verl with a zero loss: the optimizer still steps (AdamW's step count advances), nothing is NaN
    assert out["actor/num_optimizer_steps"] == 2.0 and "actor/skipped_steps" not in out
    assert all(int(s["step"]) == 2 for s in be.optimizer.state.values())
    assert all(torch.isfinite(p).all() for p in be.model.parameters())


def test_validation_sampling_does_not_advance_the_training_sampling_stream(assets):
    be = _backend(assets)
    before = be.generator.get_state().clone()
    v1 = be.generate(assets[2][:3], Sampling(n=2, max_tokens=5, validation=True))
    assert torch.equal(be.generator.get_state(), before)
    v2 = be.generate(assets[2][:3], Sampling(n=2, max_tokens=5, validation=True))
    assert v1.response_text == v2.response_text  # seeded from the (unchanged) training stream
    be.generate(assets[2][:3], Sampling(n=2, max_tokens=5))
    assert not torch.equal(be.generator.get_state(), before)


def _old_log_probs(be, batch, reuse: bool):
    data = dict(batch.data)
    if not reuse:
        data = {k: v for k, v in data.items() if k not in ("gen_log_prob", "gen_entropy", "weights_tag")}
    b = batch.take(np.arange(len(batch)), data)
    m = be.compute_old_log_probs(b)
    return b.data["old_log_prob"], m


def test_pi_old_taken_from_generation_equals_the_recomputed_forward_within_1e_5(assets):
    be = _backend(assets)
    batch = be.generate(assets[2][:6], Sampling(n=4, max_tokens=10))
    assert "gen_log_prob" in batch.data  # T = 1, no top-p / top-k, CPU float32: the sampling distribution is pi_old
    reused0 = be.counters.get("old_log_prob_reused", 0)
    got, m_got = _old_log_probs(be, batch, reuse=True)
    assert be.counters["old_log_prob_reused"] - reused0 == len(batch)
    want, m_want = _old_log_probs(be, batch, reuse=False)
    mask = batch.data["response_mask"].bool()
    assert mask.sum() > 20 and float((got - want).abs()[mask].max()) < 1e-5
    assert abs(m_got["actor/entropy"] - m_want["actor/entropy"]) < 1e-5
    assert abs(m_got["actor/mean_prob"] - m_want["actor/mean_prob"]) < 1e-5


def test_pi_old_is_recomputed_after_an_update_and_for_truncated_or_validation_sampling(assets):
    be = _backend(assets)
    batch = be.generate(assets[2][:4], Sampling(n=3, max_tokens=8))
    be.compute_old_log_probs(batch)
    be.update(batch, np.linspace(-1.0, 1.0, len(batch)))
    # the same rollout after the update (a group carried into the next step): sampled by weights that are gone
    reused0 = be.counters["old_log_prob_reused"]
    got, _ = _old_log_probs(be, batch, reuse=True)
    want, _ = _old_log_probs(be, batch, reuse=False)
    assert be.counters["old_log_prob_reused"] == reused0
    assert torch.equal(got, want)
    for s in (Sampling(n=2, max_tokens=6, top_p=0.7), Sampling(n=2, max_tokens=6, top_k=5),
              Sampling(n=2, max_tokens=6, temperature=0.7), Sampling(n=2, max_tokens=6, validation=True)):
        assert "gen_log_prob" not in be.generate(assets[2][:2], s).data, s
    off = _backend(assets, reuse_gen_log_probs=False)
    assert "gen_log_prob" not in off.generate(assets[2][:2], Sampling(n=2, max_tokens=6)).data


def test_mfu_is_verls_flops_estimate_over_the_devices_peak_and_absent_without_a_known_peak(assets, monkeypatch):
    from dapo.backends.local import update as update_mod
    from dapo.util.flops import train_flops

    be = _backend(assets, ["recipe.actor.optim.lr_warmup_steps=0"])
    batch = be.generate(assets[2][:4], Sampling(n=3, max_tokens=8))
    m = {**be.compute_old_log_probs(batch), **be.update(batch, np.linspace(-1, 1, len(batch)))}
    assert not any(k.startswith("perf/mfu/") for k in m), "a CPU has no known peak: no MFU"
    monkeypatch.setattr(update_mod, "peak_flops", lambda name: 1e9 if name == "cpu" else None)
    ticks = iter(range(100, 200))  # the update module's clock advances 1 s per reading
    monkeypatch.setattr(update_mod, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    d = batch.data
    seqlens = (d["prompt_mask"].sum(1) + d["response_mask"].sum(1)).tolist()
    stale = {k: v for k, v in d.items() if k not in ("gen_log_prob", "gen_entropy", "weights_tag")}
    infer = be.compute_old_log_probs(batch.take(np.arange(len(batch)), stale))
    # read at the start and at the end of the pass: 1 s
    assert infer["perf/mfu/actor_infer"] == pytest.approx(train_flops(be.model.config, seqlens) / 3 / (1.0 * 1e9))
    upd = be.update(batch, np.linspace(-1, 1, len(batch)))
    # start, update_seconds, MFU: 2 s; ppo_epochs 1
    assert upd["perf/mfu/actor"] == pytest.approx(train_flops(be.model.config, seqlens) / (2.0 * 1e9))

"""dapo.loss equals verl 0.9.1's compute_policy_loss_vanilla + agg_loss, and normalises correctly over mini-batches."""

from __future__ import annotations

import math

import pytest
import torch

from dapo.loss import (
    LOSS_AGG_MODES,
    KL_PENALTIES,
    agg_loss,
    entropy_from_logits,
    kl_penalty,
    log_probs_from_logits,
    overlong_filter_mask,
    policy_loss,
    token_stats,
)

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl 0.9.1 is the reference implementation")
verl_actor_config = pytest.importorskip("verl.workers.config.actor")
verl_F = pytest.importorskip("verl.utils.torch_functional")

CLIP_LOW, CLIP_HIGH, CLIP_C = 0.2, 0.28, 10.0


def verl_config(global_batch_info: dict | None = None, **over):
    """The ActorConfig verl's worker hands to the policy loss (only the clip fields and global_batch_info matter)."""
    kw = dict(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2,
              clip_ratio_low=CLIP_LOW, clip_ratio_high=CLIP_HIGH, clip_ratio_c=CLIP_C)  # fmt: skip
    kw.update(over)
    cfg = verl_actor_config.ActorConfig(**kw)
    cfg.global_batch_info.update(global_batch_info or {})
    return cfg


def random_batch(seed: int, b: int = 6, t: int = 9, empty_row: bool = True, dtype=torch.float64):
    """Log-probs with ratios far outside the clip range both ways, mixed-sign advantages, ragged masks."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=dtype) * 4
    # log-ratio in [-3, 3] so that both clip bounds and the dual clip (ratio > 10 with A < 0) are hit
    delta = torch.rand(b, t, generator=g, dtype=dtype) * 6 - 3
    delta[0, 0] = 3.0  # ratio e^3 > c = 10 on a negative-advantage row: the dual clip is active
    log_prob = (old + delta).requires_grad_(True)
    adv_seq = torch.randn(b, generator=g, dtype=dtype)
    adv_seq[0], adv_seq[1] = -abs(adv_seq[0]) - 0.1, abs(adv_seq[1]) + 0.1
    advantages = adv_seq[:, None].expand(b, t).contiguous()
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(dtype)
    if empty_row:
        mask[-1] = 0  # a fully masked response (e.g. overlong-filtered)
    return log_prob, old, advantages, mask


def assert_close(a, b, what):
    a, b = float(torch.as_tensor(a).detach()), float(torch.as_tensor(b).detach())
    assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6), f"{what}: ours {a!r} != verl {b!r}"


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_policy_loss_value_metrics_and_grad_equal_verl(mode, seed):
    log_prob, old, adv, mask = random_batch(seed)
    ours, m = policy_loss(log_prob, old, adv, mask, clip_ratio_low=CLIP_LOW, clip_ratio_high=CLIP_HIGH,
                          clip_ratio_c=CLIP_C, loss_agg_mode=mode)  # fmt: skip
    (g_ours,) = torch.autograd.grad(ours, log_prob)
    ref, ref_m = core_algos.compute_policy_loss_vanilla(old, log_prob, adv, mask.bool(), loss_agg_mode=mode,
                                                        config=verl_config())  # fmt: skip
    (g_ref,) = torch.autograd.grad(ref, log_prob)
    assert_close(ours, ref, f"{mode} loss")
    for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
        assert isinstance(m[key], torch.Tensor) and m[key].dim() == 0 and not m[key].requires_grad
        assert_close(m[key], ref_m[f"actor/{key}"], key)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-6, atol=1e-9)
    # the batch was built to exercise every branch
    assert 0 < float(m["pg_clipfrac"]) < 1 and float(m["pg_clipfrac_lower"]) > 0


def test_policy_loss_with_float_mask_and_per_response_advantages_equals_verl():
    log_prob, old, adv, mask = random_batch(7, empty_row=False, dtype=torch.float32)
    ours, _ = policy_loss(log_prob, old, adv[:, 0], mask)  # [B] advantages broadcast over tokens
    ref, _ = core_algos.compute_policy_loss_vanilla(old, log_prob, adv, mask, config=verl_config())
    assert_close(ours, ref, "token-mean loss (float32, [B] advantages)")


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_global_batch_info_semantics_equal_verl(mode):
    """dp_size / batch_num_tokens / global_batch_size / loss_scale_factor exactly as verl's global_batch_info."""
    log_prob, old, adv, mask = random_batch(11)
    info = dict(dp_size=4, batch_num_tokens=123, global_batch_size=29, loss_scale_factor=64)
    ours, _ = policy_loss(log_prob, old, adv, mask, loss_agg_mode=mode, global_tokens=123, global_seqs=29,
                          dp_size=4, loss_scale_factor=64)  # fmt: skip
    ref, _ = core_algos.compute_policy_loss_vanilla(old, log_prob, adv, mask.bool(), loss_agg_mode=mode,
                                                    config=verl_config(info))  # fmt: skip
    assert_close(ours, ref, f"{mode} with global batch info")


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_equals_verl_agg_loss(mode):
    g = torch.Generator().manual_seed(3)
    loss_mat = torch.randn(5, 7, generator=g, dtype=torch.float64)
    mask = (torch.rand(5, 7, generator=g) > 0.3).double()
    mask[2] = 0
    assert_close(agg_loss(loss_mat, mask, mode), core_algos.agg_loss(loss_mat, mask, mode), mode)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("sizes", [(3, 3), (1, 5), (2, 2, 2)])
def test_microbatch_losses_with_global_counts_sum_to_minibatch_loss(mode, sizes):
    """Gradient accumulation: with the mini-batch's token/sequence counts the micro-batch losses (and their grads)
    add up to the loss of the whole mini-batch -- the token-level loss of eq. 12 over the mini-batch."""
    log_prob, old, adv, mask = random_batch(5, b=sum(sizes))
    whole, _ = policy_loss(log_prob, old, adv, mask, loss_agg_mode=mode)
    (g_whole,) = torch.autograd.grad(whole, log_prob)
    n_tok = mask.sum()
    n_seq = (mask.sum(-1) > 0).sum()
    total, start = 0.0, 0
    for size in sizes:
        sl = slice(start, start + size)
        start += size
        part, _ = policy_loss(log_prob[sl], old[sl], adv[sl], mask[sl], loss_agg_mode=mode,
                              global_tokens=n_tok, global_seqs=n_seq)  # fmt: skip
        total = total + part
    (g_total,) = torch.autograd.grad(total, log_prob)
    assert_close(total, whole, f"{mode}: sum of micro-batch losses vs whole mini-batch")
    torch.testing.assert_close(g_total, g_whole, rtol=1e-9, atol=1e-12)


def test_microbatch_token_mean_without_global_count_is_not_the_minibatch_loss():
    """The reason global_tokens exists: averaging per-micro-batch token-means weights short micro-batches up."""
    log_prob, old, adv, mask = random_batch(5, b=6, empty_row=False)
    mask[:3, 1:] = 0  # micro-batch 1 has 3 tokens, micro-batch 2 many
    whole, _ = policy_loss(log_prob, old, adv, mask)
    parts = [policy_loss(log_prob[s], old[s], adv[s], mask[s])[0] for s in (slice(0, 3), slice(3, 6))]
    assert not math.isclose(float(sum(parts).detach() / 2), float(whole.detach()), rel_tol=1e-3)


def test_dual_clip_bounds_only_negative_advantages():
    old = torch.zeros(2, 1, dtype=torch.float64)
    log_prob = torch.full((2, 1), math.log(100.0), dtype=torch.float64)  # ratio 100
    adv = torch.tensor([[-1.0], [1.0]], dtype=torch.float64)
    mask = torch.ones(2, 1, dtype=torch.float64)
    loss_neg, m_neg = policy_loss(log_prob[:1], old[:1], adv[:1], mask[:1], clip_ratio_c=10.0)
    loss_pos, m_pos = policy_loss(log_prob[1:], old[1:], adv[1:], mask[1:], clip_ratio_c=10.0)
    assert float(loss_neg) == pytest.approx(10.0)  # min(|A| * 100, |A| * c)
    assert float(m_neg["pg_clipfrac_lower"]) == pytest.approx(1.0)
    assert float(loss_pos) == pytest.approx(-1.28)  # clip-higher: -A * (1 + 0.28)
    assert float(m_pos["pg_clipfrac_lower"]) == 0.0 and float(m_pos["pg_clipfrac"]) == pytest.approx(1.0)


def test_clip_higher_is_decoupled_from_clip_low():
    old = torch.zeros(2, 1, dtype=torch.float64)
    log_prob = torch.log(torch.tensor([[0.5], [2.0]], dtype=torch.float64))
    adv = torch.tensor([[-1.0], [1.0]], dtype=torch.float64)
    mask = torch.ones(2, 1, dtype=torch.float64)
    low, _ = policy_loss(log_prob[:1], old[:1], adv[:1], mask[:1], clip_ratio_low=0.2, clip_ratio_high=0.28)
    high, _ = policy_loss(log_prob[1:], old[1:], adv[1:], mask[1:], clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert float(low) == pytest.approx(0.8)  # A<0, ratio 0.5 clipped up to 1 - eps_low
    assert float(high) == pytest.approx(-1.28)  # A>0, ratio 2 clipped down to 1 + eps_high


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(clip_ratio_c=1.0), "clip_ratio_c"),
        (dict(clip_ratio_low=1.0), "clip_ratio_low"),
        (dict(clip_ratio_high=-0.1), "clip_ratio_high"),
        (dict(loss_agg_mode="token-sum-ish"), "loss_agg_mode"),
        (dict(global_tokens=-1), "global_tokens"),
        (dict(dp_size=2), "global_tokens"),
    ],
)
def test_policy_loss_rejects_bad_arguments_with_the_name(kwargs, message):
    log_prob, old, adv, mask = random_batch(0)
    with pytest.raises(ValueError, match=message):
        policy_loss(log_prob, old, adv, mask, **kwargs)


def test_policy_loss_rejects_mismatched_shapes():
    log_prob, old, adv, mask = random_batch(0)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(log_prob, old, adv[:, :3], mask)
    with pytest.raises(ValueError, match="same"):
        policy_loss(log_prob, old[:, :3], adv, mask)


def test_empty_mask_gives_zero_loss_not_nan():
    log_prob, old, adv, mask = random_batch(0)
    for mode in LOSS_AGG_MODES:
        loss, metrics = policy_loss(log_prob, old, adv, torch.zeros_like(mask), loss_agg_mode=mode)
        assert float(loss.detach()) == 0.0 and all(float(v) == 0.0 for v in metrics.values())


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("as_tensor", [False, True])
def test_a_zero_global_count_gives_zero_loss_and_zero_gradient_not_nan(mode, as_tensor):
    """A mini-batch whose responses are all overlong-filtered: every rank sees an empty mask, the global counts are
    0, and the loss is 0 with a zero (finite) gradient -- verl divides by 0 there."""
    log_prob, old, adv, mask = random_batch(0)
    log_prob = log_prob.detach().clone().requires_grad_(True)
    zero = torch.tensor(0.0) if as_tensor else 0
    loss, _ = policy_loss(log_prob, old, adv, torch.zeros_like(mask), loss_agg_mode=mode, global_tokens=zero,
                          global_seqs=zero, dp_size=4)  # fmt: skip
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert log_prob.grad is not None and torch.equal(log_prob.grad, torch.zeros_like(log_prob))


@pytest.mark.parametrize("kind", [k for base in KL_PENALTIES for k in (base, base + "+")])
def test_kl_penalty_equals_verls_kl_penalty_in_value_and_gradient(kind):
    g = torch.Generator().manual_seed(3)
    lp = (torch.randn(4, 9, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    ref = torch.randn(4, 9, generator=g, dtype=torch.float64) * 3
    lp_v = lp.detach().clone().requires_grad_(True)
    ours, theirs = kl_penalty(lp, ref, kind), core_algos.kl_penalty(lp_v, ref, kind)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    ours.sum().backward()
    theirs.sum().backward()
    torch.testing.assert_close(lp.grad, lp_v.grad, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(lp, ref, "k4")


def test_overlong_filter_mask_zeroes_truncated_responses_only_when_enabled():
    mask = torch.ones(3, 4)
    truncated = [False, True, False]
    assert torch.equal(overlong_filter_mask(mask, truncated, enable=False), mask)
    out = overlong_filter_mask(mask, truncated)
    assert out[1].sum() == 0 and out[0].sum() == 4 and out[2].sum() == 4
    with pytest.raises(ValueError, match="entries"):
        overlong_filter_mask(mask, [True])


def test_entropy_and_log_probs_equal_verl_helpers():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g)
    torch.testing.assert_close(entropy_from_logits(logits), verl_F.entropy_from_logits(logits))
    labels = torch.randint(0, 11, (3, 5), generator=g)
    torch.testing.assert_close(log_probs_from_logits(logits, labels), verl_F.logprobs_from_logits(logits, labels))


def test_token_stats_mean_prob_and_entropy_follow_the_mask():
    logits = torch.zeros(2, 3, 4)  # uniform over 4 tokens: p = 1/4, H = log 4
    labels = torch.zeros(2, 3, dtype=torch.long)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    logits[0, 2] = torch.tensor([100.0, 0.0, 0.0, 0.0])  # masked position: must not count
    stats = token_stats(logits, labels, mask)
    assert float(stats["mean_prob"]) == pytest.approx(0.25)
    assert float(stats["entropy_agg"]) == pytest.approx(math.log(4))
    assert float(stats["mean_log_prob"]) == pytest.approx(math.log(0.25))

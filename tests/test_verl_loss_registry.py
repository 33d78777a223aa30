"""Our DAPO loss lives in verl 0.9.1's policy-loss registry and gives verl's numbers for the same config."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

pytest.importorskip("verl")

from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config import FSDPActorConfig  # noqa: E402

import dapo.backends.verl.loss as verl_loss  # noqa: E402

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def _actor_config(**kw) -> FSDPActorConfig:
    base = dict(strategy="fsdp", rollout_n=4, use_dynamic_bsz=True, clip_ratio_low=0.2, clip_ratio_high=0.28,
                clip_ratio_c=10.0)  # fmt: skip
    base.update(kw)
    return FSDPActorConfig(**base)


def _batch(seed: int = 0, b: int = 6, t: int = 11):
    g = torch.Generator().manual_seed(seed)
    log_prob = -torch.rand(b, t, generator=g) * 2
    old = log_prob + torch.randn(b, t, generator=g) * 0.4  # ratios well outside [0.8, 1.28] on some tokens
    adv = torch.randn(b, 1, generator=g).expand(b, t).contiguous()
    mask = (torch.rand(b, t, generator=g) > 0.25).float()
    mask[:, 0] = 1.0
    return old, log_prob, adv, mask


def test_dapo_loss_is_registered_under_its_own_names_and_vanilla_is_untouched():
    assert core_algos.get_policy_loss_fn("dapo") is verl_loss.dapo_policy_loss
    assert core_algos.get_policy_loss_fn("dapo_microbatch") is verl_loss.dapo_policy_loss_microbatch
    assert core_algos.get_policy_loss_fn("vanilla") is core_algos.compute_policy_loss_vanilla


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dp_size", [1, 4])
def test_dapo_loss_equals_verl_vanilla_plus_agg_for_the_same_config(mode, dp_size):
    old, lp, adv, mask = _batch(seed=dp_size)
    cfg = _actor_config(loss_agg_mode=mode)
    # what verl 0.9.1's ppo_loss puts in config.global_batch_info for a micro-batch of a bigger global mini-batch
    cfg.global_batch_info.update(
        dp_size=dp_size, batch_num_tokens=int(mask.sum()) * 3 * dp_size, global_batch_size=6 * 3 * dp_size,
        loss_scale_factor=None,
    )  # fmt: skip
    lp = lp.clone().requires_grad_(True)
    ours, our_metrics = core_algos.get_policy_loss_fn("dapo")(old, lp, adv, mask, mode, cfg, None)
    (g_ours,) = torch.autograd.grad(ours, lp)
    ref, ref_metrics = core_algos.compute_policy_loss_vanilla(old, lp, adv, mask, mode, cfg, None)
    (g_ref,) = torch.autograd.grad(ref, lp)
    assert torch.allclose(ours, ref, rtol=1e-6, atol=1e-7)
    assert torch.allclose(g_ours, g_ref, rtol=1e-6, atol=1e-8)
    assert set(ref_metrics) == {"actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"}
    # verl's metrics, plus the one only our loss reports: the token count the token-mean divided by
    assert set(our_metrics) == set(ref_metrics) | {"actor/loss_tokens"}
    assert our_metrics["actor/loss_tokens"] == cfg.global_batch_info["batch_num_tokens"]
    for k in ref_metrics:
        assert our_metrics[k] == pytest.approx(ref_metrics[k], rel=1e-6, abs=1e-7)
    assert ref_metrics["actor/pg_clipfrac"] > 0  # the batch really exercises the clip


def test_mini_batch_scope_sums_micro_batches_to_the_mini_batch_token_mean():
    """dp ranks x micro-batches of `dapo`, averaged over ranks like DDP/FSDP, = token-mean over the whole mini-batch."""
    old, lp, adv, mask = _batch(seed=7, b=8, t=9)
    dp = 2
    cfg = _actor_config(loss_agg_mode="token-mean")
    cfg.global_batch_info.update(dp_size=dp, batch_num_tokens=float(mask.sum()), global_batch_size=8)
    fn = core_algos.get_policy_loss_fn("dapo")
    per_rank = []
    for rank_rows in (slice(0, 4), slice(4, 8)):
        micro = [fn(old[r], lp[r], adv[r], mask[r], "token-mean", cfg, None)[0]
                 for r in (slice(rank_rows.start, rank_rows.start + 1), slice(rank_rows.start + 1, rank_rows.stop))]
        per_rank.append(sum(micro))
    # verl itself on the whole mini-batch in one piece (no global info: it normalises by the tensors' own tokens)
    whole, _ = core_algos.compute_policy_loss_vanilla(old, lp, adv, mask, "token-mean", _actor_config(), None)
    assert torch.allclose(sum(per_rank) / dp, whole, rtol=1e-6)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_microbatch_scope_reproduces_the_reference_commits_micro_batch_scaling(mode):
    """Reference (verl 4f80e46 dp_actor, dynamic bsz): agg over the micro-batch alone x len(micro) / mini_per_gpu."""
    old, lp, adv, mask = _batch(seed=3, b=5, t=13)
    dp, global_bs = 4, 40  # mini-batch of 40 responses over 4 ranks -> 10 per rank; this micro-batch holds 5
    cfg = _actor_config(loss_agg_mode=mode)
    cfg.global_batch_info.update(dp_size=dp, batch_num_tokens=999, global_batch_size=global_bs)
    ours, _ = core_algos.get_policy_loss_fn("dapo_microbatch")(old, lp, adv, mask, mode, cfg, None)
    local = _actor_config(loss_agg_mode=mode)  # no global info: verl aggregates over the tensors it gets
    micro_loss, _ = core_algos.compute_policy_loss_vanilla(old, lp, adv, mask, mode, local, None)
    reference = micro_loss * (5 / (global_bs / dp))
    assert torch.allclose(ours, reference, rtol=1e-6)
    if mode == "seq-mean-token-mean":  # both scopes agree on sample-level aggregation
        full, _ = core_algos.get_policy_loss_fn("dapo")(old, lp, adv, mask, mode, cfg, None)
        assert torch.allclose(full, ours, rtol=1e-6)


def test_loss_refuses_rollout_correction_weights():
    old, lp, adv, mask = _batch()
    with pytest.raises(ValueError, match="rollout_correction"):
        core_algos.get_policy_loss_fn("dapo")(old, lp, adv, mask, "token-mean", _actor_config(), torch.ones_like(lp))


def test_registering_never_overwrites_a_different_loss_of_the_same_name():
    saved = core_algos.POLICY_LOSS_REGISTRY["dapo"]
    try:
        core_algos.POLICY_LOSS_REGISTRY["dapo"] = core_algos.compute_policy_loss_vanilla
        with pytest.raises(RuntimeError, match="refusing to overwrite"):
            importlib.reload(verl_loss)
        assert core_algos.POLICY_LOSS_REGISTRY["dapo"] is core_algos.compute_policy_loss_vanilla
    finally:
        core_algos.POLICY_LOSS_REGISTRY["dapo"] = saved
    importlib.reload(verl_loss)  # re-registering our own function is allowed (idempotent)
    assert core_algos.get_policy_loss_fn("dapo").__qualname__ == "dapo_policy_loss"


def test_a_fresh_process_sees_the_loss_through_VERL_USE_EXTERNAL_MODULES():
    """What a Ray worker does: `import verl` with the runtime env our config sets, nothing else imported."""
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="dapo.backends.verl.loss", PYTHONPATH=str(ROOT))
    code = (
        "import verl\n"
        "from verl.trainer.ppo.core_algos import get_policy_loss_fn\n"
        "print(get_policy_loss_fn('dapo').__module__, get_policy_loss_fn('dapo_microbatch').__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["dapo.backends.verl.loss", "dapo_policy_loss_microbatch"]

"""The DAPO policy loss in verl's policy-loss registry: ``actor_rollout_ref.actor.policy_loss.loss_mode=dapo``.

Importing this module registers two loss modes (never overwriting an existing name -- verl's
``register_policy_loss`` would silently replace e.g. ``vanilla``):

- ``dapo``: :func:`dapo.loss.policy_loss` normalised over the whole mini-batch, with verl 0.9.1's
  ``config.global_batch_info`` (``batch_num_tokens`` = valid tokens of the mini-batch on all data-parallel ranks,
  ``global_batch_size`` = responses of the mini-batch, ``dp_size``). For ``token-mean`` this is paper eq. 12 over the
  mini-batch::

      loss_micro = sum_{i,t in micro} M L_{i,t} / N_tok(mini-batch) * dp_size

  so the micro-batch gradients accumulate (and average over ranks) to the gradient of the mini-batch token mean.
- ``dapo_microbatch``: the reference commit's behaviour (verl 4f80e46 ``dp_actor.update_policy`` with dynamic batch
  size): the loss aggregated over the micro-batch alone, then weighted by its share of the per-rank mini-batch::

      loss_micro = agg(L, micro-batch) * B_micro / (B_mini / dp_size)

  For the ``seq-mean-*`` modes both are identical; for ``token-mean`` the reference weights each micro-batch's token
  mean by its number of *sequences*, so long and short micro-batches count alike (``recipe.actor.token_mean_scope:
  microbatch`` selects it).

Besides verl's loss metrics it reports ``actor/loss_tokens``, the token count the token-mean divided by (the local
backend reports the same); verl's own losses have no such metric, so its presence shows this loss ran in the workers.

Ray workers import this module through ``VERL_USE_EXTERNAL_MODULES=dapo.backends.verl.loss`` (verl's
``__init__`` imports the listed modules in every process), which :mod:`dapo.backends.verl.settings` puts in the
runtime env (``LOSS_MODULE``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from dapo.loss import policy_loss
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, register_policy_loss

LOSS_MODE = "dapo"
LOSS_MODE_MICROBATCH = "dapo_microbatch"


def _clip_args(config: Any) -> dict[str, float]:
    clip_ratio = config.clip_ratio
    low = config.clip_ratio_low if config.clip_ratio_low is not None else clip_ratio
    high = config.clip_ratio_high if config.clip_ratio_high is not None else clip_ratio
    return {"clip_ratio_low": float(low), "clip_ratio_high": float(high), "clip_ratio_c": float(config.clip_ratio_c)}


def _batch_info(config: Any) -> dict[str, Any]:
    info = dict(getattr(config, "global_batch_info", None) or {})
    return {
        "dp_size": int(info.get("dp_size", 1) or 1),
        "batch_num_tokens": info.get("batch_num_tokens"),
        "global_batch_size": info.get("global_batch_size"),
        "loss_scale_factor": info.get("loss_scale_factor", getattr(config, "loss_scale_factor", None)),
    }


def _verl_metrics(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    return {f"actor/{k}": float(v.item()) for k, v in metrics.items()}


def _no_rollout_weights(rollout_is_weights: Optional[torch.Tensor]) -> None:
    if rollout_is_weights is not None:
        raise ValueError(
            "the DAPO loss does not apply rollout-correction importance weights; unset "
            "algorithm.rollout_correction.rollout_is (the DAPO recipe recomputes pi_old instead)"
        )


def _core_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, *,
               mini_batch_norm: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, Any]]:
    if config is None:
        raise ValueError("the DAPO loss needs verl's actor config (clip ratios, global_batch_info)")
    _no_rollout_weights(rollout_is_weights)
    info = _batch_info(config)
    norm = {"global_tokens": info["batch_num_tokens"], "global_seqs": info["global_batch_size"],
            "dp_size": info["dp_size"]} if mini_batch_norm else {}
    loss, metrics = policy_loss(
        log_prob,
        old_log_prob,
        advantages,
        response_mask,
        loss_agg_mode=loss_agg_mode,
        loss_scale_factor=info["loss_scale_factor"],
        **norm,
        **_clip_args(config),
    )
    # the token count the token-mean divides by: the whole mini-batch on every rank (dapo), or this micro-batch
    # (dapo_microbatch); only this loss reports it, from the worker that ran it
    tokens = info["batch_num_tokens"] if mini_batch_norm and info["batch_num_tokens"] is not None else response_mask.sum()
    metrics["loss_tokens"] = torch.as_tensor(tokens, dtype=torch.float32).detach().reshape(())
    return loss, metrics, info


def dapo_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl policy-loss signature -> :func:`dapo.loss.policy_loss` normalised over the global mini-batch."""
    loss, metrics, _ = _core_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                  rollout_is_weights, mini_batch_norm=True)
    return loss, _verl_metrics(metrics)


def dapo_policy_loss_microbatch(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The reference commit's per-micro-batch aggregation, weighted by the micro-batch's share of the mini-batch."""
    loss, metrics, info = _core_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                     rollout_is_weights, mini_batch_norm=False)
    global_bs = info["global_batch_size"]
    if global_bs is not None:
        # B_micro / (B_mini / dp): the reference's `policy_loss * (len(micro) / ppo_mini_batch_size_per_gpu)`
        loss = loss * (log_prob.shape[0] * info["dp_size"] / float(global_bs))
    elif info["dp_size"] > 1:
        raise ValueError("dapo_microbatch needs global_batch_info['global_batch_size'] when dp_size > 1")
    return loss, _verl_metrics(metrics)


def _register(name: str, fn: Any) -> None:
    existing = POLICY_LOSS_REGISTRY.get(name)
    if existing is None:
        register_policy_loss(name)(fn)
    elif getattr(existing, "__qualname__", None) != fn.__qualname__ or existing.__module__ != fn.__module__:
        raise RuntimeError(
            f"verl's policy-loss registry already has a different loss named {name!r} ({existing.__module__}."
            f"{existing.__qualname__}); refusing to overwrite it"
        )


_register(LOSS_MODE, dapo_policy_loss)
_register(LOSS_MODE_MICROBATCH, dapo_policy_loss_microbatch)

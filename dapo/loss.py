"""The DAPO policy-gradient loss (paper arXiv 2503.14476, eq. 10 and eq. 12) and token statistics.

Framework-free: torch only. The numbers are those of verl 0.9.1 (``core_algos.compute_policy_loss_vanilla`` +
``core_algos.agg_loss``); ``tests/test_loss.py`` proves it against verl's own functions for every aggregation mode.

Notation (one row per response ``i``, one column per response token ``t``; everything is ``[B, T]``)::

    r_{i,t}   = exp(clamp(log pi_theta - log pi_old, -20, 20))          importance ratio (clamped for stability)
    L1        = -A_{i,t} * r_{i,t}
    L2        = -A_{i,t} * clip(r_{i,t}, 1 - eps_low, 1 + eps_high)     decoupled clip ("Clip-Higher", eq. 10)
    L_clip    = max(L1, L2)                                             the PPO pessimistic bound
    L_dual    = min(L_clip, -A_{i,t} * c)                               dual clip (Ye et al. 2019), c > 1
    L_{i,t}   = L_dual if A_{i,t} < 0 else L_clip

and the scalar loss aggregates ``L`` over the response mask ``M`` (eq. 12 is ``token-mean``)::

    token-mean               sum_{i,t} M L / N_tok                           N_tok = tokens of the (mini-)batch
    seq-mean-token-mean      sum_i [M_i.sum() > 0] (sum_t M L / (M_i.sum() + 1e-8)) / N_seq
    seq-mean-token-sum       sum_i [M_i.sum() > 0] (sum_t M L) / N_seq
    seq-mean-token-sum-norm  seq-mean-token-sum / S                          S = loss_scale_factor or T

``N_tok`` / ``N_seq`` default to the counts in the tensors passed in (a *micro*-batch). Under gradient accumulation
or data parallelism the correct token-level loss (eq. 12 over the whole mini-batch) needs the *mini-batch* counts:
pass ``global_tokens`` (valid tokens of the whole mini-batch, all data-parallel ranks included) and ``global_seqs``
(responses of the mini-batch) and the micro-batch losses then *sum* to the mini-batch loss. ``dp_size`` multiplies
the result like verl does, because DDP/FSDP *average* gradients over ranks (verl 0.9.1 ``global_batch_info``:
``batch_num_tokens``, ``global_batch_size``, ``dp_size``, ``loss_scale_factor``).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

Count = Union[int, float, torch.Tensor]

__all__ = [
    "LOSS_AGG_MODES",
    "KL_PENALTIES",
    "agg_loss",
    "entropy_from_logits",
    "kl_penalty",
    "log_probs_from_logits",
    "masked_mean",
    "masked_sum",
    "overlong_filter_mask",
    "policy_loss",
    "token_stats",
]


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """``sum(values * mask)``; values outside the mask (NaN included) contribute exactly 0."""
    mask_f = mask.to(values.dtype)
    clean = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    out = clean * mask_f
    return out.sum() if dim is None else out.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """``sum(values * mask) / (sum(mask) + 1e-8)`` -- verl's definition (0 for an empty mask, never NaN)."""
    mask_f = mask.to(values.dtype)
    return masked_sum(values, mask, dim) / ((mask_f.sum() if dim is None else mask_f.sum(dim=dim)) + 1e-8)


def _check_count(name: str, value: Optional[Count]) -> None:
    if value is None:
        return
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            return  # reading an accelerator tensor would force a device sync on every micro-batch
        value = value.detach().item()
    v = float(value)
    if not v >= 0:
        raise ValueError(f"{name} must be >= 0 (a count over the whole mini-batch), got {v}")


def _at_least_one(count: Count) -> Count:
    """``max(count, 1)``: a count of 0 means nothing in the mini-batch counts (e.g. every response overlong-filtered);
    the masked sum is then exactly 0 too, so the loss is 0 with a zero gradient instead of 0 / 0."""
    if isinstance(count, torch.Tensor):
        return count.clamp(min=1)
    return max(count, 1)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    global_tokens: Optional[Count] = None,
    global_seqs: Optional[Count] = None,
    dp_size: int = 1,
    loss_scale_factor: Optional[float] = None,
) -> torch.Tensor:
    """Aggregate a ``[B, T]`` per-token loss into a scalar (formulas in the module docstring; verl 0.9.1 semantics).

    - ``token-mean``: ``masked_sum(L) / N_tok * dp_size`` with ``N_tok = global_tokens`` or, when None, the masked
      tokens of ``loss_mask`` (an empty mask then gives 0 -- verl gives NaN there).
    - ``seq-mean-*``: per-sequence token-mean or token-sum, fully masked rows excluded, summed and divided by
      ``N_seq = global_seqs`` or the number of rows with at least one token; times ``dp_size``.
    - ``seq-mean-token-sum-norm``: additionally divided by ``loss_scale_factor`` (default: ``T = loss_mask.shape[-1]``,
      as verl; set a constant to keep the normalisation fixed across batches of different padded lengths).

    ``dp_size > 1`` needs the global counts (like verl): each rank returns ``local_sum / global_count * dp_size`` so
    that the gradient *average* DDP/FSDP computes equals the gradient of the global mean.

    A global count of 0 (a mini-batch whose responses are all masked, e.g. all truncated under overlong filtering)
    gives a loss of exactly 0 with a zero gradient: the count is used as ``max(count, 1)`` (verl divides by 0 there).
    """
    if loss_mat.shape != loss_mask.shape:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and loss_mask {tuple(loss_mask.shape)} differ in shape")
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    _check_count("global_tokens", global_tokens)
    _check_count("global_seqs", global_seqs)
    mask_f = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        if global_tokens is None:
            if dp_size > 1:
                raise ValueError("token-mean with dp_size > 1 needs global_tokens (valid tokens on all ranks)")
            global_tokens = mask_f.sum()
        return masked_sum(loss_mat, loss_mask) / _at_least_one(global_tokens) * dp_size
    if loss_agg_mode in ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        tokens_per_seq = mask_f.sum(dim=-1)
        seq_sum = masked_sum(loss_mat, loss_mask, dim=-1)
        seq_loss = seq_sum / (tokens_per_seq + 1e-8) if loss_agg_mode == "seq-mean-token-mean" else seq_sum
        seq_valid = tokens_per_seq > 0
        if global_seqs is None:
            if dp_size > 1:
                raise ValueError(f"{loss_agg_mode} with dp_size > 1 needs global_seqs (responses on all ranks)")
            global_seqs = seq_valid.to(loss_mat.dtype).sum()
        loss = masked_sum(seq_loss, seq_valid) / _at_least_one(global_seqs) * dp_size
        if loss_agg_mode == "seq-mean-token-sum-norm":
            scale = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
            if not scale > 0:
                raise ValueError(f"loss_scale_factor must be > 0, got {scale}")
            loss = loss / scale
        return loss
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; expected one of {list(LOSS_AGG_MODES)}")


def _checked_advantages(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
                        response_mask: torch.Tensor, clip_ratio_low: float, clip_ratio_high: float,
                        clip_ratio_c: float) -> torch.Tensor:
    """:func:`policy_loss`'s argument checks; the advantages as ``[B, T]`` in ``log_prob``'s dtype."""
    if not 0.0 <= clip_ratio_low < 1.0:
        raise ValueError(f"clip_ratio_low must be in [0, 1), got {clip_ratio_low}")
    if not clip_ratio_high >= 0.0:
        raise ValueError(f"clip_ratio_high must be >= 0, got {clip_ratio_high}")
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip bound) must be > 1, got {clip_ratio_c}")
    if log_prob.shape != old_log_prob.shape or log_prob.shape != response_mask.shape:
        raise ValueError(
            f"log_prob {tuple(log_prob.shape)}, old_log_prob {tuple(old_log_prob.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must have the same [B, T] shape"
        )
    if advantages.dim() == 1 and log_prob.dim() == 2:
        if advantages.shape[0] != log_prob.shape[0]:
            raise ValueError(f"advantages [B]={advantages.shape[0]} does not match log_prob batch {log_prob.shape[0]}")
        advantages = advantages[:, None].expand_as(log_prob)
    elif advantages.shape != log_prob.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} must be [B] or [B, T] = {tuple(log_prob.shape)}")
    return advantages.to(log_prob.dtype)


def policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float = 10.0,
    loss_agg_mode: str = "token-mean",
    global_tokens: Optional[Count] = None,
    global_seqs: Optional[Count] = None,
    dp_size: int = 1,
    loss_scale_factor: Optional[float] = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DAPO clipped policy-gradient loss: decoupled clip (eq. 10), dual clip on A < 0, token-level aggregation (eq. 12).

    Per token (module docstring for the full formulas)::

        ratio  = exp(clamp(log_prob - old_log_prob, -20, 20))
        L_clip = max(-A * ratio, -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high))
        L      = min(L_clip, -A * clip_ratio_c)   where A < 0,   L_clip elsewhere

    then ``agg_loss(L, response_mask, loss_agg_mode, global_tokens=..., global_seqs=..., dp_size=...,
    loss_scale_factor=...)``.

    Args:
        log_prob: ``[B, T]`` log pi_theta(o_t) (with grad).
        old_log_prob: ``[B, T]`` log pi_old(o_t) (recomputed before the update; no grad needed).
        advantages: ``[B, T]``, or ``[B]`` (one outcome advantage per response, broadcast over its tokens).
        response_mask: ``[B, T]`` bool/0-1: tokens that count (padding and overlong-filtered responses are 0).
        clip_ratio_low / clip_ratio_high: eps_low / eps_high of eq. 10 (DAPO: 0.2 / 0.28).
        clip_ratio_c: dual-clip bound c > 1 (DAPO recipe: 10.0).
        loss_agg_mode: one of :data:`LOSS_AGG_MODES` (DAPO: ``token-mean``).
        global_tokens / global_seqs / dp_size / loss_scale_factor: normalisation over the whole mini-batch (see
            :func:`agg_loss`); None = this micro-batch's own counts.

    Returns:
        ``(loss, metrics)``: ``loss`` a 0-d tensor with grad; ``metrics`` a dict of **detached 0-d tensors** (no
        device sync; ``float()`` them when logging), computed over this call's tokens like verl:

        - ``pg_clipfrac``: masked mean of ``[L2 > L1]`` (tokens where the clipped term is the active bound),
        - ``pg_clipfrac_lower``: masked mean of ``[L_clip > -A * c and A < 0]`` (tokens hit by the dual clip),
        - ``ppo_kl``: masked mean of ``old_log_prob - log_prob`` (the clamped log-ratio, negated).
    """
    advantages = _checked_advantages(log_prob, old_log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high,
                                     clip_ratio_c)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_clip = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    loss_tok = torch.where(negative, torch.minimum(loss_clip, loss_dual_bound), loss_clip)

    loss = agg_loss(loss_tok, response_mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs,
                    dp_size=dp_size, loss_scale_factor=loss_scale_factor)
    with torch.no_grad():
        dual_clipped = (loss_clip > loss_dual_bound) & negative
        metrics = {
            "pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).to(log_prob.dtype), response_mask),
            "pg_clipfrac_lower": masked_mean(dual_clipped.to(log_prob.dtype), response_mask),
            "ppo_kl": masked_mean(-log_ratio, response_mask),
        }
    return loss, {k: v.detach() for k, v in metrics.items()}


KL_PENALTIES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference policy (J. Schulman, "Approximating KL divergence",
    2020), verl 0.9.1's ``core_algos.kl_penalty``; ``d = log_prob - ref_log_prob``::

        kl | k1           d
        abs               |d|
        mse | k2          d^2 / 2
        low_var_kl | k3   clamp(exp(-d') + d' - 1, -10, 10)   with d' = clamp(d, -20, 20)

    A ``+`` suffix (``k1+``, ``k3+``, ...) keeps the forward value but takes the gradient of ``k2`` (straight-through),
    whose expected gradient is the KL's. Used by the KL loss (``recipe.actor.use_kl_loss``): ``kl_loss_coef *
    agg_loss(kl_penalty(...), mask, loss_agg_mode)`` is added to the policy loss.
    """
    base = kind[:-1] if kind.endswith("+") else kind
    if base not in KL_PENALTIES:
        raise ValueError(f"unknown KL estimator {kind!r}; expected one of {list(KL_PENALTIES)} (optionally with '+')")
    d = log_prob - ref_log_prob
    if base in ("kl", "k1"):
        fwd = d
    elif base == "abs":
        fwd = d.abs()
    elif base in ("mse", "k2"):
        fwd = 0.5 * d.square()
    else:
        neg = torch.clamp(-d, min=-20, max=20)
        fwd = torch.clamp(torch.exp(neg) - neg - 1, min=-10, max=10)
    if not kind.endswith("+") or base in ("mse", "k2"):
        return fwd
    back = 0.5 * d.square()
    return back - back.detach() + fwd.detach()


def overlong_filter_mask(response_mask: torch.Tensor, truncated, enable: bool = True) -> torch.Tensor:
    """Overlong filtering (DAPO section 3.4): zero the loss mask of truncated responses.

    ``truncated``: ``[B]`` bool (tensor, numpy or list): the response hit the length limit without EOS. With
    ``enable=False`` (the DAPO recipes' setting, which use the soft overlong *punishment* instead) the mask is returned
    unchanged. The result has ``response_mask``'s dtype and device.
    """
    if not enable:
        return response_mask
    keep = ~torch.as_tensor(truncated, dtype=torch.bool, device=response_mask.device).reshape(-1)
    if keep.shape[0] != response_mask.shape[0]:
        raise ValueError(f"truncated has {keep.shape[0]} entries, response_mask has {response_mask.shape[0]} rows")
    return response_mask * keep[:, None].to(response_mask.dtype)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of softmax(logits) over the last dim: ``H = logsumexp(z) - sum(softmax(z) * z)``.

    ``[..., V] -> [...]``; computed in float32 at least (bf16 logits are upcast).
    """
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    p = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - (p * z).sum(dim=-1)


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[label]``: ``[..., V]`` logits and ``[...]`` token ids -> ``[...]`` log-probabilities."""
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return torch.log_softmax(z, dim=-1).gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)


def token_stats(
    logits: torch.Tensor, labels: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> dict[str, torch.Tensor]:
    """Per-token statistics of a forward pass, for logging (no grad).

    Args:
        logits: ``[B, T, V]`` logits *aligned* with ``labels`` (logits at position t predict ``labels[:, t]``).
        labels: ``[B, T]`` response token ids; ``response_mask``: ``[B, T]``.

    Returns (detached):
        ``log_prob`` ``[B, T]``; ``entropy`` ``[B, T]``;
        ``entropy_agg``: the entropy aggregated with ``loss_agg_mode`` (verl's ``actor/entropy``);
        ``mean_prob``: masked token-mean of ``exp(log_prob)`` (mean probability of the sampled tokens);
        ``mean_log_prob``: masked token-mean of ``log_prob``.
    """
    with torch.no_grad():
        lp = log_probs_from_logits(logits, labels)
        ent = entropy_from_logits(logits)
        return {
            "log_prob": lp,
            "entropy": ent,
            "entropy_agg": agg_loss(ent, response_mask, loss_agg_mode),
            "mean_prob": masked_mean(lp.exp(), response_mask),
            "mean_log_prob": masked_mean(lp, response_mask),
        }

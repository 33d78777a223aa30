"""Forward passes over left-padded prompt batches of a HF causal LM: what the local backend (generation,
log-probs, updates) and the tiny model's supervised warm start (:mod:`dapo.tiny.warmstart`) both run.

It sits below both (torch only, nothing of the project), so the warm start does not import the backend.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["common_prefix_len", "left_pad", "prompt_forward"]


def left_pad(seqs: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D token tensors right-aligned: ``(ids [B, W], mask [B, W])``, ``pad`` / 0 on the left."""
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, width - len(s) :] = s
            mask[i, width - len(s) :] = 1
    return ids, mask


def common_prefix_len(p_ids: torch.Tensor, p_mask: torch.Tensor) -> int:
    """Tokens shared by the start of every (left-padded) prompt row, at most ``min(length) - 1``."""
    lens = p_mask.sum(1)
    lmin = int(lens.min()) if lens.numel() else 0
    if p_ids.shape[0] < 2 or lmin < 2:
        return 0
    starts = p_ids.shape[1] - lens
    heads = p_ids.gather(1, starts[:, None] + torch.arange(lmin, device=p_ids.device)[None])
    same = (heads == heads[:1]).all(0).long()
    return min(int(same.cumprod(0).sum()), lmin - 1)


def prompt_forward(
    model,
    p_ids: torch.Tensor,
    p_mask: torch.Tensor,
    tail_ids: Optional[torch.Tensor] = None,
    *,
    share_prefix: bool = True,
    share_groups: bool = False,
    min_prefix: int = 8,
    use_cache: bool = False,
):
    """Forward ``[prompt | tail]`` for a batch of left-padded prompts; ``tail`` (e.g. responses) is right-aligned
    after each prompt and fully attended (padding after an EOS only follows the tokens that matter).

    Shared prompt prefix: when every prompt starts with the same ``Lc >= min_prefix`` tokens (the DAPO template:
    ``<|im_start|>user\nSolve the following math problem step by step. ...``), that prefix is run once with batch
    size 1 and its key/value cache repeated over the batch (differentiably: gradients of all rows flow back into the
    one prefix pass); the rest of each prompt follows with positions continuing at ``Lc``. Causal attention makes
    this exactly the full computation (prefix tokens never see later tokens), at a fraction of the cost when the
    template dominates the prompt -- prefix caching, as vLLM does for generation, applied to training too.

    Shared prompts (``share_groups``, with a ``tail``): rows whose prompts are identical -- a GRPO group, ``n``
    responses to one prompt -- run that prompt once; its key/value cache is gathered to every row of the group
    (differentiably, as the prefix's) and only the tails are computed per row. Also exact by causality; a batch of
    16 prompts x 8 responses computes each prompt once instead of 8 times.

    Returns ``(logits [B, S + T, V], last_prompt_index, cache, attention_mask, tokens)`` where
    ``logits[:, last_prompt_index + t]`` predicts ``tail[:, t]``, ``attention_mask`` covers the cache (prefix
    included) plus the new tokens, and ``tokens`` counts the positions actually computed (padding included).
    """
    dev = p_ids.device
    keep = int(p_mask.sum(1).max())
    p_ids, p_mask = p_ids[:, p_ids.shape[1] - keep :], p_mask[:, p_mask.shape[1] - keep :]
    B = p_ids.shape[0]
    lc = common_prefix_len(p_ids, p_mask) if share_prefix else 0
    prefix = None
    if lc >= min_prefix:
        start0 = keep - int(p_mask[0].sum())
        prefix = p_ids[:1, start0 : start0 + lc]
        lens = p_mask.sum(1)
        width = int((lens - lc).max())
        block, cols = p_ids[:, keep - width :], torch.arange(keep - width, keep, device=dev)
        block_mask = (cols[None] >= (keep - lens + lc)[:, None]).long()
        head_mask = torch.ones((B, lc), dtype=torch.long, device=dev)
    else:
        lc, width, block, block_mask = 0, keep, p_ids, p_mask.long()
        head_mask = torch.zeros((B, 0), dtype=torch.long, device=dev)
    groups = None
    if share_groups and tail_ids is not None and B > 1:
        distinct, inv = torch.unique(torch.cat([block, block_mask], dim=1), dim=0, return_inverse=True)
        if len(distinct) < B:
            groups = (distinct[:, :width], distinct[:, width:], inv)
    cache = None
    if prefix is not None:
        pre = model(
            input_ids=prefix, attention_mask=torch.ones_like(prefix), position_ids=torch.arange(lc, device=dev)[None],
            use_cache=True,
        )
        cache = pre.past_key_values
        cache.batch_repeat_interleave(B if groups is None else len(groups[0]))
    if groups is not None:
        return _group_forward(model, *groups, head_mask, tail_ids, cache, lc, use_cache)
    ids = block if tail_ids is None else torch.cat([block, tail_ids], dim=1)
    mask = torch.cat([head_mask, block_mask] + ([] if tail_ids is None else [torch.ones_like(tail_ids)]), dim=1)
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=_positions(mask)[:, lc:], past_key_values=cache,
        use_cache=use_cache or cache is not None,
    )
    return out.logits, width - 1, (out.past_key_values if use_cache else None), mask, lc + ids.numel()


def _group_forward(model, prompts, prompt_mask, inv, head_mask, tail_ids, cache, lc: int, use_cache: bool):
    """:func:`prompt_forward` with shared group prompts: each distinct prompt row (``prompts``, after the ``lc``-token
    prefix whose ``cache`` has one row per distinct prompt) once, its cache gathered to the rows ``inv`` maps to it,
    then every row's tail; the same return value."""
    G, width = prompts.shape
    p_mask = torch.cat([head_mask[:G], prompt_mask], dim=1)
    out = model(input_ids=prompts, attention_mask=p_mask, position_ids=_positions(p_mask)[:, lc:],
                past_key_values=cache, use_cache=True)  # fmt: skip
    cache = out.past_key_values
    cache.batch_select_indices(inv)
    mask = torch.cat([p_mask[inv], torch.ones_like(tail_ids)], dim=1)
    tail = model(input_ids=tail_ids, attention_mask=mask, position_ids=_positions(mask)[:, lc + width :],
                 past_key_values=cache, use_cache=True)  # fmt: skip
    logits = torch.cat([out.logits[inv], tail.logits], dim=1)
    return logits, width - 1, (tail.past_key_values if use_cache else None), mask, lc + G * width + tail_ids.numel()


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of every column of a left-padded attention mask (padding at 0)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)

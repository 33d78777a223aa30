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

    Returns ``(logits [B, S + T, V], last_prompt_index, cache, attention_mask, tokens)`` where
    ``logits[:, last_prompt_index + t]`` predicts ``tail[:, t]``, ``attention_mask`` covers the cache (prefix
    included) plus the new tokens, and ``tokens`` counts the positions actually computed (padding included).
    """
    dev = p_ids.device
    keep = int(p_mask.sum(1).max())
    p_ids, p_mask = p_ids[:, p_ids.shape[1] - keep :], p_mask[:, p_mask.shape[1] - keep :]
    B = p_ids.shape[0]
    lc = common_prefix_len(p_ids, p_mask) if share_prefix else 0
    cache = None
    if lc >= min_prefix:
        start0 = keep - int(p_mask[0].sum())
        prefix = p_ids[:1, start0 : start0 + lc]
        pre = model(
            input_ids=prefix, attention_mask=torch.ones_like(prefix), position_ids=torch.arange(lc, device=dev)[None],
            use_cache=True,
        )
        cache = pre.past_key_values
        cache.batch_repeat_interleave(B)
        lens = p_mask.sum(1)
        width = int((lens - lc).max())
        block, cols = p_ids[:, keep - width :], torch.arange(keep - width, keep, device=dev)
        block_mask = (cols[None] >= (keep - lens + lc)[:, None]).long()
        head_mask = torch.ones((B, lc), dtype=torch.long, device=dev)
    else:
        lc, width, block, block_mask = 0, keep, p_ids, p_mask.long()
        head_mask = torch.zeros((B, 0), dtype=torch.long, device=dev)
    ids = block if tail_ids is None else torch.cat([block, tail_ids], dim=1)
    mask = torch.cat([head_mask, block_mask] + ([] if tail_ids is None else [torch.ones_like(tail_ids)]), dim=1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, lc:]
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
        use_cache=use_cache or cache is not None,
    )
    return out.logits, width - 1, (out.past_key_values if use_cache else None), mask, lc + ids.numel()

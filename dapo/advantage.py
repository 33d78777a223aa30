"""Group-relative outcome advantages (GRPO; DAPO paper arXiv 2503.14476, eq. 9).

For the G responses ``o_1..o_G`` sampled for one prompt (one *group*, identified by a shared group id, verl's
``uid``) with scalar outcome rewards ``R_i``::

    A_i = (R_i - mean({R_j})) / (std({R_j}) + eps)        std: unbiased (Bessel, divides by G - 1), like torch.std

and every token of response ``i`` gets ``A_i``. A group of one response uses mean 0 and std 1 (verl 0.9.1
``compute_grpo_outcome_advantage``), i.e. ``A = R / (1 + eps)``. ``norm_by_std=False`` gives the centred reward
``R_i - mean`` (Dr. GRPO). ``tests/test_advantage.py`` proves the numbers equal verl's.
"""

from __future__ import annotations

from typing import Any, Union

import numpy as np
import torch

ArrayLike = Union[np.ndarray, torch.Tensor, list, tuple]

__all__ = ["group_advantages", "group_index", "token_advantages"]


def group_index(group_ids: Any) -> tuple[np.ndarray, int]:
    """Map group ids (ints, strings such as uuids, or any hashable) to dense ``0..K-1`` in order of first appearance.

    Returns ``(inverse [N] int64, K)``.
    """
    if isinstance(group_ids, torch.Tensor):
        group_ids = group_ids.detach().cpu().numpy()
    ids = list(np.asarray(group_ids, dtype=object).reshape(-1)) if not isinstance(group_ids, list) else group_ids
    mapping: dict[Any, int] = {}
    inverse = np.empty(len(ids), dtype=np.int64)
    for i, g in enumerate(ids):
        try:
            inverse[i] = mapping.setdefault(g, len(mapping))
        except TypeError as exc:
            raise TypeError(f"group id at position {i} ({g!r}) is not hashable") from exc
    return inverse, len(mapping)


def group_advantages(scores: ArrayLike, group_ids: Any, eps: float = 1e-6, norm_by_std: bool = True):
    """Per-response GRPO advantage ``(R - group mean) / (unbiased group std + eps)`` (paper eq. 9).

    Args:
        scores: ``[N]`` outcome rewards (numpy array, torch tensor, or a list -> numpy).
        group_ids: ``[N]`` group id of each response (ints or strings; verl uses uuid strings).
        eps: added to the std (verl's ``epsilon``, 1e-6).
        norm_by_std: divide by the group std (GRPO); False: only centre (Dr. GRPO).

    Returns:
        ``[N]`` advantages of the same kind as ``scores``: a torch tensor (same dtype if floating, same device) or a
        numpy array (input float dtype kept, else float64).

    Groups of one response get mean 0 / std 1 (verl). Statistics are accumulated in float64.
    """
    is_torch = isinstance(scores, torch.Tensor)
    if is_torch:
        values = scores.detach().to("cpu", torch.float64).numpy()
    else:
        values = np.asarray(scores, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"scores must be 1-D (one outcome reward per response), got shape {values.shape}")
    inverse, num_groups = group_index(group_ids)
    if inverse.shape[0] != values.shape[0]:
        raise ValueError(f"scores has {values.shape[0]} entries but group_ids has {inverse.shape[0]}")
    if not np.all(np.isfinite(values)):
        bad = int(np.flatnonzero(~np.isfinite(values))[0])
        raise ValueError(f"score at position {bad} is not finite ({values[bad]})")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")

    counts = np.bincount(inverse, minlength=num_groups).astype(np.float64)
    means = np.bincount(inverse, weights=values, minlength=num_groups) / np.maximum(counts, 1.0)
    centred = values - means[inverse]
    sq = np.bincount(inverse, weights=centred * centred, minlength=num_groups)
    stds = np.sqrt(sq / np.maximum(counts - 1.0, 1.0))
    single = counts == 1
    means[single] = 0.0
    stds[single] = 1.0
    adv = values - means[inverse]
    if norm_by_std:
        adv = adv / (stds[inverse] + eps)

    if is_torch:
        dtype = scores.dtype if scores.is_floating_point() else torch.float32
        return torch.as_tensor(adv, dtype=dtype, device=scores.device)
    if isinstance(scores, np.ndarray) and np.issubdtype(scores.dtype, np.floating):
        return adv.astype(scores.dtype, copy=False)
    return adv


def token_advantages(advantages, response_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast ``[N]`` per-response advantages over the tokens: ``A[:, None] * response_mask`` -> ``[N, T]``."""
    a = torch.as_tensor(advantages, device=response_mask.device)
    if a.dim() != 1 or a.shape[0] != response_mask.shape[0]:
        raise ValueError(f"advantages must be [N={response_mask.shape[0]}], got shape {tuple(a.shape)}")
    dtype = a.dtype if a.is_floating_point() else torch.float32
    return a.to(dtype)[:, None] * response_mask.to(dtype)

"""The verl backend's batch helpers: plain functions over ``verl.DataProto`` (no GPU, no worker groups).

- building a DataProto from prompt rows (``_dataproto``, ``_obj_array``, ``_as_messages``, ``_mixed``);
- :func:`valid_response_ids`: each response's valid tokens as Python lists for the tokenizer, built from the valid
  tokens only (one tensor gather; the padding of ``batch x max_response_length`` never becomes Python objects);
- :func:`response_lengths` and :func:`place_scores`: verl's reward placement, ``token_level_scores[i, L_i - 1] = R_i``
  on the last valid response token (no KL in reward: ``token_level_rewards = token_level_scores``);
- :func:`balance_order`: verl's ``balance_batch`` reordering for balanced data-parallel work.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["response_lengths", "valid_response_ids", "place_scores", "balance_order"]


def _dataproto():
    from verl.protocol import DataProto

    return DataProto


def _obj_array(values: list[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def _as_messages(prompt: Any, where: str) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, np.ndarray):
        prompt = prompt.tolist()
    if not isinstance(prompt, (list, tuple)) or not all(isinstance(m, dict) and "content" in m for m in prompt):
        raise ValueError(f"{where}: 'prompt' must be a chat list [{{role, content}}, ...] (DAPO-Math-17k schema)")
    return [dict(m) for m in prompt]


def _mixed(values: Any) -> bool:
    return len({type(v) for v in values}) > 1


def response_lengths(data: Any) -> torch.Tensor:
    """Generated tokens per response (EOS included): the valid part of ``attention_mask`` after the prompt."""
    prompt_len = data.batch["prompts"].shape[-1]
    return data.batch["attention_mask"][:, prompt_len:].sum(-1)


def valid_response_ids(data: Any) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
    """(token ids of each response's valid part, lengths, each response's last valid token or -1 when empty).

    Driver work scales with the generated tokens, not with the padded ``[N, max_response_length]`` tensor (at full's
    scale 24,576 x 20,480 slots per generation batch, most of them padding): the valid tokens are gathered by the
    response mask in one tensor op and only they become Python ints (``tolist`` of a flat tensor, split by length)."""
    resp = data.batch["responses"]
    lengths = response_lengths(data).cpu()
    L = lengths.numpy().astype(np.int64)
    valid = torch.arange(resp.shape[-1], device=resp.device)[None, :] < lengths.to(resp.device)[:, None]
    flat = resp[valid].cpu().tolist()  # row-major: each row's valid tokens, rows in order
    ends = np.cumsum(L)
    ids = [flat[e - n:e] for e, n in zip(ends.tolist(), L.tolist())]
    last = np.full(len(L), -1, dtype=np.int64)
    nonempty = L > 0
    if nonempty.any():
        rows = torch.as_tensor(np.nonzero(nonempty)[0])
        last[nonempty] = resp.cpu()[rows, torch.as_tensor(L[nonempty] - 1)].numpy()
    return ids, L, last


def place_scores(data: Any, rewards: Any) -> None:
    """verl's reward placement: ``token_level_scores[i, L_i - 1] = R_i`` (last valid response token), zeros elsewhere;
    ``token_level_rewards`` = ``token_level_scores`` (no KL in the reward: ``use_kl_in_reward`` is refused)."""
    r = torch.as_tensor(np.asarray(rewards, dtype=np.float32)).reshape(-1)
    lengths = response_lengths(data)
    if r.shape[0] != lengths.shape[0]:
        raise ValueError(f"{lengths.shape[0]} responses but {r.shape[0]} rewards")
    if bool((lengths < 1).any()):
        raise ValueError("a response has no valid token: cannot place its reward")
    scores = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
    scores[torch.arange(r.shape[0]), lengths - 1] = r
    data.batch["token_level_scores"] = scores
    data.batch["token_level_rewards"] = scores.clone()


def balance_order(attention_mask: torch.Tensor, dp_size: int) -> tuple[np.ndarray, dict[str, float]]:
    """verl's ``balance_batch``: a permutation giving each of ``dp_size`` equal-size chunks a similar workload.

    Partitions by verl's Karmarkar-Karp (``get_seqlen_balanced_partitions`` over ``calculate_workload``), then within
    each partition shortest/longest sequences at both ends (verl's ordering). Returns (order, verl's balance metrics).
    """
    from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions, log_seqlen_unbalance

    n = attention_mask.shape[0]
    if dp_size <= 1 or n % dp_size:
        return np.arange(n), {}
    seqlen = attention_mask.view(n, -1).sum(-1)
    workload = calculate_workload(seqlen)
    parts = get_seqlen_balanced_partitions(workload.tolist(), k_partitions=dp_size, equal_size=True)
    ordered = []
    for part in parts:
        part = sorted(part, key=lambda i: (float(workload[i]), i))
        ordered.append(part[::2] + part[1::2][::-1])
    metrics = log_seqlen_unbalance(seqlen_list=seqlen.tolist(), partitions=ordered, prefix="global_seqlen")
    return np.asarray([i for part in ordered for i in part], dtype=np.int64), {k: float(v) for k, v in metrics.items()}

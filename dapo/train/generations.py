"""Generation dumps for debugging RL runs, in verl 0.9.1's formats (``trainer.rollout_data_dir``,
``trainer.validation_data_dir``, ``trainer.log_val_generations``). Framework-free: numpy only.

- :func:`dump_generations` writes ``<dir>/<step>.jsonl``, one JSON object per response with verl's keys
  (``RayPPOTrainer._write_generations``)::

      {"input": prompt, "output": response, "gts": ground truth, "score": R, "step": step, <extra>: ...}

  ``extra`` holds per-response reward details (``acc``, ``pred``, ``score``, ``overlong_reward`` ... like verl's
  ``reward_extra_info``); a column of another length is left out, and an extra ``score`` (the verifier's ±1)
  replaces the summed reward, both as verl does.
- :func:`pick_val_generations` chooses the validation samples verl logs (``_maybe_log_val_generations``): the
  ``(input, output, score)`` triples sorted by input, shuffled with ``numpy.random.RandomState(42)``, the first ``n``.

``input`` is the prompt text: the contents of the prompt's chat messages joined by newlines (verl decodes the
chat-templated prompt ids instead, so its ``input`` also carries the template's role markers).
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import numpy as np

__all__ = ["dump_generations", "pick_val_generations", "prompt_text"]


def prompt_text(row: dict[str, Any], prompt_key: str = "prompt") -> str:
    """The prompt of a DAPO-schema row as text (chat contents joined by newlines)."""
    chat = row.get(prompt_key)
    if isinstance(chat, str):
        return chat
    if chat is None:
        return ""
    return "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in chat)


def _plain(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    return v


def dump_generations(
    directory: str | os.PathLike,
    step: int,
    inputs: Sequence[str],
    outputs: Sequence[str],
    gts: Sequence[Any],
    scores: Sequence[float],
    extra: dict[str, Sequence[Any]] | None = None,
) -> str:
    """Write ``<directory>/<step>.jsonl`` (verl's ``_write_generations`` format); returns the file path."""
    n = len(inputs)
    if not (len(outputs) == len(gts) == len(scores) == n):
        raise ValueError(f"dump_generations: {n} inputs, {len(outputs)} outputs, {len(gts)} gts, {len(scores)} scores")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(str(directory), f"{int(step)}.jsonl")
    base: dict[str, list[Any]] = {
        "input": list(inputs), "output": list(outputs), "gts": list(gts),
        "score": [float(s) for s in scores], "step": [int(step)] * n,
    }  # fmt: skip
    for k, v in (extra or {}).items():
        if len(v) == n:  # as verl: an extra column replaces a base one of the same name ("score")
            base[k] = [_plain(x) for x in (v.tolist() if hasattr(v, "tolist") else v)]
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({k: v[i] for k, v in base.items()}, ensure_ascii=False, default=str) + "\n")
    os.replace(tmp, path)
    return path


def pick_val_generations(
    inputs: Sequence[str], outputs: Sequence[str], scores: Sequence[float], n: int
) -> list[tuple[str, str, float]]:
    """The ``n`` validation samples verl logs: sorted by input, shuffled with RandomState(42), the first ``n``."""
    if n <= 0:
        return []
    samples = list(zip(inputs, outputs, [float(s) for s in scores], strict=True))
    samples.sort(key=lambda x: x[0])
    rng = np.random.RandomState(42)
    rng.shuffle(samples)
    return samples[:n]

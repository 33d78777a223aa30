"""Supervised warm start of the tiny policy (before RL), so RL starts from partial accuracy.

Next-token cross-entropy on the response tokens only (prompt tokens are context), batches of fresh labels drawn
with :func:`dapo.tiny.task.sft_response` (the "forgot the carry" mistake at ``mistake_rate`` on carrying problems),
AdamW with a 10-step linear warm-up and a cosine decay to 10 % of ``lr``, run for ``steps`` steps (sized to reach the
plateau where the policy reproduces the label mixture).

Reproducible: the same spec gives the same weights, bit for bit, whatever the machine's core count -- the training
runs on :data:`THREADS` torch thread(s) (:func:`fixed_threads`), because a CPU matmul split over more threads sums in
another order (1 and 2 threads gave different weights after 30 steps, measured). CPUs with other vector units (AVX2
vs AVX-512, another BLAS) still round differently: see docs/ablation.md for by how much.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
from typing import Callable, Iterator, Optional

import numpy as np
import torch


# torch threads of the warm start (and of the benchmarks' precondition probe): fixed, so the core count of the machine
# does not change the float summation order
THREADS = 1


@contextlib.contextmanager
def fixed_threads(n: int = THREADS) -> Iterator[None]:
    """Run the block on ``n`` torch intra-op threads, then restore the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def weights_digest(model) -> str:
    """sha256 of the model's parameters and buffers (name, dtype, shape, bytes; in name order): equal digests are
    bit-identical weights."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def encode_response(tokenizer, response: str) -> list[int]:
    """Response ids + EOS (what the policy must produce)."""
    return tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def sft(
    model,
    tokenizer,
    problems,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    mistake_rate: float,
    seed: int,
    recheck_rate: float = 0.0,
    guess_rate: float = 0.0,
    recheck_mistake_rate: Optional[float] = None,
    swap_rate: float = 0.0,
    log: Callable[[str], None] = print,
) -> dict:
    """Train ``model`` in place; returns {"loss": final smoothed loss, "seconds": wall, "steps": steps}.

    The prompt template shared by every row is computed once per batch (:func:`dapo.util.lm_forward.prompt_forward`).
    """
    from dapo.tiny.task import dapo_prompt, sft_response

    rng = np.random.default_rng(seed)
    prompt_cache: dict[int, list[int]] = {}

    def prompt_ids(i: int) -> list[int]:
        if i not in prompt_cache:
            msgs = [{"role": "user", "content": dapo_prompt(problems[i].text())}]
            out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            prompt_cache[i] = list(out["input_ids"] if hasattr(out, "keys") else out)
        return prompt_cache[i]

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.dim() < 2 else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.98)
    )
    warm = min(10, max(1, steps // 10))

    def lr_at(step: int) -> float:
        if step < warm:
            return lr * (step + 1) / warm
        progress = (step - warm) / max(1, steps - warm)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    from dapo.util.lm_forward import left_pad, prompt_forward

    model.train()
    t0 = time.time()
    ema = None
    pad = tokenizer.pad_token_id
    for step in range(steps):
        idx = rng.integers(0, len(problems), size=batch_size)
        prompts = [torch.tensor(prompt_ids(int(i))) for i in idx]
        resps = [encode_response(tokenizer, sft_response(problems[int(i)], rng, mistake_rate, recheck_rate, guess_rate,
                                                         recheck_mistake_rate, swap_rate)) for i in idx]
        p_ids, p_mask = left_pad(prompts, pad)
        width = max(len(r) for r in resps)
        r_ids = torch.full((batch_size, width), pad, dtype=torch.long)
        r_mask = torch.zeros((batch_size, width), dtype=torch.bool)
        for k, r in enumerate(resps):  # right padding
            r_ids[k, : len(r)] = torch.tensor(r)
            r_mask[k, : len(r)] = True
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        logits, last, _, _, _ = prompt_forward(model, p_ids, p_mask, r_ids)
        logits = logits[:, last : last + width].float()
        loss = torch.nn.functional.cross_entropy(logits[r_mask], r_ids[r_mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.9 * ema + 0.1 * loss.item()
        if (step + 1) % max(1, steps // 10) == 0 or step + 1 == steps:
            log(f"warm start: step {step + 1}/{steps} | loss {ema:.4f} | {time.time() - t0:.0f}s")
    model.eval()
    return {"loss": ema, "seconds": time.time() - t0, "steps": steps}

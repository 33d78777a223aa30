#!/usr/bin/env python
"""Benchmark the algorithm core against verl 0.9.1, side by side in one process (not a test).

Measures, alternating ours / verl on the same inputs so that machine load hits both alike, and prints ratios
(verl time / our time: > 1 means we are faster):

- verifier throughput: ``dapo.reward.compute_score`` vs ``verl.utils.reward_score.math_dapo.compute_score`` on
  synthetic DAPO-style responses (reasoning text + ``Answer: N`` / ``\\boxed{N}``), plus one adversarial ground truth;
- policy loss forward + backward: ``dapo.loss.policy_loss`` vs ``core_algos.compute_policy_loss_vanilla`` on a
  mini-batch of ``--batch x --tokens`` (default 512 x 2048) float32 tensors, every aggregation mode;
- group advantages: ``dapo.advantage.group_advantages`` vs ``core_algos.compute_grpo_outcome_advantage`` for
  ``--prompts x --n`` responses.

Usage: ``python scripts/bench_core.py [--batch 512 --tokens 2048 --repeats 5 --device cpu]``.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time
import warnings

import numpy as np
import torch


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def side_by_side(ours, ref, repeats: int) -> tuple[float, float]:
    """Median seconds of ours and ref, measured alternately (one warm-up call each)."""
    ours(), ref()
    a, b = [], []
    for _ in range(repeats):
        a += timed(ours, 1)
        b += timed(ref, 1)
    return statistics.median(a), statistics.median(b)


def synthetic_responses(count: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    words = "we consider the sum of the digits so that x equals y then by symmetry it follows and".split()
    out = []
    for i in range(count):
        gt = str(rng.randint(0, 999))
        body = " ".join(rng.choice(words) for _ in range(rng.randint(150, 700)))  # ~1-4k characters
        ans = gt if rng.random() < 0.5 else str(int(gt) + 1)
        style = i % 4
        if style == 0:
            tail = f"\nAnswer: {ans}"
        elif style == 1:
            tail = f"\nAnswer: ${ans}$"
        elif style == 2:
            tail = f"\nso the answer is \\boxed{{{ans}}}"
        else:
            tail = f"\nAnswer: 7\nLet me re-check.\nAnswer: \\text{{{ans}}} degrees"
        out.append((body + tail, gt))
    return out


def bench_verifier(args, ours_fn, verl_fn) -> None:
    pairs = synthetic_responses(args.responses)
    for s, g in pairs[:200]:
        assert ours_fn(s, g) == verl_fn(s, g)
    ours_t, verl_t = side_by_side(
        lambda: [ours_fn(s, g) for s, g in pairs], lambda: [verl_fn(s, g) for s, g in pairs], args.repeats
    )
    n = len(pairs)
    print(f"verifier  {n} responses (1-4k chars)   ours {n / ours_t:10.0f}/s   verl {n / verl_t:10.0f}/s   "
          f"ratio {verl_t / ours_t:5.2f}x")  # fmt: skip
    bad_gt = "a$" + "b" * args.adversarial_chars  # a lone '$' in a long ground truth
    ours_t, verl_t = side_by_side(lambda: ours_fn("Answer: 1", bad_gt), lambda: verl_fn("Answer: 1", bad_gt), 1)
    print(f"verifier  adversarial ground truth ({len(bad_gt)} chars, one '$')   ours {ours_t * 1e3:8.2f} ms   "
          f"verl {verl_t * 1e3:8.1f} ms   ratio {verl_t / ours_t:7.0f}x")  # fmt: skip


def bench_loss(args, core_algos, actor_config_cls) -> None:
    from dapo.loss import LOSS_AGG_MODES, policy_loss

    dev = torch.device(args.device)
    g = torch.Generator(device="cpu").manual_seed(0)
    b, t = args.batch, args.tokens
    old = (-torch.rand(b, t, generator=g) * 4).to(dev)
    base = (old + torch.randn(b, t, generator=g) * 0.3).to(dev)
    adv = torch.randn(b, 1, generator=g).expand(b, t).contiguous().to(dev)
    lengths = torch.randint(t // 8, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float().to(dev)
    cfg = actor_config_cls(strategy="fsdp", rollout_n=16, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=0.2,
                           clip_ratio_high=0.28, clip_ratio_c=10.0)  # fmt: skip

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for mode in LOSS_AGG_MODES:
        lp = base.clone().requires_grad_(True)

        def ours():
            loss, m = policy_loss(lp, old, adv, mask, loss_agg_mode=mode)
            loss.backward()
            {k: float(v) for k, v in m.items()}  # the same host syncs verl's .item() metrics do
            lp.grad = None
            sync()

        def ref():
            loss, _ = core_algos.compute_policy_loss_vanilla(old, lp, adv, mask, loss_agg_mode=mode, config=cfg)
            loss.backward()
            lp.grad = None
            sync()

        ours_t, verl_t = side_by_side(ours, ref, args.repeats)
        print(f"loss fwd+bwd {b}x{t} {mode:24s} ours {ours_t * 1e3:8.1f} ms   verl {verl_t * 1e3:8.1f} ms   "
              f"ratio {verl_t / ours_t:5.2f}x")  # fmt: skip


def bench_advantage(args, core_algos) -> None:
    from dapo.advantage import group_advantages

    count = args.prompts * args.n
    ids = np.array([f"uid-{i // args.n}" for i in range(count)], dtype=object)
    scores = torch.from_numpy(np.random.default_rng(0).choice([-1.0, 1.0], count)).float()
    rewards = torch.zeros(count, 8)
    rewards[:, -1] = scores
    mask = torch.ones(count, 8)
    ours_t, verl_t = side_by_side(
        lambda: group_advantages(scores, ids),
        lambda: core_algos.compute_grpo_outcome_advantage(rewards, mask, ids),
        args.repeats,
    )
    print(f"advantage {args.prompts}x{args.n} responses            ours {ours_t * 1e3:8.2f} ms   "
          f"verl {verl_t * 1e3:8.1f} ms   ratio {verl_t / ours_t:5.1f}x")  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=512, help="responses per loss mini-batch")
    p.add_argument("--tokens", type=int, default=2048, help="response tokens per row (padded)")
    p.add_argument("--responses", type=int, default=2000, help="responses for the verifier throughput")
    p.add_argument("--adversarial-chars", type=int, default=10_000)
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")

    from verl.trainer.ppo import core_algos
    from verl.utils.reward_score import math_dapo
    from verl.workers.config.actor import ActorConfig

    from dapo.reward import compute_score

    print(f"# python {platform.python_version()}, torch {torch.__version__}, device {args.device}, "
          f"{torch.get_num_threads()} torch threads, median of {args.repeats} alternating runs")  # fmt: skip
    bench_verifier(args, compute_score, math_dapo.compute_score)
    bench_advantage(args, core_algos)
    bench_loss(args, core_algos, ActorConfig)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

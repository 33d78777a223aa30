"""``dapo bench sampler``: a simulation of Algorithm 1's sampling with the real
:class:`dapo.sampler.DynamicSampler` (no model): each prompt group is kept independently with probability
``keep_rate``; prints generation batches per step and generated prompts per trained prompt for the reference and
the carry sampler, next to the ``dapo plan`` model.
"""

from __future__ import annotations

import argparse


def simulate_sampler(mode: str, train_batch_size: int, gen_batch_size: int, keep_rate: float, *, n: int = 2,
                     steps: int = 200, seed: int = 0) -> dict[str, float]:
    """Run ``steps`` steps of the DynamicSampler on groups kept with probability ``keep_rate``; returns
    generated prompts per step, generation batches per step and generated prompts per trained prompt."""
    import numpy as np

    from dapo.sampler import DynamicSampler

    rng = np.random.default_rng(seed)
    s = DynamicSampler(train_batch_size, n, mode=mode, gen_batch_size=gen_batch_size, max_num_gen_batches=0)
    prompts = batches = 0
    gid = 0
    for _ in range(steps):
        while not s.is_full():
            size = s.suggested_gen_batch_size()
            mixed = rng.random(size) < keep_rate
            ids = np.repeat(np.arange(gid, gid + size), n)
            acc = np.zeros((size, n))
            acc[mixed, 0] = 1.0  # a group with one correct response varies; an all-zero group does not
            s.add(ids, acc.reshape(-1))
            gid += size
            prompts += size
            batches += 1
        s.selection()
        s.finish_step()
    return {"prompts_per_step": prompts / steps, "gen_batches_per_step": batches / steps,
            "prompts_per_trained_prompt": prompts / (steps * train_batch_size)}


def cmd_sampler(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="dapo bench sampler", description="reference vs carry sampler, simulated")
    p.add_argument("--train-batch-size", type=int, default=512)
    p.add_argument("--gen-batch-size", type=int, default=1536)
    p.add_argument("--keep-rates", default="0.2,0.3,0.4,0.5,0.7")
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args(argv)
    from dapo.plan.steps import carry_prompts_per_step

    B, G = args.train_batch_size, args.gen_batch_size
    print(f"train_batch_size {B}, gen_batch_size {G}, {args.steps} simulated steps per cell; generated prompts per "
          "trained prompt (generation batches per step)")
    print("| keep rate | reference | carry | carry saves | plan model: reference | plan model: carry |")
    print("|---|---|---|---|---|---|")
    import math

    for k in [float(x) for x in args.keep_rates.split(",")]:
        ref = simulate_sampler("reference", B, G, k, steps=args.steps)
        car = simulate_sampler("carry", B, G, k, steps=args.steps)
        model_ref = math.ceil(B / (G * k)) * G / B
        model_car = carry_prompts_per_step(B, k) / B
        save = 1 - car["prompts_per_trained_prompt"] / ref["prompts_per_trained_prompt"]
        print(f"| {k:.2f} | {ref['prompts_per_trained_prompt']:.2f} ({ref['gen_batches_per_step']:.2f}) | "
              f"{car['prompts_per_trained_prompt']:.2f} ({car['gen_batches_per_step']:.2f}) | {save:.0%} | "
              f"{model_ref:.2f} | {model_car:.2f} |")
    return 0

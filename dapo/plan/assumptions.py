"""The stated assumptions of the plan's time and memory model (:class:`Assumptions`): mean and longest lengths,
the dynamic-sampling keep rate, achieved fractions of peak bandwidth / FLOPs and fixed overheads. Every plan prints
them; they are calibrated on the published runs in :mod:`dapo.plan.calibration`. (The loop's host-memory model has
its own, :class:`dapo.plan.memory.SizingAssumptions`.)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Assumptions:
    # Mean prompt tokens (DAPO-Math-17k prompts average ~170 tokens: prompt_length/mean in a verl DAPO log, verl#816).
    mean_prompt_len: int = 200
    # Mean response tokens; None = 20% of max_response_length, at most 4,096 (DAPO-32B responses average ~3-6k of
    # the 20k cap over a run, growing with training).
    mean_response_len: Optional[int] = None
    # Longest response per step; None = max_response_length (with thousands of samples per step some hit the cap).
    tail_response_len: Optional[int] = None
    # Std / mean of response lengths (enters the attention FLOPs through E[L^2]).
    length_cv: float = 1.0
    # Dynamic sampling: fraction of prompt groups with mixed outcomes (kept by filter_groups).
    keep_rate: float = 0.4
    # Decode: achieved fraction of peak HBM bandwidth when streaming weights and KV cache.
    hbm_efficiency: float = 0.6
    # Decode: achieved fraction of peak FLOPs for large decode batches (compute-bound on low-FLOP parts like H20).
    decode_mfu: float = 0.2
    # Decode: fixed cost per engine iteration (scheduler, sampling, launches, TP all-reduce latency), seconds.
    decode_iter_overhead_s: float = 0.002
    # Prefill: achieved fraction of peak FLOPs.
    prefill_mfu: float = 0.5
    # Training (FSDP forward/backward incl. attention): achieved fraction of peak FLOPs.
    train_mfu: float = 0.4
    # Per rollout step: weight sync to vLLM, CPU offload/onload, reward, Ray transfers, seconds.
    step_overhead_s: float = 20.0
    # Aggregate checkpoint write bandwidth to the shared volume, GB/s.
    storage_gbps: float = 5.0
    # vLLM memory besides weights and KV cache (activations, sampler, CUDA graphs), GiB per GPU.
    vllm_reserve_gib: float = 2.0
    # CUDA context + allocator slack outside vLLM's budget, GiB per GPU.
    cuda_context_gib: float = 1.0
    # vLLM max concurrent sequences per engine (verl rollout.max_num_seqs; raise it for long-response DAPO runs).
    max_num_seqs: int = 1024
    # A failed attempt's restart: the next cluster, images on the nodes, model and checkpoint load, engine start,
    # seconds (not measurable without the cluster; dapo.plan.faults).
    restart_s: float = 1200.0
    # Unexpected interruptions per GPU and day: Llama 3 405B pre-training, 419 in 54 days on 16,384 H100s
    # (arXiv 2407.21783, Table 5).
    faults_per_gpu_day: float = 419 / (54 * 16384)

    def resolved_response_len(self, max_response_length: int) -> int:
        if self.mean_response_len is not None:
            return self.mean_response_len
        return min(round(0.2 * max_response_length), 4096)

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

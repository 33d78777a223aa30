"""``dapo plan``: what a preset costs before GPUs are booked -- memory per GPU, tokens, step time, GPU-hours.

Everything is derived from the preset (``dapo.config.load_preset``, the single source of truth) and a small table of
model architectures and accelerators. :func:`make_plan` is a pure function ``(preset, gpu, nodes, ...) -> Plan``;
:func:`render_text`, ``--json`` and ``--markdown`` print it.

Step semantics (the #1 source of confusion when reproducing DAPO)
-----------------------------------------------------------------
* a **generation round** samples ``gen_batch_size`` prompts x ``n`` responses;
* a **rollout step** trains on ``train_batch_size`` prompt groups. With dynamic sampling (``filter_groups``) it takes
  ``ceil(train_batch_size / (gen_batch_size * keep_rate))`` rounds, ``keep_rate`` = fraction of groups whose
  responses are not all right or all wrong; without it, one round. With the carry sampler
  (``filter_groups.mode: carry``) surplus kept groups are trained on in the next step and the generation batch follows
  the observed keep rate, so in steady state ``train_batch_size / keep_rate`` prompts are generated per step
  (:func:`carry_prompts_per_step`; checked against a simulation of :class:`dapo.sampler.DynamicSampler` in
  tests/test_plan.py, measured with ``dapo bench sampler``);
* a **gradient step** is one optimizer update on ``ppo_mini_batch_size`` prompt groups:
  ``gradient steps = rollout steps * train_batch_size / ppo_mini_batch_size * ppo_epochs`` (16 for the DAPO recipe).
  The paper's training-step axis counts gradient steps (verl issues #795, #1643).
* an **epoch** is one pass of the dataloader (batches of ``gen_batch_size`` prompts, last partial batch dropped).
  The hub DAPO-Math-17k file is ~17.9k problems repeated ~100x (1,791,700 rows), so one epoch of ``full`` is 1,166
  generation rounds -- months of compute -- while the paper stopped after ~320 rollout steps.

Time model (stated assumptions, calibrated against published runs; see ``ANCHORS`` and docs/reproduce.md)
-----------------------------------------------------------------------------------------------------------
Generation (vLLM, one engine per ``rollout_tp`` GPUs) is decode-bound. Each decode iteration streams the engine's
weights once (``2N/tp`` bytes per GPU at ``hbm_efficiency`` x peak bandwidth) plus a fixed per-iteration overhead;
each generated token adds ``max(KV bytes read, 2N + attention FLOPs)`` at the bandwidth / ``decode_mfu`` roofline::

    t_gen = a * max(L_tail, tokens_per_engine / concurrency) + b * tokens_per_engine + prefill

``L_tail`` (the longest response, the response cap by default) is the floor adding GPUs cannot remove; concurrency is
bounded by ``max_num_seqs`` and by the KV cache (``gpu_memory_utilization``). Training is compute-bound: forward
``2N`` FLOPs per token plus causal attention ``2 * layers * d_attn * L^2`` per sequence; the update costs 3x the
forward (+1x recompute with gradient checkpointing), the old-log-prob recomputation 1x (+1x for a reference model
when a KL term is on), at ``train_mfu`` of peak. Per mini-batch, a data-parallel rank processes at least the longest
sequence (``max(tokens / dp, L_tail)``), which is why long-response runs stop scaling with more GPUs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from dapo.config import ConfigError, Preset, load_preset

GIB = 1024**3

# The DAPO paper's 32B run: ~320 rollout steps (= ~5,100 gradient steps at 16 per rollout step); a DAPO author in
# https://github.com/verl-project/verl/issues/795 ("the 6k steps in the paper correspond to gradient steps ... the
# total number of rollout steps is around 320").
PAPER_ROLLOUT_STEPS = 320

# Row counts of the files `dapo data prepare` writes (hub DAPO-Math-17k: 17,917 problems x 100 copies).
KNOWN_DATASET_ROWS = {
    "dapo-math-17k.parquet": 1_791_700,
    "dapo-math-17k-dedup.parquet": 17_917,
    "aime-2024.parquet": 960,
}


class PlanError(ValueError):
    """The plan cannot be made (unknown model, local preset, ...); the message says what to pass instead."""


# --------------------------------------------------------------------------------------------------------------------
# Architectures
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arch:
    """A dense decoder (Qwen2 family: GQA attention with q/k/v biases, SwiGLU MLP, RMSNorm)."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    head_dim_: Optional[int] = None

    @property
    def head_dim(self) -> int:
        return self.head_dim_ or self.hidden_size // self.num_heads

    @property
    def attn_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        h = self.hidden_size
        attn = h * self.attn_dim + self.attn_dim + 2 * (h * self.kv_dim + self.kv_dim) + self.attn_dim * h
        return attn + 3 * h * self.intermediate_size + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        emb = self.embedding_params * (1 if self.tie_word_embeddings else 2)
        return emb + self.num_layers * self.layer_params + self.hidden_size

    @property
    def matmul_params(self) -> int:
        """Parameters used in matmuls per token (the input embedding is a lookup unless tied to the LM head)."""
        return self.params - (0 if self.tie_word_embeddings else self.embedding_params)

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.num_layers * self.kv_dim * dtype_bytes

    def fwd_flops(self, tokens: float, sum_sq_len: float) -> float:
        """Forward FLOPs: 2 * matmul params per token + causal attention (QK^T and AV) 2 * layers * d_attn * L^2."""
        return 2.0 * self.matmul_params * tokens + 2.0 * self.num_layers * self.attn_dim * sum_sq_len


# Values from each model's config.json on the Hugging Face hub.
ARCHS: dict[str, Arch] = {
    "qwen2.5-32b": Arch("Qwen2.5-32B", 5120, 64, 40, 8, 27648, 152064, False, 131072),
    "qwen2.5-7b": Arch("Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064, False, 131072),
    # Qwen2.5-Math-7B: the 7B architecture with a 4k context (rope_theta 1e4); the DAPO 7B scripts override
    # max_position_embeddings to 32768.
    "qwen2.5-math-7b": Arch("Qwen2.5-Math-7B", 3584, 28, 28, 4, 18944, 152064, False, 4096),
    "qwen2.5-1.5b": Arch("Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936, True, 32768),
    "qwen2.5-math-1.5b": Arch("Qwen2.5-Math-1.5B", 1536, 28, 12, 2, 8960, 151936, True, 4096),
    "qwen2.5-0.5b": Arch("Qwen2.5-0.5B", 896, 24, 14, 2, 4864, 151936, True, 32768),
}


def arch_from_config(config: dict[str, Any], name: str) -> Arch:
    """An :class:`Arch` from a HF ``config.json`` mapping."""
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in required if k not in config]
    if missing:
        raise PlanError(f"{name}: config.json lacks {', '.join(missing)} (a dense decoder config is expected)")
    return Arch(
        name=name,
        hidden_size=int(config["hidden_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=int(config["num_attention_heads"]),
        num_kv_heads=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
        head_dim_=int(config["head_dim"]) if config.get("head_dim") else None,
    )


def resolve_arch(model_path: str, model_config: Optional[str] = None) -> Arch:
    """Architecture of ``model_path``: an explicit config.json, a local model directory, or the known table."""
    if model_config:
        p = Path(model_config)
        p = p / "config.json" if p.is_dir() else p
        if not p.is_file():
            raise PlanError(f"--model-config {model_config}: no config.json there")
        try:
            return arch_from_config(json.loads(p.read_text()), str(p.parent.name or p))
        except json.JSONDecodeError as exc:
            raise PlanError(f"{p}: not valid JSON ({exc})") from exc
    local = Path(model_path) / "config.json"
    if local.is_file():
        return arch_from_config(json.loads(local.read_text()), Path(model_path).name)
    key = model_path.rstrip("/").split("/")[-1].lower()
    key = key.removesuffix("-instruct")
    if key in ARCHS:
        return ARCHS[key]
    raise PlanError(
        f"unknown model architecture for {model_path!r}: pass --model-config PATH (the model's config.json or a "
        f"directory holding it). Known: {', '.join(a.name for a in ARCHS.values())}"
    )


# --------------------------------------------------------------------------------------------------------------------
# Accelerators
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPU:
    name: str
    bf16_tflops: float  # dense BF16 tensor-core peak
    hbm_tbps: float  # HBM bandwidth, TB/s
    memory_gib: float  # usable device memory

    @property
    def flops(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def bandwidth(self) -> float:
        return self.hbm_tbps * 1e12


# NVIDIA datasheet peaks (dense BF16, no sparsity). A800/H800 are the export variants of A100/H100: same compute and
# HBM, reduced NVLink (not modelled).
GPUS: dict[str, GPU] = {
    "h100": GPU("H100 SXM 80GB", 989.0, 3.35, 79.6),
    "h800": GPU("H800 SXM 80GB", 989.0, 3.35, 79.6),
    "h200": GPU("H200 SXM 141GB", 989.0, 4.8, 140.4),
    "a100": GPU("A100 SXM 80GB", 312.0, 2.0, 80.0),
    "a800": GPU("A800 SXM 80GB", 312.0, 2.0, 80.0),
    "h20": GPU("H20 96GB", 148.0, 4.0, 95.6),
}


# --------------------------------------------------------------------------------------------------------------------
# Assumptions (stated in every plan; calibrated on ANCHORS)
# --------------------------------------------------------------------------------------------------------------------


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

    def resolved_response_len(self, max_response_length: int) -> int:
        if self.mean_response_len is not None:
            return self.mean_response_len
        return min(round(0.2 * max_response_length), 4096)

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------------------------------
# Step semantics
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class StepSemantics:
    dataset_rows: Optional[int]
    train_batch_size: int
    gen_batch_size: int
    n: int
    ppo_mini_batch_size: int
    ppo_epochs: int
    dynamic_sampling: bool
    keep_rate: float
    gen_rounds_per_step: int
    prompts_trained_per_step: int
    gradient_steps_per_rollout_step: int
    gen_rounds_per_epoch: Optional[int]
    rollout_steps_per_epoch: Optional[int]
    gradient_steps_per_epoch: Optional[int]
    epochs_for_paper: Optional[float]

    @property
    def overgeneration(self) -> float:
        """Generated prompts per trained prompt (1.0 without dynamic sampling)."""
        return self.gen_rounds_per_step * self.gen_batch_size / self.prompts_trained_per_step


def step_semantics(preset: Preset, dataset_rows: Optional[int], keep_rate: float = Assumptions.keep_rate
                   ) -> StepSemantics:
    """Rollout steps, generation rounds and gradient steps per epoch for ``preset`` over ``dataset_rows`` prompts."""
    d, a, fg = preset.recipe.data, preset.recipe.actor, preset.recipe.filter_groups
    gen_bs = d.gen_batch_size or d.train_batch_size
    if fg.enable:
        rounds = max(1, math.ceil(d.train_batch_size / (gen_bs * keep_rate)))
        trained = d.train_batch_size
    else:
        # without filtering every generated prompt is trained on (the reference trainer's behaviour)
        rounds, trained = 1, gen_bs
    grad_per_step = trained // a.ppo_mini_batch_size * a.ppo_epochs
    if dataset_rows is None:
        per_epoch = steps = grads = epochs = None
    else:
        per_epoch = dataset_rows // gen_bs
        steps = per_epoch // rounds
        grads = steps * grad_per_step
        epochs = PAPER_ROLLOUT_STEPS / steps if steps else None
    return StepSemantics(dataset_rows, d.train_batch_size, gen_bs, preset.recipe.rollout.n, a.ppo_mini_batch_size,
                         a.ppo_epochs, fg.enable, keep_rate, rounds, trained, grad_per_step, per_epoch, steps,
                         grads, epochs)


def carry_prompts_per_step(train_batch_size: int, keep_rate: float) -> float:
    """Prompts generated per rollout step by the carry sampler in steady state: ``train_batch_size / keep_rate``.

    Every kept group is trained on (surplus groups in the next step), so the expected number of generation batches
    per step is ``train_batch_size / (keep_rate * g)`` for an adapted batch of ``g`` prompts, against
    ``ceil(train_batch_size / (keep_rate * gen_batch_size))`` whole batches of the reference sampler, whose surplus is
    discarded.
    """
    return train_batch_size / keep_rate


# --------------------------------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Check:
    level: str  # "error" | "warning"
    key: str  # the preset key (or plan input) to change
    message: str

    def __str__(self) -> str:
        return f"{self.level.upper()} {self.key}: {self.message}"


@dataclass
class Plan:
    preset: str
    model: str
    gpu: str
    gpu_name: str
    nodes: int
    gpus_per_node: int
    world: int
    params: int
    memory_gib: dict[str, dict[str, float]]
    tokens: dict[str, float]
    time_s: dict[str, float]
    steps: dict[str, Any]
    totals: dict[str, float]
    assumptions: dict[str, Any]
    checks: list[Check] = field(default_factory=list)
    # where the loop runs and the volume (dapo.plan.memory): filled by the CLI, which knows the chart values
    runtime: dict[str, Any] = field(default_factory=dict)
    # the step with the reference sampler and with the carry sampler: {"reference": {...}, "carry": {...}}
    samplers: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def errors(self) -> list[Check]:
        return [c for c in self.checks if c.level == "error"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.level == "warning"]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["checks"] = [dataclasses.asdict(c) for c in self.checks]
        return d


def _gen_time(arch: Arch, gpu: GPU, tp: int, engines: int, sequences: float, prompt: float, resp: float,
              tail: float, kv_tokens_per_engine: float, A: Assumptions) -> dict[str, float]:
    """Seconds to generate ``sequences`` responses on ``engines`` vLLM engines of ``tp`` GPUs (see module doc)."""
    per_engine = sequences / engines
    tokens = per_engine * resp
    ctx = prompt + resp
    concurrency = max(1.0, min(per_engine, A.max_num_seqs, kv_tokens_per_engine / ctx))
    bw = gpu.bandwidth * A.hbm_efficiency
    a = A.decode_iter_overhead_s + (2.0 * arch.params / tp) / bw
    b_mem = ctx * arch.kv_bytes_per_token() / tp / bw
    b_cmp = (2.0 * arch.matmul_params + 4.0 * arch.num_layers * arch.attn_dim * ctx) / (tp * gpu.flops * A.decode_mfu)
    b = max(b_mem, b_cmp)
    iterations = max(tail, tokens / concurrency)
    prefill = per_engine * prompt * 2.0 * arch.matmul_params / (tp * gpu.flops * A.prefill_mfu)
    seconds = a * iterations + b * tokens + prefill
    return {
        "seconds": seconds,
        "concurrency": concurrency,
        # most of the time goes to decoding the longest response, which more engines cannot shorten
        "tail_bound": float(tail >= tokens / concurrency and a * tail >= 0.5 * seconds),
        "per_iteration_s": a,
        "per_token_s": b,
    }


def make_plan(preset: Preset | str, gpu: Optional[str] = None, nodes: Optional[int] = None, *,
              gpus_per_node: Optional[int] = None, dataset_rows: Optional[int] = None,
              val_rows: Optional[int] = None, total_rollout_steps: Optional[int] = None,
              model_config: Optional[str] = None, assumptions: Optional[Assumptions] = None) -> Plan:
    """The plan of ``preset`` on ``nodes`` x ``gpus_per_node`` ``gpu`` (defaults: the preset's placement).

    ``dataset_rows`` / ``val_rows`` default to the known sizes of the files the preset names; ``total_rollout_steps``
    overrides the preset's ``total_training_steps`` / ``total_epochs``. Problems that stop the run are ``errors``.
    """
    if isinstance(preset, str):
        preset = load_preset(preset)
    A = assumptions or Assumptions()
    r, p = preset.recipe, preset.placement
    if p.backend != "verl":
        raise PlanError(f"preset {preset.name!r} runs on the {p.backend} backend (one process, no cluster); "
                        "`dapo plan` sizes verl cluster runs -- try --preset smoke or full")
    gpu_key = (gpu or p.accelerator).lower()
    if gpu_key not in GPUS:
        raise PlanError(f"unknown accelerator {gpu_key!r}; known: {', '.join(GPUS)}")
    G = GPUS[gpu_key]
    nodes = nodes or p.nodes
    gpn = gpus_per_node or p.gpus_per_node
    world = nodes * gpn
    arch = resolve_arch(r.model.path, model_config)
    par = p.parallel
    tp, sp = par.rollout_tp, par.ulysses_sp
    d, a = r.data, r.actor
    checks: list[Check] = []

    def err(key: str, msg: str) -> None:
        checks.append(Check("error", key, msg))

    def warn(key: str, msg: str) -> None:
        checks.append(Check("warning", key, msg))

    # ---------------------------------------------------------------- divisibility / shape checks
    max_seq = d.max_prompt_length + d.max_response_length
    max_pos = int(r.model.override_config.get("max_position_embeddings", arch.max_position_embeddings))
    if max_seq > max_pos:
        err("recipe.model.override_config.max_position_embeddings",
            f"prompt + response = {max_seq} tokens exceed the model's max_position_embeddings {max_pos}")
    if gpn % tp or world % tp:
        err("placement.parallel.rollout_tp", f"{tp} must divide gpus_per_node ({gpn}): a vLLM engine stays in a node")
    if arch.num_heads % tp:
        err("placement.parallel.rollout_tp", f"{tp} must divide the {arch.num_heads} attention heads")
    if arch.num_kv_heads % tp and tp % arch.num_kv_heads:
        err("placement.parallel.rollout_tp", f"{tp} and the {arch.num_kv_heads} KV heads must divide one another")
    if world % sp:
        err("placement.parallel.ulysses_sp", f"{sp} must divide the {world} GPUs")
    if arch.num_heads % sp:
        err("placement.parallel.ulysses_sp", f"{sp} must divide the {arch.num_heads} attention heads (Ulysses "
                                             "splits heads)")
    if arch.num_kv_heads % sp and sp % arch.num_kv_heads:
        err("placement.parallel.ulysses_sp", f"{sp} and the {arch.num_kv_heads} KV heads must divide one another")
    dp = max(1, world // sp)
    mini_seqs = a.ppo_mini_batch_size * r.rollout.n
    if mini_seqs % dp:
        err("recipe.actor.ppo_mini_batch_size",
            f"ppo_mini_batch_size x n = {mini_seqs} sequences must split evenly over {dp} data-parallel ranks "
            f"(GPUs / ulysses_sp); verl floors the per-rank share and the update changes")
    if (d.train_batch_size * r.rollout.n) % world:
        (warn if par.use_dynamic_bsz else err)(
            "recipe.data.train_batch_size",
            f"train_batch_size x n = {d.train_batch_size * r.rollout.n} is not a multiple of the {world} GPUs")
    gen_bs = d.gen_batch_size or d.train_batch_size
    if (gen_bs * r.rollout.n) % world:
        warn("recipe.data.gen_batch_size", f"gen_batch_size x n = {gen_bs * r.rollout.n} does not split evenly over "
                                           f"{world} GPUs (verl pads the batch)")
    if par.use_dynamic_bsz and par.ppo_max_token_len_per_gpu * sp < max_seq:
        err("placement.parallel.ppo_max_token_len_per_gpu",
            f"{par.ppo_max_token_len_per_gpu} x ulysses_sp {sp} < prompt + response ({max_seq}): a max-length "
            "sequence does not fit a micro-batch")
    if not par.enable_chunked_prefill and par.max_num_batched_tokens < max_seq:
        err("placement.parallel.max_num_batched_tokens",
            f"{par.max_num_batched_tokens} < prompt + response ({max_seq}) with chunked prefill off (vLLM refuses)")
    if not r.filter_groups.enable and gen_bs != d.train_batch_size:
        warn("recipe.data.gen_batch_size", f"{gen_bs} != train_batch_size {d.train_batch_size} without dynamic "
                                           "sampling: every generated prompt is trained on")

    # ---------------------------------------------------------------- memory per GPU
    N = arch.params
    shards = par.fsdp_size if par.fsdp_size > 0 else world
    if par.fsdp_size > 0 and world % par.fsdp_size:
        err("placement.parallel.fsdp_size", f"{par.fsdp_size} must divide the {world} GPUs")
    # fp32 master weights, fp32 gradients, Adam m and v, sharded over the FSDP group; during the update they are all
    # on the GPU (offload moves them to host memory between phases, not during it)
    states = {"params_fp32": 4.0 * N / shards, "grads_fp32": 4.0 * N / shards, "adam_fp32": 8.0 * N / shards}
    gather = 2.0 * (2 * arch.layer_params + 2 * arch.embedding_params)  # bf16 all-gather of 2 layers + root unit
    P = min(A.mean_prompt_len, d.max_prompt_length)
    R = min(A.resolved_response_len(d.max_response_length), d.max_response_length)
    tail = min(A.tail_response_len or d.max_response_length, d.max_response_length)
    dp = max(1, world // sp)
    if par.use_dynamic_bsz:
        budget_tokens = float(par.ppo_max_token_len_per_gpu)
    else:
        budget_tokens = par.ppo_micro_batch_size_per_gpu * max_seq / sp
    # what a micro-batch holds at the assumed lengths: a rank's share of a mini-batch (at least the longest
    # sequence), split over its Ulysses group, capped by the token budget
    share = max(mini_seqs / dp * (P + R), P + tail) / sp
    expected_tokens = min(budget_tokens, share)
    h, I, kvd = arch.hidden_size, arch.intermediate_size, arch.kv_dim

    def train_memory(tokens_per_gpu: float) -> dict[str, float]:
        layer_act = tokens_per_gpu * 2.0 * (7 * h + 2 * kvd + 4 * I)  # bf16 tensors saved by one decoder layer
        if r.model.enable_gradient_checkpointing:
            activations = tokens_per_gpu * 2.0 * h * arch.num_layers + layer_act
        else:
            activations = layer_act * arch.num_layers
        # bf16 logits + their gradient (fused cross-entropy: no fp32 copy of the logits)
        logits = tokens_per_gpu * arch.vocab_size * 4.0
        mem = {**states, "fsdp_gather": gather, "activations": activations, "logits": logits}
        mem["total"] = sum(mem.values()) + A.cuda_context_gib * GIB
        mem["tokens_per_gpu"] = tokens_per_gpu * GIB  # (divided by GIB below like the rest)
        return mem

    train_mem = train_memory(expected_tokens)
    train_worst = train_memory(budget_tokens)
    train_total = train_mem["total"]
    # rollout: vLLM's budget (gpu_memory_utilization x memory) + FSDP state that stays resident while it runs
    budget = par.gpu_memory_utilization * G.memory_gib * GIB
    weights = 2.0 * N / tp
    kv = budget - weights - A.vllm_reserve_gib * GIB
    resident = (0.0 if par.param_offload else states["params_fp32"]) + \
               (0.0 if par.optimizer_offload else states["adam_fp32"])
    rollout_total = budget + resident + A.cuda_context_gib * GIB
    kv_tokens_per_engine = max(0.0, kv) * tp / arch.kv_bytes_per_token()
    if train_total > G.memory_gib * GIB:
        err("placement.parallel.ppo_max_token_len_per_gpu",
            f"training needs ~{train_total / GIB:.1f} GiB per GPU > {G.memory_gib} GiB at the assumed lengths "
            f"({expected_tokens:,.0f} tokens per GPU per micro-batch): lower the token budget, raise ulysses_sp, "
            "enable gradient checkpointing, or shard over more GPUs (fsdp_size / nodes)")
    elif train_worst["total"] > G.memory_gib * GIB:
        warn("placement.parallel.ppo_max_token_len_per_gpu",
             f"a micro-batch filled to the {budget_tokens:,.0f}-token budget needs ~{train_worst['total'] / GIB:.1f}"
             f" GiB per GPU > {G.memory_gib} GiB: fine at the assumed lengths, OOM risk as responses grow")
    if kv <= 0 or kv_tokens_per_engine < max_seq:
        err("placement.parallel.gpu_memory_utilization",
            f"vLLM's KV cache ({max(kv, 0) / GIB:.1f} GiB per GPU after {weights / GIB:.1f} GiB of weights at "
            f"rollout_tp {tp}) cannot hold one {max_seq}-token sequence: raise gpu_memory_utilization or rollout_tp")
    if rollout_total > G.memory_gib * GIB:
        err("placement.parallel.gpu_memory_utilization",
            f"vLLM budget {par.gpu_memory_utilization} x {G.memory_gib} GiB + {resident / GIB:.1f} GiB of FSDP "
            f"state resident during rollout > {G.memory_gib} GiB: lower gpu_memory_utilization or turn on "
            "param_offload / optimizer_offload")
    host_per_node = gpn * ((states["params_fp32"] if par.param_offload else 0.0) +
                           (states["adam_fp32"] if par.optimizer_offload else 0.0))
    memory = {
        "train": {k: v / GIB for k, v in train_mem.items()},
        "train_at_budget": {k: v / GIB for k, v in train_worst.items()},
        "rollout": {"vllm_budget": budget / GIB, "weights": weights / GIB, "kv_cache": max(kv, 0) / GIB,
                    "fsdp_resident": resident / GIB, "total": rollout_total / GIB,
                    "kv_tokens_per_engine": kv_tokens_per_engine,
                    "max_len_sequences_in_kv": kv_tokens_per_engine / max_seq},
        "host": {"offload_per_node": host_per_node / GIB},
        "gpu_memory": {"total": G.memory_gib},
    }

    # ---------------------------------------------------------------- tokens
    sem = step_semantics(preset, dataset_rows if dataset_rows is not None else
                         KNOWN_DATASET_ROWS.get(Path(d.train_files[0]).name) if d.train_files else None, A.keep_rate)
    if r.filter_groups.enable and r.filter_groups.max_num_gen_batches > 0 and \
            sem.gen_rounds_per_step > r.filter_groups.max_num_gen_batches:
        err("recipe.filter_groups.max_num_gen_batches",
            f"at a keep rate of {A.keep_rate:.0%} a step needs {sem.gen_rounds_per_step} generation rounds > "
            f"{r.filter_groups.max_num_gen_batches}: the sampler would raise")
    n = r.rollout.n
    gen_prompts = sem.gen_rounds_per_step * gen_bs
    if r.filter_groups.enable and r.filter_groups.mode == "carry":
        gen_prompts = carry_prompts_per_step(sem.prompts_trained_per_step, A.keep_rate)
    gen_seqs = gen_prompts * n
    train_seqs = sem.prompts_trained_per_step * n
    e_sq = (P + R) ** 2 + (A.length_cv * R) ** 2
    tokens = {
        "mean_prompt": P, "mean_response": R, "tail_response": tail,
        "prompts_generated": gen_prompts, "responses_generated": gen_seqs, "generated_tokens": gen_seqs * R,
        "sequences_trained": train_seqs, "trained_tokens": train_seqs * (P + R),
        "overgeneration": sem.overgeneration,
    }

    # ---------------------------------------------------------------- time per rollout step
    engines = world // tp if tp and world % tp == 0 else max(1, world // max(tp, 1))
    g = _gen_time(arch, G, tp, engines, gen_seqs, P, R, tail, kv_tokens_per_engine, A)
    peak = G.flops * A.train_mfu
    tail_seq = P + tail

    def phase(seqs: float, mult: float) -> float:
        """Seconds for ``mult`` x forward over ``seqs`` sequences; a DP rank holds at least the longest one."""
        load_tok = max(seqs * (P + R) / dp, tail_seq)
        load_sq = max(seqs * e_sq / dp, tail_seq**2)
        return mult * arch.fwd_flops(load_tok, load_sq) / (sp * peak)

    old_lp = phase(train_seqs, 1.0)
    use_ref = r.actor.use_kl_loss or r.algorithm.use_kl_in_reward
    ref = phase(train_seqs, 1.0) if use_ref else 0.0
    upd_mult = 3.0 + (1.0 if r.model.enable_gradient_checkpointing else 0.0)
    n_mini = sem.prompts_trained_per_step // a.ppo_mini_batch_size
    update = n_mini * a.ppo_epochs * phase(mini_seqs, upd_mult)
    step = g["seconds"] + old_lp + ref + update + A.step_overhead_s
    vrows = val_rows if val_rows is not None else (
        KNOWN_DATASET_ROWS.get(Path(d.val_files[0]).name, 0) if d.val_files else 0)
    val = _gen_time(arch, G, tp, engines, vrows * r.rollout.val.n, P, R, tail, kv_tokens_per_engine, A)["seconds"] \
        if vrows else 0.0
    ckpt = 12.0 * N / (A.storage_gbps * 1e9)  # fp32 params + Adam moments, all ranks
    tf, sf = r.trainer.test_freq, r.trainer.save_freq
    val_amort = val / tf if tf > 0 else 0.0
    ckpt_amort = ckpt / sf if sf > 0 else 0.0
    wall = step + val_amort + ckpt_amort
    time_s = {
        "generation": g["seconds"], "old_log_prob": old_lp, "ref_log_prob": ref, "update": update,
        "overhead": A.step_overhead_s, "step": step, "validation": val, "validation_per_step": val_amort,
        "checkpoint": ckpt, "checkpoint_per_step": ckpt_amort, "wall_per_step": wall,
        "generation_tail_bound": g["tail_bound"], "decode_concurrency": g["concurrency"],
    }

    # ---------------------------------------------------------------- run length
    if total_rollout_steps is not None:
        total, source = total_rollout_steps, "--steps"
    elif r.trainer.total_training_steps is not None:
        total, source = r.trainer.total_training_steps, "recipe.trainer.total_training_steps"
    elif sem.rollout_steps_per_epoch is not None:
        total = sem.rollout_steps_per_epoch * r.trainer.total_epochs
        source = f"recipe.trainer.total_epochs={r.trainer.total_epochs} over {sem.dataset_rows:,} rows"
    else:
        total, source = None, "unknown: pass --dataset-rows or --steps"
        warn("recipe.trainer.total_training_steps", "unset and the dataset size is unknown: pass --dataset-rows N")
    steps = {
        **dataclasses.asdict(sem),
        "overgeneration": sem.overgeneration,
        "total_rollout_steps": total,
        "total_gradient_steps": None if total is None else total * sem.gradient_steps_per_rollout_step,
        "total_source": source,
        "paper_rollout_steps": PAPER_ROLLOUT_STEPS,
        "sampler_mode": r.filter_groups.mode,
    }
    hours = None if total is None else (total * wall + (val if r.trainer.val_before_train else 0.0)) / 3600
    totals = {"hours": hours, "days": None if hours is None else hours / 24,
              "gpu_hours": None if hours is None else hours * world,
              "gpu_hours_per_rollout_step": wall * world / 3600}
    samplers: dict[str, dict[str, Any]] = {}
    for mode in ("reference", "carry"):
        m_prompts = sem.gen_rounds_per_step * gen_bs
        if mode == "carry" and r.filter_groups.enable:
            m_prompts = carry_prompts_per_step(sem.prompts_trained_per_step, A.keep_rate)
        m_gen = _gen_time(arch, G, tp, engines, m_prompts * n, P, R, tail, kv_tokens_per_engine, A)["seconds"]
        m_step = m_gen + old_lp + ref + update + A.step_overhead_s
        m_wall = m_step + val_amort + ckpt_amort
        m_hours = None if total is None else (total * m_wall + (val if r.trainer.val_before_train else 0.0)) / 3600
        samplers[mode] = {"prompts_generated": m_prompts, "responses_generated": m_prompts * n,
                          "gen_batches_per_step": m_prompts / gen_bs, "generation_s": m_gen, "step_s": m_step,
                          "wall_per_step_s": m_wall, "gpu_hours": None if m_hours is None else m_hours * world}
    if total is not None and r.trainer.total_training_steps is None and total_rollout_steps is None \
            and total > 2 * PAPER_ROLLOUT_STEPS:
        warn("recipe.trainer.total_training_steps",
             f"unset: {source} = {total:,} rollout steps ({hours / 24:,.0f} days here). The paper stopped near "
             f"{PAPER_ROLLOUT_STEPS} rollout steps (~{PAPER_ROLLOUT_STEPS * sem.gradient_steps_per_rollout_step:,} "
             "gradient steps); the hub file repeats each prompt ~100x -- set total_training_steps or train on "
             "the de-duplicated file (dapo data prepare --dedup)")
    if time_s["generation_tail_bound"] and world > 8:
        warn("placement.nodes", f"generation is bound by the longest response ({tail} tokens) at this size: more "
                                "GPUs will not shorten it")

    return Plan(preset=preset.name, model=arch.name, gpu=gpu_key, gpu_name=G.name, nodes=nodes, gpus_per_node=gpn,
                world=world, params=N, memory_gib=memory, tokens=tokens, time_s=time_s, steps=steps, totals=totals,
                assumptions=A.describe() | {"mean_response_len": R, "tail_response_len": tail}, checks=checks,
                samplers=samplers)


# --------------------------------------------------------------------------------------------------------------------
# Calibration anchors (published measurements the time model is checked against; tests/test_plan.py)
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Anchor:
    name: str
    preset: str
    overrides: tuple[str, ...]
    gpu: str
    nodes: int
    mean_response_len: int
    measured_s: float  # wall-clock seconds per rollout step
    source: str
    note: str

    def plan(self) -> Plan:
        return make_plan(load_preset(self.preset, list(self.overrides)), self.gpu, self.nodes,
                         assumptions=Assumptions(mean_response_len=self.mean_response_len))


_VERL_7B_H20 = (
    "recipe.model.path=Qwen/Qwen2.5-Math-7B", "recipe.data.max_response_length=28672",
    "recipe.data.gen_batch_size=512", "recipe.filter_groups.enable=false", "recipe.trainer.test_freq=20",
    "recipe.trainer.save_freq=-1", "placement.parallel.rollout_tp=4", "placement.parallel.ulysses_sp=4",
    "placement.parallel.gpu_memory_utilization=0.8", "placement.parallel.ppo_max_token_len_per_gpu=61440",
    "placement.parallel.max_num_batched_tokens=30720", "placement.parallel.param_offload=true",
    "placement.parallel.optimizer_offload=true", "placement.parallel.fsdp_size=2",
)
_VERL_7B_SRC = ("verl docs/advance/fully_async.md, 'Asynchronous Training on 7B Model' (colocate sync, DAPO, "
                "Qwen2.5-Math-7B, 28k responses, H20); wall time of 400 rollout steps / 400")

ANCHORS: tuple[Anchor, ...] = (
    Anchor("DAPO 32B, 128 x A800", "full", (), "a800", 16, 3000,
           5 * 86400 / 230,
           "https://github.com/verl-project/verl/issues/795 (230 rollout steps in 5 days on 128 A800)",
           "mean response 3,000 assumed over the first 230 steps (DAPO-32B lengths grow from ~1k towards 4-5k)"),
    Anchor("DAPO 7B-Math, 32 x H20", "7b", _VERL_7B_H20, "h20", 4, 1000, (89 * 3600 + 5 * 60) / 400,
           _VERL_7B_SRC + ": 3d17h5m (timing_s/step 790)", "mean response 1,000 assumed (Qwen2.5-Math-7B)"),
    Anchor("DAPO 7B-Math, 64 x H20", "7b", _VERL_7B_H20, "h20", 8, 1000, (41 * 3600 + 32 * 60) / 400,
           _VERL_7B_SRC + ": 1d17h32m (timing_s/step 365)", "mean response 1,000 assumed (Qwen2.5-Math-7B)"),
    Anchor("DAPO 7B-Math, 128 x H20", "7b", _VERL_7B_H20, "h20", 16, 1000, (40 * 3600 + 48 * 60) / 400,
           _VERL_7B_SRC + ": 1d16h48m (timing_s/step 356)", "mean response 1,000 assumed (Qwen2.5-Math-7B)"),
)


# --------------------------------------------------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------------------------------------------------


def _fmt_s(s: Optional[float]) -> str:
    if s is None:
        return "?"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def _fmt_n(x: Optional[float]) -> str:
    if x is None:
        return "?"
    if x >= 1e9:
        return f"{x / 1e9:.2f}B"
    if x >= 1e6:
        return f"{x / 1e6:.1f}M"
    if x < 100 and x != int(x):
        return f"{x:.1f}"
    return f"{x:,.0f}"


def render_text(plan: Plan) -> str:
    m, t, tm, st, tot = plan.memory_gib, plan.tokens, plan.time_s, plan.steps, plan.totals
    tr, ro = m["train"], m["rollout"]
    cap = m["gpu_memory"]["total"]
    L = [f"dapo plan: preset {plan.preset} -- {plan.model} ({plan.params / 1e9:.1f}B params) on {plan.nodes} x "
         f"{plan.gpus_per_node} {plan.gpu_name} ({plan.world} GPUs)", ""]
    L.append(f"Memory per GPU (GiB, of {cap:.1f})")
    tb = m["train_at_budget"]
    L.append(f"  training peak  {tr['total']:6.1f} = params {tr['params_fp32']:.1f} + grads {tr['grads_fp32']:.1f} + "
             f"Adam {tr['adam_fp32']:.1f} (fp32, FSDP-sharded) + all-gather {tr['fsdp_gather']:.1f} + "
             f"activations {tr['activations']:.1f} + logits {tr['logits']:.1f} + context "
             f"({tr['tokens_per_gpu']:,.0f} tokens/GPU per micro-batch at the assumed lengths)")
    L.append(f"  at the budget  {tb['total']:6.1f}   (micro-batch filled to {tb['tokens_per_gpu']:,.0f} tokens/GPU: "
             "ppo_max_token_len_per_gpu)")
    L.append(f"  rollout        {ro['total']:6.1f} = vLLM {ro['vllm_budget']:.1f} (weights {ro['weights']:.1f} + KV "
             f"{ro['kv_cache']:.1f} = {_fmt_n(ro['kv_tokens_per_engine'])} tokens/engine, "
             f"{ro['max_len_sequences_in_kv']:.0f} max-length sequences) + FSDP resident {ro['fsdp_resident']:.1f}"
             " + context")
    if m["host"]["offload_per_node"]:
        L.append(f"  host RAM       {m['host']['offload_per_node']:6.1f} per node for param/optimizer offload")
    L.append("")
    L.append(f"Tokens per rollout step (assumed mean prompt {t['mean_prompt']:,.0f}, mean response "
             f"{t['mean_response']:,.0f}, longest {t['tail_response']:,.0f})")
    ds = (f"; dynamic sampling keeps {st['keep_rate']:.0%} of groups -> {t['overgeneration']:.1f}x over-generation"
          if st["dynamic_sampling"] else "")
    L.append(f"  generated  {t['prompts_generated']:,.0f} prompts x {st['n']} = {t['responses_generated']:,.0f} "
             f"responses ({st['gen_rounds_per_step']} round(s) of {st['gen_batch_size']:,}{ds}) = "
             f"{_fmt_n(t['generated_tokens'])} tokens")
    L.append(f"  trained    {st['prompts_trained_per_step']:,} x {st['n']} = {t['sequences_trained']:,.0f} sequences = "
             f"{_fmt_n(t['trained_tokens'])} tokens, {st['gradient_steps_per_rollout_step']} gradient steps")
    L.append("")
    L.append("Time per rollout step (estimate)")
    bound = "tail-bound: the longest response" if tm["generation_tail_bound"] else "throughput-bound"
    L.append(f"  generation     {_fmt_s(tm['generation']):>10}  ({bound}; ~{tm['decode_concurrency']:,.0f} "
             "sequences per engine)")
    L.append(f"  old log-prob   {_fmt_s(tm['old_log_prob']):>10}")
    if tm["ref_log_prob"]:
        L.append(f"  ref log-prob   {_fmt_s(tm['ref_log_prob']):>10}")
    L.append(f"  update         {_fmt_s(tm['update']):>10}")
    L.append(f"  fixed          {_fmt_s(tm['overhead']):>10}")
    L.append(f"  = step         {_fmt_s(tm['step']):>10};  wall-clock incl. validation/test_freq and "
             f"checkpoint/save_freq: {_fmt_s(tm['wall_per_step'])}")
    if st["dynamic_sampling"] and plan.samplers:
        L.append(f"  dynamic sampling at keep rate {st['keep_rate']:.0%} (this preset: filter_groups.mode "
                 f"{plan.steps.get('sampler_mode', '?')}):")
        for mode, sm in plan.samplers.items():
            L.append(f"    {mode:<9} {sm['gen_batches_per_step']:.2f} x {st['gen_batch_size']:,} prompts/step: "
                     f"generation {_fmt_s(sm['generation_s'])}, step {_fmt_s(sm['step_s'])}, "
                     f"{_fmt_n(sm['gpu_hours'])} GPU-hours")
    L.append("")
    L.append("Steps")
    if st["dataset_rows"] is not None:
        L.append(f"  1 epoch of {st['dataset_rows']:,} rows = {st['gen_rounds_per_epoch']:,} generation rounds = "
                 f"{st['rollout_steps_per_epoch']:,} rollout steps = {st['gradient_steps_per_epoch']:,} gradient steps")
    L.append(f"  run: {_fmt_n(st['total_rollout_steps'])} rollout steps = {_fmt_n(st['total_gradient_steps'])} "
             f"gradient steps ({st['total_source']}); the paper: ~{st['paper_rollout_steps']} rollout steps")
    L.append("")
    L.append(f"Total: {_fmt_s(None if tot['hours'] is None else tot['hours'] * 3600)}, "
             f"{_fmt_n(tot['gpu_hours'])} GPU-hours ({tot['gpu_hours_per_rollout_step']:.1f} per rollout step)")
    if plan.checks:
        L.append("")
        L += [f"  {c}" for c in plan.checks]
    L.append("")
    L.append("Assumptions: " + ", ".join(f"{k}={v}" for k, v in plan.assumptions.items()))
    return "\n".join(L)


# --------------------------------------------------------------------------------------------------------------------
# Docs tables (docs/reproduce.md is generated from these; tests/test_plan.py checks it is fresh)
# --------------------------------------------------------------------------------------------------------------------

DOCS_BEGIN = "<!-- BEGIN generated by `dapo plan --markdown {block}` -->"
DOCS_END = "<!-- END generated -->"

# Published reference runs for the reproduction table (verl docs/algo/dapo.md, recipe/dapo/README.md and scripts).
WANDB_DAPO = "https://wandb.ai/verl-org/DAPO%20Reproduction%20on%20verl/workspace?nw=wmb4qxfht0n"
WANDB_DAPO_7B = "https://wandb.ai/verl-org/DAPO%20Reproduction%20on%20verl/runs/ow47vvon"
# preset -> (target / published result, image stack + verl commit, wandb reference run, paper-scale column?)
REFERENCE_RUNS: dict[str, tuple[str, str, str, bool]] = {
    "early": ("44 (verl: 44 on 16x8 H20)", "repro stack (verl `4f80e46`) or current (verl 0.9.1)",
              f"[verl-org workspace]({WANDB_DAPO}) (early run)", True),
    "full": ("50 (verl: 52 on 16x8 H800)", "repro stack (verl `4f80e46`) or current (verl 0.9.1)",
             f"[verl-org workspace]({WANDB_DAPO}) (DAPO run)", True),
    "7b": ("- (none published)", "current (verl 0.9.1); script from verl `a44b83c`",
           f"[verl-org run ow47vvon]({WANDB_DAPO_7B}) (linked from verl's DAPO 7B-Math scripts)", False),
    "smoke": ("- (pipeline check)", "current (verl 0.9.1)", "-", False),
}


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def markdown_block(block: str) -> str:
    """The generated markdown for one docs block: ``presets``, ``calibration`` or ``epochs``."""
    if block == "presets":
        rows = []
        for name, (target, stack, wandb, paper_scale) in REFERENCE_RUNS.items():
            preset = load_preset(name)
            pl = make_plan(preset)
            cfg_steps = pl.steps["total_rollout_steps"]
            hw = f"{pl.nodes}x{pl.gpus_per_node} {pl.gpu.upper()}"
            if paper_scale:
                paper = make_plan(preset, total_rollout_steps=PAPER_ROLLOUT_STEPS)
                paper_txt = f"{_fmt_n(paper.totals['gpu_hours'])} ({_fmt_s(paper.totals['hours'] * 3600)})"
            else:
                paper_txt = "-"
            rows.append([
                f"`{name}`", target, hw, f"`{preset.recipe.model.path}`", stack,
                _fmt_s(pl.time_s["wall_per_step"]), paper_txt,
                f"{cfg_steps:,} steps: {_fmt_n(pl.totals['gpu_hours'])} ({_fmt_s(pl.totals['hours'] * 3600)})",
                wandb,
            ])
        tiny = load_preset("tiny")
        rows.append(["`tiny`", "- (CPU demo)", "one CPU", f"`{tiny.recipe.model.path}`", "current (.venv)", "-", "-",
                     f"{tiny.recipe.trainer.total_training_steps} steps on CPU (`make train`)", "-"])
        return _md_table(["preset", "target AIME-2024 avg@32", "hardware", "model", "image / verl",
                          "est. time / rollout step", f"est. GPU-hours to {PAPER_ROLLOUT_STEPS} rollout steps (paper)",
                          "est. GPU-hours as configured", "wandb reference run"], rows)
    if block == "calibration":
        rows = []
        for an in ANCHORS:
            pl = an.plan()
            est = pl.time_s["wall_per_step"]
            rows.append([an.name, _fmt_s(an.measured_s), _fmt_s(est), f"{est / an.measured_s - 1:+.0%}",
                         f"{_fmt_s(pl.time_s['generation'])} / {_fmt_s(pl.time_s['old_log_prob'])} / "
                         f"{_fmt_s(pl.time_s['update'])}", an.note, an.source])
        return _md_table(["setup", "published wall-clock / rollout step", "`dapo plan` estimate", "error",
                          "est. generation / old log-prob / update", "assumption", "source"], rows)
    if block == "epochs":
        rows = []
        for name in ("early", "full"):
            preset = load_preset(name)
            for fname, nrows in (("dapo-math-17k.parquet (hub, ~100x duplicated)", 1_791_700),
                                 ("dapo-math-17k-dedup.parquet", 17_917)):
                s = step_semantics(preset, nrows)
                rows.append([f"`{name}`", fname, f"{nrows:,}", f"{s.gen_rounds_per_epoch:,}",
                             f"{s.rollout_steps_per_epoch:,}", f"{s.gradient_steps_per_epoch:,}",
                             f"{s.epochs_for_paper:.2f}" if s.epochs_for_paper and s.epochs_for_paper < 10
                             else f"{s.epochs_for_paper:.1f}"])
        return _md_table(["preset", "train file", "rows", "generation rounds / epoch", "rollout steps / epoch",
                          "gradient steps / epoch", f"epochs for {PAPER_ROLLOUT_STEPS} rollout steps"], rows)
    raise PlanError(f"unknown docs block {block!r}; known: presets, calibration, epochs")


DOCS_BLOCKS = ("presets", "calibration", "epochs")


def update_docs(path: str | os.PathLike) -> bool:
    """Rewrite every generated block in ``path``; returns whether the file changed."""
    p = Path(path)
    text = p.read_text()
    new = text
    for block in DOCS_BLOCKS:
        begin = DOCS_BEGIN.format(block=block)
        if begin not in new:
            continue
        head, rest = new.split(begin, 1)
        if DOCS_END not in rest:
            raise PlanError(f"{p}: '{begin}' has no matching '{DOCS_END}'")
        _, tail = rest.split(DOCS_END, 1)
        new = f"{head}{begin}\n{markdown_block(block)}\n{DOCS_END}{tail}"
    if new != text:
        p.write_text(new)
    return new != text


# --------------------------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dapo plan", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="full", help="preset name or YAML path (default: full)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="preset override, e.g. placement.parallel.rollout_tp=8 (repeatable)")
    ap.add_argument("--gpu", choices=sorted(GPUS), help="accelerator (default: the preset's placement.accelerator)")
    ap.add_argument("--nodes", type=int, help="nodes (default: the preset's placement.nodes)")
    ap.add_argument("--gpus-per-node", type=int)
    ap.add_argument("--dataset-rows", type=int, help="training prompts (default: the train file's rows if it exists "
                                                      "locally, else the hub file's 1,791,700)")
    ap.add_argument("--steps", type=int, help="total rollout steps (default: the preset's)")
    ap.add_argument("--mean-response-len", type=int, help="assumed mean response tokens")
    ap.add_argument("--keep-rate", type=float, help="dynamic sampling: fraction of groups kept (default 0.4)")
    ap.add_argument("--model-config", help="config.json (or its directory) for a model not in the built-in table")
    ap.add_argument("--json", action="store_true", help="machine-readable plan")
    ap.add_argument("--markdown", choices=DOCS_BLOCKS, help="print a generated docs table")
    ap.add_argument("--update-docs", metavar="FILE", help="regenerate the tables between the markers in FILE")
    ap.add_argument("--values", action="append", default=[], metavar="FILE",
                    help="chart values the loop's memory and the volume are checked against (repeatable; default: "
                         "the chart defaults + values/<preset>.yaml of this checkout)")
    ap.add_argument("--requirements-file", metavar="FILE",
                    help="write the chart's per-preset storage / loop-memory data (charts/dapo/files/requirements.yaml)")
    ap.add_argument("--check", action="store_true", help="with --requirements-file: exit 1 if FILE is stale")
    return ap


CHECKOUT = Path(__file__).resolve().parents[2]


def _chart_values(preset: Preset, value_files: list[str]) -> tuple[Optional[dict[str, Any]], str]:
    """Coalesced chart values for the checks, and where they came from (None: no chart beside the package)."""
    chart = CHECKOUT / "charts" / "dapo"
    if not (chart / "values.yaml").is_file():
        if value_files:
            raise PlanError(f"--values needs the chart (charts/dapo) beside the dapo package; not found at {chart}")
        return None, "no chart beside the package"
    from dapo.k8s import load_values

    files = [Path(f) for f in value_files]
    if not files and (CHECKOUT / "values" / f"{preset.name}.yaml").is_file():
        files = [CHECKOUT / "values" / f"{preset.name}.yaml"]
    return load_values(chart, files), "chart defaults" + "".join(f" + {f}" for f in value_files or
                                                                  [str(f.relative_to(CHECKOUT)) for f in files])


def runtime_report(preset: Preset, dataset_rows: Optional[int], value_files: list[str], *,
                   nodes: Optional[int] = None, gpus_per_node: Optional[int] = None
                   ) -> tuple[dict[str, Any], list[Check], list[str]]:
    """The loop's peak host memory against the worker pod it runs on, and the volume against the run's storage
    (dapo.plan.memory states the model). Returns (numbers, checks, printed lines)."""
    from dapo.plan import memory as sizing

    fb = sizing.fmt_bytes
    lm = sizing.loop_memory(preset, dataset_rows)
    st = sizing.storage(preset)
    values, where = _chart_values(preset, value_files)
    checks: list[Check] = []
    L = ["Where the loop runs: the Ray job driver, on a worker pod (RayJob entrypointNumCpus 1; head num-cpus 0)"]
    held = lm["during_generation"] - 2 * lm["generation_batch"]
    L.append(f"  loop peak host memory {fb(lm['peak'])} = base {fb(lm['base'])} + training rows as objects "
             f"{fb(lm['rows_as_objects'])}" + (f" + model state {fb(lm['model_state'])}" if lm["model_state"] else "")
             + f" + max(generation 2 x {fb(lm['generation_batch'])} (padded batch + its concat) + kept rows "
             f"{fb(held)}, building the step {fb(lm['building_step'])})")
    out: dict[str, Any] = {"loop_memory": lm, "storage": st, "values": where}
    if values is not None:
        w = values["worker"]
        limit_text = (w["resources"].get("limits") or {}).get("memory") or (w["resources"].get("requests") or {}).get(
            "memory")
        if limit_text is None:
            checks.append(Check("warning", "worker.resources.limits.memory", "not set: the loop's memory is unbounded "
                                "by the pod and unchecked"))
        else:
            limit = sizing.parse_quantity(limit_text)
            # the placement the chart gives the worker group: --nodes / --gpus-per-node, else values, else preset
            res = sizing.worker_reserved(preset, sizing.parse_quantity(w["shmSize"]),
                                         nodes=nodes or values.get("nodes"),
                                         gpus_per_node=gpus_per_node or values.get("gpusPerNode"))
            avail = limit - res["total"]
            out["worker"] = {"limit": limit, "reserved": res, "available": avail}
            L.append(f"  worker pod ({where}): memory {limit_text} - reserved {fb(res['total'])} (/dev/shm "
                     f"{fb(res['shm'])} + verl processes {fb(res['worker_processes'])} + FSDP offload "
                     f"{fb(res['fsdp_offload'])} + hf_model gather {fb(res['hf_model_gather'])}) = {fb(avail)} for "
                     "the loop")
            if lm["peak"] > avail:
                checks.append(Check(
                    "error", "worker.resources.limits.memory",
                    f"preset {preset.name}: the loop needs ~{fb(lm['peak'])} on its worker pod but only {fb(avail)} "
                    f"is left of {limit_text} ({where}); raise worker.resources.limits.memory / lower worker.shmSize, "
                    "or lower recipe.data.gen_batch_size / recipe.data.max_response_length"))
    L.append("")
    L.append("Storage (the shared volume)")
    L.append(f"  needs {st['summary']}")
    if values is not None:
        s = values["storage"]
        if s["existingClaim"]:
            L.append(f"  storage.existingClaim {s['existingClaim']}: not sized by the chart; make sure it holds the above")
        elif st["bytes"] is not None:
            L.append(f"  storage.size {s['size']} ({where})")
            if sizing.parse_quantity(s["size"]) < st["bytes"]:
                checks.append(Check("error", "storage.size", sizing.storage_message(preset.name, s["size"],
                                                                                    st["summary"])))
    if st["bytes"] is None:
        checks.append(Check("warning", "recipe.trainer.max_ckpt_to_keep", st["summary"]))
    return out, checks, L


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.markdown:
            print(markdown_block(args.markdown))
            return 0
        if args.update_docs:
            changed = update_docs(args.update_docs)
            print(f"{args.update_docs}: {'updated' if changed else 'already up to date'}")
            return 0
        if args.requirements_file:
            from dapo.plan.memory import requirements_text

            text, path = requirements_text(), Path(args.requirements_file)
            if args.check:
                fresh = path.is_file() and path.read_text() == text
                print(f"{path}: {'up to date' if fresh else 'STALE: rerun without --check'}")
                return 0 if fresh else 1
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
            return 0
        preset = load_preset(args.preset, args.set)
        rows = args.dataset_rows
        if rows is None and preset.recipe.data.train_files and Path(preset.recipe.data.train_files[0]).is_file():
            from dapo.data.parquet import parquet_rows

            rows = parquet_rows(preset.recipe.data.train_files[0])
        if rows is None and preset.recipe.data.train_files:
            rows = KNOWN_DATASET_ROWS.get(Path(preset.recipe.data.train_files[0]).name)
        runtime, runtime_checks, runtime_lines = runtime_report(preset, rows, args.values, nodes=args.nodes,
                                                                gpus_per_node=args.gpus_per_node)
        if preset.placement.backend == "local":  # no GPU plan: only where the loop runs and the volume
            print(f"dapo plan: preset {preset.name} -- local backend (one process, no GPU plan)\n")
            print("\n".join(runtime_lines + [""] + [f"  {c}" for c in runtime_checks]))
            return 1 if any(c.level == "error" for c in runtime_checks) else 0
        kw = {}
        if args.mean_response_len is not None:
            kw["mean_response_len"] = args.mean_response_len
        if args.keep_rate is not None:
            kw["keep_rate"] = args.keep_rate
        plan = make_plan(preset, args.gpu, args.nodes, gpus_per_node=args.gpus_per_node, dataset_rows=rows,
                         total_rollout_steps=args.steps, model_config=args.model_config,
                         assumptions=Assumptions(**kw))
    except (ConfigError, PlanError) as exc:
        print(f"dapo plan: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # chart values that do not load (schema, YAML): dapo.k8s.ValuesError
        print(f"dapo plan: {exc}", file=sys.stderr)
        return 2
    plan.checks += runtime_checks
    plan.runtime = runtime
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        text = render_text(plan)
        head, sep, tail = text.partition("\nTotal: ")
        print(head + "\n" + "\n".join(runtime_lines) + "\n" + sep + tail if sep else text)
    return 1 if plan.errors else 0


if __name__ == "__main__":
    sys.exit(main())

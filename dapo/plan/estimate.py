"""The estimate of ``dapo plan``: memory per GPU, tokens, step time and GPU-hours of a preset before GPUs are booked.

:func:`make_plan` is a pure function ``(preset, gpu, nodes, ...) -> Plan`` built from the preset
(``dapo.config.load_preset``, the single source of truth), the model and accelerator tables
(:mod:`dapo.plan.models`), the step semantics (:mod:`dapo.plan.steps`) and stated :mod:`dapo.plan.assumptions`,
in parts: the shape checks (:mod:`dapo.plan.shape`), memory per GPU, tokens, time per rollout step and run length;
:mod:`dapo.plan.report` prints it, :mod:`dapo.plan.cli` is ``dapo plan``. Library code: never imports the CLI,
:mod:`dapo.plan.memory` or :mod:`dapo.k8s`.

Time model (stated assumptions, calibrated against published runs; see :mod:`dapo.plan.calibration`, docs/reproduce.md)
-----------------------------------------------------------------------------------------------------------------------
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

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from dapo.config import Preset, load_preset
from dapo.plan.assumptions import Assumptions
from dapo.plan.faults import fault_costs
from dapo.plan.models import GPU, Arch
from dapo.plan.shape import Check, Checks, Run, check_shape, resolve_run
from dapo.plan.steps import (KNOWN_DATASET_ROWS, PAPER_ROLLOUT_STEPS, StepSemantics, carry_prompts_per_step,
                             step_semantics)

GIB = 1024**3


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
    # time lost per fault and the effective training time share (dapo.plan.faults)
    faults: dict[str, Any] = field(default_factory=dict)

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
    Its parts, in order: the shape checks, memory per GPU, tokens, time per rollout step, run length (module doc).
    """
    if isinstance(preset, str):
        preset = load_preset(preset)
    s = resolve_run(preset, gpu, nodes, gpus_per_node, model_config, assumptions or Assumptions())
    checks = Checks()
    check_shape(s, checks)
    memory = _memory(s, checks)
    sem, tokens = _tokens(s, dataset_rows, checks)
    time_s = _step_time(s, sem, tokens, memory, val_rows)
    steps, totals = _run_length(s, sem, time_s, total_rollout_steps, checks)
    samplers = _samplers(s, sem, memory, time_s, steps["total_rollout_steps"])
    if time_s["generation_tail_bound"] and s.world > 8:
        checks.warn("placement.nodes", f"generation is bound by the longest response ({s.tail} tokens) at this size: "
                                       "more GPUs will not shorten it")
    return Plan(preset=preset.name, model=s.arch.name, gpu=s.gpu_key, gpu_name=s.G.name, nodes=s.nodes,
                gpus_per_node=s.gpn, world=s.world, params=s.arch.params, memory_gib=memory, tokens=tokens,
                time_s=time_s, steps=steps, totals=totals,
                assumptions=s.A.describe() | {"mean_response_len": s.R, "tail_response_len": s.tail},
                checks=list(checks), samplers=samplers,
                faults=fault_costs(preset, time_s, s.world, s.A.restart_s, s.A.faults_per_gpu_day,
                                   steps.get("gen_rounds_per_step") or 1))


def _train_memory(s: Run, states: dict[str, float], tokens_per_gpu: float) -> dict[str, float]:
    """Bytes per GPU during the update with ``tokens_per_gpu`` tokens in a micro-batch."""
    arch = s.arch
    h, I, kvd = arch.hidden_size, arch.intermediate_size, arch.kv_dim
    gather = 2.0 * (2 * arch.layer_params + 2 * arch.embedding_params)  # bf16 all-gather of 2 layers + root unit
    layer_act = tokens_per_gpu * 2.0 * (7 * h + 2 * kvd + 4 * I)  # bf16 tensors saved by one decoder layer
    if s.preset.recipe.model.enable_gradient_checkpointing:
        activations = tokens_per_gpu * 2.0 * h * arch.num_layers + layer_act
    else:
        activations = layer_act * arch.num_layers
    # bf16 logits + their gradient (fused cross-entropy: no fp32 copy of the logits)
    logits = tokens_per_gpu * arch.vocab_size * 4.0
    mem = {**states, "fsdp_gather": gather, "activations": activations, "logits": logits}
    mem["total"] = sum(mem.values()) + s.A.cuda_context_gib * GIB
    mem["tokens_per_gpu"] = tokens_per_gpu * GIB  # (divided by GIB below like the rest)
    return mem


def _memory(s: Run, checks: Checks) -> dict[str, dict[str, float]]:
    """GiB per GPU in the update (at the assumed lengths and at the token budget) and in the rollout."""
    par, G, A, tp, max_seq = s.preset.placement.parallel, s.G, s.A, s.tp, s.max_seq
    N = s.arch.params
    shards = par.fsdp_size if par.fsdp_size > 0 else s.world
    if par.fsdp_size > 0 and s.world % par.fsdp_size:
        checks.err("placement.parallel.fsdp_size", f"{par.fsdp_size} must divide the {s.world} GPUs")
    # fp32 master weights, fp32 gradients, Adam m and v, sharded over the FSDP group; during the update they are all
    # on the GPU (offload moves them to host memory between phases, not during it)
    states = {"params_fp32": 4.0 * N / shards, "grads_fp32": 4.0 * N / shards, "adam_fp32": 8.0 * N / shards}
    if par.use_dynamic_bsz:
        budget_tokens = float(par.ppo_max_token_len_per_gpu)
    else:
        budget_tokens = par.ppo_micro_batch_size_per_gpu * max_seq / s.sp
    # what a micro-batch holds at the assumed lengths: a rank's share of a mini-batch (at least the longest
    # sequence), split over its Ulysses group, capped by the token budget
    share = max(s.mini_seqs / s.dp * (s.P + s.R), s.P + s.tail) / s.sp
    expected_tokens = min(budget_tokens, share)
    train_mem = _train_memory(s, states, expected_tokens)
    train_worst = _train_memory(s, states, budget_tokens)
    train_total = train_mem["total"]
    # rollout: vLLM's budget (gpu_memory_utilization x memory) + FSDP state that stays resident while it runs
    budget = par.gpu_memory_utilization * G.memory_gib * GIB
    weights = 2.0 * N / tp
    kv = budget - weights - A.vllm_reserve_gib * GIB
    resident = (0.0 if par.param_offload else states["params_fp32"]) + \
               (0.0 if par.optimizer_offload else states["adam_fp32"])
    rollout_total = budget + resident + A.cuda_context_gib * GIB
    kv_tokens_per_engine = max(0.0, kv) * tp / s.arch.kv_bytes_per_token()
    if train_total > G.memory_gib * GIB:
        checks.err("placement.parallel.ppo_max_token_len_per_gpu",
                   f"training needs ~{train_total / GIB:.1f} GiB per GPU > {G.memory_gib} GiB at the assumed lengths "
                   f"({expected_tokens:,.0f} tokens per GPU per micro-batch): lower the token budget, raise "
                   "ulysses_sp, enable gradient checkpointing, or shard over more GPUs (fsdp_size / nodes)")
    elif train_worst["total"] > G.memory_gib * GIB:
        checks.warn("placement.parallel.ppo_max_token_len_per_gpu",
                    f"a micro-batch filled to the {budget_tokens:,.0f}-token budget needs "
                    f"~{train_worst['total'] / GIB:.1f} GiB per GPU > {G.memory_gib} GiB: fine at the assumed "
                    "lengths, OOM risk as responses grow")
    if kv <= 0 or kv_tokens_per_engine < max_seq:
        checks.err("placement.parallel.gpu_memory_utilization",
                   f"vLLM's KV cache ({max(kv, 0) / GIB:.1f} GiB per GPU after {weights / GIB:.1f} GiB of weights at "
                   f"rollout_tp {tp}) cannot hold one {max_seq}-token sequence: raise gpu_memory_utilization or "
                   "rollout_tp")
    if rollout_total > G.memory_gib * GIB:
        checks.err("placement.parallel.gpu_memory_utilization",
                   f"vLLM budget {par.gpu_memory_utilization} x {G.memory_gib} GiB + {resident / GIB:.1f} GiB of FSDP "
                   f"state resident during rollout > {G.memory_gib} GiB: lower gpu_memory_utilization or turn on "
                   "param_offload / optimizer_offload")
    host_per_node = s.gpn * ((states["params_fp32"] if par.param_offload else 0.0) +
                             (states["adam_fp32"] if par.optimizer_offload else 0.0))
    return {
        "train": {k: v / GIB for k, v in train_mem.items()},
        "train_at_budget": {k: v / GIB for k, v in train_worst.items()},
        "rollout": {"vllm_budget": budget / GIB, "weights": weights / GIB, "kv_cache": max(kv, 0) / GIB,
                    "fsdp_resident": resident / GIB, "total": rollout_total / GIB,
                    "kv_tokens_per_engine": kv_tokens_per_engine,
                    "max_len_sequences_in_kv": kv_tokens_per_engine / max_seq,
                    # what vLLM is handed (dapo.backends.verl.settings): its context and the model's positions
                    "max_model_len": float(max_seq), "model_positions": float(s.arch.max_position_embeddings),
                    "position_override": float(s.preset.recipe.model.override_config.get("max_position_embeddings", 0))},
        "host": {"offload_per_node": host_per_node / GIB},
        "gpu_memory": {"total": G.memory_gib},
    }


def _tokens(s: Run, dataset_rows: Optional[int], checks: Checks) -> tuple[StepSemantics, dict[str, float]]:
    """The step semantics (:mod:`dapo.plan.steps`) and the prompts, responses and tokens of one rollout step."""
    r, A, P, R = s.preset.recipe, s.A, s.P, s.R
    d, fg = r.data, r.filter_groups
    sem = step_semantics(s.preset, dataset_rows if dataset_rows is not None else
                         KNOWN_DATASET_ROWS.get(Path(d.train_files[0]).name) if d.train_files else None, A.keep_rate)
    if fg.enable and fg.max_num_gen_batches > 0 and sem.gen_rounds_per_step > fg.max_num_gen_batches:
        checks.err("recipe.filter_groups.max_num_gen_batches",
                   f"at a keep rate of {A.keep_rate:.0%} a step needs {sem.gen_rounds_per_step} generation rounds > "
                   f"{fg.max_num_gen_batches}: the sampler would raise")
    n = r.rollout.n
    gen_prompts = sem.gen_rounds_per_step * s.gen_bs
    if fg.enable and fg.mode == "carry":
        gen_prompts = carry_prompts_per_step(sem.prompts_trained_per_step, A.keep_rate)
    gen_seqs = gen_prompts * n
    train_seqs = sem.prompts_trained_per_step * n
    return sem, {
        "mean_prompt": P, "mean_response": R, "tail_response": s.tail,
        "prompts_generated": gen_prompts, "responses_generated": gen_seqs, "generated_tokens": gen_seqs * R,
        "sequences_trained": train_seqs, "trained_tokens": train_seqs * (P + R),
        "overgeneration": sem.overgeneration,
    }


def _step_time(s: Run, sem: StepSemantics, tokens: dict[str, float], memory: dict[str, dict[str, float]],
               val_rows: Optional[int]) -> dict[str, float]:
    """Seconds per rollout step by phase, and validation and checkpoints amortised per step (module doc)."""
    r, A, arch, P, R, tail = s.preset.recipe, s.A, s.arch, s.P, s.R, s.tail
    kv_tokens_per_engine = memory["rollout"]["kv_tokens_per_engine"]
    g = _gen_time(arch, s.G, s.tp, s.engines, tokens["responses_generated"], P, R, tail, kv_tokens_per_engine, A)
    peak = s.G.flops * A.train_mfu
    tail_seq = P + tail
    e_sq = (P + R) ** 2 + (A.length_cv * R) ** 2

    def phase(seqs: float, mult: float) -> float:
        """Seconds for ``mult`` x forward over ``seqs`` sequences; a DP rank holds at least the longest one."""
        load_tok = max(seqs * (P + R) / s.dp, tail_seq)
        load_sq = max(seqs * e_sq / s.dp, tail_seq**2)
        return mult * arch.fwd_flops(load_tok, load_sq) / (s.sp * peak)

    train_seqs = tokens["sequences_trained"]
    old_lp = phase(train_seqs, 1.0)
    use_ref = r.actor.use_kl_loss or r.algorithm.use_kl_in_reward
    ref = phase(train_seqs, 1.0) if use_ref else 0.0
    upd_mult = 3.0 + (1.0 if r.model.enable_gradient_checkpointing else 0.0)
    n_mini = sem.prompts_trained_per_step // r.actor.ppo_mini_batch_size
    update = n_mini * r.actor.ppo_epochs * phase(s.mini_seqs, upd_mult)
    step = g["seconds"] + old_lp + ref + update + A.step_overhead_s
    d = r.data
    vrows = val_rows if val_rows is not None else (
        KNOWN_DATASET_ROWS.get(Path(d.val_files[0]).name, 0) if d.val_files else 0)
    val = _gen_time(arch, s.G, s.tp, s.engines, vrows * r.rollout.val.n, P, R, tail, kv_tokens_per_engine,
                    A)["seconds"] if vrows else 0.0
    ckpt = 12.0 * arch.params / (A.storage_gbps * 1e9)  # fp32 params + Adam moments, all ranks
    tf, sf = r.trainer.test_freq, r.trainer.save_freq
    val_amort = val / tf if tf > 0 else 0.0
    ckpt_amort = ckpt / sf if sf > 0 else 0.0
    return {
        "generation": g["seconds"], "old_log_prob": old_lp, "ref_log_prob": ref, "update": update,
        "overhead": A.step_overhead_s, "step": step, "validation": val, "validation_per_step": val_amort,
        "checkpoint": ckpt, "checkpoint_per_step": ckpt_amort, "wall_per_step": step + val_amort + ckpt_amort,
        "generation_tail_bound": g["tail_bound"], "decode_concurrency": g["concurrency"],
    }


def _run_length(s: Run, sem: StepSemantics, time_s: dict[str, float], total_rollout_steps: Optional[int],
                 checks: Checks) -> tuple[dict[str, Any], dict[str, Optional[float]]]:
    """Rollout and gradient steps of the whole run (and where the number comes from), hours and GPU-hours."""
    t = s.preset.recipe.trainer
    wall, world = time_s["wall_per_step"], s.world
    if total_rollout_steps is not None:
        total, source = total_rollout_steps, "--steps"
    elif t.total_training_steps is not None:
        total, source = t.total_training_steps, "recipe.trainer.total_training_steps"
    elif sem.rollout_steps_per_epoch is not None:
        total = sem.rollout_steps_per_epoch * t.total_epochs
        source = f"recipe.trainer.total_epochs={t.total_epochs} over {sem.dataset_rows:,} rows"
    else:
        total, source = None, "unknown: pass --dataset-rows or --steps"
        checks.warn("recipe.trainer.total_training_steps", "unset and the dataset size is unknown: pass --dataset-rows N")
    steps = {
        **dataclasses.asdict(sem),
        "overgeneration": sem.overgeneration,
        "total_rollout_steps": total,
        "total_gradient_steps": None if total is None else total * sem.gradient_steps_per_rollout_step,
        "total_source": source,
        "paper_rollout_steps": PAPER_ROLLOUT_STEPS,
        "sampler_mode": s.preset.recipe.filter_groups.mode,
    }
    hours = None if total is None else (total * wall + (time_s["validation"] if t.val_before_train else 0.0)) / 3600
    totals = {"hours": hours, "days": None if hours is None else hours / 24,
              "gpu_hours": None if hours is None else hours * world,
              "gpu_hours_per_rollout_step": wall * world / 3600}
    if total is not None and t.total_training_steps is None and total_rollout_steps is None \
            and total > 2 * PAPER_ROLLOUT_STEPS:
        checks.warn("recipe.trainer.total_training_steps",
                    f"unset: {source} = {total:,} rollout steps ({hours / 24:,.0f} days here). The paper stopped near "
                    f"{PAPER_ROLLOUT_STEPS} rollout steps (~{PAPER_ROLLOUT_STEPS * sem.gradient_steps_per_rollout_step:,} "
                    "gradient steps); the hub file repeats each prompt ~100x -- set total_training_steps or train on "
                    "the de-duplicated file (dapo data prepare --dedup)")
    return steps, totals


def _samplers(s: Run, sem: StepSemantics, memory: dict[str, dict[str, float]], time_s: dict[str, float],
              total: Optional[int]) -> dict[str, dict[str, Any]]:
    """The step with the reference sampler and with the carry sampler (the same training, other generation)."""
    r, A, t = s.preset.recipe, s.A, s.preset.recipe.trainer
    n, val = r.rollout.n, time_s["validation"]
    kv_tokens_per_engine = memory["rollout"]["kv_tokens_per_engine"]
    samplers: dict[str, dict[str, Any]] = {}
    for mode in ("reference", "carry"):
        m_prompts = sem.gen_rounds_per_step * s.gen_bs
        if mode == "carry" and r.filter_groups.enable:
            m_prompts = carry_prompts_per_step(sem.prompts_trained_per_step, A.keep_rate)
        m_gen = _gen_time(s.arch, s.G, s.tp, s.engines, m_prompts * n, s.P, s.R, s.tail, kv_tokens_per_engine,
                          A)["seconds"]
        m_step = m_gen + time_s["old_log_prob"] + time_s["ref_log_prob"] + time_s["update"] + A.step_overhead_s
        m_wall = m_step + time_s["validation_per_step"] + time_s["checkpoint_per_step"]
        m_hours = None if total is None else (total * m_wall + (val if t.val_before_train else 0.0)) / 3600
        samplers[mode] = {"prompts_generated": m_prompts, "responses_generated": m_prompts * n,
                          "gen_batches_per_step": m_prompts / s.gen_bs, "generation_s": m_gen, "step_s": m_step,
                          "wall_per_step_s": m_wall, "gpu_hours": None if m_hours is None else m_hours * s.world}
    return samplers

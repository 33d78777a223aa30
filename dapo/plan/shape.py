"""What a preset is on an accelerator and a placement (:class:`Run`, read by every part of the estimate), the plan's
findings (:class:`Check`, collected in order in :class:`Checks`) and the first of them: the divisibility and shape
checks of :func:`check_shape` (what verl, vLLM or the model refuse at this placement). :mod:`dapo.plan.estimate`
adds memory, tokens, time and run length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dapo.config import Preset
from dapo.plan.assumptions import Assumptions
from dapo.plan.models import GPUS, GPU, Arch, PlanError, resolve_arch


@dataclass
class Check:
    level: str  # "error" | "warning"
    key: str  # the preset key (or plan input) to change
    message: str

    def __str__(self) -> str:
        return f"{self.level.upper()} {self.key}: {self.message}"


class Checks(list):
    """The plan's :class:`Check` list, in the order the estimate finds them."""

    def err(self, key: str, msg: str) -> None:
        self.append(Check("error", key, msg))

    def warn(self, key: str, msg: str) -> None:
        self.append(Check("warning", key, msg))


@dataclass(frozen=True)
class Run:
    """What every part of the estimate reads: the preset on an accelerator and a placement, and the lengths."""

    preset: Preset
    A: Assumptions
    gpu_key: str
    G: GPU
    arch: Arch
    nodes: int
    gpn: int  # GPUs per node
    world: int
    tp: int  # rollout tensor parallel
    sp: int  # Ulysses sequence parallel
    dp: int  # data-parallel ranks (GPUs / sp)
    engines: int  # vLLM engines
    max_seq: int  # prompt + response cap
    mini_seqs: int  # sequences per mini-batch
    gen_bs: int  # prompts per generation batch
    P: int  # mean prompt length (assumed)
    R: int  # mean response length (assumed)
    tail: int  # longest response (assumed)


def resolve_run(preset: Preset, gpu: Optional[str], nodes: Optional[int], gpus_per_node: Optional[int],
                model_config: Optional[str], A: Assumptions) -> Run:
    """The :class:`Run` of ``preset`` (placement defaults from the preset); :class:`PlanError` when there is none."""
    r, p = preset.recipe, preset.placement
    if p.backend != "verl":
        raise PlanError(f"preset {preset.name!r} runs on the {p.backend} backend (one process, no cluster); "
                        "`dapo plan` sizes verl cluster runs -- try --preset smoke or full")
    gpu_key = (gpu or p.accelerator).lower()
    if gpu_key not in GPUS:
        raise PlanError(f"unknown accelerator {gpu_key!r}; known: {', '.join(GPUS)}")
    nodes = nodes or p.nodes
    gpn = gpus_per_node or p.gpus_per_node
    world = nodes * gpn
    tp, sp = p.parallel.rollout_tp, p.parallel.ulysses_sp
    d = r.data
    return Run(preset=preset, A=A, gpu_key=gpu_key, G=GPUS[gpu_key], arch=resolve_arch(r.model.path, model_config),
                nodes=nodes, gpn=gpn, world=world, tp=tp, sp=sp, dp=max(1, world // sp),
                engines=world // tp if tp and world % tp == 0 else max(1, world // max(tp, 1)),
                max_seq=d.max_prompt_length + d.max_response_length,
                mini_seqs=r.actor.ppo_mini_batch_size * r.rollout.n, gen_bs=d.gen_batch_size or d.train_batch_size,
                P=min(A.mean_prompt_len, d.max_prompt_length),
                R=min(A.resolved_response_len(d.max_response_length), d.max_response_length),
                tail=min(A.tail_response_len or d.max_response_length, d.max_response_length))


def check_shape(s: Run, checks: Checks) -> None:
    """Divisibility and shape: what verl, vLLM or the model refuse at this placement."""
    r, arch, tp, sp, world, gpn, max_seq = s.preset.recipe, s.arch, s.tp, s.sp, s.world, s.gpn, s.max_seq
    d, par, err, warn = r.data, s.preset.placement.parallel, checks.err, checks.warn
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
    if s.mini_seqs % s.dp:
        err("recipe.actor.ppo_mini_batch_size",
            f"ppo_mini_batch_size x n = {s.mini_seqs} sequences must split evenly over {s.dp} data-parallel ranks "
            f"(GPUs / ulysses_sp); verl floors the per-rank share and the update changes")
    if (d.train_batch_size * r.rollout.n) % world:
        (warn if par.use_dynamic_bsz else err)(
            "recipe.data.train_batch_size",
            f"train_batch_size x n = {d.train_batch_size * r.rollout.n} is not a multiple of the {world} GPUs")
    if (s.gen_bs * r.rollout.n) % world:
        warn("recipe.data.gen_batch_size", f"gen_batch_size x n = {s.gen_bs * r.rollout.n} does not split evenly "
                                           f"over {world} GPUs (verl pads the batch)")
    if par.use_dynamic_bsz and par.ppo_max_token_len_per_gpu * sp < max_seq:
        err("placement.parallel.ppo_max_token_len_per_gpu",
            f"{par.ppo_max_token_len_per_gpu} x ulysses_sp {sp} < prompt + response ({max_seq}): a max-length "
            "sequence does not fit a micro-batch")
    if not par.enable_chunked_prefill and par.max_num_batched_tokens < max_seq:
        err("placement.parallel.max_num_batched_tokens",
            f"{par.max_num_batched_tokens} < prompt + response ({max_seq}) with chunked prefill off (vLLM refuses)")
    if not r.filter_groups.enable and s.gen_bs != d.train_batch_size:
        warn("recipe.data.gen_batch_size", f"{s.gen_bs} != train_batch_size {d.train_batch_size} without dynamic "
                                           "sampling: every generated prompt is trained on")

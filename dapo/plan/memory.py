"""Host memory of the DAPO loop and storage of a run, per preset -- what ``dapo plan`` reports and the chart checks.

Where the loop runs
-------------------
The loop is the Ray job driver, started on a worker pod (the training RayJob's ``entrypointNumCpus: 1``; the head has
``num-cpus: 0``). Its memory is bounded by that pod's limit minus what the pod's other tenants use:

    available = worker.resources.limits.memory - reserved
    reserved  = worker.shmSize                                  (memory-backed /dev/shm counts against the limit)
              + gpus_per_node x worker_process_gib              (a verl worker + its vLLM engine per GPU: CUDA
                                                                 context, NCCL and pinned buffers, Python)
              + FSDP offload per node                           (fp32 params / Adam moments with param_offload /
                                                                 optimizer_offload, sharded over all GPUs)
              + 4 N, only with hf_model in save_contents         (verl's hf_model save gathers the full fp32 state
                                                                 dict on rank 0's pod; the loop may share it; the
                                                                 presets save none: dapo.backends.verl.settings.
                                                                 CHECKPOINT_CONTENTS)

Local-backend presets run the whole model in the loop's process; only /dev/shm is reserved there.

The loop's peak (verl backend), from verl 0.9.1's agent-loop output (``AgentLoopManager`` pads every sample to
``prompt_length`` / ``response_length`` and concatenates the workers' outputs in the caller)::

    row     = 8 x (P + R + R + 3 (P + R))     int64 prompts, responses, response_mask, input_ids, attention_mask,
                                              position_ids
            + 4 x R                           fp32 rollout_log_probs
            + 4 x R                           fp32 verl_rm_scores, only with recipe.reward.verl_agreement (verl's
                                              reward loop scores too; by default the loop scores once, itself)
    gen     = gen_batch_size x n rows;   train = train_batch_size x n rows
    during generation: 2 x gen x row (the workers' outputs + their concat) + kept rows held from earlier batches
                       of the step (dapo.sampler: at most train rows; carry mode also a batch's surplus)
    building the step: kept rows + their concat (train x row each) + fp32 old log-probs, advantages, returns,
                       token_level_scores and token_level_rewards (train x R x 4 each; dapo.backends.verl.backend)
    peak    = base + dataset rows x row_object_bytes + max(generation, step)

with P = max_prompt_length, R = max_response_length (padded, so lengths do not matter).

Storage
-------
At most ``max_ckpt_to_keep + 1`` checkpoints exist at once (dapo.train.checkpoint prunes before and after a save),
plus the one with the best validation score when it is older (never deleted; counted when ``test_freq`` > 0). One
verl checkpoint of an N-parameter model: fp32 FSDP model shards (4N) + Adam moments (8N) (+ 4N with ``hf_model`` in
``save_contents``: verl passes the fp32 full state dict to ``save_pretrained``; the presets save none); the model
download in the HF cache is bf16 (2N); data is a
fixed allowance; 10% headroom on top. ``max_ckpt_to_keep: null`` (keep all) counts every checkpoint the run saves.

The chart's copy of these numbers (charts/dapo/files/requirements.yaml) is written by :mod:`dapo.plan.cli`.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any, Optional

from dapo.backends.verl.settings import CHECKPOINT_CONTENTS

# verl's full-weights HF copy at every save (rank 0 gathers the fp32 model): not in the presets' save_contents
HF_MODEL_SAVED = "hf_model" in CHECKPOINT_CONTENTS
GIB = 1024**3
TIB = 1024**4

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([KMGTPE]i?|k)?$")
_MULT = {None: 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
         "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


@dataclass(frozen=True)
class SizingAssumptions:
    # The loop process besides its batches: interpreter, torch, verl, the Ray core worker, tokenizer, wandb.
    loop_base_gib: float = 4.0
    # The same for the local backend (torch + transformers, no verl / Ray client).
    local_base_gib: float = 1.5
    # One training row held by the loop as Python objects (chat prompt, ground truth, metadata).
    row_object_bytes: int = 2048
    # Per GPU on a verl worker pod: the FSDP worker and the vLLM engine processes outside the GPU.
    worker_process_gib: float = 10.0
    # Parquet files on the volume (training + validation + a de-duplicated copy).
    data_gib: float = 2.0
    # Storage headroom (logs, wandb, eval outputs, file system overhead).
    headroom: float = 0.10

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def parse_quantity(text: Any) -> float:
    """Bytes of a Kubernetes quantity as the chart's schema allows it (``500Gi``, ``8Ti``, ``1.5T``, ``1000``)."""
    m = _QUANTITY.match(str(text).strip())
    if not m:
        raise ValueError(f"{text!r} is not a quantity like 500Gi or 8Ti")
    return float(m.group(1)) * _MULT[m.group(2)]


def fmt_bytes(b: float) -> str:
    """``366.4 GiB`` / ``2.3 TiB`` -- one format for messages, the chart's data file and docs."""
    if b >= TIB:
        return f"{b / TIB:.1f} TiB"
    if b >= GIB:
        return f"{b / GIB:.1f} GiB"
    return f"{b / 2**20:.1f} MiB"


def model_params(preset) -> int:
    """Parameters of the preset's model (the plan's architecture table; a built-in tiny model from ``local``)."""
    from dapo.plan.models import Arch, resolve_arch

    if preset.recipe.model.path.startswith("builtin:"):
        m = preset.local.model
        return Arch("builtin", m.hidden_size, m.num_hidden_layers, m.num_attention_heads, m.num_key_value_heads,
                    m.intermediate_size, m.vocab_size, m.tie_word_embeddings, m.max_position_embeddings).params
    return resolve_arch(preset.recipe.model.path).params


def row_bytes(prompt_len: int, response_len: int, verl_rm_scores: bool = False) -> int:
    """Host bytes of one padded sample of verl 0.9.1's agent-loop output as the loop holds it (module doc)."""
    P, R = prompt_len, response_len
    return 8 * (P + R + R + 3 * (P + R)) + 4 * R + (4 * R if verl_rm_scores else 0)


def loop_memory(preset, dataset_rows: Optional[int] = None, A: SizingAssumptions = SizingAssumptions()
                ) -> dict[str, float]:
    """Peak host bytes of the loop process and its parts (module doc)."""
    r = preset.recipe
    d, n = r.data, r.rollout.n
    gen_rows = (d.gen_batch_size or d.train_batch_size) * n
    train_rows = d.train_batch_size * n
    row = row_bytes(d.max_prompt_length, d.max_response_length, r.reward.verl_agreement)
    gen = gen_rows * row
    train = train_rows * row
    held = 0.0
    if r.filter_groups.enable:
        held = train + (gen if r.filter_groups.mode == "carry" else 0.0)
    generation = 2.0 * gen + held
    step = 2.0 * train + 5.0 * train_rows * d.max_response_length * 4.0
    out = {
        "row_bytes": float(row),
        "generation_batch": float(gen),
        "during_generation": generation,
        "building_step": step,
        "dataset_rows": float(dataset_rows or 0),
        "rows_as_objects": float((dataset_rows or 0) * A.row_object_bytes),
        "base": (A.local_base_gib if preset.placement.backend == "local" else A.loop_base_gib) * GIB,
        "model_state": 0.0,
    }
    if preset.placement.backend == "local":
        # the whole model lives in the loop: fp32 weights, gradients, Adam moments, plus a frozen reference copy
        out["model_state"] = 20.0 * model_params(preset)
    out["peak"] = out["base"] + out["rows_as_objects"] + out["model_state"] + max(generation, step)
    return out


def worker_reserved(preset, shm_bytes: float, A: SizingAssumptions = SizingAssumptions(), *,
                    nodes: Optional[int] = None, gpus_per_node: Optional[int] = None) -> dict[str, float]:
    """Bytes of the worker pod the loop cannot use (module doc); ``nodes`` / ``gpus_per_node`` default to the
    preset's placement."""
    p = preset.placement
    out = {"shm": float(shm_bytes), "worker_processes": 0.0, "fsdp_offload": 0.0, "hf_model_gather": 0.0}
    if p.backend != "local":
        N = model_params(preset)
        gpn = gpus_per_node or p.gpus_per_node
        world = (nodes or p.nodes) * gpn
        shards = p.parallel.fsdp_size if p.parallel.fsdp_size > 0 else world
        out["worker_processes"] = gpn * A.worker_process_gib * GIB
        out["fsdp_offload"] = gpn * ((4.0 * N / shards if p.parallel.param_offload else 0.0)
                                     + (8.0 * N / shards if p.parallel.optimizer_offload else 0.0))
        out["hf_model_gather"] = 4.0 * N if HF_MODEL_SAVED else 0.0
    out["total"] = sum(out.values())
    return out


def checkpoints_saved(preset) -> Optional[int]:
    """Checkpoints a run saves in all (None if the run length is unknown)."""
    t = preset.recipe.trainer
    if t.save_freq <= 0 or t.total_training_steps is None:
        return None
    return math.ceil(t.total_training_steps / t.save_freq)


def storage(preset, A: SizingAssumptions = SizingAssumptions()) -> dict[str, Any]:
    """Bytes the run's volume needs (module doc) and a one-line account of them."""
    t = preset.recipe.trainer
    N = model_params(preset)
    per_ckpt = (4.0 + 8.0 + (4.0 if HF_MODEL_SAVED else 0.0)) * N if preset.placement.backend != "local" else 16.0 * N
    keep = t.max_ckpt_to_keep if t.max_ckpt_to_keep and t.max_ckpt_to_keep > 0 else None
    saved = checkpoints_saved(preset)
    if keep is not None:
        best = 1 if t.test_freq > 0 else 0  # the best-scoring checkpoint stays besides the newest ones
        count = keep + 1 + best if saved is None else min(keep + 1 + best, saved)
        how = f"(max_ckpt_to_keep {keep} + 1{' + the best' if best else ''}) checkpoints"
    elif saved is not None:
        count, how = saved, f"all {saved} checkpoints (max_ckpt_to_keep: null)"
    else:
        count, how = None, "all checkpoints (max_ckpt_to_keep: null, run length unknown)"
    model_cache = 0.0 if preset.recipe.model.path.startswith("builtin:") else 2.0 * N
    data = A.data_gib * GIB if preset.recipe.data.train_files else 0.0  # a built-in task is made in memory
    if count is None:
        return {"bytes": None, "per_checkpoint": per_ckpt, "checkpoints": None, "model_cache": model_cache,
                "data": data, "summary": f"unbounded: {how} x {fmt_bytes(per_ckpt)}; set "
                                         "recipe.trainer.max_ckpt_to_keep"}
    total = (count * per_ckpt + model_cache + data) * (1.0 + A.headroom)
    total = float(math.ceil(total / GIB) * GIB)  # whole GiB: the same number in every file and message
    summary = (f"{fmt_bytes(total)} = {how} x {fmt_bytes(per_ckpt)} + model cache {fmt_bytes(model_cache)} + data "
               f"{fmt_bytes(data)} + {A.headroom:.0%} headroom")
    return {"bytes": total, "per_checkpoint": per_ckpt, "checkpoints": count, "model_cache": model_cache,
            "data": data, "summary": summary}


def storage_message(preset_name: str, size: str, summary: str) -> str:
    """The refusal of a too-small volume -- the chart prints the same text (charts/dapo/templates/_validate.tpl)."""
    return (f"storage.size: {size} is smaller than what preset {preset_name} needs: {summary} (dapo plan --preset "
            f"{preset_name}); raise storage.size or lower recipe.trainer.max_ckpt_to_keep")


# The checkpoint write may take at most this share of the run's wall time (the preflight's storage check).
CHECKPOINT_WALL_SHARE = 0.10


def checkpoint_write(preset, checkpoint_bytes: float) -> dict[str, Any]:
    """The write throughput the shared volume needs: a checkpoint of ``checkpoint_bytes`` every ``save_freq`` steps
    of the plan's step time (generation, training, validation) takes at most CHECKPOINT_WALL_SHARE of the wall time,
    w <= share * (between + w), i.e. bytes / rate <= share / (1 - share) * between -- an aggregate rate: every rank
    of the run (``writeStreams`` = nodes x GPUs per node) writes its FSDP shard at once. Empty for a preset without a
    step-time model (the local backend) or without checkpoints."""
    save_freq = preset.recipe.trainer.save_freq
    if save_freq <= 0:
        return {}
    try:
        from dapo.plan.estimate import make_plan
        from dapo.plan.models import PlanError

        t = make_plan(preset).time_s
    except PlanError:
        return {}
    between = save_freq * (t["step"] + t["validation_per_step"])
    rate = checkpoint_bytes / (CHECKPOINT_WALL_SHARE / (1 - CHECKPOINT_WALL_SHARE) * between)
    p = preset.placement
    return {"checkpointBytes": int(checkpoint_bytes), "secondsBetweenSaves": int(round(between)),
            "minWriteBytesPerSecond": int(round(rate)), "writeStreams": int(p.nodes * p.gpus_per_node)}

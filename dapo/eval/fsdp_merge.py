"""Merge a verl FSDP actor checkpoint (``global_step_N/actor/``) into HF-format safetensors, with torch alone (the
evaluation image has no verl).

``load_fsdp_shards`` memory-maps every rank's ``model_world_size_W_rank_R.pt`` (the world size from
``fsdp_config.json``, or from the shard names for verl 4f80e46, which writes none) and checks the shard and key sets;
``merge_entry`` rebuilds one entry: a DTensor from its ranks' local pieces following its device mesh and placements
(``Shard(d)``: concatenate along ``d`` in mesh order, ``Replicate``: take one copy), checked against its global shape,
a plain tensor as the one copy every rank holds; ``write_safetensors`` casts to ``dtype`` and streams the entries into
``model-0000i-of-0000n.safetensors`` files of at most ``max_shard_bytes`` with a ``model.safetensors.index.json``;
``merge_verl_fsdp`` does all three after copying the HF config and tokenizer. Peak memory is one output file plus one
full-precision tensor, not the model.

Holds :class:`ExportError` and the export dtypes, which :mod:`dapo.eval.export` (step resolution, the atomic export,
its CLI arguments) builds on.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

SHARD0_RE = re.compile(r"^model_world_size_(\d+)_rank_0\.pt$")
WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin", "model*.bin")
DTYPES = ("bfloat16", "float16", "float32")
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3


class ExportError(RuntimeError):
    """No usable checkpoint, or a target we must not touch; the message names the directory."""


def _mesh_ranks(mesh: Any, key: str):
    """The rank layout of a DTensor's device mesh. A mesh pickled by an older torch -- 2.6, the stack of verl 4f80e46
    that writes the reference runs' checkpoints -- holds it as the plain attribute ``mesh``; newer torch computes
    ``DeviceMesh.mesh`` from layout state such a pickle lacks (``AttributeError: ... '_layout'``)."""
    try:
        return mesh.mesh
    except AttributeError:
        ranks = vars(mesh).get("mesh")
        if ranks is None:
            raise ExportError(f"{key}: the DTensor's device mesh holds no rank layout (torch {type(mesh)})") from None
        return ranks


def _merge_dtensor(pieces: list, key: str):
    """Rebuild the global tensor of one DTensor entry from every rank's piece (``pieces[r]`` from rank ``r``)."""
    import torch

    ref = pieces[0]
    mesh = _mesh_ranks(ref.device_mesh, key)  # tensor of global ranks, one axis per mesh dim
    placements = tuple(ref.placements)
    # the local piece is the DTensor's `_local_tensor` slot in every torch release; to_local() may need mesh state
    locals_by_rank = {r: p._local_tensor if hasattr(p, "_local_tensor") else p.to_local() for r, p in enumerate(pieces)}

    def build(sub, dim: int):
        if dim == len(placements):
            rank = int(sub.item())
            if rank not in locals_by_rank:
                raise ExportError(f"{key}: the device mesh names rank {rank}, but only {len(pieces)} shard files exist")
            return locals_by_rank[rank]
        parts = [build(sub.select(0, i), dim + 1) for i in range(sub.shape[0])]
        p = placements[dim]
        if p.is_replicate():
            return parts[0]
        if p.is_shard():
            return torch.cat(parts, dim=p.dim)
        raise ExportError(f"{key}: placement {p} on mesh dim {dim} is not supported (only Shard and Replicate)")

    full = build(mesh, 0)
    if tuple(full.shape) != tuple(ref.shape):
        raise ExportError(f"{key}: merged shape {tuple(full.shape)} != the DTensor's global shape {tuple(ref.shape)}")
    return full


def load_fsdp_shards(actor: Path) -> tuple[list[dict], list[str], dict]:
    """Every rank's shard file, memory-mapped (nothing is read until a tensor is used): (state dicts by rank, keys,
    fsdp_config). Checks the shard set and key sets."""
    import torch

    cfg_path = actor / "fsdp_config.json"
    try:
        fsdp_cfg = json.loads(cfg_path.read_text())
        world_size = int(fsdp_cfg["world_size"])
    except FileNotFoundError:
        # verl 4f80e46 (the reference runs) writes no fsdp_config.json: the world size is in the shard names
        sizes = sorted({int(m.group(1)) for p in actor.glob("model_world_size_*_rank_0.pt")
                        if (m := SHARD0_RE.match(p.name))})
        if len(sizes) != 1:
            raise ExportError(
                f"{cfg_path} does not exist and {actor} holds "
                + (f"rank-0 shards of several world sizes {sizes}" if sizes else "no model_world_size_W_rank_0.pt")
                + ": not a verl FSDP checkpoint of one run"
            ) from None
        world_size = sizes[0]
        fsdp_cfg = {"world_size": world_size}
    except (ValueError, KeyError, TypeError) as exc:
        raise ExportError(f"{cfg_path}: no usable world_size ({exc})") from None
    files = [actor / f"model_world_size_{world_size}_rank_{r}.pt" for r in range(world_size)]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ExportError(f"{actor}: world_size {world_size} but shard files are missing: {missing[:5]}")
    if (actor / "lora_train_meta.json").exists():
        raise ExportError(f"{actor} is a LoRA checkpoint; merge it with verl's model merger (it writes an adapter)")
    # unpickling a DTensor's DeviceMesh without process groups makes torch warn once per tensor; harmless here
    mesh_log = logging.getLogger("torch.distributed.device_mesh")
    level = mesh_log.level
    mesh_log.setLevel(logging.ERROR)
    try:
        shards = [torch.load(f, map_location="cpu", mmap=True, weights_only=False) for f in files]
    finally:
        mesh_log.setLevel(level)
    keys = list(shards[0].keys())
    for r, sd in enumerate(shards[1:], start=1):
        if set(sd.keys()) != set(keys):
            diff = sorted(set(sd.keys()) ^ set(keys))[:5]
            raise ExportError(f"{files[r]} holds other keys than rank 0's (e.g. {diff})")
    if any("lora_" in k for k in keys):
        raise ExportError(f"{actor} holds LoRA weights; merge it with verl's model merger (it writes an adapter)")
    return shards, sorted(keys), fsdp_cfg


def merge_entry(shards: list[dict], key: str):
    """The full tensor of one state-dict entry, from every rank's piece."""
    import torch

    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.5
        from torch.distributed._tensor import DTensor
    pieces = [sd[key] for sd in shards]
    if isinstance(pieces[0], DTensor):
        return _merge_dtensor(pieces, key)
    if isinstance(pieces[0], torch.Tensor):
        # FSDP only makes DTensors of what it shards; plain entries are replicated on every rank
        for r, p in enumerate(pieces[1:], start=1):
            if p.shape != pieces[0].shape or not torch.equal(p, pieces[0]):
                raise ExportError(f"{key}: plain (replicated) entry differs between rank 0 and rank {r}")
        return pieces[0]
    raise ExportError(f"{key}: unsupported entry type {type(pieces[0]).__name__}")


def write_safetensors(
    keys: list[str], get, out: Path, dtype: str, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES
) -> list[str]:
    """Stream ``get(key)`` for each key (sorted), cast floating tensors to ``dtype``, and write HF-style (sharded)
    safetensors + index. At most one output shard plus one full-precision tensor is in memory. Returns file names."""
    import torch
    from safetensors.torch import save_file

    tdtype = getattr(torch, dtype)
    names: list[str] = []
    weight_map: dict[str, str] = {}
    total = 0
    part: dict = {}
    part_bytes = 0

    def flush() -> None:
        nonlocal part, part_bytes
        if not part:
            return
        name = f"part-{len(names):05d}.tmp.safetensors"
        save_file(part, str(out / name), metadata={"format": "pt"})
        for k in part:
            weight_map[k] = name
        names.append(name)
        part, part_bytes = {}, 0

    for key in keys:
        t = get(key)
        if t.is_floating_point():
            t = t.to(tdtype)
        t = t.contiguous().clone()  # own storage: detached from the mmap'd shard and from tied siblings
        nbytes = t.numel() * t.element_size()
        if part and part_bytes + nbytes > max_shard_bytes:
            flush()
        part[key] = t
        part_bytes += nbytes
        total += nbytes
    flush()
    if len(names) == 1:
        final = {names[0]: "model.safetensors"}
    else:
        final = {n: f"model-{i + 1:05d}-of-{len(names):05d}.safetensors" for i, n in enumerate(names)}
    for old, new in final.items():
        os.replace(out / old, out / new)
    if len(names) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": {k: final[v] for k, v in sorted(weight_map.items())}}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return sorted(final.values())


def _copy_hf_metadata(src: Path, out: Path, dtype: str) -> dict:
    """Config, tokenizer, generation config, chat template, remote code: everything in ``huggingface/`` except
    weights. The config's dtype is set to the exported one."""
    if not (src / "config.json").is_file():
        raise ExportError(f"{src / 'config.json'} does not exist: the checkpoint has no HF config to export with")
    for p in src.iterdir():
        if p.is_file() and not any(p.match(g) for g in WEIGHT_GLOBS) and p.name != "model.safetensors.index.json":
            shutil.copy2(p, out / p.name)
    config = json.loads((out / "config.json").read_text())
    for key in ("torch_dtype", "dtype"):
        if key in config or key == "torch_dtype":
            config[key] = dtype
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return config


def merge_verl_fsdp(actor: Path, out: Path, dtype: str = "bfloat16", max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES):
    """Merge ``actor/`` (a verl FSDP checkpoint) into ``out`` (must exist, empty)."""
    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    config = _copy_hf_metadata(actor / "huggingface", out, dtype)
    shards, keys, _ = load_fsdp_shards(actor)
    if config.get("tie_word_embeddings") and "lm_head.weight" in keys:
        # tied: the HF loader (and vLLM) take the output projection from the embedding
        keys.remove("lm_head.weight")
    return write_safetensors(keys, lambda key: merge_entry(shards, key), out, dtype, max_shard_bytes)

"""Export of a checkpoint of the reference runner: verl 4f80e46's FSDP layout (no fsdp_config.json) is merged by
dapo.eval.export into the original weights, which transformers loads -- so the same evaluation job scores both runs.

The layout, from verl 4f80e46 (the reference runs):
- ``ray_trainer._save_checkpoint``: ``<default_local_dir>/global_step_N/actor/`` (the actor's checkpoint),
  ``global_step_N/data.pt`` (dataloader state), then ``<default_local_dir>/latest_checkpointed_iteration.txt``
  holding ``str(global_steps)``.
- ``FSDPCheckpointManager.save_checkpoint``: every rank writes ``model_world_size_W_rank_R.pt`` (the
  ``SHARDED_STATE_DICT`` of FSDP1), ``optim_world_size_W_rank_R.pt`` and ``extra_state_world_size_W_rank_R.pt``
  (``lr_scheduler``, ``rng``); with ``hf_model`` in ``checkpoint.contents`` rank 0 writes the HF *config and
  tokenizer* (no weights) to ``actor/huggingface``. No ``fsdp_config.json`` (added to verl later).
- FSDP1 built with a device mesh (``fsdp_workers.create_device_mesh``: 1-D, ``mesh_dim_names=['fsdp']`` for
  ``fsdp_size: -1``) turns ``_use_dtensor`` on, so each state-dict value is ``_create_chunk_dtensor(param, rank,
  mesh)``: a DTensor, ``Shard(0)``. FSDP1 cannot be built on CPU in this torch, so each rank calls that same torch
  function on the full parameters -- the values FSDP1's state-dict hook produces.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import free_port
from dapo.eval.export import export_checkpoint
from dapo.eval.fsdp_merge import ExportError

torch = pytest.importorskip("torch")

RANK_SCRIPT = textwrap.dedent(
    """
    import os, random, sys
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp._shard_utils import _create_chunk_dtensor

    original, actor = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    sd = {k: _create_chunk_dtensor(v, rank, mesh) for k, v in torch.load(original).items()}
    opt = torch.optim.AdamW([torch.nn.Parameter(v.to_local().clone()) for v in sd.values()], lr=1e-6)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    name = f"world_size_{world}_rank_{rank}.pt"
    torch.save(sd, os.path.join(actor, "model_" + name))
    torch.save(opt.state_dict(), os.path.join(actor, "optim_" + name))
    rng = {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}
    torch.save({"lr_scheduler": sched.state_dict(), "rng": rng}, os.path.join(actor, "extra_state_" + name))
    dist.barrier()
    # done: leave without tearing gloo down (its teardown can abort a finished rank, exit -6: tests/test_export.py)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
    """
)


@pytest.fixture(scope="module")
def reference_ckpt(tmp_path_factory) -> Path:
    """<default_local_dir> of a reference run at step 5 (2 ranks, an untied tiny Qwen2), as verl 4f80e46 writes it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    ckpt = tmp_path_factory.mktemp("ref") / "DAPO-verl" / "DAPO-Qwen2.5-32B"
    step = ckpt / "global_step_5"
    actor = step / "actor"
    (actor / "huggingface").mkdir(parents=True)
    vocab = {f"t{i}": i for i in range(61)} | {"<|im_end|>": 61, "<|endoftext|>": 62}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    torch.manual_seed(1)
    cfg = Qwen2Config(vocab_size=63, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=128, tie_word_embeddings=False,
                      architectures=["Qwen2ForCausalLM"])
    model = Qwen2ForCausalLM(cfg)
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, ckpt.parent / "original.pt")
    model.config.save_pretrained(actor / "huggingface")  # rank 0: config + tokenizer, no weights
    fast.save_pretrained(actor / "huggingface")
    script = ckpt.parent / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(ckpt.parent / "original.pt"), str(actor)],
            env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for r in range(2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, out[-2000:] + err[-3000:]
    torch.save({"dataloader": "state"}, step / "data.pt")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("5")
    return ckpt


def test_reference_layout_exports_to_the_original_weights_and_loads_in_transformers(reference_ckpt, tmp_path):
    actor = reference_ckpt / "global_step_5" / "actor"
    assert not (actor / "fsdp_config.json").exists()
    assert sorted(p.name for p in actor.iterdir() if p.suffix == ".pt") == [
        f"{kind}_world_size_2_rank_{r}.pt" for kind in ("extra_state", "model", "optim") for r in (0, 1)]
    shard = torch.load(actor / "model_world_size_2_rank_0.pt", weights_only=False)
    first = shard["model.embed_tokens.weight"]
    assert type(first).__name__ == "DTensor" and first.device_mesh.mesh_dim_names == ("fsdp",)
    assert tuple(first.to_local().shape) == (32, 64)  # rank 0's half of 63 rows: uneven shards are merged right

    res = export_checkpoint(reference_ckpt, "latest", tmp_path / "hf", dtype="float32", log=lambda *_: None)
    assert res.step == 5 and res.action == "merged"
    original = torch.load(reference_ckpt.parent / "original.pt")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(res.path)
    loaded = model.state_dict()
    assert set(loaded) == set(original)
    for k, v in original.items():
        assert torch.equal(loaded[k], v), k
    assert AutoTokenizer.from_pretrained(res.path).eos_token == "<|im_end|>"
    assert json.loads((res.path / "config.json").read_text())["torch_dtype"] == "float32"


def test_reference_layout_with_shards_of_two_world_sizes_is_refused(reference_ckpt, tmp_path):
    import shutil

    broken = tmp_path / "ckpt"
    shutil.copytree(reference_ckpt / "global_step_5", broken / "global_step_5")
    actor = broken / "global_step_5" / "actor"
    shutil.copy(actor / "model_world_size_2_rank_0.pt", actor / "model_world_size_4_rank_0.pt")
    with pytest.raises(ExportError, match=r"several world sizes \[2, 4\]"):
        export_checkpoint(broken, 5, tmp_path / "hf", log=lambda *_: None)
    assert not (tmp_path / "hf").exists()


def test_shards_whose_device_mesh_was_pickled_by_torch_2_6_export_the_same(reference_ckpt, tmp_path):
    """The reference runs' checkpoints are written by the reproduction stack's torch 2.6 and exported on the
    evaluation image's newer torch. torch 2.6's DeviceMesh keeps its ranks as plain attributes (its ``__init__``:
    ``device_type``, ``mesh``, ``mesh_dim_names``, ``_flatten_mesh_list``, ``_parent_mesh``, ``_thread_id``, then the
    process-group bookkeeping), which newer torch unpickles but hides behind a ``mesh`` property that needs state
    the old pickle lacks. The shards are rewritten here with meshes of that older shape."""
    import copy
    import shutil

    from torch.distributed.device_mesh import DeviceMesh

    old_ckpt = tmp_path / "ckpt"
    shutil.copytree(reference_ckpt, old_ckpt)
    actor = old_ckpt / "global_step_5" / "actor"
    for r in (0, 1):
        path = actor / f"model_world_size_2_rank_{r}.pt"
        shard = torch.load(path, weights_only=False)
        old = DeviceMesh.__new__(DeviceMesh)
        old.__dict__.update({
            "device_type": "cuda", "mesh": torch.tensor([0, 1], dtype=torch.int), "mesh_dim_names": ("fsdp",),
            "_flatten_mesh_list": (0, 1), "_parent_mesh": None, "_thread_id": None, "_coordinate_on_dim": [r],
            "_dim_group_infos": [("ptd:1", [0, 1], "1")],
        })  # fmt: skip
        for dt in shard.values():
            spec = copy.copy(dt._spec)
            object.__setattr__(spec, "mesh", old)
            dt._spec = spec
        torch.save(shard, path)
    reloaded = torch.load(actor / "model_world_size_2_rank_0.pt", weights_only=False)
    with pytest.raises(AttributeError):
        next(iter(reloaded.values())).device_mesh.mesh  # what the newer torch makes of the old mesh
    res = export_checkpoint(old_ckpt, "latest", tmp_path / "hf", dtype="float32", log=lambda *_: None)
    original = torch.load(reference_ckpt.parent / "original.pt")
    from safetensors.torch import load_file

    merged = load_file(str(res.path / "model.safetensors"))
    assert set(merged) == set(original) and all(torch.equal(merged[k], v) for k, v in original.items())

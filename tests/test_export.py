"""Checkpoint -> HF export: a real 2-rank FSDP2 sharded checkpoint (CPU, gloo) in verl 0.9.1's layout is merged by
dapo.eval.export (through dapo.eval.fsdp_merge) and compared with the original weights and with verl's own model
merger (the reference)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import free_port
from dapo.eval.export import MARKER, export_checkpoint, resolve_step
from dapo.eval.fsdp_merge import ExportError

torch = pytest.importorskip("torch")

# Each of 2 gloo ranks (own processes) rebuilds the module tree of a tiny Qwen2 from its state dict (torch only:
# importing transformers per rank costs seconds), shards it with FSDP2 on verl's 1-D mesh ("fsdp"), and saves what
# verl 0.9.1's FSDPCheckpointManager.save_checkpoint writes for FSDP2: torch.save(model.state_dict()) -- DTensors --
# to model_world_size_2_rank_R.pt, and (rank 0) fsdp_config.json. The test process writes huggingface/ (config +
# tokenizer, as the manager's rank 0 does) and the trainer's tracker file.
RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    original, actor, fsdp_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # verl's create_device_mesh (workers/engine/fsdp/utils.py): 1-D "fsdp", or ("ddp", "fsdp") when 0 < fsdp_size <
    # world -- 7b's fsdp_size 32 on 64 GPUs; FSDP2 on a 2-D mesh is HSDP (Replicate over ddp, Shard over fsdp)
    if fsdp_size < 0 or fsdp_size >= world:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    else:
        mesh = init_device_mesh("cpu", (world // fsdp_size, fsdp_size), mesh_dim_names=("ddp", "fsdp"))

    def sharded(state):
        root = torch.nn.Module()
        for name, tensor in state.items():
            *path, leaf = name.split(".")
            m = root
            for part in path:
                if not hasattr(m, part):
                    m.add_module(part, torch.nn.Module())
                m = getattr(m, part)
            m.register_parameter(leaf, torch.nn.Parameter(tensor))
        for layer in root.model.layers.children():
            fully_shard(layer, mesh=mesh)
        fully_shard(root, mesh=mesh)
        return root

    weights = torch.load(original)
    root = sharded(weights)
    shard = os.path.join(actor, f"model_world_size_{world}_rank_{rank}.pt")
    torch.save(root.state_dict(), shard)
    if rank == 0:
        with open(os.path.join(actor, "fsdp_config.json"), "w") as f:
            json.dump({"FSDP_version": 2, "world_size": world}, f, indent=4)
    dist.barrier()
    # resume as verl's FSDPCheckpointManager.load_checkpoint does: each rank loads its own shard file into a model
    # sharded the same way (here one holding other weights); the full weights must be the saved ones again
    fresh = sharded({k: torch.zeros_like(v) for k, v in weights.items()})
    fresh.load_state_dict(torch.load(shard, weights_only=False))
    for k, v in fresh.state_dict().items():
        assert torch.equal(v.full_tensor(), weights[k]), k
    dist.barrier()
    # done: the shard is written and read back. Leave without tearing gloo down: its teardown can abort a rank after
    # the work is done ("terminate called without an active exception", exit -6: a gloo thread still joinable when
    # the process group is destroyed; seen in a fresh-clone run), and a process about to exit needs no teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
    """
)


def build_checkpoint(ckpt: Path, step: int, tie: bool, world: int = 2, fsdp_size: int = -1) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    actor = ckpt / f"global_step_{step}" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    vocab = {f"t{i}": i for i in range(61)} | {"<|im_end|>": 61, "<|endoftext|>": 62}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=63, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=128, tie_word_embeddings=tie,
        architectures=["Qwen2ForCausalLM"],
    )  # fmt: skip
    model = Qwen2ForCausalLM(cfg)
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, ckpt / "original.pt")
    model.config.save_pretrained(actor / "huggingface")
    fast.save_pretrained(actor / "huggingface")
    script = ckpt / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(ckpt / "original.pt"), str(actor), str(fsdp_size)],
            env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for r in range(world)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, out[-2000:] + err[-3000:]
    (ckpt / "latest_checkpointed_iteration.txt").write_text(str(step))


@pytest.fixture(scope="module")
def verl_ckpt(tmp_path_factory) -> Path:
    """A 2-rank FSDP2 verl checkpoint of an untied tiny Qwen2 at step 3 (plus an older step 1 dir without files)."""
    ckpt = tmp_path_factory.mktemp("run") / "ckpts"
    build_checkpoint(ckpt, 3, tie=False)
    (ckpt / "global_step_1").mkdir()
    return ckpt


def _load_safetensors_dir(d: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_export_merges_fsdp_shards_into_the_original_weights(verl_ckpt, tmp_path):
    sharded = torch.load(verl_ckpt / "global_step_3" / "actor" / "model_world_size_2_rank_0.pt", weights_only=False)
    assert any(type(v).__name__ == "DTensor" for v in sharded.values()), "the fixture must hold real DTensor shards"
    res = export_checkpoint(verl_ckpt, "latest", tmp_path / "hf", dtype="float32", log=lambda *_: None)
    assert res.step == 3 and res.action == "merged" and res.path == tmp_path / "hf"
    original = torch.load(verl_ckpt / "original.pt")
    merged = _load_safetensors_dir(res.path)
    assert set(merged) == set(original)
    for k, v in original.items():
        assert torch.equal(merged[k], v), k
    cfg = json.loads((res.path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["torch_dtype"] == "float32"
    assert (res.path / "tokenizer.json").is_file() and json.loads((res.path / MARKER).read_text())["step"] == 3
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(res.path)
    assert AutoTokenizer.from_pretrained(res.path).eos_token == "<|im_end|>"
    for k, v in original.items():
        assert torch.equal(model.state_dict()[k], v), k


def test_export_matches_verl_model_merger_bf16(verl_ckpt, tmp_path):
    from verl.model_merger.base_model_merger import ModelMergerConfig
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    actor = verl_ckpt / "global_step_3" / "actor"
    ref_dir = tmp_path / "verl"
    ref_dir.mkdir()
    FSDPModelMerger(
        ModelMergerConfig(
            operation="merge", backend="fsdp", local_dir=str(actor), target_dir=str(ref_dir),
            hf_model_config_path=str(actor / "huggingface"),
        )
    ).merge_and_save()  # fmt: skip
    # a tiny shard limit forces the multi-file layout with an index
    res = export_checkpoint(verl_ckpt, 3, tmp_path / "ours", max_shard_bytes=20_000, log=lambda *_: None)
    ours, ref = _load_safetensors_dir(res.path), _load_safetensors_dir(ref_dir)
    assert set(ours) == set(ref)
    for k in ref:
        assert ours[k].dtype == ref[k].dtype == torch.bfloat16 and torch.equal(ours[k], ref[k]), k
    index = json.loads((res.path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(ours) and len(set(index["weight_map"].values())) > 1
    assert all((res.path / f).is_file() for f in index["weight_map"].values())


def test_a_two_level_fsdp_size_checkpoint_resumes_and_exports_to_the_original_weights(tmp_path):
    """7b's layout: fsdp_size below the world size gives verl a ("ddp", "fsdp") mesh, which FSDP2 shards as HSDP --
    each weight sharded over fsdp and replicated over ddp, so rank r and rank r + fsdp_size write the same piece.
    Here 4 ranks with fsdp_size 2: each rank reloads its own file as verl's resume does (checked in the rank script),
    and the export merges the 4 files into the original weights, as verl's own model merger does."""
    from verl.model_merger.base_model_merger import ModelMergerConfig
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    ckpt = tmp_path / "ckpts"
    build_checkpoint(ckpt, 2, tie=False, world=4, fsdp_size=2)
    actor = ckpt / "global_step_2" / "actor"
    piece = torch.load(actor / "model_world_size_4_rank_0.pt", weights_only=False)["model.embed_tokens.weight"]
    assert piece.device_mesh.mesh_dim_names == ("ddp", "fsdp") and piece.placements[0].is_replicate()
    res = export_checkpoint(ckpt, "latest", tmp_path / "hf", dtype="float32", log=lambda *_: None)
    original, merged = torch.load(ckpt / "original.pt"), _load_safetensors_dir(res.path)
    assert set(merged) == set(original)
    for k, v in original.items():
        assert torch.equal(merged[k], v), k
    ref_dir = tmp_path / "verl"
    ref_dir.mkdir()
    FSDPModelMerger(ModelMergerConfig(operation="merge", backend="fsdp", local_dir=str(actor), target_dir=str(ref_dir),
                                      hf_model_config_path=str(actor / "huggingface"))).merge_and_save()
    ref = _load_safetensors_dir(ref_dir)
    ours = _load_safetensors_dir(export_checkpoint(ckpt, "latest", tmp_path / "bf16", log=lambda *_: None).path)
    assert set(ours) == set(ref)
    for k, v in ref.items():
        assert ours[k].dtype == v.dtype == torch.bfloat16 and torch.equal(ours[k], v), k


def test_export_is_skipped_when_a_complete_export_exists_and_refuses_foreign_dirs(verl_ckpt, tmp_path):
    first = export_checkpoint(verl_ckpt, "latest", tmp_path / "hf", log=lambda *_: None)
    stamp = (first.path / MARKER).stat().st_mtime_ns
    again = export_checkpoint(verl_ckpt, "latest", tmp_path / "hf", log=lambda *_: None)
    assert again.action == "reused" and (again.path / MARKER).stat().st_mtime_ns == stamp
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="no completion marker"):
        export_checkpoint(verl_ckpt, "latest", foreign, log=lambda *_: None)
    assert (foreign / "notes.txt").read_text() == "mine"
    assert not list(tmp_path.glob(".*.tmp-*")), "no temp dir may be left behind"


def test_export_leaves_no_target_when_the_merge_fails(verl_ckpt, tmp_path):
    broken = tmp_path / "ckpt"
    actor = broken / "global_step_2" / "actor"
    actor.mkdir(parents=True)
    src = verl_ckpt / "global_step_3" / "actor"
    for p in src.iterdir():
        if p.is_dir():
            shutil.copytree(p, actor / p.name)
        elif "rank_1" not in p.name:  # rank 1's shard is lost
            (actor / p.name).write_bytes(p.read_bytes())
    with pytest.raises(ExportError, match="rank_1"):
        export_checkpoint(broken, "latest", tmp_path / "hf", log=lambda *_: None)
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".hf.tmp-*"))


def test_step_selection_and_errors_name_the_directory(tmp_path, verl_ckpt):
    assert resolve_step(verl_ckpt, "latest") == 3  # the tracker file, not the directory listing
    assert resolve_step(verl_ckpt, "1") == 1
    with pytest.raises(ExportError, match=r"step 7 .*steps present: \[1, 3\]"):
        resolve_step(verl_ckpt, 7)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ExportError, match=f"no checkpoint in {empty}"):
        resolve_step(empty)
    with pytest.raises(ExportError, match="does not exist"):
        resolve_step(tmp_path / "nope")
    no_tracker = tmp_path / "nt"
    (no_tracker / "global_step_2").mkdir(parents=True)
    (no_tracker / "global_step_10").mkdir()
    assert resolve_step(no_tracker) == 10
    (no_tracker / "latest_checkpointed_iteration.txt").write_text("12")
    with pytest.raises(ExportError, match="names step 12"):
        resolve_step(no_tracker)
    with pytest.raises(ExportError, match="neither a verl FSDP checkpoint"):
        export_checkpoint(verl_ckpt, 1, tmp_path / "x", log=lambda *_: None)


def test_an_hf_directory_is_served_as_is(tmp_path):
    d = tmp_path / "hfmodel"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"")
    res = export_checkpoint(d, log=lambda *_: None)
    assert res.action == "as-is" and res.path == d


def test_local_backend_checkpoints_are_served_as_is(tmp_path):
    """dapo.train.checkpoint's layout: RUN/checkpoints/global_step_N/{actor (HF dir), COMPLETE} + the pointer file."""
    root = tmp_path / "run" / "checkpoints"
    for step, complete in ((2, True), (4, True), (6, False)):
        actor = root / f"global_step_{step}" / "actor"
        actor.mkdir(parents=True)
        (actor / "config.json").write_text("{}")
        (actor / "model.safetensors").write_bytes(b"")
        (root / f"global_step_{step}" / "loop_state.pt").write_bytes(b"")
        if complete:
            (root / f"global_step_{step}" / "COMPLETE").write_text("")
    (root / "latest_checkpointed_iteration.txt").write_text("4")
    res = export_checkpoint(tmp_path / "run", "latest", log=lambda *_: None)  # the run dir is accepted too
    assert res.action == "as-is" and res.step == 4 and res.path == root / "global_step_4" / "actor"
    with pytest.raises(ExportError, match="incomplete local-backend checkpoint"):
        export_checkpoint(root, 6, log=lambda *_: None)


def test_tied_embeddings_export_without_lm_head(verl_ckpt, tmp_path):
    ckpt = tmp_path / "tied"
    shutil.copytree(verl_ckpt / "global_step_3", ckpt / "global_step_3")
    cfg_path = ckpt / "global_step_3" / "actor" / "huggingface" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tie_word_embeddings"] = True
    cfg_path.write_text(json.dumps(cfg))
    res = export_checkpoint(ckpt, 3, tmp_path / "hf", dtype="float32", log=lambda *_: None)
    merged = _load_safetensors_dir(res.path)
    assert "lm_head.weight" not in merged and "model.embed_tokens.weight" in merged
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(res.path)
    assert torch.equal(model.lm_head.weight, merged["model.embed_tokens.weight"])

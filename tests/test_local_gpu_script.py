"""scripts/gpu_tiny.py (the prepared GPU throughput/MFU run) works end to end on its CPU smoke path."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT


def test_peak_table_matches_device_names():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from gpu_tiny import peak_tflops
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops("NVIDIA L4") == 121.0 and peak_tflops("NVIDIA L40S") == 362.0
    assert peak_tflops("some cpu") is None


@pytest.mark.slow
def test_gpu_script_cpu_smoke_run_reports_throughput(tmp_path):
    out = subprocess.run(
        [sys.executable, "scripts/gpu_tiny.py", "--device", "cpu", "--smoke", "--run-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**__import__("os").environ, "WANDB_MODE": "disabled"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    runs = json.loads((tmp_path / "gpu_tiny.json").read_text())["runs"]
    assert [r["model"] for r in runs] == ["tiny", "0.5b"]  # both models of the GPU command, at toy sizes here
    for res in runs:
        assert res["steps"] == 2 and res["gen_tokens"] > 0 and res["update_tokens"] > 0
        assert res["gen_tokens_per_s"] > 0 and res["update_tokens_per_s"] > 0
        assert res["mfu_update"] is None  # no peak for a CPU
        assert set(res["val_acc"]) == {"0", "2"}  # the accuracy curve: before RL and at step 2
    assert "tokens/s" in out.stdout and "MFU" in out.stdout and "validation accuracy by step" in out.stdout


def test_gpu_models_are_the_tiny_model_and_about_half_a_billion_parameters():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from gpu_tiny import MODELS
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    from dapo.config import load_preset

    tiny = load_preset("tiny").local.model
    assert MODELS["tiny"][:4] == (tiny.hidden_size, tiny.num_hidden_layers, tiny.num_attention_heads,
                                  tiny.intermediate_size)  # fmt: skip
    h, layers, heads, inter = MODELS["0.5b"][:4]
    per_layer = 4 * h * h + 3 * h * inter  # q/k/v/o (k/v at full heads) + SwiGLU
    assert 0.4e9 < layers * per_layer < 0.6e9 and h // heads == 64

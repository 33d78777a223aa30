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
    res = json.loads((tmp_path / "gpu_tiny.json").read_text())
    assert res["steps"] == 2 and res["gen_tokens"] > 0 and res["update_tokens"] > 0
    assert res["gen_tokens_per_s"] > 0 and res["update_tokens_per_s"] > 0
    assert res["mfu_update"] is None  # no peak for a CPU
    assert "tokens/s" in out.stdout and "MFU" in out.stdout

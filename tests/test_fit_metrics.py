"""fit()'s metrics, ours and verl's, on the same batch.

verl 0.9.1's own metric functions (``compute_data_metrics``, ``compute_timing_metrics``, ``compute_throughout_metrics``,
its FLOPs estimate and device peaks) are the reference: the framework-free twins the local backend logs
(:mod:`dapo.train.step_metrics`, :mod:`dapo.util.flops`) must give the same numbers on a synthetic ``DataProto``
(one aborted response, two at the length cap, a prompt at the prompt cap, left-padded prompts); the verl backend's
:func:`dapo.backends.verl.fit_metrics.fit_metrics` must give verl's numbers and fit()'s rollout-correction keys.
The key set fit() really logged (``tests/fixtures/verl_fit_keys.json``) is checked against the verl backend's run in
tests/test_verl_cpu_e2e.py; here, that the fixture is what ``dapo bench verl-fit --keys-out`` writes from verl's
file log.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from dapo.train.metric_names import describe  # noqa: E402
from dapo.train.step_metrics import batch_metrics, timing_metrics  # noqa: E402
from dapo.util.flops import GPUS, peak_flops, train_flops  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "verl_fit_keys.json"
# verl computes in float32 torch, ours in float64 numpy
REL = 1e-6
P, R = 5, 7  # prompt and response widths (max_prompt_length, max_response_length)
PROMPT_LEN = [5, 3, 2, 5, 4, 1]
RESPONSE_LEN = [7, 0, 3, 7, 1, 5]  # one aborted (0 tokens), two at the cap
REWARD = [1.0, -1.0, -1.0, 0.5, 1.0, -0.25]
ADV = [0.9, -0.3, -1.1, 0.2, 1.4, -0.7]
TIMING = {"gen": 3.0, "reward": 0.5, "filter": 0.1, "adv": 0.02, "old_log_prob": 1.5, "update_actor": 4.0}


def _dataproto():
    from verl import DataProto

    n = len(PROMPT_LEN)
    g = torch.Generator().manual_seed(0)
    pmask = torch.tensor([[0] * (P - p) + [1] * p for p in PROMPT_LEN])
    rmask = torch.tensor([[1] * r + [0] * (R - r) for r in RESPONSE_LEN])
    scores = torch.zeros(n, R)
    for i, (r, v) in enumerate(zip(RESPONSE_LEN, REWARD)):
        if r:
            scores[i, r - 1] = v
    old = -torch.rand(n, R, generator=g) * rmask
    rollout = old + 0.05 * torch.randn(n, R, generator=g) * rmask
    return DataProto.from_dict(tensors={
        "prompts": torch.randint(3, 50, (n, P), generator=g) * pmask,
        "responses": torch.randint(3, 50, (n, R), generator=g) * rmask,
        "response_mask": rmask, "attention_mask": torch.cat([pmask, rmask], 1),
        "token_level_scores": scores, "old_log_probs": old, "rollout_log_probs": rollout,
    })  # fmt: skip


def _ours() -> dict[str, float]:
    m = batch_metrics(REWARD, ADV, RESPONSE_LEN, R, PROMPT_LEN, P)
    m.update(timing_metrics(TIMING, 10.0, sum(PROMPT_LEN), sum(RESPONSE_LEN), n_gpus=2))
    return m


def _verl() -> dict[str, float]:
    from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_throughout_metrics, compute_timing_metrics

    from dapo.backends.verl.fit_metrics import metric_batch

    batch = metric_batch(_dataproto(), np.asarray(ADV))
    timing = {**TIMING, "step": 10.0}
    m = dict(compute_data_metrics(batch=batch, use_critic=False))
    m.update(compute_timing_metrics(batch=batch, timing_raw=timing))
    m.update(compute_throughout_metrics(batch=batch, timing_raw=timing, n_gpus=2))
    return {k: float(v) for k, v in m.items()}


def test_the_local_metrics_equal_verls_functions_on_the_same_batch():
    ours, verl = _ours(), _verl()
    shared = sorted(set(verl) & set(ours))
    assert not set(verl) - set(ours), "every verl metric of these functions has a local twin"
    assert len(shared) >= 30
    for k in shared:
        assert ours[k] == pytest.approx(verl[k], rel=REL, abs=1e-9), k
    # the cases this batch is built to exercise
    assert verl["response/aborted_ratio"] == pytest.approx(1 / 6)
    assert verl["prompt_length/clip_ratio"] == pytest.approx(2 / 6)
    assert verl["response_length/clip_ratio"] == pytest.approx(2 / 6)
    assert verl["response_length_non_aborted/clip_ratio"] == pytest.approx(2 / 5)
    assert verl["critic/score/min"] == pytest.approx(-1.0) and ours["critic/score/mean"] == pytest.approx(1.25 / 5)


def test_the_verl_backend_logs_verls_values_and_the_rollout_mismatch():
    from omegaconf import OmegaConf

    from dapo.backends.verl.fit_metrics import fit_metrics

    cfg = OmegaConf.create({"algorithm": {"rollout_correction": {
        "rollout_is": None, "rollout_is_threshold": 2.0, "rollout_rs": None, "rollout_rs_threshold": None,
        "bypass_mode": False, "loss_type": "ppo_clip", "rollout_is_batch_normalize": False}}})  # fmt: skip
    data = _dataproto()
    mask_before = data.batch["response_mask"].clone()
    got = fit_metrics(data, np.asarray(ADV), {**TIMING, "step": 10.0}, cfg, 2)
    verl = _verl()
    for k, v in verl.items():
        if not k.startswith("timing_s/"):  # timing_s/* are the loop's own
            assert got[k] == pytest.approx(v, rel=REL), k
    old, ro, m = data.batch["old_log_probs"], data.batch["rollout_log_probs"], data.batch["response_mask"].bool()
    assert got["rollout_corr/kl"] == pytest.approx(float((ro - old)[m].mean()), rel=1e-5)
    assert {"rollout_corr/k3_kl", "rollout_corr/chi2_token", "rollout_corr/chi2_seq", "rollout_corr/ppl_ratio"} <= set(
        got)
    assert torch.equal(data.batch["response_mask"], mask_before), "the training batch's mask is left alone"
    assert all(describe(k) for k in got), [k for k in got if not describe(k)]


def test_flops_and_peaks_are_verls():
    from verl.utils.flops_counter import _DEVICE_FLOPS, _estimate_qwen2_flops

    class Qwen05B:  # Qwen2.5-0.5B's config.json
        hidden_size, vocab_size, num_hidden_layers, num_key_value_heads = 896, 151936, 24, 2
        num_attention_heads, intermediate_size = 14, 4864

    lens = [100, 317, 2048]
    assert train_flops(Qwen05B, lens) / 1e12 == pytest.approx(_estimate_qwen2_flops(Qwen05B, sum(lens), lens, 1.0))
    for key in GPUS:
        assert peak_flops(f"NVIDIA {key.upper()} 80GB HBM3") == _DEVICE_FLOPS[key.upper()], key
    assert peak_flops("NVIDIA H200") == _DEVICE_FLOPS["H200"] and peak_flops("cpu") is None


def test_the_fit_keys_fixture_is_what_the_bench_writes_from_verls_file_log(tmp_path, monkeypatch):
    """The bench's own path from fit()'s log to the fixture, without workers: verl's ``Tracking`` file logger (what
    fit() logs through, ``VERL_FILE_LOGGER_PATH`` as the bench sets it) writes two steps whose keys together are the
    fixture's, each step only part of them; the bench reads that log (:func:`fit_log_records`) and its ``--keys-out``
    writer (:func:`key_report`) writes a file equal to tests/fixtures/verl_fit_keys.json, byte for byte."""
    from verl.utils.tracking import Tracking

    from dapo.bench.verl_fit import fit_log_records, key_report

    fixture = json.loads(FIXTURE.read_text())
    keys = fixture["fit_keys"]
    log = tmp_path / "verl-fit.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(log))
    tracking = Tracking(project_name="dapo", experiment_name="bench", default_backend=["file"])
    tracking.log(data={k: np.float32(0.5) for k in keys[::2]}, step=1)
    tracking.log(data={k: i for i, k in enumerate(keys[1::2])}, step=2)
    tracking.finish()
    records = fit_log_records(log)
    assert [sorted(r) for r in records] == [sorted(keys[::2]), sorted(keys[1::2])]
    loop = [{"step": 1, "ts": 0.0, **{k: 0.0 for k in keys[2:]}}]
    out = tmp_path / "keys.json"
    report = key_report(records, loop, str(out))
    assert out.read_text() == FIXTURE.read_text()
    assert report == {"fit_keys": len(keys), "loop_keys": len(keys) - 2, "fit_keys_missing_from_loop": keys[:2]}
    assert fixture["verl"] == "0.9.1" and fixture["command"].startswith("dapo bench verl-fit")
    assert len(keys) > 90 and all(describe(k) for k in keys), [k for k in keys if not describe(k)]

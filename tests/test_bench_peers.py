"""`dapo bench peers` harness: the TRL configuration mirrors the preset, TRL's reward is ours, the tables count what
they claim; the ours-side harness runs end to end; with the TRL environment present (make setup-trl) one tiny round
of all three systems runs (skipped otherwise, with the reason)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT
from dapo.bench.peers import PEER_SYSTEMS, peer_curve_table, peer_table
from dapo.config import load_preset
from dapo.bench.peers_trl import grpo_kwargs, make_reward_fn
from dapo.reward import score_responses
from loop_support import SMALL_TINY

TRL_PYTHON = Path(os.environ.get("DAPO_TRL_PYTHON", ROOT / ".venv-trl" / "bin" / "python"))


def test_trl_config_mirrors_the_tiny_preset():
    recipe = load_preset("tiny").to_dict()["recipe"]
    kw = grpo_kwargs(recipe, "out", steps=10, seed=3)
    # 16 prompts x 8 per rollout step, 2 mini-batches of 8 prompts -> 2 optimizer steps per generation
    assert (kw["num_generations"], kw["per_device_train_batch_size"]) == (8, 64)
    assert kw["steps_per_generation"] == 2 and kw["max_steps"] == 20 and kw["gradient_accumulation_steps"] == 1
    assert (kw["epsilon"], kw["epsilon_high"], kw["delta"]) == (0.2, 0.28, 10.0)
    assert kw["loss_type"] == "dapo" and kw["beta"] == 0.0 and kw["scale_rewards"] == "group"
    assert (kw["learning_rate"], kw["weight_decay"], kw["max_grad_norm"]) == (1e-4, 0.1, 1.0)
    assert kw["warmup_steps"] == 4  # 2 rollout steps of warm-up = 4 optimizer steps
    assert (kw["max_completion_length"], kw["temperature"], kw["top_p"], kw["top_k"]) == (32, 1.0, 1.0, 0)
    naive = load_preset("tiny", ["recipe.actor.loss_agg_mode=seq-mean-token-mean"]).to_dict()["recipe"]
    assert grpo_kwargs(naive, "o", 1, 0)["loss_type"] == "grpo"
    bad = load_preset("tiny", ["recipe.actor.loss_agg_mode=seq-mean-token-sum"]).to_dict()["recipe"]
    with pytest.raises(ValueError, match="loss_agg_mode"):
        grpo_kwargs(bad, "o", 1, 0)


def test_trl_reward_is_the_dapo_reward_with_eos_counted():
    recipe = load_preset("tiny").to_dict()["recipe"]  # max_response_length 32, overlong buffer 6
    fn = make_reward_fn(recipe, tokenizer=type("T", (), {"eos_token_id": 2})())
    texts = ["1+2=3\nAnswer: 3", "Answer: 4", "Answer: 3", "Answer: 3"]
    ids = [[5] * 10 + [2], [5] * 27 + [2], [5] * 30 + [2], [5] * 32]  # TRL keeps EOS; the last one was truncated
    got = fn(prompts=[""] * 4, completions=texts, completion_ids=ids, ground_truth=["3"] * 4)
    want = score_responses(texts, ["3"] * 4, [11, 28, 31, 32], max_response_length=32, overlong_buffer_len=6,
                           overlong_penalty_factor=1.0, overlong_enable=True)["reward"]  # fmt: skip
    np.testing.assert_allclose(got, want)
    assert got[0] == 1.0 and got[1] < -1.0 and -1.0 < got[2] < 1.0


def _round(step_s, gen_s, old_s, tokens, cpu_s=None):
    steps = [{"step": i + 1, "step_s": step_s + (5.0 if i == 0 else 0.0), "gen_s": gen_s, "old_log_prob_s": old_s,
              "update_s": step_s - gen_s - old_s} for i in range(4)]  # fmt: skip
    for st in steps if cpu_s is not None else []:
        st["cpu_s"] = cpu_s + (3.0 if st["step"] == 1 else 0.0)
    return {"steps": steps, "gen_tokens": tokens, "gen_seconds": 4 * gen_s,
            "curve": [(0, 0.6, 0.0), (4, 0.9, 512.0)]}  # fmt: skip


def test_peer_table_leaves_out_the_warm_up_step_and_divides_by_trl():
    res = {PEER_SYSTEMS[0]: [_round(0.5, 0.2, 0.05, 800), _round(0.7, 0.2, 0.05, 800)],
           PEER_SYSTEMS[1]: [_round(1.8, 0.9, 0.1, 800), _round(1.8, 0.9, 0.1, 800)]}  # fmt: skip
    rows = peer_table(res).splitlines()
    assert rows[2].startswith(f"| {PEER_SYSTEMS[0]} | 0.600 ± 0.100 | 0.200 | 0.050 | 0.350 | 1000 | 3.00x |")
    assert rows[2].endswith("| - | - |") and rows[3].endswith("| - | - | - |")  # no CPU seconds recorded
    # with the steps' CPU seconds: their mean over rounds (warm-up step left out) and TRL's divided by it
    res = {PEER_SYSTEMS[0]: [_round(0.5, 0.2, 0.05, 800, 0.4), _round(0.7, 0.2, 0.05, 800, 0.6)],
           PEER_SYSTEMS[1]: [_round(1.8, 0.9, 0.1, 800, 1.5), _round(1.8, 0.9, 0.1, 800, 1.5)]}  # fmt: skip
    rows = peer_table(res).splitlines()
    assert rows[2].endswith("| 3.00x | 0.500 ± 0.100 | 3.00x |") and rows[3].endswith("| - | 1.500 ± 0.000 | - |")
    assert "0.900 @ 512 resp." in peer_curve_table(res)


def _bench(tmp_path, systems: str, extra_env=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), WANDB_MODE="disabled", **(extra_env or {}))
    cmd = [sys.executable, "-m", "dapo.bench", "peers", "--rounds", "1", "--steps", "2", "--test-freq", "2",
           "--systems", systems, "--out", str(tmp_path), "--trl-python", str(TRL_PYTHON),
           *[o for o in SMALL_TINY if not o.startswith("recipe.trainer.logger")]]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)


@pytest.mark.slow
def test_ours_side_of_the_harness_times_phases_and_validates(tmp_path):
    done = _bench(tmp_path, "0")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    res = json.loads((tmp_path / "peers.json").read_text())[PEER_SYSTEMS[0]][0]
    assert [s["step"] for s in res["steps"]] == [1, 2]
    for s in res["steps"]:
        assert s["gen_s"] > 0 and s["update_s"] > 0 and s["responses"] == 16 and 0 < s["cpu_s"]
    assert [c[0] for c in res["curve"]] == [0, 2] and res["gen_tokens"] > 0
    assert "| ours, dynamic sampling off |" in (tmp_path / "peers.md").read_text()


@pytest.mark.slow
@pytest.mark.skipif(not TRL_PYTHON.exists(), reason=f"no TRL environment at {TRL_PYTHON} (make setup-trl)")
def test_trl_and_ours_run_side_by_side(tmp_path):
    done = _bench(tmp_path, "0,1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    res = json.loads((tmp_path / "peers.json").read_text())
    trl = res[PEER_SYSTEMS[1]][0]
    assert [s["step"] for s in trl["steps"]] == [1, 2] and all(s["gen_s"] > 0 < s["cpu_s"] for s in trl["steps"])
    assert trl["trl_version"] == "1.16.0"
    assert [c[0] for c in trl["curve"]] == [0, 2] and trl["curve"][1][1] is not None
    assert "x |" in (tmp_path / "peers.md").read_text()

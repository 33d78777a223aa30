"""The one-GPU preset, trained on CPU: ``dapo train --preset one-gpu`` with a stand-in for its model, through verl's
own workers with ONE FSDP rank and ONE colocated vLLM engine (its placement: 1 node x 1 GPU, rollout TP 1).

The preset is taken as it is; the test swaps only what a CPU cannot take (tests/one_gpu_standin.py, ``SWAPPED``):
the hub model for a locally built model of the same architecture and config shape, DAPO-Math-17k for locally made rows
in its schema, the platform (``placement.accelerator=cpu``: docs/verl.md, "verl on CPU"; remove-padding off, as every
verl run on CPU has it: one of "the GPU-only settings" there), and the scale (lengths, batch sizes, 2 steps). Every
other value of the verl config the worker groups were built with is the preset's own, key for key.

One run (module fixture) in the vLLM-on-CPU venv (``DAPO_VLLM_PYTHON``); the driver starts Ray itself with the
preset's one logical GPU. Measured in three runs on 2 cores shared with other work (load average 8-26): 10.4-13.5 min
in all -- the stand-in's warm start 2-3 min (one torch thread; 43 s at a lower load), `dapo train` 7-10.6 min, most of
it Ray's, the worker group's and the vLLM engine's start; a step 3-9 s.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import ROOT, kill_processes_naming, remove_orphaned_shm, shm_entries, vllm_python

pytestmark = [pytest.mark.slow, pytest.mark.verl_cpu]

PRESET = "one-gpu"
STEPS = 2
RUN_TIMEOUT_S = float(os.environ.get("DAPO_E2E_ATTEMPT_TIMEOUT_S", "1200"))
# the recorder in front of `dapo train`: writes the verl config the worker groups are built with, then runs the CLI
DRIVER = """
import sys
from omegaconf import OmegaConf
from dapo.backends.verl import workers
init = workers.RayWorkers.__init__
def recording(self, cfg, *args, **kwargs):
    open(sys.argv[1], "w").write(OmegaConf.to_yaml(cfg))
    init(self, cfg, *args, **kwargs)
workers.RayWorkers.__init__ = recording
from dapo.train.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_", "VERL_", "WANDB_", "DAPO_"))}
    (root / "home").mkdir(exist_ok=True)
    (root / "ray").mkdir(exist_ok=True)
    env.update(HOME=str(root / "home"), RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1",
               WANDB_MODE="offline", WANDB_DIR=str(root), TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
               PYTHONPATH=str(ROOT), RAY_TMPDIR=str(root / "ray"),
               PATH=f"{Path(vllm_python()).parent}{os.pathsep}{os.environ.get('PATH', '')}")  # fmt: skip
    return env


@pytest.fixture(scope="module")
def scenario():
    from one_gpu_standin import build_standin, swaps

    from dapo.config import load_preset

    py = vllm_python()
    # a short root: Ray's socket paths live under RAY_TMPDIR (AF_UNIX paths are capped at 107 bytes)
    root = Path(tempfile.mkdtemp(prefix="d1g-", dir="/tmp"))
    shm = shm_entries()
    try:
        t0 = time.monotonic()
        assets, spec = build_standin(load_preset(PRESET).recipe.model.path, root / "assets")
        built_s = time.monotonic() - t0
        run, recorded = root / "run", root / "workers-config.yaml"
        argv = ["--preset", PRESET, "--no-progress", *swaps(assets, run, STEPS)]
        t0 = time.monotonic()
        r = subprocess.run([py, "-c", DRIVER, str(recorded), *argv], env=_env(root), cwd=root, capture_output=True,
                           text=True, timeout=RUN_TIMEOUT_S, start_new_session=True)  # fmt: skip
        run_s = time.monotonic() - t0
        (root / "train.out").write_text(r.stdout + r.stderr)
        assert r.returncode == 0, (r.stdout + r.stderr)[-8000:]
        print(f"\none-gpu on CPU: stand-in built in {built_s:.0f} s, `dapo train` {run_s:.0f} s")
        yield {"root": root, "run": run, "assets": assets, "spec": spec, "argv": argv, "recorded": recorded,
               "out": r.stdout + r.stderr}
    finally:
        kill_processes_naming(str(root))
        remove_orphaned_shm(shm)
        shutil.rmtree(root, ignore_errors=True)


def test_the_standin_has_the_architecture_and_config_shape_of_the_presets_model(scenario):
    from dapo.config import load_preset
    from dapo.plan.models import resolve_arch

    real = resolve_arch(load_preset(PRESET).recipe.model.path)
    cfg = json.loads((scenario["assets"].policy_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["architectures"] == ["Qwen2ForCausalLM"]
    heads, kv, hidden = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    assert hidden // heads == real.head_dim and kv < heads  # the same head size, grouped-query attention
    assert cfg["intermediate_size"] / hidden == pytest.approx(real.intermediate_size / real.hidden_size, rel=0.05)
    assert cfg["tie_word_embeddings"] == real.tie_word_embeddings
    assert cfg["max_position_embeddings"] == real.max_position_embeddings
    assert (scenario["assets"].policy_dir / "tokenizer.json").is_file()
    import pyarrow.parquet as pq

    rows = pq.read_table(scenario["assets"].train_file).to_pylist()
    assert {"data_source", "prompt", "ability", "reward_model", "extra_info"} <= set(rows[0])  # DAPO-Math-17k's schema
    assert rows[0]["prompt"][0]["role"] == "user" and "ground_truth" in rows[0]["reward_model"]


def test_the_workers_got_the_presets_verl_config_but_for_the_swapped_keys(scenario):
    """The verl config the worker groups were built with, against ``verl_config.resolve`` of the untouched preset:
    every key differs only where a swapped preset key (:data:`SWAPPED`) is its source, per the settings table."""
    import yaml
    from omegaconf import OmegaConf
    from one_gpu_standin import differences, flat

    from dapo.backends.verl import config as verl_config
    from dapo.config import load_preset

    preset = verl_config.resolve(load_preset(PRESET))
    ran = verl_config.resolve(load_preset(PRESET, scenario["argv"][3:]))
    recorded_cfg = yaml.safe_load(scenario["recorded"].read_text())
    differ, unexplained = differences(yaml.safe_load(OmegaConf.to_yaml(preset.cfg)), recorded_cfg,
                                      preset.settings + ran.settings)
    assert not unexplained, f"(preset, run) of keys no swap explains: {unexplained}"
    expected, recorded = flat(yaml.safe_load(OmegaConf.to_yaml(preset.cfg))), flat(recorded_cfg)
    assert "actor_rollout_ref.model.path" in differ and len(recorded) > 300
    # what makes it the one-GPU placement, as run: one FSDP rank, one vLLM engine (TP 1), colocated
    for key, want in {"trainer.nnodes": 1, "trainer.n_gpus_per_node": 1,
                      "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
                      "actor_rollout_ref.rollout.gpu_memory_utilization": 0.4,
                      "actor_rollout_ref.actor.fsdp_config.param_offload": False,
                      "actor_rollout_ref.actor.fsdp_config.optimizer_offload": False,
                      "actor_rollout_ref.model.enable_gradient_checkpointing": True,
                      "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 8192,
                      "actor_rollout_ref.actor.policy_loss.loss_mode": "dapo",
                      "algorithm.filter_groups.enable": True}.items():  # fmt: skip
        assert recorded[key] == want == expected[key], key
    print(f"{len(recorded)} verl keys; {len(differ)} differ from the preset's, each from a swap: {sorted(differ)}")


def test_it_trained_two_steps_on_one_rank_and_one_engine_and_saved_a_checkpoint(scenario):
    from dapo.train.checkpoint import complete_steps

    run = scenario["run"]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = sorted({m["step"] for m in metrics if "timing_s/step" in m})
    assert steps == list(range(1, STEPS + 1)), steps
    trained = [m for m in metrics if "timing_s/step" in m]
    assert all(m["actor/pg_loss"] == m["actor/pg_loss"] for m in trained)  # a finite loss each step
    assert any(k.startswith("val-core/") for m in metrics for k in m), "the preset's validation before training"
    assert complete_steps(run / "checkpoints") == [STEPS]  # the end of the run saves (save_freq 10 > 2 steps)
    actor = run / "checkpoints" / f"global_step_{STEPS}" / "actor"
    shards = sorted(p.name for p in actor.glob("model_world_size_*_rank_*.pt"))
    assert shards == ["model_world_size_1_rank_0.pt"], shards  # ONE FSDP rank
    # dynamic sampling on (the preset's): each step filled its 4 groups from generation batches of 12 prompts x 4
    for m in trained:
        assert 1 <= m["train/num_gen_batches"] <= 10 and 0 < m["train/kept_group_ratio"] <= 1, m
        assert m["train/num_gen_samples"] == m["train/num_gen_batches"] * 12 * 4, m
    # ONE vLLM engine: every line of the rollout server in the driver's log comes from one process
    log = (run / "logs" / "attempt-1.log").read_text()
    servers = set(re.findall(r"\(vLLMHttpServer pid=(\d+)", log))
    assert len(servers) == 1, servers
    print("timing_s/step:", [round(m["timing_s/step"], 1) for m in trained],
          "generation batches:", [m["train/num_gen_batches"] for m in trained])

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
it Ray's, the worker group's and the vLLM engine's start; a step 3-9 s. With the two fault attempts below, the whole
module took 671 s at a lower load (stand-in and run 241 s, the fault attempts 421 s).

The same run then goes on for two more attempts, each with a fault injected from outside (the ``faults`` fixture): a
vLLM engine frozen in a generation, then a save blocked in its write; each must end its attempt through the watchdog
within the phase's budget + 60 s, with the stacks saved, and the attempt after resumes from the newest checkpoint.
(The hung gloo rank, the slowed rank and the process-group timeout are in tests/test_verl_cpu_e2e.py; the same faults
on the local backend in tests/test_attempt_faults.py.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
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


# The same run continued for two more steps (a checkpoint every step, no validation), with a fault injected from
# outside into each of two attempts: the vLLM engine frozen in a generation, then the checkpoint's write blocked.
# Short budgets where the phase is the frozen one: the first generation of an attempt gets first_s (here 45 s; vLLM's
# CPU warm-up is not reached, the engine is frozen before it answers), a save gets save_s (30 s).
MORE = STEPS + 2
FAULT_RECIPE = [f"recipe.trainer.total_training_steps={MORE}", "recipe.trainer.save_freq=1",
                "recipe.trainer.test_freq=0", "recipe.trainer.val_before_train=false",
                "recipe.trainer.watchdog.evidence_wait_s=10"]  # fmt: skip
FROZEN_GEN = ["recipe.trainer.watchdog.first_s=45"]
STUCK_SAVE = ["recipe.trainer.watchdog.save_s=30"]


def _attempt(scenario, extra: list[str], name: str) -> subprocess.Popen:
    argv = [*scenario["argv"], *FAULT_RECIPE, *extra]
    # the child keeps its own descriptor of the file; ours closes once it has started
    with open(scenario["root"] / f"{name}.out", "w") as out:
        return subprocess.Popen([vllm_python(), "-m", "dapo.train", *argv], env=_env(scenario["root"]),
                                cwd=scenario["root"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_phase(run: Path, phase: str, step: int, proc: subprocess.Popen, timeout: float = RUN_TIMEOUT_S) -> None:
    """Until the loop's progress record says ``phase`` after ``step`` completed steps (dapo.train.attempts)."""
    from dapo.train.attempts import read_progress

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the attempt ended (exit {proc.returncode}) before {phase} after step {step}"
        rec = read_progress(run) or {}
        if rec.get("phase") == phase and rec.get("step") == step:
            return
        time.sleep(0.01)
    pytest.fail(f"never reached {phase} after step {step}: {read_progress(run)}")


def _engine_cores(driver_pid: int) -> list[int]:
    """The vLLM engine processes (``VLLM::EngineCore``) of this run: descendants of the driver, which started Ray."""
    import psutil

    out = []
    for p in psutil.Process(driver_pid).children(recursive=True):
        try:
            if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                out.append(p.pid)
        except psutil.Error:
            pass
    return out


@pytest.fixture(scope="module")
def faults(scenario):
    """Attempt 2: the run continued; once it generates for step STEPS + 1, every vLLM engine process is frozen
    (SIGSTOP: a wedged engine). Attempt 3: the checkpoint pointer's temporary file is a FIFO, so the save of step
    STEPS + 1 blocks in its write (a hung volume). Each is left to the watchdog; what each wrote is returned."""
    from dapo.train import attempts

    root, run = scenario["root"], scenario["run"]
    out: dict = {}
    second = _attempt(scenario, FROZEN_GEN, "attempt-2")
    try:
        _wait_phase(run, "gen", STEPS, second)
        engines = _engine_cores(second.pid)
        assert engines, "no vLLM engine process under the driver"
        for pid in engines:
            os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        out["gen_exit"] = second.wait(timeout=600)
        out["gen_ended_after_s"] = time.monotonic() - t0
    finally:
        kill_processes_naming(str(root))
    out["gen_end"] = attempts.read_end(run / "logs", 2)
    fifo = run / "checkpoints" / ".latest_checkpointed_iteration.txt.tmp"
    os.mkfifo(fifo)
    third = _attempt(scenario, STUCK_SAVE, "attempt-3")
    try:
        out["save_exit"] = third.wait(timeout=RUN_TIMEOUT_S)
    finally:
        kill_processes_naming(str(root))
        fifo.unlink()
    out["save_end"] = attempts.read_end(run / "logs", 3)
    out["outs"] = {n: (root / f"attempt-{n}.out").read_text() for n in (2, 3)}
    print(f"\nfrozen engine: attempt 2 ended {out['gen_ended_after_s']:.0f} s after the freeze "
          f"(budget {out['gen_end']['budget_s']:.0f} s); stuck save: attempt 3 ended {out['save_end']['elapsed_s']:.0f} s "
          f"into the save (budget {out['save_end']['budget_s']:.0f} s)")
    return out


def test_a_frozen_vllm_engine_ends_its_attempt_within_budget_and_the_next_resumes_from_the_newest_checkpoint(scenario,
                                                                                                          faults):
    """The engine froze in the generation of step STEPS + 1: the driver's watchdog ended the attempt (exit 6) within
    the phase's budget + 60 s, its evidence holding the driver's stacks naming the phase and the FSDP rank's; the
    attempt after resumed from checkpoint STEPS, the newest."""
    from dapo.train import attempts

    end = faults["gen_end"]
    assert faults["gen_exit"] == attempts.EXIT_STALLED, faults["outs"][2][-4000:]
    assert end["cause"] == "stalled" and end["phase"] == "gen" and end["step"] == STEPS + 1, end
    assert end["elapsed_s"] <= end["budget_s"] + 60 and faults["gen_ended_after_s"] <= end["budget_s"] + 60, end
    evidence = Path(end["evidence"])
    assert f"phase gen of step {STEPS + 1}" in (evidence / "stacks-driver.txt").read_text()
    assert list(evidence.glob("stacks-rank0-*.txt")), sorted(p.name for p in evidence.iterdir())  # the FSDP rank
    assert f"resumed from {scenario['run'] / 'checkpoints' / f'global_step_{STEPS}'}" in faults["outs"][2]
    assert f"resumed from {scenario['run'] / 'checkpoints' / f'global_step_{STEPS}'}" in faults["outs"][3]


def test_a_save_stuck_on_io_ends_its_attempt_within_budget_and_leaves_the_newest_checkpoint_whole(scenario, faults):
    """The save of step STEPS + 1 blocked in a write: the watchdog ended the attempt in the save phase (exit 6) within
    its budget + 60 s, the driver's stacks showing the blocked write. The blocked write is the pointer's, the last of
    a save: the checkpoint itself was written whole and marked complete before it, so it is the newest complete one,
    the one the next attempt resumes from (by the marker, not the pointer)."""
    from dapo.train import attempts
    from dapo.train.checkpoint import complete_steps

    end = faults["save_end"]
    assert faults["save_exit"] == attempts.EXIT_STALLED, faults["outs"][3][-4000:]
    assert end["cause"] == "stalled" and end["phase"] == "save" and end["step"] == STEPS + 1, end
    assert end["elapsed_s"] <= end["budget_s"] + 60, end
    assert "write_text" in (Path(end["evidence"]) / "stacks-driver.txt").read_text()
    assert complete_steps(scenario["run"] / "checkpoints") == [STEPS, STEPS + 1]

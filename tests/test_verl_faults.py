"""Two more faults on verl's own workers (``dapo train --preset verl-tiny`` on CPU, the driver starting Ray itself):
a generation that never returns (the vLLM engine process frozen) and a save stuck on I/O (the checkpoint pointer's
write blocks) each end their attempt through the watchdog within the phase's budget + 60 s, with the stacks of the
driver and of the Ray workers that answered; the attempt after resumes from the newest checkpoint and completes.

Opt-in (``DAPO_VERL_FAULTS=1``): three verl attempts, ~12 minutes on an idle 2-core machine, beyond CI's time. The
hung gloo rank, the slowed rank and the process-group timeout are in tests/test_verl_cpu_e2e.py, inside the run
``make test`` already has; the same two faults run on the local backend in tests/test_attempt_faults.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import ROOT, kill_processes_naming, remove_orphaned_shm, shm_entries, vllm_python
from dapo.train import attempts

pytestmark = [pytest.mark.slow, pytest.mark.verl_cpu,
              pytest.mark.skipif(os.environ.get("DAPO_VERL_FAULTS") != "1",
                                 reason="opt-in: DAPO_VERL_FAULTS=1 (three verl attempts, ~12 min; not in make test)")]

STEPS = 3
RECIPE = [f"recipe.trainer.total_training_steps={STEPS}", "recipe.trainer.test_freq=0",
          "recipe.trainer.val_before_train=false", "local.task.n_val=16", "recipe.data.gen_batch_size=18",
          "recipe.trainer.watchdog.evidence_wait_s=10"]


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_", "VERL_", "WANDB_", "DAPO_"))}
    (root / "home").mkdir(exist_ok=True)
    env.update(HOME=str(root / "home"), RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1",
               WANDB_MODE="disabled", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), RAY_TMPDIR=str(root / "ray"),
               PATH=f"{Path(vllm_python()).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    (root / "ray").mkdir(exist_ok=True)
    return env


def _start(root: Path, run: Path) -> subprocess.Popen:
    cmd = [vllm_python(), "-m", "dapo.train", "--preset", "verl-tiny", "--no-progress", *RECIPE,
           f"recipe.trainer.default_local_dir={run}"]
    out = open(root / f"attempt-{len(list(root.glob('attempt-*.out'))) + 1}.out", "w")
    return subprocess.Popen(cmd, env=_env(root), cwd=root, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _wait_phase(run: Path, phase: str, step: int, proc: subprocess.Popen, timeout: float = 3600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the attempt ended (exit {proc.returncode}) before {phase} after step {step}"
        rec = attempts.read_progress(run) or {}
        if rec.get("phase") == phase and rec.get("step") == step:
            return
        time.sleep(0.01)
    pytest.fail(f"never reached {phase} after step {step}")


def _engine_cores(driver_pid: int) -> list[int]:
    """The vLLM engine processes (``VLLM::EngineCore``) of this run: descendants of its driver's Ray."""
    import psutil

    out = []
    for p in psutil.Process(driver_pid).children(recursive=True):
        try:
            if "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name():
                out.append(p.pid)
        except psutil.Error:
            pass
    return out


@pytest.fixture(scope="module")
def root():
    vllm_python()
    base = Path(tempfile.mkdtemp(prefix="dvf-", dir="/tmp"))
    shm = shm_entries()
    try:
        yield base
    finally:
        kill_processes_naming(str(base))
        remove_orphaned_shm(shm)
        shutil.rmtree(base, ignore_errors=True)


def test_a_frozen_engine_then_a_stuck_save_each_end_their_attempt_and_the_last_resumes(root):
    run = root / "run"
    # attempt 1: the vLLM engines freeze during step 2's generation (SIGSTOP: a wedged engine)
    first = _start(root, run)
    try:
        _wait_phase(run, "gen", 1, first)
        engines = _engine_cores(first.pid)
        assert engines, "no vLLM engine process found under the driver"
        for pid in engines:
            os.kill(pid, signal.SIGSTOP)
        t_frozen = time.monotonic()
        assert first.wait(timeout=600) == attempts.EXIT_STALLED, (root / "attempt-1.out").read_text()[-4000:]
        frozen_for = time.monotonic() - t_frozen
    finally:
        kill_processes_naming(str(root))
    end = attempts.read_end(run / "logs", 1)
    assert end["phase"] == "gen" and end["step"] == 2 and end["elapsed_s"] <= end["budget_s"] + 60, end
    assert frozen_for <= end["budget_s"] + 60 + 10
    ev = Path(end["evidence"])
    assert "phase gen of step 2" in (ev / "stacks-driver.txt").read_text()
    assert list(ev.glob("stacks-rank*-*.txt")), sorted(p.name for p in ev.iterdir())  # the FSDP ranks answered
    # attempt 2: resumes from checkpoint 1; the save of step 2 blocks in a write (the pointer file is a FIFO)
    fifo = run / "checkpoints" / ".latest_checkpointed_iteration.txt.tmp"
    os.mkfifo(fifo)
    second = _start(root, run)
    try:
        assert second.wait(timeout=3600) == attempts.EXIT_STALLED, (root / "attempt-2.out").read_text()[-4000:]
    finally:
        kill_processes_naming(str(root))
    out2 = (root / "attempt-2.out").read_text()
    assert f"resumed from {run / 'checkpoints' / 'global_step_1'}" in out2
    end = attempts.read_end(run / "logs", 2)
    assert end["phase"] == "save" and end["step"] == 2 and end["elapsed_s"] <= end["budget_s"] + 60, end
    assert "write_text" in (Path(end["evidence"]) / "stacks-driver.txt").read_text()
    fifo.unlink()
    # attempt 3: the volume answers again; it resumes from the newest checkpoint and completes
    third = _start(root, run)
    try:
        assert third.wait(timeout=3600) == 0, (root / "attempt-3.out").read_text()[-4000:]
    finally:
        kill_processes_naming(str(root))
    assert f"resumed from {run / 'checkpoints' / 'global_step_2'}" in (root / "attempt-3.out").read_text()
    print(f"frozen engine: attempt ended {frozen_for:.0f} s after the freeze; stuck save: "
          f"{end['elapsed_s']:.0f} s of a {end['budget_s']:.0f} s budget")

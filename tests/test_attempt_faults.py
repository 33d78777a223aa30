"""``dapo train`` on the local backend with a fault injected into a real run (tests/fault_runner.py wraps one call of
the unchanged product): what the attempt does, what it leaves, and what the next attempt does with it.

- a generation that never returns: the watchdog ends the attempt within the tiny preset's own budget + 60 s (exit 6),
  the driver's stacks name the phase and the blocked call, the next attempt resumes from the newest checkpoint;
- a save stuck on I/O (the checkpoint pointer's write blocks, as on a hung NFS server): the same, in the save phase;
- a NaN in the weights: the attempt ends at that step with a message, not a traceback (exit 7), nothing of the step
  is saved; the same NaN at the same step again stops the run for good, and the attempt after exits at once (exit
  8) building nothing; a changed preset runs again;
- a full volume: the attempt says so before it writes (exit 9);
- a health stop: final; the next attempt exits at once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT
from dapo.train import attempts
from dapo.train.checkpoint import complete_steps
from dapo.train.metrics import read_jsonl
from loop_support import SMALL_TINY

pytestmark = pytest.mark.slow

RUNNER = ROOT / "tests" / "fault_runner.py"
BASE = SMALL_TINY + [
    "recipe.trainer.resume_mode=auto",
    "recipe.trainer.test_freq=0",
    "recipe.trainer.val_before_train=false",
    # the 30-step warm start of this small model solves nothing yet: dynamic sampling would never fill a batch
    "recipe.filter_groups.enable=false",
    "recipe.data.gen_batch_size=null",
]
# shorter budgets where the test is not about the preset's own (the evidence wait too): CI time
QUICK = ["recipe.trainer.watchdog.first_s=20", "recipe.trainer.watchdog.floor_s=10",
         "recipe.trainer.watchdog.save_s=15", "recipe.trainer.watchdog.evidence_wait_s=2"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", WANDB_MODE="disabled", PYTHONPATH=str(ROOT))
    env.pop(attempts.ACK_TIMEOUT_ENV, None)
    return env


def _train(run: Path, overrides: list[str], fault: dict | None = None, timeout: float = 600):
    args = ["--preset", "tiny", "--run-dir", str(run), "--no-progress", *BASE, *overrides]
    cmd = ([sys.executable, str(RUNNER), json.dumps(fault), "--", *args] if fault else
           [sys.executable, "-m", "dapo.train", *args])
    t0 = time.time()
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    proc.ended_at = time.time()
    return proc, proc.ended_at - t0


def _why(proc) -> str:
    return proc.stdout[-4000:] + proc.stderr[-4000:]


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    """The small tiny model, task and warm start, built once (by a one-step run) for every run of this module."""
    run = tmp_path_factory.mktemp("assets-run")
    proc, _ = _train(run, ["recipe.trainer.total_training_steps=1", "recipe.trainer.save_freq=0"])
    assert proc.returncode == 0, _why(proc)
    return run / "assets"


def _run_dir(tmp_path: Path, assets: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(assets, run / "assets")
    return run


def _attempt_log(run: Path, n: int) -> str:
    return (run / "logs" / f"attempt-{n}.log").read_text()


def test_a_generation_that_never_returns_ends_the_attempt_and_the_next_resumes(tmp_path, assets):
    run = _run_dir(tmp_path, assets)
    steps = ["recipe.trainer.total_training_steps=5", "recipe.trainer.save_freq=2"]
    hung, wall = _train(run, steps, {"kind": "hang_generate", "call": 4})  # the tiny preset's own budgets
    assert hung.returncode == attempts.EXIT_STALLED, _why(hung)
    end = attempts.read_end(run / "logs", 1)
    assert end["cause"] == "stalled" and end["phase"] == "gen" and end["step"] == 4 and not end["final"]
    assert end["budget_s"] == 30.0  # recipe.trainer.watchdog.floor_s of the tiny preset: gen ran before
    # from the moment the call hung to the end of the process: the budget, then at most a minute
    hung_at = float(re.search(r"fault_runner: hung at (\d+\.\d+)", hung.stdout).group(1))
    assert hung.ended_at - hung_at <= end["budget_s"] + 60, (hung.ended_at - hung_at, end)
    assert hung.ended_at - hung_at < 120  # "a stall on the tiny preset ends within two minutes"
    print(f"generation hang (tiny's budgets): attempt ended {hung.ended_at - hung_at:.1f} s after the call hung "
          f"(phase budget {end['budget_s']:.0f} s, watchdog saw {end['elapsed_s']:.1f} s)")
    log = _attempt_log(run, 1)
    assert log.rstrip().endswith(f"dapo: exit code 6 | log {run / 'logs' / 'attempt-1.log'}")
    stacks = (run / "evidence" / "attempt-1" / "stacks-driver.txt").read_text()
    assert "phase gen of step 4" in stacks and "in generate" in stacks and "threading.Event().wait()" in stacks
    assert "thread MainThread" in stacks and "dapo-watchdog" in stacks
    assert complete_steps(run / "checkpoints") == [2]

    again, wall = _train(run, steps)
    assert again.returncode == 0, _why(again)
    assert f"resumed from {run / 'checkpoints' / 'global_step_2'} (step 2/5)" in again.stdout
    print(f"the next attempt resumed from checkpoint 2 and finished steps 3-5 in {wall:.1f} s")
    assert sorted(r["step"] for r in read_jsonl(run / "metrics.jsonl")) == [1, 2, 3, 4, 5]


def test_a_save_stuck_on_io_ends_the_attempt_in_the_save_phase(tmp_path, assets):
    run = _run_dir(tmp_path, assets)
    ckpts = run / "checkpoints"
    ckpts.mkdir()
    fifo = ckpts / f".{'latest_checkpointed_iteration.txt'}.tmp"
    os.mkfifo(fifo)  # opening it for writing blocks until a reader comes: a write that never returns
    steps = ["recipe.trainer.total_training_steps=4", "recipe.trainer.save_freq=2", *QUICK]
    stuck, wall = _train(run, steps)
    assert stuck.returncode == attempts.EXIT_STALLED, _why(stuck)
    end = attempts.read_end(run / "logs", 1)
    assert end["phase"] == "save" and end["budget_s"] == 15.0 and end["elapsed_s"] <= 15 + 60
    stacks = (run / "evidence" / "attempt-1" / "stacks-driver.txt").read_text()
    assert "phase save of step 2" in stacks and "in save" in stacks and "write_text" in stacks
    print(f"save stuck on I/O: the watchdog saw {end['elapsed_s']:.1f} s of save (budget {end['budget_s']:.0f} s); "
          f"the whole attempt took {wall:.1f} s")
    fifo.unlink()  # the volume answers again
    again, _ = _train(run, steps)
    assert again.returncode == 0, _why(again)
    assert f"resumed from {ckpts / 'global_step_2'} (step 2/4)" in again.stdout  # written whole before the pointer


def test_a_nan_in_the_weights_ends_the_attempt_then_stops_the_run_when_it_recurs(tmp_path, assets):
    run = _run_dir(tmp_path, assets)
    steps = ["recipe.trainer.total_training_steps=5", "recipe.trainer.save_freq=1"]
    fault = {"kind": "nan_weights", "step": 3}
    first, _ = _train(run, steps, fault)
    assert first.returncode == attempts.EXIT_NONFINITE, _why(first)
    assert "NON-FINITE: non-finite value at step 3: weights = nan; nothing of step 3 was saved" in first.stdout
    assert "Traceback" not in _attempt_log(run, 1)
    assert complete_steps(run / "checkpoints") == [1, 2]  # no checkpoint written after the NaN
    rec3 = [r for r in read_jsonl(run / "metrics.jsonl") if r["step"] == 3]
    assert rec3 and rec3[-1]["health/nonfinite"] == 1.0  # the flag is recorded, not dropped
    assert not attempts.end_records(run / "logs")[0]["final"]

    second, _ = _train(run, steps, fault)  # resumes from step 2, meets the same NaN at step 3
    assert second.returncode == attempts.EXIT_NONFINITE, _why(second)
    assert "the same as attempt 1 at the same step" in second.stdout
    verdict = attempts.read_verdict(run)
    assert verdict["cause"] == "nonfinite" and verdict["step"] == 3 and verdict["attempt"] == 2

    before = sorted(p.name for p in run.rglob("*"))
    third, wall = _train(run, steps)
    assert third.returncode == attempts.EXIT_VERDICT, _why(third)
    assert "stopped for good at step 3 by attempt 2" in third.stdout
    assert "dapo train: preset" not in third.stdout  # no backend built, no model loaded
    assert complete_steps(run / "checkpoints") == [1, 2]
    new = sorted(set(p.name for p in run.rglob("*")) - set(before))
    assert new == ["attempt-3.end.json", "attempt-3.log"], new  # nothing else was written
    assert wall < 60

    changed, _ = _train(run, [*steps, "recipe.actor.optim.lr=5e-5"])  # the fix: another preset runs again
    assert changed.returncode == 0, _why(changed)


def test_a_full_volume_is_said_before_the_checkpoint_is_written(tmp_path, assets):
    run = _run_dir(tmp_path, assets)
    steps = ["recipe.trainer.total_training_steps=4", "recipe.trainer.save_freq=2"]
    full, _ = _train(run, steps, {"kind": "disk_free", "bytes": 4096, "step": 2})
    assert full.returncode == attempts.EXIT_NO_SPACE, _why(full)
    assert "NO SPACE: the volume holding" in full.stdout and "nothing was written" in full.stdout
    assert complete_steps(run / "checkpoints") == [] and not list((run / "checkpoints").glob(".tmp-*"))
    assert attempts.read_end(run / "logs", 1)["cause"] == "no_space"
    assert attempts.read_verdict(run) is None  # not final: a grown volume lets the next attempt run


def test_a_health_stop_is_final_and_the_next_attempt_exits_at_once(tmp_path, assets):
    run = _run_dir(tmp_path, assets)
    stop = ["recipe.trainer.total_training_steps=4", "recipe.trainer.save_freq=0",
            "recipe.trainer.health.stop_on=[entropy_collapse]", "recipe.trainer.health.entropy_min=100",
            "recipe.trainer.health.patience=1"]
    first, _ = _train(run, stop)
    assert first.returncode == attempts.EXIT_HEALTH_STOP, _why(first)
    assert attempts.read_verdict(run)["cause"] == "health_stop"
    again, _ = _train(run, stop)
    assert again.returncode == attempts.EXIT_VERDICT, _why(again)
    assert "dapo train: preset" not in again.stdout

"""What every verl worker process does for the run (dapo.backends.verl.worker_hooks), in a fresh process that imports
verl exactly as a Ray worker does -- through VERL_USE_EXTERNAL_MODULES and the variables the driver sets -- and then
creates its process group where verl creates it: the timeout read back from the group, stacks and the compute probe
answered from the shared directory while the main thread is busy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, free_port

pytest.importorskip("verl")

from dapo.backends.verl import worker_hooks  # noqa: E402
from dapo.backends.verl.ranks import RankWatch  # noqa: E402
from dapo.config import WatchdogConfig  # noqa: E402

WORKER = """
import os, sys, time, types, torch.distributed as dist
# a worker's class module in the middle of its import (as the hooks' thread may see it): nothing defined yet
sys.modules["verl.workers.engine_workers"] = types.ModuleType("verl.workers.engine_workers")
import verl  # imports dapo.backends.verl.loss and .worker_hooks (VERL_USE_EXTERNAL_MODULES)
from verl.utils.distributed import initialize_global_process_group_ray
initialize_global_process_group_ray(timeout_second=None)  # what engine_workers.py:89 passes
print("ready", flush=True)
time.sleep(float(os.environ["HOLD_S"]))  # the main thread busy (a long update, a wait)
"""


def _sleep_line() -> int:
    """The line of WORKER where its main thread sleeps (line numbers of ``python -c``)."""
    return next(i for i, line in enumerate(WORKER.split("\n"), 1) if line.startswith("time.sleep"))


def _worker(run_dir: Path, timeout_s: int, hold_s: float) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOLD_S=str(hold_s), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), DAPO_NODE_NAME="gpu-node-3",
               DAPO_POD_NAME="dapo-train-worker-x1", DAPO_HOOK_POLL_S="0.1",
               # verl's own workers on CPU: the CPU platform's patch of the same function applies too (its entry point)
               VERL_PLATFORM="cpu",
               VERL_USE_EXTERNAL_MODULES="dapo.backends.verl.loss,dapo.backends.verl.worker_hooks",
               **worker_hooks.env_for(str(run_dir), 4, timeout_s, driver_pid=os.getpid()))
    return subprocess.Popen([sys.executable, "-c", WORKER], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _wait_ready(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    assert line.strip() == "ready", line + proc.stderr.read()


def test_the_process_group_gets_verls_nccl_timeout_and_the_probe_reads_it_back(tmp_path):
    proc = _worker(tmp_path, 123, hold_s=30)
    try:
        _wait_ready(proc)
        watch = RankWatch(str(tmp_path), 4, world_size=1, cfg=WatchdogConfig())
        metrics = watch.probe(step=7)
        assert metrics["ranks/pg_timeout_s"] == 123.0  # torch's default would be 1800 s (gloo)
        assert metrics["ranks/answered"] == 1.0 and metrics["ranks/probe_s/max"] > 0
        rec = json.loads((worker_hooks.attempt_dir(tmp_path, 4) / "ranks" / "rank-0.json").read_text())
        assert rec["node"] == "gpu-node-3" and rec["pod"] == "dapo-train-worker-x1" and rec["step"] == 7
    finally:
        proc.kill()
        proc.wait()


def test_stacks_are_written_while_the_main_thread_is_busy_and_a_silent_rank_is_named(tmp_path):
    proc = _worker(tmp_path, 60, hold_s=30)
    try:
        _wait_ready(proc)
        watch = RankWatch(str(tmp_path), 4, world_size=2, cfg=WatchdogConfig(), probe_wait_s=3)  # rank 1: none
        watch.probe(step=1)
        dest = worker_hooks.attempt_dir(tmp_path, 4)
        t0 = time.monotonic()
        missing = watch.stacks(dest, "dapo watchdog: phase update_actor of step 2 ...", wait_s=5)
        stacks = (dest / f"stacks-rank0-{os.uname().nodename}-{proc.pid}.txt").read_text()
        # the main thread in the sleep of the script (its last line): where it is busy
        assert "phase update_actor of step 2" in stacks and "--- thread MainThread" in stacks and f"line {_sleep_line()}, in <module>" in stacks
        assert [n["rank"] for n in missing] == [1] and "wrote no stacks within 5 s" in missing[0]["why"]
        assert time.monotonic() - t0 < 10
    finally:
        proc.kill()
        proc.wait()


def test_nothing_is_set_up_in_the_driver_or_without_a_run(monkeypatch):
    assert worker_hooks.install({}) is False
    env = worker_hooks.env_for("/tmp/run", 1, 60, driver_pid=os.getpid())
    assert worker_hooks.install(env) is False  # the driver exports the same variables to itself


def test_a_rank_refuses_to_save_a_shard_with_non_finite_weights():
    """verl's own TrainingWorker.save_checkpoint, wrapped as every worker wraps it: a NaN in this rank's parameters
    raises with the mark the loop reads (no shard written); finite parameters save as before."""
    import types

    import torch
    import verl.workers.engine_workers as engine_workers

    from dapo.train.attempts import NONFINITE_WEIGHTS_MARK

    saved = []
    original = engine_workers.TrainingWorker.save_checkpoint
    stand_in = types.SimpleNamespace(TrainingWorker=type("TrainingWorker", (), {
        "save_checkpoint": lambda self, path, *a, **k: saved.append(path)}))
    assert worker_hooks.patch_finite_save(stand_in) and not worker_hooks.patch_finite_save(stand_in)
    worker = stand_in.TrainingWorker()
    worker.engine = types.SimpleNamespace(module=torch.nn.Linear(4, 4))
    worker.save_checkpoint("/ckpt/ok")
    with torch.no_grad():
        worker.engine.module.weight[1, 2] = float("inf")
    with pytest.raises(RuntimeError, match=f"{NONFINITE_WEIGHTS_MARK}: rank .*1 parameters not finite, e.g. weight"):
        worker.save_checkpoint("/ckpt/bad")
    assert saved == ["/ckpt/ok"]
    assert engine_workers.TrainingWorker.save_checkpoint is original  # only the patched module changed
    assert "save_checkpoint" in vars(engine_workers.TrainingWorker)  # the real class has the method it wraps


def test_a_flight_record_dumped_as_bytes_is_saved_beside_the_stacks(tmp_path, monkeypatch):
    """torch's flight-recorder dump returns bytes: the stacks and the record are both written (written as text,
    the request fails with 'data must be str, not bytes' in every rank)."""
    from dapo.backends.verl import worker_hooks

    monkeypatch.setattr(worker_hooks, "_flight_record", lambda: b'{"entries": []}')
    path = worker_hooks.write_stacks(tmp_path, "header")
    assert "header" in path.read_text()
    records = list(tmp_path.glob("flight-recorder-*.json"))
    assert [r.read_bytes() for r in records] == [b'{"entries": []}']

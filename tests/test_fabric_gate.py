"""The fabric gate as `dapo train` runs it (dapo.backends.verl.fabric.gate), for real: the verl-tiny preset's two ranks
(gloo over loopback, two Ray actors in their own processes), on a Ray instance of the test's own.

- a floor above the measured bus bandwidth: exit 5, the reason naming the floor given with --fabric-min-busbw, nothing
  trained or built (no tiny model, no checkpoint), the verdict on the run directory;
- the next attempt of the same check (a KubeRay retry) exits 5 at once, before Ray starts, naming that verdict;
- a network other than the declared one (gloo's TCP when efa is declared) with a floor it passes: exit 5 for the
  network alone -- so the floor judged is the one given.
- ranks on more nodes than the Ray cluster has (2 nodes on this one-node Ray): the attempt ends after the placement
  timeout naming the node missing, and records no verdict (the nodes, not the fabric: a retry checks again).
(What makes two checks "the same", and the recheck token, are tested without Ray in tests/test_fabric.py.)

Each check run takes a minute or two on a loaded 2-core machine (Ray's start and a 1 MiB..1 GiB sweep): slow."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow


def _train(run_dir: Path, home: Path, *args: str, nodes: int = 1, gpus_per_node: int = 2) -> tuple[int, str, float]:
    env = dict(os.environ, HOME=str(home), PYTHONPATH=str(ROOT), RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
               OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    env.pop("RAY_ADDRESS", None)
    t0 = time.monotonic()
    # the check's two ranks on the one Ray node this test starts (verl-tiny itself is 2 nodes x 1 GPU, which the
    # verl e2e runs on two raylets): a placement over nodes this Ray instance does not have would wait forever
    out = subprocess.run([sys.executable, "-m", "dapo.train", "--preset", "verl-tiny", "--no-progress", *args,
                          f"placement.nodes={nodes}", f"placement.gpus_per_node={gpus_per_node}",
                          f"recipe.trainer.default_local_dir={run_dir}"], env=env, capture_output=True, text=True,
                         timeout=900, cwd=str(home))
    return out.returncode, out.stdout + out.stderr, time.monotonic() - t0


@pytest.fixture(scope="module")
def gate_runs(tmp_path_factory):
    """The three attempts on one run directory, in order: floor too high; its retry; another network."""
    base = tmp_path_factory.mktemp("gate")
    run_dir, home = base / "run", base / "home"
    home.mkdir()
    first = _train(run_dir, home, "--fabric-check", "socket", "--fabric-min-busbw", "1000000")
    verdict = json.loads((run_dir / "fabric-check.json").read_text()) if (run_dir / "fabric-check.json").exists() \
        else None
    retry = _train(run_dir, home, "--fabric-check", "socket", "--fabric-min-busbw", "1000000")
    other = _train(run_dir, home, "--fabric-check", "efa", "--fabric-min-busbw", "0.000001")
    return run_dir, first, verdict, retry, other


def test_a_floor_above_the_measured_busbw_exits_5_and_trains_nothing(gate_runs):
    run_dir, (rc, out, _), verdict, _, _ = gate_runs
    assert rc == 5, out[-3000:]
    assert "fabric check: 2 ranks on 1 node(s), backend gloo, declared fabric socket (floor 1e+06 GB/s busbw)" in out
    assert "fabric check FAILED: all-reduce bus bandwidth" in out and "below the socket floor 1e+06 GB/s" in out
    assert "nothing trained (exit code 5)" in out
    # before any model: the tiny model and task were not built, no checkpoint was written
    assert not (run_dir / "assets").exists() and not list(run_dir.glob("global_step_*")), sorted(os.listdir(run_dir))
    assert verdict["passed"] is False and verdict["expect"] == "socket"
    assert any("below the socket floor 1e+06 GB/s" in r for r in verdict["reasons"])


def test_the_retry_of_a_failed_check_exits_at_once_naming_the_verdict(gate_runs):
    run_dir, (_, _, first_s), verdict, (rc, out, seconds), _ = gate_runs
    assert rc == 5, out[-3000:]
    assert f"fabric check: not run again: the check of socket failed at {verdict['time']}" in out
    assert str(run_dir / "fabric-check.json") in out and "--set fabric.recheck=" in out
    assert "Started a local Ray instance" not in out and "fabric check: all-reduce" not in out
    assert seconds < first_s / 2, (seconds, first_s)


def test_another_network_than_declared_exits_5_on_its_own_and_the_given_floor_is_the_one_judged(gate_runs):
    _, _, _, _, (rc, out, _) = gate_runs
    assert rc == 5, out[-3000:]
    assert "declared fabric efa (floor 1e-06 GB/s busbw)" in out  # --fabric-min-busbw, not efa's 40
    assert "fabric check FAILED: NCCL chose Socket (socket), but the values declare efa" in out
    assert "below the efa floor" not in out  # the measured busbw passes the floor that was given


def test_ranks_on_more_nodes_than_ray_has_end_the_attempt_naming_the_missing_node_and_record_nothing(tmp_path):
    run_dir, home = tmp_path / "run", tmp_path / "home"
    home.mkdir()
    rc, out, _ = _train(run_dir, home, "--fabric-check", "socket", "--fabric-placement-timeout", "5", nodes=2,
                        gpus_per_node=1)
    assert rc == 5, out[-3000:]
    assert "fabric check NOT RUN: the check's 2 x 1 ranks could not be placed in 5 s: they need 2 Ray node(s) with " \
           "1 CPU each" in out, out[-3000:]
    assert re.search(r"the cluster has 1 \([0-9.]+\) of 1 alive node\(s\): 1 node\(s\) missing", out), out[-3000:]
    assert "not recorded as a verdict (a retry checks again)" in out and "nothing trained (exit code 5)" in out
    assert not (run_dir / "fabric-check.json").exists()  # a retry (a new RayCluster) is not refused
    assert "fabric check: all-reduce (busbw" not in out  # nothing was measured

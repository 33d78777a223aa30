"""The rehearsal of a lost node, on loopback, from the rendered `tiny` manifests.

The RayJob's cluster is stood up as KubeRay would (tests/kuberay_loopback.py): a head with the head group's
rayStartParams, the worker group's replicas as separate raylets with the resources KubeRay derives from their
rayStartParams and container resources; the shared volume is a temporary directory (the values' mount path points
there). The rendered entrypoint, runtime env and entrypoint resources are submitted as KubeRay's submitter does, with
the token auth the rendered authOptions turn on (the loopback operator's token in every pod, KubeRay's header on the
HTTPMode submission). Then:

0. a submission without the token (401) or with a wrong one (403) and a ray.init without it are refused;
1. an uninterrupted run: the driver (the DAPO loop) runs on a worker, not on the head;
2. a second attempt of the same entrypoint loses the worker pod hosting its driver after its first checkpoint
   (SIGKILL to the raylet, then to every process of that pod): the job fails;
3. a replacement worker with the same resources joins, the same entrypoint is submitted under a new submission id
   (what KubeRay's retry does) and resumes from the newest complete checkpoint on the shared directory;
4. it ends with the same metrics (every metrics.jsonl record but timings, summary.json, final weights) as the
   uninterrupted run; the newest `max_ckpt_to_keep` complete checkpoints and the best-scoring one remain; every
   attempt's driver log is at
   `<trainer.default_local_dir>/logs/attempt-<N>.log`; both attempts logged to the same (offline) wandb run;
5. the log follower, started from the rendered follower Job's command and arguments (its emptyDir and the shared
   volume under the test's directory) before the first attempt, printed both attempts' logs, every step line once,
   and handed exit code 0 to the Job's main container, whose rendered command exits with it; the token is in no file
   the run wrote.

Not modelled (docs/rehearsed.md): pod recreation by Kubernetes, image pulls, NCCL, losing the head,
KubeRay's own retry controller (here the test resubmits; the head survives, where KubeRay builds a new cluster), the
API server (the follower runs without one: it judges the end from the attempt logs and the rendered backoffLimit).
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

import pytest
import yaml

from conftest import ROOT
from dapo.train.checkpoint import best_step, complete_steps
from dapo.config import load_preset
from dapo.train.metrics import read_jsonl
from dapo.config import split_overrides
from k8s_support import by_key, helm_objects, set_files, user_values
from loop_support import WALL_CLOCK, assert_the_kept_best_has_the_best_validation
from kuberay_loopback import (
    TERMINAL,
    VENV_BIN,
    LoopbackRayCluster,
    files_containing,
    kuberay_job_id,
    stop_marked_processes,
    unauthenticated_refusals,
)

pytestmark = pytest.mark.slow

# The run made short through the values' `overrides` (appended to the rendered entrypoint): a smaller model and task,
# a short warm start, STEPS steps with a checkpoint after each -- more than values/tiny.yaml keeps, so old ones are
# deleted, and steps are left after the first one. The 30-step warm start solves nothing yet, so every group is
# all-wrong and dynamic sampling (tested with a scripted backend in test_loop.py) would never fill a batch.
STEPS = 6
SHORT = [
    "local.model.hidden_size=64",
    "local.model.num_hidden_layers=1",
    "local.model.num_attention_heads=2",
    "local.model.num_key_value_heads=2",
    "local.model.intermediate_size=128",
    "local.task.n_train=400",
    "local.task.n_val=16",
    "local.warm_start.steps=30",
    "local.warm_start.batch_size=32",
    "local.micro_batch_size=8",
    "recipe.data.train_batch_size=4",
    "recipe.data.gen_batch_size=null",
    "recipe.rollout.n=4",
    "recipe.actor.ppo_mini_batch_size=2",
    "recipe.filter_groups.enable=false",
    f"recipe.trainer.total_training_steps={STEPS}",
    "recipe.trainer.save_freq=1",
]
# wall-clock metrics (timing_s/*, timing_per_token_ms/*, ...): they differ between any two runs
VOLATILE = WALL_CLOCK + ("ts", "perf/")


def _render(root: Path):
    """The tiny RayJob and preset ConfigMap from Helm, with the shared volume and the preset mount under root."""
    shared, presets_dir = root / "shared", root / "etc" / "presets"
    files, release = set_files("tiny")
    base = user_values(files)
    mount = base.get("storage", {}).get("mountPath", "/shared").rstrip("/")
    overrides = [o.replace(f"={mount}/", f"={shared}/") for o in base.get("overrides", [])] + SHORT
    values = user_values(files, {
        "storage": {"mountPath": str(shared), "hfHome": f"{shared}/hf"},
        "dataPrep": {"outDir": f"{shared}/data"},
        "train": {"presetDir": str(presets_dir), "runtimeEnv": {"WANDB_DIR": f"{shared}/wandb"}},
        "overrides": overrides,
    })
    objects = by_key(helm_objects(values, release=release))
    return (objects[("RayJob", f"{release}-train")], objects[("ConfigMap", f"{release}-preset")],
            objects[("Job", f"{release}-train-logs")], shared, presets_dir)


def _follower(job, root: Path, env: dict[str, str]):
    """The rendered follower Job's two containers as processes, its emptyDir at root/state: the printer (the
    restartable init container) started now, and the command of the main container, to run at the end."""
    pod = job["spec"]["template"]["spec"]
    (follow,), (result,) = pod["initContainers"], pod["containers"]
    (state,) = [m["mountPath"] for m in follow["volumeMounts"] if m["name"] == "state"]
    local = str(root / "state")
    argv = [a.replace(state, local) for a in follow["command"] + follow["args"]]
    with open(root / "follower.out", "wb") as out, open(root / "follower.err", "wb") as err:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, start_new_session=True)
    return proc, [a.replace(state, local) for a in result["command"]], Path(local)


def _wandb_runs(shared: Path, run_id: str) -> list[Path]:
    """The offline wandb run directories of run id ``run_id`` under the shared volume (one per attempt)."""
    return sorted(d for d in shared.rglob(f"offline-run-*-{run_id}") if d.is_dir())


def _effective_preset(rayjob, presets_dir: Path):
    """The preset the entrypoint runs: `--preset <file>` plus its key=value overrides."""
    argv = shlex.split(rayjob["spec"]["entrypoint"])
    preset_file = argv[argv.index("--preset") + 1]
    ours, verl = split_overrides([a for a in argv if "=" in a and not a.startswith("-")])
    assert not verl, verl
    return load_preset(preset_file, ours)


def _records(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in read_jsonl(run_dir / "metrics.jsonl")]


def _summary(run_dir: Path) -> dict:
    s = json.loads((run_dir / "summary.json").read_text())
    return {k: v for k, v in s.items() if "seconds" not in k}


def _logical(node) -> dict:
    """A node's logical resources (object store size and the per-node marker resource depend on the host)."""
    return {k: v for k, v in node.resources_total.items() if k != "object_store_memory" and not k.startswith("node:")}


def _expected_resources(pod) -> dict:
    """The resources a worker pod registers, from the `ray start` parameters KubeRay derived from the manifest."""
    p = pod.params
    out = {"CPU": float(p.get("num-cpus", 0)), "GPU": float(p.get("num-gpus", 0)), "memory": float(p.get("memory", 0))}
    out.update({k: float(v) for k, v in json.loads(p.get("resources", "{}").strip("'")).items()})
    return {k: v for k, v in out.items() if v}


def _drivers(presets_dir: Path) -> set[int]:
    """Pids of the running training drivers (their command line names the preset file of this test)."""
    import psutil

    out = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if "dapo.train" in cmd and any(str(presets_dir) in a for a in cmd):
            out.add(p.pid)
    return out


def _submitter_done(submitter, output: str) -> None:
    """A submitter (K8sJobMode: `ray job logs --follow` after the submission) ends with its job, successfully."""
    if submitter is not None:
        assert submitter.wait(timeout=60) == 0, output


def _wait(client, job_id: str, timeout: float, until=TERMINAL) -> str:
    deadline = time.monotonic() + timeout
    while (status := str(client.get_job_status(job_id).value)) not in until:
        assert time.monotonic() < deadline, f"job {job_id} still {status} after {timeout:.0f}s"
        time.sleep(0.5)
    return status


def test_tiny_rayjob_loses_the_driver_node_mid_run_then_a_resubmission_resumes_to_identical_metrics():
    if shutil.which("ray", path=str(VENV_BIN)) is None:
        pytest.skip("the ray CLI is not installed next to this Python")
    root = Path(tempfile.mkdtemp(prefix="dapo-rh-", dir="/tmp"))  # short: AF_UNIX socket paths <= 107 bytes
    t0 = time.monotonic()

    def phase(msg):
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", file=sys.stderr)

    cluster = follower = None
    try:
        # --- the rendered objects ----------------------------------------------------------------------------
        rayjob, configmap, follower_job, shared, presets_dir = _render(root)
        presets_dir.mkdir(parents=True)
        for key, text in configmap["data"].items():  # what the kubelet mounts at train.presetDir
            (presets_dir / key).write_text(text)
        trainer = _effective_preset(rayjob, presets_dir).recipe.trainer
        steps, keep = trainer.total_training_steps, trainer.max_ckpt_to_keep
        assert (steps, trainer.save_freq) == (STEPS, 1)
        assert keep and keep < steps, f"recipe.trainer.max_ckpt_to_keep {keep}: the rehearsal needs 1..{steps - 1}"
        run_dir = Path(trainer.default_local_dir)
        assert run_dir.is_relative_to(shared), f"the run directory {run_dir} is not on the shared volume"
        ckpts = run_dir / "checkpoints"
        spec = rayjob["spec"]
        assert set(yaml.safe_load(spec["runtimeEnvYAML"])) == {"env_vars"}  # env only: the code is in the image
        (shared / "wandb").mkdir(parents=True)

        # --- the cluster -------------------------------------------------------------------------------------
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "HF_TOKEN", "WANDB_"))}
        env.update({"HOME": str(root / "home"), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                    "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                    "PYTHONPATH": str(ROOT)})  # the image's code: this checkout
        (root / "home").mkdir()
        groups = spec["rayClusterSpec"].get("workerGroupSpecs", [])
        assert groups, "the tiny RayJob has no worker group: the loop could only run on the head"
        cluster = LoopbackRayCluster(rayjob, root, env)
        nodes = cluster.wait_nodes()
        head_id = cluster.head.node_id
        workers = cluster.workers()
        assert len(workers) >= 2, f"the tiny worker group has {len(workers)} replica(s); the rehearsal needs two"
        assert nodes[head_id].resources_total.get("CPU", 0) == 0, nodes[head_id].resources_total
        client = cluster.client()
        phase(f"cluster up: head + {len(workers)} workers {[nodes[w.node_id].resources_total for w in workers]}")

        # token auth as the rendered RayJob sets it (authOptions; the loopback operator does what KubeRay does with
        # it): whoever lacks the token is refused by the dashboard's Jobs API and by the GCS
        assert spec["rayClusterSpec"]["authOptions"] == {"mode": "token"} and cluster.token
        refused = unauthenticated_refusals(cluster)
        assert (refused["no token"], refused["wrong token"]) == ("401", "403"), refused
        assert refused["ray.init"].startswith("REFUSED"), refused["ray.init"]
        assert "InvalidAuthToken" in refused["ray.init stderr"], refused["ray.init stderr"][-2000:]
        assert refused["ray.init with the token"] == "JOINED", refused
        phase("unauthenticated submission (401), wrong token (403) and ray.init without the token refused")

        def run_attempt(job_id):
            submitter = cluster.submit(job_id)
            deadline = time.monotonic() + 60
            while job_id not in {j.submission_id for j in client.list_jobs()}:  # the submitter is on its way
                if submitter is not None and submitter.poll() not in (None, 0):
                    pytest.fail(f"the submitter failed:\n{cluster.submitter_output(job_id)}")
                assert time.monotonic() < deadline, f"{job_id} not submitted:\n{cluster.submitter_output(job_id)}"
                time.sleep(0.5)
            status = _wait(client, job_id, 60, until=TERMINAL | {"RUNNING"})
            return submitter, status

        def driver_node(job_id) -> str:
            info = client.get_job_info(job_id)
            assert info.entrypoint == spec["entrypoint"]
            assert info.runtime_env["env_vars"] == yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"]
            assert info.driver_node_id, info
            assert info.driver_node_id != head_id, f"the driver of {job_id} runs on the head"
            return info.driver_node_id

        # --- 1. an uninterrupted run -------------------------------------------------------------------------
        straight_id = kuberay_job_id(rayjob)
        submitter, _ = run_attempt(straight_id)
        driver_node(straight_id)
        status = _wait(client, straight_id, 420)
        assert status == "SUCCEEDED", f"{status}: {client.get_job_info(straight_id).message}"
        _submitter_done(submitter, cluster.submitter_output(straight_id))
        phase("uninterrupted run SUCCEEDED off the head")
        assert (run_dir / "logs" / "attempt-1.log").is_file(), sorted(run_dir.rglob("*.log"))
        straight = run_dir.with_name(run_dir.name + "-straight")
        run_dir.rename(straight)  # the rehearsed run starts from an empty run directory

        # the log follower of the rehearsed run, as the chart starts it: before the run's log directory exists
        follower_env = {k: v for k, v in env.items() if not k.startswith("KUBERNETES_")}  # no API server here
        follower, result_cmd, state_dir = _follower(follower_job, root, follower_env)

        # --- 2. attempt 1 loses the pod of its driver after its first checkpoint -----------------------------
        first_id = kuberay_job_id(rayjob)
        submitter, status = run_attempt(first_id)
        assert status == "RUNNING", f"{status}: {client.get_job_info(first_id).message}"
        node = driver_node(first_id)
        lost = cluster.pod_of(node)
        assert lost in workers
        lost_node, lost_resources = cluster.nodes()[node], _expected_resources(lost)
        assert _logical(lost_node) == lost_resources
        deadline = time.monotonic() + 300
        while not (drivers := _drivers(presets_dir)):
            assert time.monotonic() < deadline, "no driver process after 300 s"
            time.sleep(0.2)
        assert drivers <= {p.pid for p in lost.tree()}, "the job driver is not a process of its node"
        polls = 0
        while not complete_steps(ckpts):  # poll fast: the kill must come while steps are left
            if polls % 20 == 0:
                assert client.get_job_status(first_id).value == "RUNNING", client.get_job_info(first_id).message
                assert time.monotonic() < deadline, "no checkpoint after 300 s"
            polls += 1
            time.sleep(0.05)
        killed = lost.lose()
        assert drivers <= set(killed) and not _drivers(presets_dir), "a job driver outlived the loss of its pod"
        at_kill = complete_steps(ckpts)
        phase(f"lost {lost.name} (node {node[:8]}, {len(killed)} processes) with checkpoints {at_kill}")
        assert at_kill and at_kill[-1] < steps, f"the run was not mid-way when its node was lost: {at_kill}"
        status = _wait(client, first_id, 90)
        assert status == "FAILED", status
        phase(f"attempt 1 {status}: {client.get_job_info(first_id).message}")
        if submitter is not None:
            submitter.wait(timeout=60)  # `ray job logs --follow` ends with the job
        time.sleep(2)
        assert complete_steps(ckpts) == at_kill, "something still writes checkpoints after the pod was lost"

        # --- 3. a replacement worker with the same resources joins; the same entrypoint is submitted again ---
        replacement = cluster.add_worker(lost.group)
        nodes = cluster.wait_nodes()  # the lost node is dead, the replacement alive
        assert lost.node_id not in nodes and replacement.node_id in nodes
        assert _logical(nodes[replacement.node_id]) == _logical(lost_node) == lost_resources
        phase(f"replacement {replacement.name} joined")
        second_id = kuberay_job_id(rayjob)
        assert second_id != first_id
        submitter, _ = run_attempt(second_id)
        driver_node(second_id)
        status = _wait(client, second_id, 420)
        assert status == "SUCCEEDED", f"{status}: {client.get_job_info(second_id).message}"
        _submitter_done(submitter, cluster.submitter_output(second_id))
        phase("attempt 2 SUCCEEDED")

        # --- 4. the same end, bounded storage, the logs of every attempt ------------------------------------
        logs = run_dir / "logs"
        assert sorted(p.name for p in logs.glob("attempt-*.log")) == ["attempt-1.log", "attempt-2.log"]
        first_log, second_log = (logs / "attempt-1.log").read_text(), (logs / "attempt-2.log").read_text()
        for n, text in ((1, first_log), (2, second_log)):  # the first line names the file
            assert str(logs / f"attempt-{n}.log") in text.splitlines()[0], text[:500]
        assert "resumed from" not in first_log and "dapo: exit code" not in first_log  # it ended with its pod
        assert f"resumed from {ckpts / f'global_step_{at_kill[-1]}'}" in second_log, second_log[-3000:]
        assert f"step {steps}/{steps}" in second_log and "dapo: exit code 0" in second_log.splitlines()[-1]

        a, b = _records(straight), _records(run_dir)
        diff = [(x, y) for x, y in zip(a, b) if x != y]
        assert len(a) == len(b) and not diff, f"the resumed run differs from the uninterrupted one: {diff[:2]}"
        assert _summary(straight) == _summary(run_dir)
        final = f"global_step_{steps}/actor/model.safetensors"
        assert (straight / "checkpoints" / final).read_bytes() == (ckpts / final).read_bytes()

        # the newest `keep`, and the best-scoring one when older: the run's best validation by its own metrics
        for run in (run_dir, straight):
            best, score = assert_the_kept_best_has_the_best_validation(run, trainer.save_freq, steps)
            kept = set(range(steps - keep + 1, steps + 1)) | {best}
            assert complete_steps(run / "checkpoints") == sorted(kept), (run, complete_steps(run / "checkpoints"))
        assert best_step(ckpts) == best_step(straight / "checkpoints")
        phase(f"kept best: global_step_{best}, the run's best validation ({score:.4f})")
        assert not list(ckpts.glob(".tmp-*")) + list(ckpts.glob(".trash-*")), "a temporary directory was left behind"
        phase("same metrics, retention and attempt logs checked")

        # --- 5. one wandb run across the attempts; the follower's stream of both ---------------------------------
        run_id = (run_dir / "wandb_run_id").read_text().strip()
        runs = _wandb_runs(shared, run_id)
        # both attempts opened the run of the id the first one wrote to <run dir>/wandb_run_id; the first was killed
        # right after saving step 1, before it logged that step (the loop logs a step after its checkpoint), so its
        # records are the second's to write: the resumed attempt logs step 1's metrics, saved with the checkpoint,
        # then the rest -- one curve
        assert len(runs) == 2, f"one offline wandb run directory per attempt, both of run {run_id}: {runs}"
        data = (runs[1] / f"run-{run_id}.wandb").read_bytes()
        assert run_id.encode() in data and b"response_length/mean" in data, runs[1]
        assert (straight / "wandb_run_id").read_text().strip() != run_id  # the uninterrupted run had its own
        deadline = time.monotonic() + 60
        while not (state_dir / "result").exists():
            assert follower.poll() is None, (root / "follower.err").read_text()
            assert time.monotonic() < deadline, (root / "follower.err").read_text()
            time.sleep(0.5)
        waiter = subprocess.run(result_cmd, timeout=30)
        assert waiter.returncode == 0, "the follower Job's main container exits with the run's result"
        follower.send_signal(signal.SIGTERM)
        assert follower.wait(timeout=30) == 0
        out = (root / "follower.out").read_bytes()
        first, second = (logs / "attempt-1.log").read_bytes(), (logs / "attempt-2.log").read_bytes()
        pos1 = out.index(f"==> attempt 1, started ".encode())
        pos2 = out.index(f"==> attempt 2, started ".encode())
        assert out[out.index(b"\n", pos1) + 1:].startswith(first) and pos1 < pos2
        assert out[out.index(b"\n", pos2) + 1:].startswith(second)
        assert out.endswith(b"==> the run succeeded: attempt 2 exited with code 0 <==\n")
        step_lines = [line for line in (first + second).splitlines() if line.startswith(b"step ")]
        assert step_lines and any(line.startswith(f"step {steps}/{steps} ".encode()) for line in step_lines)
        for line in step_lines:  # every step line of both attempts, once each
            assert out.count(line + b"\n") == (first + second).count(line + b"\n"), line
        phase("one wandb run over both attempts; the follower printed both attempts and exited 0")
        # the token is in no file the run wrote: Ray's logs, the driver logs, the follower's output, checkpoints
        assert not files_containing(root, cluster.token), files_containing(root, cluster.token)
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
        if cluster is not None:
            cluster.close()
        stop_marked_processes(str(root))
        phase("stopped")
        shutil.rmtree(root, ignore_errors=True)

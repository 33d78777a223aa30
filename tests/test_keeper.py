"""What the log follower does between attempts (dapo.cluster.keeper), end to end: the follower (`python -m
dapo.cluster.follow`, a process) against the stand-in API, the training RayJob rendered from values/tiny.yaml held
there and driven through KubeRay v1.7.0's retry path (tests/kuberay_twin.py: every retry's cluster scheduled from
the RayJob's spec as it is when the retry starts), each attempt's driver a process that speaks the attempt protocol
with an injected fault (tests/attempt_driver.py)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from api_standin import StandInApi
from k8s_support import ROOT, VALUES_DIR, by_key, chart_objects, helm_objects, user_values
from test_follow_waits import asked
from kuberay_twin import KubeRayTwin, node_matches
from dapo.cluster.budget import FILE as FAILURES
from dapo.train import attempts

NS = "ml"
DRIVER = Path(__file__).with_name("attempt_driver.py")
FOLLOW_FAST = ["--poll", "0.1", "--status-every", "0.2", "--waits-every", "0.2", "--grace", "0.5"]
ACTS = ["--leave-out-nodes", "4", "--max-failures", "6", "--same-cause", "3", "--heartbeat-timeout", "0"]
# the user's own required affinity on the workers: the follower's exclusion must be ANDed into it, not replace it
POOL = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["workers"]}]}]}}}


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "PYTHONUNBUFFERED": "1"}


def node(name: str, **labels) -> dict:
    return {"kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}}}


NODES = [node("cpu-1"), *(node(f"gpu-{i}", pool="workers") for i in range(1, 6))]


def tiny_rayjob(backoff_limit: int = 200) -> dict:
    objects = by_key(chart_objects([VALUES_DIR / "tiny.yaml"], namespace=NS, extra={"worker": {"affinity": POOL}}))
    rayjob = objects[("RayJob", "dapo-train")]
    rayjob["spec"]["backoffLimit"] = backoff_limit  # the failure budget decides, not KubeRay's lifetime count
    return rayjob


class Run:
    """One run: the stand-in API, the twin, the follower process; ``drivers`` the per-attempt driver processes."""

    def __init__(self, tmp_path: Path, driver_args, follower_args=ACTS, rebuild_after: float = 0.5,
                 attempt_hook=None, backoff_limit: int = 200):
        self.api = StandInApi()
        self.log_dir = tmp_path / "run" / "logs"
        self.log_dir.mkdir(parents=True)
        self.driver_args, self.attempt_hook, self.drivers = driver_args, attempt_hook, {}
        self.twin = KubeRayTwin(self.api, tiny_rayjob(backoff_limit), NODES, self.drive, namespace=NS,
                                rebuild_after=rebuild_after)
        self.out = tmp_path / "follow.out"
        self.err = tmp_path / "follow.err"
        argv = [sys.executable, "-m", "dapo.cluster.follow", "--log-dir", str(self.log_dir), "--rayjob",
                "dapo-train", "--namespace", NS, "--api-server", self.api.url, "--release", "dapo", "--state-dir",
                str(tmp_path / "state"), *FOLLOW_FAST, *follower_args]
        self.follower = subprocess.Popen(argv, env=env(), stdout=open(self.out, "w"), stderr=open(self.err, "w"))
        # as on a cluster, the follower runs before the first driver: a driver waits only for a follower that beats
        deadline = time.monotonic() + 60
        while not attempts.follower_alive(self.log_dir):
            assert self.follower.poll() is None and time.monotonic() < deadline, self.err.read_text()
            time.sleep(0.05)
        self.twin.start()

    def drive(self, k: int, pods: list[dict]) -> int:
        workers = [p for p in pods if "-worker-" in p["metadata"]["name"]]
        e = {**env(), "DAPO_ATTEMPT_NODES": ",".join(p["spec"]["nodeName"] for p in workers),
             "DAPO_ATTEMPT_IPS": json.dumps({p["spec"]["nodeName"]: p["status"]["podIP"] for p in workers}),
             "DAPO_POD_NAME": workers[0]["metadata"]["name"], attempts.ACK_TIMEOUT_ENV: "20"}
        nodes = [p["spec"]["nodeName"] for p in workers]
        args = self.driver_args(k, nodes) if callable(self.driver_args) else self.driver_args
        proc = subprocess.Popen([sys.executable, str(DRIVER), "--log-dir", str(self.log_dir), *args], env=e,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.drivers[k] = (proc, workers[0]["metadata"]["name"])
        if self.attempt_hook:
            self.attempt_hook(self, k, proc, nodes)
        return proc.wait(timeout=60)

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        try:
            code = self.follower.wait(timeout=timeout)
        finally:
            if self.follower.poll() is None:
                self.follower.kill()
            for proc, _ in self.drivers.values():
                if proc.poll() is None:
                    proc.kill()
            self.api.close()
        assert self.twin.error is None, self.twin.error
        self.assert_the_role_allows_what_the_follower_did()
        return code, self.out.read_text(), self.err.read_text()

    def assert_the_role_allows_what_the_follower_did(self) -> None:
        """Every request the follower sent is one the chart's Role for this run grants."""
        used = {asked(r) for r in self.api.requests}
        used |= {("ray.io", "rayjobs", "patch", path.partition("?")[0].rsplit("/", 1)[-1])
                 for path, _, _ in self.api.patched}
        used |= {asked(path.partition("?")[0])[:2] + ("delete", path.partition("?")[0].rsplit("/", 1)[-1])
                 for path in self.api.deleted}
        for granted in role_grants():
            # a rule without resourceNames grants every name
            missing = {u for u in used if u not in granted and u[:3] + ("",) not in granted}
            assert not missing, missing

    def rayjob(self) -> dict:
        return self.twin.live()

    def failures(self) -> dict:
        return json.loads((self.log_dir.parent / FAILURES).read_text())


@functools.lru_cache(maxsize=1)
def role_grants() -> tuple[set]:
    """(group, resource, verb, name) the follower's Role grants for this run, as Helm renders it."""
    rules = by_key(helm_objects(user_values([VALUES_DIR / "tiny.yaml"]), namespace=NS))[("Role", "dapo-logs")]["rules"]
    return ({(g, res, verb, name) for r in rules for g in r["apiGroups"] for res in r["resources"]
             for verb in r["verbs"] for name in r.get("resourceNames") or [""]},)


def final_line(out: str) -> str:
    return out.strip().splitlines()[-1]


def test_a_node_failing_every_attempt_is_left_out_of_the_next_one_and_the_run_completes(tmp_path):
    # the driver names the failing worker by its address only (an ActorDied), which the follower resolves to a node
    run = Run(tmp_path, ["--bad-node", "gpu-1", "--name-by", "ip", "--cause", "error"])
    code, out, err = run.finish()
    assert code == 0 and "the run succeeded" in final_line(out), (out, err)
    first, second = run.twin.clusters
    assert "gpu-1" in first["nodes"] and "gpu-1" not in second["nodes"], run.twin.clusters
    # the second cluster was built from the patched spec: every group keeps off gpu-1, the user's pool term kept
    worker = second["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert not node_matches(worker, NODES[1]) and node_matches(worker, NODES[2]) and not node_matches(worker, NODES[0])
    assert not node_matches(second["spec"]["headGroupSpec"]["template"]["spec"], NODES[1])
    ack = attempts.read_json(attempts.ack_path(run.log_dir, 1))
    assert any(a.startswith("left out node gpu-1 (ActorDied: a worker at 10.0.1.2 died") for a in ack["actions"]), ack
    assert any("RayJob dapo-train patched: its next cluster avoids gpu-1" in a for a in ack["actions"]), ack
    # patched, then answered: the driver exits (and KubeRay retries) only after the spec holds the exclusion
    (when,) = [t for _, body, t in run.api.patched if "rayClusterSpec" in body.get("spec", {})]
    assert when <= attempts.ack_path(run.log_dir, 1).stat().st_mtime
    (seen,) = [line for line in (run.log_dir / "attempt-1.log").read_text().splitlines() if line.startswith("ack:")]
    assert "left out node gpu-1" in seen, "the answer the driver waited for is the one written after the patch"
    record = run.failures()
    assert [f["cause"] for f in record["failures"]] == ["error"] and record["failures"][0]["recorded"]
    assert [e["node"] for e in record["left_out"]] == ["gpu-1"] and record["counted"] == 1


def test_three_failures_of_one_cause_in_a_row_stop_the_run_naming_it(tmp_path):
    run = Run(tmp_path, ["--fail-always", "--cause", "stalled"])
    code, out, err = run.finish()
    assert code == 1, (out, err)
    assert len(run.twin.clusters) == 3, "no fourth cluster is built"
    assert run.rayjob()["status"]["jobDeploymentStatus"] == "Failed" and run.rayjob()["spec"]["backoffLimit"] == 0
    line = final_line(out)
    assert "stopped by the follower: the same cause, stalled, ended 3 attempts in a row (attempts 1, 2, 3" in line
    ack = attempts.read_json(attempts.ack_path(run.log_dir, 3))
    assert any(a.startswith("stopped KubeRay's retries (backoffLimit 0)") for a in ack["actions"]), ack
    # each failing attempt's node was left out of the next: three clusters on three different first nodes
    assert [c["nodes"][0] for c in run.twin.clusters] == ["gpu-1", "gpu-2", "gpu-3"]


def test_a_final_verdict_builds_no_next_cluster_and_the_last_line_names_it(tmp_path):
    run = Run(tmp_path, ["--final"])
    code, out, err = run.finish()
    assert code == 1 and len(run.twin.clusters) == 1, (out, err)
    live = run.rayjob()
    assert live["status"]["jobDeploymentStatus"] == "Failed" and live["spec"]["backoffLimit"] == 0
    assert "stopped by the follower: final verdict of attempt 1 at step 3: nonfinite: actor/pg_loss = nan" in \
        final_line(out)


def test_a_frozen_driver_is_ended_by_the_follower_and_the_next_attempt_runs(tmp_path):
    def freeze(run, k, proc, nodes):  # attempt 1's driver heartbeats, then stops (SIGSTOP): it writes nothing more
        if k != 1:
            return
        deadline = time.monotonic() + 30
        while (attempts.read_progress(run.log_dir.parent) or {}).get("attempt") != 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGSTOP)

    run = Run(tmp_path, lambda k, nodes: ["--hang"] if k == 1 else [], attempt_hook=freeze,
              follower_args=["--heartbeat-timeout", "2", "--max-failures", "6", "--same-cause", "3"])
    # the kubelet ends a deleted pod's processes, a stopped one too: SIGKILL
    run.api.on_delete.append(lambda path: [proc.kill() for proc, pod in run.drivers.values() if path.endswith(pod)])
    code, out, err = run.finish()
    assert code == 0 and len(run.twin.clusters) == 2, (out, err)
    assert f"/api/v1/namespaces/{NS}/pods/dapo-train-c1x-worker-0?propagationPolicy=Background" in run.api.deleted
    end = attempts.read_end(run.log_dir, 1)
    assert end["cause"] == "stalled" and end["by"] == "follower" and "no heartbeat" in end["message"]
    assert "the follower deleted its pod dapo-train-c1x-worker-0" in err
    assert [f["cause"] for f in run.failures()["failures"]] == ["stalled"]


@pytest.mark.parametrize("rebuild_after, attempts_on_it", [(1.5, 1), (0.0, 2)], ids=["follower-first", "kuberay-first"])
def test_an_oom_killed_worker_without_an_end_record_is_left_out_of_a_later_attempt(tmp_path, rebuild_after,
                                                                                   attempts_on_it):
    def oom(run, k, proc, nodes):  # on gpu-1 the worker is OOM-killed and the driver dies without an end record
        if "gpu-1" not in nodes:
            return
        with run.api.lock:
            pod = next(p for p in run.api.store[("/api/v1", "pods", NS)].values() if p["spec"]["nodeName"] == "gpu-1")
            pod["status"]["containerStatuses"] = [{"name": "ray-worker", "restartCount": 0, "state": {
                "terminated": {"reason": "OOMKilled", "exitCode": 137}}}]
        time.sleep(1.0)  # the follower looks at the pods every 0.2 s
        proc.kill()

    # follower-first: KubeRay takes 1.5 s to build the retry, the follower reads the status every 0.2 s and patches
    # before it; kuberay-first: the retry is built at once, from the old spec -- the node is left out of the one after
    run = Run(tmp_path, lambda k, nodes: ["--hang"] if "gpu-1" in nodes else [], attempt_hook=oom,
              rebuild_after=rebuild_after)
    code, out, err = run.finish()
    assert code == 0, (out, err)
    assert ["gpu-1" in c["nodes"] for c in run.twin.clusters] == [True] * attempts_on_it + [False]
    failures = run.failures()["failures"]
    assert [f["cause"] for f in failures] == ["oom_killed"] * attempts_on_it and not any(f["recorded"] for f in failures)
    assert all("gpu-1" in f["nodes"] for f in failures)
    assert "left out node gpu-1 (pod dapo-train-c1x-worker-0: container ray-worker OOMKilled)" in err


@pytest.mark.parametrize("forbid", [("PATCH",), ("PATCH", "DELETE")])
def test_without_the_permission_to_patch_the_follower_deletes_or_says_so_and_still_answers(tmp_path, forbid):
    run = Run(tmp_path, ["--fail-always", "--cause", "stalled"], backoff_limit=3)
    for verb in forbid:
        run.api.forbid_verb(verb, "rayjobs")
    code, out, err = run.finish()
    assert code == 1, (out, err)
    ack = attempts.read_json(attempts.ack_path(run.log_dir, 1))
    assert any("could not patch the RayJob (HTTP 403" in a for a in ack["actions"]), ack
    if forbid == ("PATCH",):  # the third failure's retry was under way: the RayJob is deleted instead
        assert len(run.twin.clusters) == 3 and run.rayjob() is None
        assert "stopped by the follower: the same cause, stalled" in final_line(out)
        assert "(KubeRay retried it anyway)" in final_line(out)
    else:  # nothing can stop KubeRay: it retries until its own limits, and the follower says why it could not
        assert len(run.twin.clusters) == 4
        assert "could not be deleted (HTTP 403" in err

"""Without a gang scheduler, a run whose pods never started is stopped, not retried blindly: the start guard
(python -m dapo.cluster.start_guard, a real process) against the stand-in API server (api_standin.StandInApi),
scripted as KubeRay v1.7.0 moves a RayJob: Initializing with 15 of 16 workers scheduled -> PreRunningDeadlineExceeded
-> Retrying (failed 1). The guard deletes the RayJob and its log follower Job at that point -- before KubeRay's retry
holds the GPUs again -- names the causes and the next step, and exits 1; a run that reaches Running, or one that ran
before the guard started, is left alone (exit 0). The chart and scripts/render.py give the guard the same Job and the
least RBAC that allows it, and only without a queue."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest

from api_standin import StandInApi
from k8s_support import VALUES_DIR, by_key, helm_objects, chart_objects, user_values
from test_follow import ENV
from test_follow_waits import NO_GPUS, pod

FULL = [VALUES_DIR / "full.yaml"]


def rayjob(deployment: str, failed: int = 0, reason: str = "") -> dict:
    created = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": "dapo-train", "namespace": "ml", "uid": "u1", "creationTimestamp": created},
            "spec": {"backoffLimit": 3, "preRunningDeadlineSeconds": 1800},
            "status": {"jobDeploymentStatus": deployment, "failed": failed, "reason": reason,
                       **({"message": "The RayJob has passed the preRunningDeadlineSeconds."} if reason else {})}}


@pytest.fixture
def api():
    a = StandInApi()
    a.put({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "dapo-train-logs", "namespace": "ml"}})
    yield a
    a.close()


def guard(api: StandInApi) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dapo.cluster.start_guard", "--rayjob", "dapo-train", "--follower",
                             "dapo-train-logs", "--namespace", "ml", "--api-server", api.url, "--release", "dapo",
                             "--claim", "dapo-shared", "--poll", "0.05"], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def gets(api: StandInApi) -> int:
    return sum(1 for r in list(api.requests) if r.startswith("/apis/ray.io/v1/namespaces/ml/rayjobs/dapo-train"))


def settle(api: StandInApi, n: int = 3) -> None:
    want, end = gets(api) + n, time.monotonic() + 60
    while gets(api) < want:
        assert time.monotonic() < end, "the guard stopped looking"
        time.sleep(0.02)


def test_a_first_attempt_that_never_ran_is_stopped_instead_of_retried(api):
    names = [f"dapo-train-gpu-workers-worker-{i:02d}" for i in range(16)]
    api.put(rayjob("Initializing"))
    api.replace("Pod", [pod("dapo-train-head", phase="Running")] + [pod(n, phase="Running") for n in names[:15]]
                + [pod(names[15], scheduled=NO_GPUS)], "ml")
    proc = guard(api)
    settle(api)
    # KubeRay: PreRunningDeadlineExceeded, then checkBackoffLimitAndUpdateStatusIfNeeded -> Retrying (failed 1)
    api.put(rayjob("Retrying", failed=1, reason="PreRunningDeadlineExceeded"))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert api.deleted == ["/apis/ray.io/v1/namespaces/ml/rayjobs/dapo-train?propagationPolicy=Background",
                           "/apis/batch/v1/namespaces/ml/jobs/dapo-train-logs?propagationPolicy=Background"]
    assert ("start-guard: STOPPED: attempt 1 failed before it ran (Retrying, job -, 1 failed attempt(s) "
            "(PreRunningDeadlineExceeded: The RayJob has passed the preRunningDeadlineSeconds.))") in out
    assert f"start-guard: cause: pod {names[15]}: not scheduled: Unschedulable: 0/18 nodes are available" in out
    assert "next: fix the cause" in out and "the same `helm upgrade --install` again" in out


def test_a_run_that_starts_is_left_to_run(api):
    api.put(rayjob("Initializing"))
    proc = guard(api)
    settle(api)
    api.put(rayjob("Running"))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "the run started: RayJob dapo-train is Running" in out and not api.deleted


@pytest.mark.parametrize("status", [("Running", 0), ("Initializing", 1), ("Complete", 0), ("Suspended", 0)])
def test_a_run_that_started_or_ran_before_is_not_the_guards(api, status):
    """helm upgrade of a live or retrying run (post-upgrade): the guard exits at once and touches nothing."""
    api.put(rayjob(status[0], failed=status[1]))
    out, _ = guard(api).communicate(timeout=60)
    assert "nothing to guard" in out and not api.deleted


def test_the_guard_gets_its_job_and_least_rbac_only_without_a_queue():
    p = by_key(helm_objects(user_values(FULL)))
    for key in [("ServiceAccount", "dapo-train-start"), ("RoleBinding", "dapo-train-start")]:
        assert key in p, key
    assert p[("RoleBinding", "dapo-train-start")]["subjects"] == [
        {"kind": "ServiceAccount", "name": "dapo-train-start", "namespace": "ml"}]
    assert p[("RoleBinding", "dapo-train-start")]["roleRef"]["name"] == "dapo-train-start"
    job = p[("Job", "dapo-train-start")]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    assert job["spec"]["activeDeadlineSeconds"] == 1800 + 600
    spec = job["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["serviceAccountName"] == "dapo-train-start"
    (c,) = spec["containers"]
    assert c["command"] == ["python", "-m", "dapo.cluster.start_guard"]
    assert c["args"][:4] == ["--rayjob", "dapo-train", "--follower", "dapo-train-logs"]
    assert p[("Role", "dapo-train-start")]["rules"] == [
        {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "resourceNames": ["dapo-train"], "verbs": ["get", "delete"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "resourceNames": ["dapo-train-logs"], "verbs": ["delete"]},
        {"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["list"]}]
    queued = by_key(chart_objects(FULL, extra={"queue": {"scheduler": "kueue", "name": "dapo"}}))
    assert not [k for k in queued if k[1] == "dapo-train-start"]
    off = by_key(helm_objects(user_values(FULL, {"train": {"startGuard": False}})))
    assert not [k for k in off if k[1] == "dapo-train-start"]

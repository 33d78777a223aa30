"""`kubectl logs -f job/<release>-train-logs` explains every wait: the follower (python -m dapo.cluster.follow, a real
process) against a stand-in Kubernetes API server (k8s_support.JsonHandler) scripted through Pending on GPUs ->
ImagePullBackOff -> Running -> the driver's log. Each cause is printed once, then the driver's lines; the exit codes
are the run's; a run that fails before its driver started names the cause; without the permission to list pods and
events the follower says so once and goes on."""

from __future__ import annotations

import time
import urllib.parse
from datetime import datetime, timedelta, timezone

import pytest

import api_standin
from dapo.cluster.waits import pod_causes
from test_follow import finish, follower, stream_of, write_attempt

SELECTOR = ("app.kubernetes.io/instance=dapo,app.kubernetes.io/component in "
            "(train-head,train-worker,train-submitter)")
IMAGE = "registry.example.com/ml/dapo:0.1.0-verl0.9.1"
PULL = ('rpc error: code = NotFound desc = failed to pull and unpack image "registry.example.com/ml/dapo:0.1.0-verl0.9.1"'
        ": not found")
GPU = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available."


def pod(name: str, *, phase: str = "Pending", scheduled: str | None = None, waiting: dict | None = None,
        component: str | None = None) -> dict:
    status: dict = {"phase": phase, "conditions": []}
    if scheduled:
        status["conditions"].append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": scheduled})
    if waiting:
        status["containerStatuses"] = [{"name": "ray-worker", "image": IMAGE, "restartCount": 0,
                                        "state": {"waiting": waiting}}]
    elif phase == "Running":
        status["containerStatuses"] = [{"name": "ray-worker", "image": IMAGE, "state": {"running": {}}}]
    component = component or ("train-head" if "head" in name else "train-worker")
    return {"metadata": {"name": name, "labels": {"app.kubernetes.io/instance": "dapo",
                                                  "app.kubernetes.io/component": component}},
            "spec": {"containers": [{"name": "ray-worker", "image": IMAGE}]}, "status": status}


def warning(kind: str, name: str, reason: str, message: str, count: int = 1, type_: str = "Warning") -> dict:
    return {"metadata": {"name": f"{name}.{abs(hash((reason, message))):x}"}, "type": type_,
            "involvedObject": {"kind": kind, "name": name}, "reason": reason, "message": message, "count": count}


class StandInApi(api_standin.StandInApi):
    """The RayJob dapo-train, the pods of the chart's selector and the namespace's events in namespace ml."""

    @property
    def pods(self) -> list[dict]:
        return list(self.store.get(("/api/v1", "pods", "ml"), {}).values())

    @pods.setter
    def pods(self, pods: list[dict]) -> None:
        self.replace("Pod", pods, "ml")

    @property
    def events(self) -> list[dict]:
        return list(self.store.get(("/api/v1", "events", "ml"), {}).values())

    @events.setter
    def events(self, events: list[dict]) -> None:
        self.replace("Event", events, "ml")

    @property
    def selectors(self) -> list[str]:
        return [urllib.parse.parse_qs(r.partition("?")[2]).get("labelSelector", [""])[0] for r in self.requests
                if r.startswith("/api/v1/namespaces/ml/pods?")]

    def status(self, deployment: str, job: str = "", failed: int = 0) -> None:
        created = (datetime.now(timezone.utc) - timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.put({"apiVersion": "ray.io/v1", "kind": "RayJob",
                  "metadata": {"name": "dapo-train", "namespace": "ml", "uid": "u1", "creationTimestamp": created},
                  "spec": {"backoffLimit": 0},
                  "status": {"jobDeploymentStatus": deployment, "jobStatus": job, "failed": failed,
                             **({"reason": "DeadlineExceeded"} if deployment == "Failed" else {})}})


@pytest.fixture
def api():
    a = StandInApi()
    yield a
    a.close()


def start(log_dir, api):
    return follower(log_dir, "--rayjob", "dapo-train", "--namespace", "ml", "--api-server", api.url, "--release",
                    "dapo", "--kind", "train", "--claim", "dapo-shared", "--waits-every", "0.1")


def test_each_wait_is_explained_once_then_the_driver_log_follows(tmp_path, api):
    log_dir = tmp_path / "logs"
    api.status("Initializing")
    api.pods = [pod("dapo-train-head"), pod("dapo-train-worker-0", scheduled=GPU)]
    api.events = [warning("Pod", "dapo-train-worker-0", "FailedScheduling", GPU, 3),
                  warning("Pod", "someone-elses-pod", "FailedScheduling", "not ours"),
                  warning("Workload", "rayjob-dapo-train-3f2a1", "Pending", "couldn't assign flavors to pod set"),
                  warning("Workload", "rayjob-dapo-train-logs-1", "Pending", "not ours either"),
                  {**warning("Pod", "dapo-train-head", "Pulled", "ok"), "type": "Normal"}]
    proc = start(log_dir, api)
    time.sleep(1.5)  # ~15 looks at an unchanged cluster
    api.pods = [pod("dapo-train-head", waiting={"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{IMAGE}"'}),
                pod("dapo-train-worker-0", waiting={"reason": "ErrImagePull", "message": PULL})]
    api.events = [warning("Pod", "dapo-train-worker-0", "Failed", f"Failed to pull image \"{IMAGE}\": {PULL}")]
    time.sleep(1.5)
    api.status("Running", job="RUNNING")
    api.pods = [pod("dapo-train-head", phase="Running"), pod("dapo-train-worker-0", phase="Running")]
    api.events = []
    time.sleep(1.0)
    assert write_attempt(log_dir, "first", 0) == 0
    api.status("Complete", job="SUCCEEDED")
    rc, out, err = finish(proc)
    assert rc == 0, err
    assert out == stream_of(log_dir, [1]) + b"==> the run succeeded: attempt 1 exited with code 0 <==\n"
    waits = [line for line in err.splitlines() if line.startswith("[wait] ")]
    expected = [
        "[wait] RayJob dapo-train: Initializing, job -, 0 failed attempt(s)",
        f"[wait] pod dapo-train-worker-0 is not scheduled: Unschedulable: {GPU}",
        f"[wait] Pod dapo-train-worker-0: FailedScheduling: {GPU}",
        "[wait] Workload rayjob-dapo-train-3f2a1: Pending: couldn't assign flavors to pod set",
        f'[wait] pod dapo-train-head: container ray-worker ImagePullBackOff: image {IMAGE}: Back-off pulling image "{IMAGE}"',
        f"[wait] pod dapo-train-worker-0: container ray-worker ErrImagePull: image {IMAGE}: {PULL}",
        f'[wait] Pod dapo-train-worker-0: Failed: Failed to pull image "{IMAGE}": {PULL}',
        "[wait] RayJob dapo-train: Running, job RUNNING, 0 failed attempt(s)",
    ]
    assert waits == expected, "\n".join(waits)  # each once, in order; not the other pod's, not Normal events
    assert set(api.selectors) == {SELECTOR} and len(api.selectors) > 10


def test_a_run_that_fails_before_its_driver_started_exits_1_naming_the_cause(tmp_path, api):
    api.status("Initializing")
    api.pods = [pod("dapo-train-worker-0", waiting={"reason": "ErrImagePull", "message": PULL})]
    proc = start(tmp_path / "logs", api)
    time.sleep(1.0)
    api.status("Failed", job="", failed=1)  # preRunningDeadlineSeconds passed
    rc, out, err = finish(proc)
    assert rc == 1, err
    final = out.decode().strip().splitlines()[-1]
    assert final.startswith("==> the run failed: the RayJob is Failed, job -, 1 failed attempt(s) (DeadlineExceeded: )"
                            "; before its driver started: pod dapo-train-worker-0: container ray-worker ErrImagePull: "
                            f"image {IMAGE}: {PULL}"), final


def test_without_access_to_pods_the_follower_says_so_once_and_goes_on(tmp_path, api):
    log_dir = tmp_path / "logs"
    api.forbid("pods")
    api.status("Running", job="RUNNING")
    proc = start(log_dir, api)
    time.sleep(1.0)
    assert write_attempt(log_dir, "first", 0) == 0
    api.status("Complete", job="SUCCEEDED")
    rc, out, err = finish(proc)
    assert rc == 0, err
    assert out.endswith(b"==> the run succeeded: attempt 1 exited with code 0 <==\n")
    assert err.count("HTTP 403") == 1 and "may not list pods in namespace ml" in err
    assert "waits are not explained, the run's logs still are" in err


def test_a_crash_looping_init_container_is_named_with_its_last_lines():
    crash = {"metadata": {"name": "dapo-train-head"}, "spec": {}, "status": {
        "phase": "Pending",
        "initContainerStatuses": [{"name": "fix-ownership", "restartCount": 4,
                                   "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 2m40s"}},
                                   "lastState": {"terminated": {"exitCode": 1, "message":
                                                                "chown: /shared: Operation not permitted\n"}}}],
        "containerStatuses": [{"name": "ray-head", "state": {"waiting": {"reason": "PodInitializing"}}}]}}
    assert pod_causes(crash) == ["pod dapo-train-head: init container fix-ownership CrashLoopBackOff (exit code 1, 4 "
                                 "restarts); its last lines: chown: /shared: Operation not permitted"]
    assert pod_causes(pod("x", phase="Running")) == []


def test_the_chart_gives_the_follower_what_it_needs_to_explain_waits():
    from k8s_support import VALUES_DIR, by_key, helm_objects, python_objects, user_values

    files = [VALUES_DIR / "full.yaml"]
    extra = {"storage": {"fixOwnership": {"enabled": True}}}
    for objects in (helm_objects(user_values(files, extra)), python_objects(files, extra=extra)):
        objs = by_key(objects)
        follow = objs[("Job", "dapo-train-logs")]["spec"]["template"]["spec"]["initContainers"][0]
        args = follow["args"]
        assert args[args.index("--release"):] == ["--release", "dapo", "--kind", "train", "--claim", "dapo-shared"]
        head = objs[("RayJob", "dapo-train")]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        assert [c["name"] for c in head["initContainers"]][:2] == ["fix-ownership", "data-prepare"]
        assert all(c["terminationMessagePolicy"] == "FallbackToLogsOnError" for c in head["initContainers"])


def test_the_eval_follower_explains_the_eval_rayjobs_waits():
    from dapo.cluster.follow import build_parser
    from dapo.cluster.waits import Waits
    from k8s_support import VALUES_DIR, by_key, helm_objects, python_objects, user_values

    files = [VALUES_DIR / "full.yaml", VALUES_DIR / "eval.yaml"]
    for objects in (helm_objects(user_values(files), release="dapo-aime"), python_objects(files, release="dapo-aime")):
        follow = by_key(objects)[("Job", "dapo-aime-eval-logs")]["spec"]["template"]["spec"]["initContainers"][0]
        args = build_parser().parse_args(follow["args"])
        assert (args.rayjob, args.release, args.kind, args.claim) == ("dapo-aime-eval", "dapo-aime", "eval",
                                                                      "dapo-shared")
    waits = Waits(object(), release="dapo-aime", kind="eval")  # type: ignore[arg-type]
    assert waits.selector == ("app.kubernetes.io/instance=dapo-aime,app.kubernetes.io/component in "
                              "(eval-head,eval-worker,eval-submitter)")

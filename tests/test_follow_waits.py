"""`kubectl logs -f job/<release>-train-logs` names every cause: the follower (python -m dapo.cluster.follow, a real
process) against the suite's stand-in Kubernetes API server (api_standin.StandInApi) scripted through Pending on GPUs
-> ImagePullBackOff -> Running -> the driver's log, and through a bad first hour (16 workers without GPUs and an
autoscaler at its maximum, a rate-limited pull, an old driver, then an OOM-killed worker, a lost node and a preemption
while the driver runs). Each cause is printed once, one line however many pods share it, its decisive part kept;
then the driver's lines; the exit codes are the run's; a run that fails names its causes; without the permission to
list pods and events the follower says so once and goes on."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import urllib.parse
from datetime import datetime, timedelta, timezone

import pytest

import api_standin
from dapo.cluster.waits import Waits, decisive, pod_causes
from test_follow import ENV, finish, follower, stream_of, write_attempt

SELECTOR = ("app.kubernetes.io/instance=dapo,app.kubernetes.io/component in "
            "(train-head,train-worker,train-submitter)")
IMAGE = "registry.example.com/ml/dapo:0.1.0-verl0.9.1"
PULL = ('rpc error: code = NotFound desc = failed to pull and unpack image "registry.example.com/ml/dapo:0.1.0-verl0.9.1"'
        ": not found")
GPU = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available."
# the scheduler's and the cluster autoscaler's words (cluster-autoscaler 1.36.1, eventing_scale_up_processor.go and
# skippedreasons.go) on an 18-node cluster whose GPU node group is at its maximum
NO_GPUS = ("0/18 nodes are available: 2 node(s) had untolerated taint {node-role.kubernetes.io/system: }, 16 "
           "Insufficient nvidia.com/gpu. preemption: 0/18 nodes are available: 2 Preemption is not helpful for "
           "scheduling, 16 No preemption victims found for incoming pod.")
NOT_TRIGGERED = "pod didn't trigger scale-up: 1 max node group size reached"


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


def looks(api, n: int = 3, timeout: float = 60.0) -> None:
    """Wait until the follower has listed the pods ``n`` more times: it has seen what the stand-in now serves."""
    def count():
        return sum(1 for r in list(api.requests) if r.startswith("/api/v1/namespaces/ml/pods?"))
    want, end = count() + n, time.monotonic() + timeout
    while count() < want:
        assert time.monotonic() < end, "the follower stopped looking at the pods"
        time.sleep(0.05)


def serve(api, pods: list[dict], events: list[dict]) -> None:
    """The stand-in now serves ``pods``, then their ``events``. The follower lists the pods, then the events, so a
    look straddling two plain assignments can pair the old pods with the new events (an event ahead of its pod, a
    line the test does not expect: seen under load). So the events are cleared first, and the new ones served only
    after a look has listed the new pods: each look then sees the new pods with no events, or both."""
    api.events = []
    api.pods = pods
    looks(api, 1)
    api.events = events


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
    looks(api, 10)  # ten looks at an unchanged cluster
    serve(api, [pod("dapo-train-head", waiting={"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{IMAGE}"'}),
                pod("dapo-train-worker-0", waiting={"reason": "ErrImagePull", "message": PULL})],
          [warning("Pod", "dapo-train-worker-0", "Failed", f"Failed to pull image \"{IMAGE}\": {PULL}")])
    looks(api)
    api.status("Running", job="RUNNING")
    serve(api, [pod("dapo-train-head", phase="Running"), pod("dapo-train-worker-0", phase="Running")], [])
    looks(api)
    assert write_attempt(log_dir, "first", 0) == 0
    api.status("Complete", job="SUCCEEDED")
    rc, out, err = finish(proc)
    assert rc == 0, err
    assert out == stream_of(log_dir, [1]) + b"==> the run succeeded: attempt 1 exited with code 0 <==\n"
    waits = [line for line in err.splitlines() if line.startswith("[wait] ")]
    expected = [
        "[wait] RayJob dapo-train: Initializing, job -, 0 failed attempt(s)",
        f"[wait] pod dapo-train-worker-0: not scheduled: Unschedulable: {GPU}",  # its FailedScheduling event repeats it
        "[wait] Workload rayjob-dapo-train-3f2a1: Pending: couldn't assign flavors to pod set",
        f'[wait] pod dapo-train-head: container ray-worker ImagePullBackOff: image {IMAGE}: Back-off pulling image "{IMAGE}"',
        f"[wait] pod dapo-train-worker-0: container ray-worker ErrImagePull: image {IMAGE}: {PULL}",
        "[wait] RayJob dapo-train: Running, job RUNNING, 0 failed attempt(s)",
    ]
    assert waits == expected, "\n".join(waits)  # each once, in order; not the other pod's, not Normal noise
    assert set(api.selectors) == {SELECTOR} and len(api.selectors) > 10
    assert_the_role_grants_exactly(api.requests)


def asked(path: str) -> tuple[str, str, str, str]:
    """(API group, resource, verb, name or "") of one GET the follower sent, as the API server's RBAC reads it."""
    path, _, query = path.partition("?")
    parts = path.strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[parts.index("namespaces") + 2:]
    watch = urllib.parse.parse_qs(query).get("watch", [""])[0] in ("1", "true")
    verb = "watch" if watch else ("get" if len(rest) == 2 else "list")
    return group, rest[0], verb, rest[1] if len(rest) == 2 else ""


def assert_the_role_grants_exactly(requests: list[str]) -> None:
    """Every request the follower made is allowed by the follower's Role as the chart renders it, and the Role allows
    no verb on no resource that the follower did not use: its text says what it reads."""
    from k8s_support import VALUES_DIR, by_key, helm_objects, user_values

    used = {asked(r) for r in requests}
    files = [VALUES_DIR / "full.yaml"]
    # the follower as it only reads: what it does between attempts (train.retries) adds its own grants, which
    # tests/test_keeper.py checks against what that follower sends
    reads = {"train": {"retries": {"leaveOutNodes": {"enabled": False}, "failureBudget": {"enabled": False},
                                   "heartbeatTimeoutSeconds": 0}}}
    objects = helm_objects(user_values(files, reads), namespace="ml")
    rules = by_key(objects)[("Role", "dapo-logs")]["rules"]
    granted = {(g, res, verb, name) for r in rules for g in r["apiGroups"] for res in r["resources"]
               for verb in r["verbs"] for name in r.get("resourceNames") or [""]}
    assert used <= granted, used - granted
    # names the Role allows for a run it does not follow here (dapo-eval) aside, all of it was used
    assert {(g, res, verb) for g, res, verb, _ in granted} == {(g, res, verb) for g, res, verb, _ in used}, \
        (granted, used)


def test_a_run_that_fails_before_its_driver_started_exits_1_naming_the_cause(tmp_path, api):
    api.status("Initializing")
    api.pods = [pod("dapo-train-worker-0", waiting={"reason": "ErrImagePull", "message": PULL})]
    proc = start(tmp_path / "logs", api)
    looks(api)
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
    deadline = time.monotonic() + 60
    while not any(r.startswith("/api/v1/namespaces/ml/pods?") for r in list(api.requests)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert write_attempt(log_dir, "first", 0) == 0
    api.status("Complete", job="SUCCEEDED")
    rc, out, err = finish(proc)
    assert rc == 0, err
    assert out.endswith(b"==> the run succeeded: attempt 1 exited with code 0 <==\n")
    assert err.count("HTTP 403") == 1 and "may not list pods in namespace ml" in err
    assert "waits are not explained, the run's logs still are" in err


def lines(pods: list[dict], events: list[dict] = (), running: bool = False) -> list[str]:
    """What one look at ``pods`` and ``events`` prints (dapo.cluster.waits, no server)."""
    class Api:
        name = "dapo-train"

        def list_json(self, resource, query=""):
            return list(pods) if resource == "pods" else list(events)
    return Waits(Api(), release="dapo", kind="train", claim="dapo-shared").poll(running=running)[0]


def test_a_crash_looping_init_container_is_named_with_its_last_lines():
    crash = {"metadata": {"name": "dapo-train-head"}, "spec": {}, "status": {
        "phase": "Pending",
        "initContainerStatuses": [{"name": "fix-ownership", "restartCount": 4,
                                   "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 2m40s"}},
                                   "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message":
                                                                "chown: /shared: Operation not permitted\n"}}}],
        "containerStatuses": [{"name": "ray-head", "state": {"waiting": {"reason": "PodInitializing"}}}]}}
    assert lines([crash]) == ["pod dapo-train-head: init container fix-ownership CrashLoopBackOff (Error code 1, 4 "
                              "restarts); its last lines: chown: /shared: Operation not permitted"]
    assert pod_causes(pod("x", phase="Running")) == []


# A registry's rate limit as containerd reports it (the shape of kata-containers/kata-containers#10109 and
# namespacelabs/foundation#846), from a registry with a long name: the status code comes after ~400 characters.
REGISTRY = "123456789012.dkr.ecr.us-east-1.amazonaws.com/ml/dapo"
RATE_LIMITED = (f'Failed to pull image "{REGISTRY}:0.1.0-verl0.9.1": rpc error: code = Unknown desc = failed to pull and unpack image "{REGISTRY}:0.1.0-verl0.9.1": failed to '
                f"copy: httpReadSeeker: failed open: unexpected status code https://123456789012.dkr.ecr.us-east-1."
                f"amazonaws.com/v2/ml/dapo/blobs/sha256:{'9f3a' * 16}: 429 Too Many Requests - Server message: "
                "toomanyrequests: You have reached your pull rate limit. You may increase the limit by authenticating "
                "and upgrading: https://www.docker.com/increase-rate-limit")


def test_a_long_message_keeps_its_status_code_and_its_root_cause():
    assert RATE_LIMITED.index("429") > 400  # where the old 400-character cut dropped it
    short = decisive(RATE_LIMITED)
    assert "429 Too Many Requests" in short and short.endswith("https://www.docker.com/increase-rate-limit")
    assert short.startswith(f'Failed to pull image "{REGISTRY}') and len(short) <= 320
    assert "sha256:9f3a9f3a9f3a..." in decisive("blob sha256:" + "9f3a" * 16)  # a digest: its first 12 characters
    middle = "x" * 300 + " 503 Service Unavailable " + "y" * 300
    assert "503 Service Unavailable" in decisive(middle)


def test_one_cause_over_sixteen_pods_is_one_line_and_the_autoscalers_word_is_read():
    pending = [pod(f"dapo-train-gpu-workers-worker-{i:02d}", scheduled=NO_GPUS) for i in range(16)]
    events = [warning("Pod", p["metadata"]["name"], "FailedScheduling", NO_GPUS, 4) for p in pending]
    events += [warning("Pod", p["metadata"]["name"], "NotTriggerScaleUp", NOT_TRIGGERED, 9, type_="Normal")
               for p in pending]
    events += [warning("Pod", "dapo-train-head", "Scheduled", "Successfully assigned ml/dapo-train-head to n1",
                       type_="Normal")]
    assert lines(pending, events) == [f"16 worker pods: not scheduled: Unschedulable: {NO_GPUS}",
                                      f"16 worker pods: NotTriggerScaleUp: {NOT_TRIGGERED}"]


def test_what_ended_a_container_and_what_removes_a_pod_are_named():
    oom = pod("dapo-train-gpu-workers-worker-03", phase="Running")
    oom["status"]["containerStatuses"][0].update(restartCount=1, lastState={"terminated": {
        "reason": "OOMKilled", "exitCode": 137}})
    lost = pod("dapo-train-gpu-workers-worker-07", phase="Running")
    lost["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                                         "message": "Taint manager: deleting due to NoExecute taint"})
    evicted = pod("dapo-train-gpu-workers-worker-11", phase="Failed")
    evicted["status"].update(reason="Evicted", message="The node was low on resource: memory.")
    got = lines([oom, lost, evicted], [warning("Pod", "dapo-train-gpu-workers-worker-07", "TaintManagerEviction",
                                               "Marking for deletion Pod ml/dapo-train-gpu-workers-worker-07",
                                               type_="Normal")], running=True)
    assert got == [
        "pod dapo-train-gpu-workers-worker-03: container ray-worker restarted (1x), last ended OOMKilled exit code 137",
        "pod dapo-train-gpu-workers-worker-07: being removed: DeletionByTaintManager: Taint manager: deleting due to "
        "NoExecute taint",  # its TaintManagerEviction event repeats it
        "pod dapo-train-gpu-workers-worker-11: failed: Evicted The node was low on resource: memory.",
    ]
    # while a driver runs, a pod that merely waits is no news
    assert lines([pod("dapo-train-gpu-workers-worker-12", scheduled=NO_GPUS)], running=True) == []


# A driver that prints a step, then waits for the stand-in's cue and dies as a run does when its workers are lost.
DRIVER = textwrap.dedent("""
    import os, sys, time
    from dapo.train.runlog import run_logged

    def driver():
        print("step 1/320 | score 0.12", flush=True)
        while not os.path.exists(sys.argv[2]):
            time.sleep(0.05)
        print("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.", flush=True)
        return 1

    sys.exit(run_logged(sys.argv[1], driver, header="dapo train (bad hour)", prog="driver"))
""")


def test_a_bad_first_hour_names_every_cause_in_at_most_15_lines_and_exits_1(tmp_path, api):
    """The issue's hour: 16 workers wait for GPUs on an 18-node cluster whose autoscaler is at its maximum; then one
    worker's pull is rate-limited and another node's driver is too old; the driver starts; a worker is OOM-killed,
    a node is lost, a worker is preempted; the attempt fails. Every cause is named, one line each, and the run's last
    line names the disruptions."""
    log_dir, cue = tmp_path / "logs", tmp_path / "cue"
    names = [f"dapo-train-gpu-workers-worker-{i:02d}" for i in range(16)]
    api.status("Initializing")
    api.pods = [pod("dapo-train-head", phase="Running")] + [pod(n, scheduled=NO_GPUS) for n in names]
    api.events = ([warning("Pod", n, "FailedScheduling", NO_GPUS, 12) for n in names]
                  + [warning("Pod", n, "NotTriggerScaleUp", NOT_TRIGGERED, 30, type_="Normal") for n in names]
                  + [warning("Pod", "dapo-train-head", "Pulled", "Successfully pulled image", type_="Normal")])
    proc = start(log_dir, api)
    looks(api, 5)
    # the group's maximum raised: 14 workers run, one pull is rate-limited, one node's driver is too old
    hook = ("Exec lifecycle hook ([python -m dapo.cluster.gpu_check --min-driver 580]) for Container \"ray-worker\" in "
            f"Pod \"{names[15]}_ml\" failed - error: command 'python -m dapo.cluster.gpu_check --min-driver 580' exited "
            "with 1, message: \"gpu_check: NVIDIA driver 550.54.15 is too old: this image's CUDA 13 needs driver >= 580\"")
    crash = pod(names[15], waiting={"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"})
    crash["status"]["containerStatuses"][0].update(restartCount=2, lastState={"terminated": {"reason": "Error",
                                                                                             "exitCode": 137}})
    serve(api, ([pod("dapo-train-head", phase="Running")] + [pod(n, phase="Running") for n in names[:14]]
                + [pod(names[14], waiting={"reason": "ErrImagePull", "message": RATE_LIMITED}), crash]),
          [warning("Pod", n, "TriggeredScaleUp", "pod triggered scale-up: [{eks-p5-a 2->16 (max: 16)}]",
                   type_="Normal") for n in names[:14]]
          + [warning("Pod", names[14], "Failed", RATE_LIMITED, 3),
             warning("Pod", names[15], "FailedPostStartHook", hook, 2)])
    looks(api, 5)
    # fixed: every pod runs, the driver starts
    api.status("Running", job="RUNNING")
    serve(api, [pod("dapo-train-head", phase="Running")] + [pod(n, phase="Running") for n in names], [])
    looks(api)
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(log_dir), str(cue)], env=ENV)
    deadline = time.monotonic() + 60
    while not list(log_dir.glob("attempt-*.log")):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    looks(api)
    # while it runs: an OOM-killed worker, a lost node, a preemption
    oom = pod(names[3], phase="Running")
    oom["status"]["containerStatuses"][0].update(restartCount=1, lastState={"terminated": {"reason": "OOMKilled",
                                                                                           "exitCode": 137}})
    lost, preempted = pod(names[7], phase="Running"), pod(names[9], phase="Running")
    lost["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                         "reason": "DeletionByTaintManager",
                                         "message": "Taint manager: deleting due to NoExecute taint"})
    serve(api, [pod("dapo-train-head", phase="Running")] + [
        {3: oom, 7: lost, 9: preempted}.get(i) or pod(n, phase="Running") for i, n in enumerate(names)],
          [warning("Pod", names[7], "TaintManagerEviction", f"Marking for deletion Pod ml/{names[7]}",
                   type_="Normal"),
           warning("Pod", names[9], "Preempted", "Preempted by pod 3f0c2a1e-5b6d-4c7e-8f9a-0b1c2d3e4f5a on "
                   "node ip-10-0-7-9.ec2.internal", type_="Normal")])
    looks(api, 5)
    cue.touch()
    assert driver.wait(timeout=60) == 1
    api.status("Failed", job="FAILED", failed=1)
    rc, out, err = finish(proc)
    assert rc == 1, err
    said = [line for line in err.splitlines() if line.startswith(("[wait] ", "[cluster] "))]
    assert len(said) <= 15, "\n".join(said)
    text = "\n".join(said)
    for cause in ("16 worker pods: not scheduled: Unschedulable: 0/18 nodes are available",
                  "16 worker pods: NotTriggerScaleUp: pod didn't trigger scale-up: 1 max node group size reached",
                  "14 worker pods: TriggeredScaleUp",
                  f"pod {names[14]}: container ray-worker ErrImagePull: image", "429 Too Many Requests",
                  f"pod {names[15]}: FailedPostStartHook:", "NVIDIA driver 550.54.15 is too old",
                  f"pod {names[15]}: container ray-worker CrashLoopBackOff (Error code 137, 2 restarts)",
                  "RayJob dapo-train: Running",
                  f"[cluster] pod {names[3]}: container ray-worker restarted (1x), last ended OOMKilled exit code 137",
                  f"[cluster] pod {names[7]}: being removed: DeletionByTaintManager",
                  f"[cluster] pod {names[9]}: Preempted: Preempted by pod"):
        assert cause in text, (cause, text)
    final = out.decode().strip().splitlines()[-1]
    assert final.startswith("==> the run failed: the RayJob is Failed, job FAILED, 1 failed attempt(s)"), final
    for cause in ("while its last attempt ran", "OOMKilled", "DeletionByTaintManager", "Preempted"):
        assert cause in final, (cause, final)


def test_the_chart_gives_the_follower_what_it_needs_to_explain_waits():
    from k8s_support import VALUES_DIR, by_key, helm_objects, user_values

    files = [VALUES_DIR / "full.yaml"]
    extra = {"storage": {"fixOwnership": {"enabled": True}}}
    objects = helm_objects(user_values(files, extra))
    objs = by_key(objects)
    follow = objs[("Job", "dapo-train-logs")]["spec"]["template"]["spec"]["initContainers"][0]
    args = follow["args"]
    i = args.index("--release")
    assert args[i:i + 6] == ["--release", "dapo", "--kind", "train", "--claim", "dapo-shared"]
    head = objs[("RayJob", "dapo-train")]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert [c["name"] for c in head["initContainers"]][:2] == ["fix-ownership", "data-prepare"]
    assert all(c["terminationMessagePolicy"] == "FallbackToLogsOnError" for c in head["initContainers"])


def test_the_eval_follower_explains_the_eval_rayjobs_waits():
    from dapo.cluster.follow import build_parser
    from dapo.cluster.waits import Waits
    from k8s_support import VALUES_DIR, by_key, helm_objects, user_values

    files = [VALUES_DIR / "full.yaml", VALUES_DIR / "eval.yaml"]
    objects = helm_objects(user_values(files), release="dapo-aime")
    follow = by_key(objects)[("Job", "dapo-aime-eval-logs")]["spec"]["template"]["spec"]["initContainers"][0]
    args = build_parser().parse_args(follow["args"])
    assert (args.rayjob, args.release, args.kind, args.claim) == ("dapo-aime-eval", "dapo-aime", "eval",
                                                                  "dapo-shared")
    waits = Waits(object(), release="dapo-aime", kind="eval")  # type: ignore[arg-type]
    assert waits.selector == ("app.kubernetes.io/instance=dapo-aime,app.kubernetes.io/component in "
                              "(eval-head,eval-worker,eval-submitter)")


def _oom(name: str) -> dict:
    p = pod(name, phase="Running")
    p["status"]["containerStatuses"][0].update(restartCount=1, lastState={"terminated": {"reason": "OOMKilled",
                                                                                         "exitCode": 137}})
    return p


def _lost(name: str) -> dict:
    p = pod(name, phase="Running")
    p["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                                      "message": "Taint manager: deleting due to NoExecute taint"})
    return p


def test_a_failed_run_names_its_last_attempts_disruptions_not_an_earlier_attempts(tmp_path, api):
    """Three attempts, each on a new RayCluster (KubeRay's retry): a worker OOM-killed in attempt 1, a node lost in
    attempt 2, a worker OOM-killed again in attempt 3. The run's last line names attempt 3's cause, the OOM kill
    -- printed again although attempt 1 had the same one -- and not attempt 2's lost node."""
    log_dir = tmp_path / "logs"
    api.status("Running", job="RUNNING")
    api.pods = [pod("dapo-train-a1b2c-head", phase="Running")]
    proc = start(log_dir, api)
    for n, (cluster, disrupt) in enumerate([("a1b2c", _oom), ("d3e4f", _lost), ("g5h6k", _oom)], 1):
        workers = [f"dapo-train-{cluster}-gpu-workers-worker-{i}" for i in range(2)]
        serve(api, [pod(f"dapo-train-{cluster}-head", phase="Running")] + [pod(w, phase="Running") for w in workers],
              [])
        looks(api)
        cue = tmp_path / f"cue-{n}"
        driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(log_dir), str(cue)], env=ENV)
        deadline = time.monotonic() + 60
        while not (log_dir / f"attempt-{n}.log").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        looks(api, 5)  # the follower prints attempt n now
        serve(api, [pod(f"dapo-train-{cluster}-head", phase="Running"), pod(workers[0], phase="Running"),
                    disrupt(workers[1])], [])
        looks(api, 5)
        cue.touch()
        assert driver.wait(timeout=60) == 1
        api.status("Failed" if n == 3 else "Running", job="FAILED" if n == 3 else "RUNNING", failed=n)
    rc, out, err = finish(proc)
    assert rc == 1, err
    said = [line for line in err.splitlines() if line.startswith("[cluster] ")]
    assert sum("OOMKilled" in line for line in said) == 2 and sum("DeletionByTaintManager" in line for line in said) \
        == 1, "\n".join(said)
    final = out.decode().strip().splitlines()[-1]
    assert final.startswith("==> the run failed: the RayJob is Failed, job FAILED, 3 failed attempt(s)"), final
    assert "while its last attempt ran: pod dapo-train-g5h6k-gpu-workers-worker-1: container ray-worker restarted " \
           "(1x), last ended OOMKilled exit code 137" in final, final
    assert "DeletionByTaintManager" not in final and "a1b2c" not in final, final
    assert "before its driver started" not in final, final  # every attempt's driver ran


PREEMPTORS = {18: "3f0c2a1e-5b6d-4c7e-8f9a-0b1c2d3e4f5a", 20: "ab7d4e2f-c1d2-4e3f-a4b5-c6d7e8f9a0b1",
              22: "c1a8f03d-9e8d-4c7b-b6a5-f4e3d2c1b0a9"}  # the preemptor: another uid each time


def test_a_cause_whose_numbers_change_is_printed_once_and_a_new_cause_at_once(tmp_path, api):
    """The same wait read again and again with its numbers moving -- the scheduler's node counts as the autoscaler
    adds nodes, the autoscaler's group sizes, the preemptor's uid -- is one cause, printed once; a cause in other
    words (the pull failing) is printed as soon as it appears."""
    names = [f"dapo-train-gpu-workers-worker-{i:02d}" for i in range(4)]
    api.status("Initializing")
    proc = start(tmp_path / "logs", api)
    for nodes in (18, 20, 22):
        msg = NO_GPUS.replace("0/18", f"0/{nodes}").replace("16 Insufficient", f"{nodes - 2} Insufficient")
        serve(api, [pod("dapo-train-head", phase="Running")] + [pod(n, scheduled=msg) for n in names],
              [warning("Pod", n, "TriggeredScaleUp", f"pod triggered scale-up: [{{eks-p5-a {nodes - 2}->{nodes} "
                       f"(max: {nodes + 2})}}]", type_="Normal") for n in names]
              + [warning("Pod", "dapo-train-head", "Preempted", f"Preempted by pod {uid} on node "
                         f"ip-10-0-7-{nodes}.ec2.internal", type_="Normal")
                 for uid in [PREEMPTORS[nodes]]])
        looks(api, 3)
    serve(api, [pod("dapo-train-head", phase="Running")] + [pod(n, waiting={"reason": "ErrImagePull", "message": PULL})
                                                            for n in names], [])
    looks(api, 3)
    api.status("Failed", job="", failed=1)
    rc, out, err = finish(proc)
    assert rc == 1, err
    said = [line for line in err.splitlines() if line.startswith("[wait] ") and "RayJob" not in line]
    assert said == [
        f"[wait] 4 worker pods: not scheduled: Unschedulable: {NO_GPUS}",
        "[wait] 4 worker pods: TriggeredScaleUp: pod triggered scale-up: [{eks-p5-a 16->18 (max: 20)}]",
        f"[wait] pod dapo-train-head: Preempted: Preempted by pod {PREEMPTORS[18]} on node "
        "ip-10-0-7-18.ec2.internal",
        f"[wait] 4 worker pods: container ray-worker ErrImagePull: image {IMAGE}: {PULL}",
    ], "\n".join(said)

"""The log follower Jobs of the chart (logs.enabled), from the rendered objects: each follows the directory its
RayJob's driver really writes (computed as the driver computes it, not copied from the template), reads only the
status of that RayJob (the least RBAC: get, by name) -- and acts on the training one only as train.retries asks --,
runs non-root on a read-only root filesystem with the claim read-only but for the follower that acts, and its
rendered command line is one the follower accepts."""

from __future__ import annotations

import shlex

import pytest

from dapo.config import load_preset, split_overrides
from dapo.train.cli import build_parser as train_parser
from dapo.train.cli import run_dir_of
from dapo.cluster.follow import build_parser as follow_parser
from k8s_support import VALUES_DIR, by_key, chart_objects, helm_objects, render_script, set_files, user_values

SETS = sorted(render_script().RENDER_SETS)


def driver_log_dir(rayjob: dict) -> str:
    """Where the RayJob's driver writes attempt-<N>.log, from its entrypoint, as the driver itself decides."""
    argv = shlex.split(rayjob["spec"]["entrypoint"])
    if argv[:3] == ["python", "-m", "dapo.train"]:  # dapo.train.cli: <run dir>/logs
        args = train_parser().parse_args(argv[3:])
        ours, _ = split_overrides(args.overrides)
        return str(run_dir_of(load_preset(args.preset.rsplit("/", 1)[-1].removesuffix(".yaml"), ours), args) / "logs")
    if argv[:3] == ["python3", "-m", "dapo.reference.attempt_log"]:  # the reference runner's --log-dir
        return argv[argv.index("--log-dir") + 1]
    assert argv[:3] == ["dapo", "eval", "run"], argv  # dapo.eval.cli: <output>/logs
    return argv[argv.index("--output") + 1].rstrip("/") + "/logs"


@pytest.mark.parametrize("name", SETS)
def test_every_rayjob_has_a_follower_of_the_directory_its_driver_writes(name):
    files, release = set_files(name)
    objects = by_key(chart_objects(files, release=release))
    rayjobs = [o for (kind, _), o in objects.items() if kind == "RayJob"]
    assert rayjobs
    for rayjob in rayjobs:
        job = objects[("Job", rayjob["metadata"]["name"] + "-logs")]
        pod = job["spec"]["template"]["spec"]
        (follow,) = pod["initContainers"]
        argv = follow["command"] + follow["args"]
        assert argv[:3] == ["python", "-m", "dapo.cluster.follow"]
        args = follow_parser().parse_args(argv[3:])
        assert str(args.log_dir) == driver_log_dir(rayjob)
        assert args.rayjob == rayjob["metadata"]["name"] and args.backoff_limit == rayjob["spec"]["backoffLimit"]
        assert args.sidecar and str(args.state_dir) == "/state"
        head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        assert follow["image"] == head["containers"][0]["image"]  # already on the nodes that ran the head
        # read-only, but for a follower that acts between attempts (it writes its answers and failures.json)
        writes = bool(args.leave_out_nodes or args.max_failures is not None or args.heartbeat_timeout)
        # the reference recipe records no end
        ours = shlex.split(rayjob["spec"]["entrypoint"])[:3] != ["python3", "-m", "dapo.reference.attempt_log"]
        assert writes == rayjob["metadata"]["name"].endswith("-train")
        assert ("DAPO_ACK_TIMEOUT_S" in rayjob["spec"].get("runtimeEnvYAML", "")) == (writes and ours), \
            "the driver waits for answers iff one comes"
        (shared,) = [v for v in head["volumes"] if v["name"] == "shared"]
        (claim,) = [v for v in pod["volumes"] if v["name"] == "shared"]
        assert claim["persistentVolumeClaim"] == {**shared["persistentVolumeClaim"], "readOnly": not writes}
        (mount,) = [m for m in head["containers"][0]["volumeMounts"] if m["name"] == "shared"]
        assert {"name": "shared", "mountPath": mount["mountPath"], "readOnly": not writes} in follow["volumeMounts"]


def test_the_follower_reads_its_rayjobs_lists_pods_and_events_and_acts_only_on_the_training_run_non_root():
    values = user_values([VALUES_DIR / "full.yaml"], {"eval": {"enabled": True}})
    objects = by_key(helm_objects(values, release="dapo", namespace="ml"))
    role = objects[("Role", "dapo-logs")]
    # get on its RayJobs; list on the namespace's pods and events (why a run waits; tests/test_follow_waits.py proves
    # these are exactly the requests the follower makes); and, between the training run's attempts (train.retries,
    # tests/test_keeper.py), patch and delete on that one RayJob and delete on pods (a frozen driver's)
    assert role["rules"] == [{"apiGroups": ["ray.io"], "resources": ["rayjobs"],
                              "resourceNames": ["dapo-train", "dapo-eval"], "verbs": ["get"]},
                             {"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["list"]},
                             {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "resourceNames": ["dapo-train"],
                              "verbs": ["patch", "delete"]},
                             {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}]
    binding = objects[("RoleBinding", "dapo-logs")]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "dapo-logs"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "dapo-logs", "namespace": "ml"}]
    assert ("ServiceAccount", "dapo-logs") in objects
    for kind in ("train", "eval"):
        job = objects[("Job", f"dapo-{kind}-logs")]
        template = job["spec"]["template"]
        pod = template["spec"]
        assert pod["serviceAccountName"] == "dapo-logs" and pod["restartPolicy"] == "Never"
        # `kubectl logs job/...` shows the follower, a native sidecar restarted in place (keeping /state)
        assert template["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] == "follow"
        assert pod["initContainers"][0]["name"] == "follow" and pod["initContainers"][0]["restartPolicy"] == "Always"
        for c in pod["initContainers"] + pod["containers"]:
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert not any("valueFrom" in e and "secretKeyRef" in e["valueFrom"] for e in c.get("env", []))
            assert c["resources"]["limits"]["memory"] == "96Mi" and c["resources"]["requests"]["cpu"] == "10m"
        # the claim is written only by the training follower (its answers, failures.json, the end record of an
        # attempt it ended)
        assert all(m.get("readOnly") == (kind == "eval") for c in pod["initContainers"] + pod["containers"]
                   for m in c["volumeMounts"] if m["name"] == "shared")
        # the main container's exit codes that end the Job at once: the run failed (1), a usage error (2)
        rules = job["spec"]["podFailurePolicy"]["rules"]
        assert rules[0] == {"action": "FailJob", "onExitCodes": {"containerName": "result", "operator": "In",
                                                                 "values": [1, 2]}}
        assert rules[1]["action"] == "Ignore" and rules[1]["onPodConditions"][0]["type"] == "DisruptionTarget"


def test_logs_disabled_leaves_no_follower_and_no_rbac():
    extra = {"logs": {"enabled": False}, "storage": {"storageClassName": "rwx-class"}}
    objects = helm_objects(user_values([VALUES_DIR / "full.yaml"], extra))
    kinds = {o["kind"] for o in objects if o["metadata"]["name"] not in ("dapo-preflight", "dapo-train-start")}
    assert not kinds & {"Job", "Role", "RoleBinding", "ServiceAccount"}, kinds
    guard = [o for o in objects if o["metadata"]["name"] == "dapo-train-start"]  # no follower Job to delete
    role = next(o for o in guard if o["kind"] == "Role")
    assert not [r for r in role["rules"] if r["resources"] == ["jobs"]]

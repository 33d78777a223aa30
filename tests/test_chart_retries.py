"""The chart's side of what the log follower does between attempts (train.retries) and of the evidence the Ray
pods leave (train.evidence), from the objects Helm renders: each part on gives the
training follower exactly its options (parsed by the follower itself) and its Role exactly the permissions that part
needs, each part off takes both away; the driver waits for answers only when one comes; the training pods copy
their logs into the run's directory -- the one the follower reads -- before `ray stop`, within their grace period."""

from __future__ import annotations

import copy
import shlex

import pytest

from dapo.cluster import keeper
from dapo.cluster.evidence import build_parser as evidence_parser
from dapo.cluster.follow import build_parser as follow_parser
from k8s_support import RWX, by_key, chart_objects, objects_by_key, ray_pod_templates, render_script
from k8s_support import set_files
from test_chart_ops import refused

SETS = sorted(render_script().RENDER_SETS)
ON = {"leaveOutNodes": {"enabled": True, "max": 4},
      "failureBudget": {"enabled": True, "maxFailures": 6, "windowHours": 24, "sameCauseInARow": 3},
      "heartbeatTimeoutSeconds": 600}
CASES = {
    "all-on": {},
    "no-leave-out": {"leaveOutNodes": {"enabled": False}},
    "no-budget": {"failureBudget": {"enabled": False}},
    "no-heartbeat": {"heartbeatTimeoutSeconds": 0},
    "all-off": {"leaveOutNodes": {"enabled": False}, "failureBudget": {"enabled": False},
                "heartbeatTimeoutSeconds": 0},
}


def _merged(case):
    out = copy.deepcopy(ON)
    for k, v in CASES[case].items():
        out[k] = {**out[k], **v} if isinstance(v, dict) else v
    return out


def follower_of(objects):
    job = objects[("Job", "dapo-train-logs")]
    (follow,) = job["spec"]["template"]["spec"]["initContainers"]
    return job, follow_parser().parse_args(follow["args"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_part_gives_the_follower_its_option_and_its_role_only_what_that_part_needs(case):
    values = {**RWX, "train": {"retries": CASES[case]}}
    p = objects_by_key(values)
    r = _merged(case)
    _, args = follower_of(p)
    k = keeper.from_args(args, api=object(), selector="s")  # what the follower would do with these options
    acts = r["leaveOutNodes"]["enabled"] or r["failureBudget"]["enabled"] or r["heartbeatTimeoutSeconds"] > 0
    assert (k is not None) == acts
    assert args.status_every == (5 if acts else 15)  # a retry KubeRay builds in seconds: read its status often
    if k is not None:
        assert k.leave_out == (4 if r["leaveOutNodes"]["enabled"] else 0)
        assert (k.budget is not None) == r["failureBudget"]["enabled"]
        if k.budget:
            assert (k.budget.max_failures, k.budget.window_s, k.budget.same_cause) == (6, 24 * 3600, 3)
        assert k.heartbeat_s == r["heartbeatTimeoutSeconds"]
    rules = p[("Role", "dapo-logs")]["rules"]
    acting = [rule for rule in rules if set(rule["verbs"]) - {"get", "list"}]
    verbs = {v for rule in acting if rule["resources"] == ["rayjobs"] for v in rule["verbs"]}
    assert verbs == ({"patch"} if r["leaveOutNodes"]["enabled"] or r["failureBudget"]["enabled"] else set()) | \
        ({"delete"} if r["failureBudget"]["enabled"] else set())
    assert all(rule.get("resourceNames") == ["dapo-train"] for rule in acting if rule["resources"] == ["rayjobs"])
    assert any(rule == {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]} for rule in acting) == \
        (r["heartbeatTimeoutSeconds"] > 0)
    env = p[("RayJob", "dapo-train")]["spec"]["runtimeEnvYAML"]
    assert ('"DAPO_ACK_TIMEOUT_S": "180"' in env) == acts  # the driver waits only for an answer that comes
    pod = p[("Job", "dapo-train-logs")]["spec"]["template"]["spec"]
    (claim,) = [v for v in pod["volumes"] if v["name"] == "shared"]
    assert claim["persistentVolumeClaim"]["readOnly"] == (not acts)


def test_without_the_follower_nothing_acts_and_the_driver_does_not_wait():
    p = objects_by_key({**RWX, "logs": {"enabled": False}})
    assert ("Role", "dapo-logs") not in p
    assert "DAPO_ACK_TIMEOUT_S" not in p[("RayJob", "dapo-train")]["spec"]["runtimeEnvYAML"]


@pytest.mark.parametrize("name", SETS)
def test_the_training_pods_copy_their_logs_into_the_runs_directory_before_ray_stop(name):
    files, release = set_files(name)
    objects = by_key(chart_objects(files, release=release))
    for rayjob in (o for o in objects.values() if o["kind"] == "RayJob"):
        train = rayjob["metadata"]["name"].endswith("-train")
        follow = objects[("Job", rayjob["metadata"]["name"] + "-logs")]
        log_dir = follow_parser().parse_args(follow["spec"]["template"]["spec"]["initContainers"][0]["args"]).log_dir
        for role, template in ray_pod_templates(rayjob):
            (container,) = [c for c in template["spec"]["containers"] if c["name"].startswith("ray-")]
            sh, dash_c, script = container["lifecycle"]["preStop"]["exec"]["command"]
            assert (sh, dash_c) == ("/bin/sh", "-c")
            *copy_cmd, stop = script.split("; ")
            assert stop == "ray stop", (role, script)
            if not train:
                assert not copy_cmd and "terminationGracePeriodSeconds" not in template["spec"]
                continue
            argv = shlex.split(copy_cmd[0])
            assert argv[:3] == ["python", "-m", "dapo.cluster.evidence"], script
            args = evidence_parser().parse_args(argv[3:])
            assert args.log_dir == log_dir  # the attempts the follower reads: evidence/attempt-<N> beside them
            assert args.seconds < template["spec"]["terminationGracePeriodSeconds"]  # and `ray stop` after it


def test_evidence_off_stops_ray_only_and_keeps_kubernetes_grace_period():
    p = objects_by_key({**RWX, "train": {"evidence": {"enabled": False}}})
    for role, template in ray_pod_templates(p[("RayJob", "dapo-train")]):
        assert template["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-1] == "ray stop"
        assert "terminationGracePeriodSeconds" not in template["spec"]


def test_a_copy_that_cannot_end_within_the_grace_period_is_refused():
    refused({**RWX, "train": {"evidence": {"seconds": 60, "terminationGracePeriodSeconds": 60}}},
            "train.evidence.seconds: the copy of the logs (60 s) must end within "
            "train.evidence.terminationGracePeriodSeconds (60 s)")

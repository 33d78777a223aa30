"""The preflight Job (the chart's preflight.yaml), as Helm renders it: first
(a pre-install hook: Helm creates it before the release's objects and goes on only when it succeeded; a pre-upgrade
hook while the RayJob does not exist), where a GPU worker runs (the workers' GPUs, selectors, tolerations), in the
run's image, with the storage floor and the parallel writers of `dapo plan` and a volume like the run's claim; each
check can be switched off by a value; no preflight for a CPU run. The checks themselves run as processes in
tests/test_preflight.py."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from dapo.cluster.preflight import build_parser
from k8s_support import CHART_DIR, VALUES_DIR, by_key, helm_objects, chart_objects, set_files, user_values

FULL = [VALUES_DIR / "full.yaml"]
REQUIREMENTS = yaml.safe_load((CHART_DIR / "files" / "requirements.yaml").read_text())["presets"]
BRANCHES = [
    None,
    {"storage": {"fixOwnership": {"enabled": True}}, "worker": {"tolerations": [{"key": "gpu", "operator": "Exists"}],
                                                                "nodeSelector": {"pool": "h100"}},
     "imagePullSecrets": [{"name": "regcred"}], "podSecurityContext": {"fsGroup": 100}},
    {"storage": {"existingClaim": "team-shared"}, "preflight": {"storage": {"throughput": False}}},
    {"worker": {"minDriver": 0}, "preflight": {"storage": {"enabled": False}}},
    {"train": {"runner": "reference", "reference": {"image": {"repository": "registry.example.com/ml/dapo"}}},
     "rayAuth": {"enabled": False}},  # Ray 2.43 of the reproduction image has no token auth
]


def both(extra):
    """(None, Helm's objects) for full.yaml with these values over it."""
    return None, helm_objects(user_values(FULL, copy.deepcopy(extra)))


@pytest.mark.parametrize("extra", BRANCHES, ids=["default", "fix-ownership", "existing-claim", "no-checks",
                                                 "reference"])
def test_the_preflight_job_comes_first(extra):
    _, p = both(extra)
    first = 3 if (extra or {}).get("storage", {}).get("existingClaim") else 0  # its RBAC hooks come first
    assert p[first]["metadata"]["name"] == "dapo-preflight", p[first]
    assert p[first]["kind"] == "Job" and p[first]["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    kubernetes_validate.validate(p[first], "1.30", strict=True)


def containers(job):
    spec = job["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}, spec


def test_the_default_preflight_runs_where_a_worker_runs_with_the_plans_floor_and_writers():
    # the README's values select no node: the workers reach the GPU pool through their GPU request alone, so the
    # preflight requests the same GPUs (and devices) with the same tolerations -- it cannot land on a CPU node
    _, p = both({"worker": {"extraResources": {"vpc.amazonaws.com/efa": 32}, "runtimeClassName": "nvidia"}})
    objs = by_key(p)
    job = objs[("Job", "dapo-preflight")]
    cs, spec = containers(job)
    assert list(cs) == ["driver", "storage", "image"]
    worker = objs[("RayJob", "dapo-train")]["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert "nodeSelector" not in worker and "nodeSelector" not in spec
    assert spec["tolerations"] == worker["tolerations"] and spec["runtimeClassName"] == "nvidia"
    devices = {k: val for k, val in worker["containers"][0]["resources"]["limits"].items()
               if k not in ("cpu", "memory")}
    assert devices == {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": 32}
    for section in ("requests", "limits"):
        assert {k: cs["image"]["resources"][section][k] for k in devices} == devices
        assert "nvidia.com/gpu" not in cs["driver"]["resources"][section]  # the pod's request is the main one's
    image = objs[("RayJob", "dapo-train")]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"][
        "containers"][0]["image"]
    assert all(c["image"] == image for c in cs.values())
    assert cs["driver"]["command"][-1] == "580" and "--job" in cs["driver"]["command"]
    args = build_parser().parse_args(cs["storage"]["command"][3:])
    need = REQUIREMENTS["full"]
    assert (args.min_bytes_per_second, args.checkpoint_bytes, args.seconds_between_saves, args.streams) == (
        need["minWriteBytesPerSecond"], need["checkpointBytes"], need["secondsBetweenSaves"], need["writeStreams"])
    assert args.streams == 16 * 8 and args.job == "dapo-preflight" and args.claim is None
    assert args.write_bytes == 4 << 30 and (args.uid, args.gid) == (1000, 100) and str(args.dir) == "/shared"
    # a volume like the run's claim, created for the pod (the release's own claim comes after the hook)
    claim = objs[("PersistentVolumeClaim", "dapo-shared")]["spec"]
    assert spec["volumes"] == [{"name": "shared", "ephemeral": {"volumeClaimTemplate": {
        "metadata": {"labels": job["spec"]["template"]["metadata"]["labels"]}, "spec": claim}}}]
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 2400
    assert "serviceAccountName" not in spec and spec["automountServiceAccountToken"] is False


def test_with_an_existing_claim_the_storage_check_reads_its_access_modes_with_a_token_of_its_own():
    _, p = both({"storage": {"existingClaim": "team-shared"}})
    sa, role, binding, job = p[:4]
    assert [o["kind"] for o in (sa, role, binding)] == ["ServiceAccount", "Role", "RoleBinding"]
    assert all(o["metadata"]["annotations"]["helm.sh/hook-weight"] == "-1" for o in (sa, role, binding))
    assert role["rules"] == [{"apiGroups": [""], "resources": ["persistentvolumeclaims"],
                              "resourceNames": ["team-shared"], "verbs": ["get"]}]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "dapo-preflight", "namespace": "ml"}]
    cs, spec = containers(job)
    assert spec["serviceAccountName"] == "dapo-preflight" and spec["automountServiceAccountToken"] is False
    assert build_parser().parse_args(cs["storage"]["command"][3:]).claim == "team-shared"
    token = [m for c in cs.values() for m in c.get("volumeMounts", []) if m["name"] == "api-token"]
    assert token == [{"name": "api-token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                      "readOnly": True}]  # the storage check's container only


def test_without_gpus_the_preflight_needs_a_selector_of_the_gpu_pool():
    from dapo.k8s import ValuesError

    no_gpus = {"preflight": {"requestGpus": False}}
    with pytest.raises(ValuesError) as refused:
        chart_objects(FULL, extra=no_gpus)
    assert str(refused.value).startswith("preflight.requestGpus: false leaves the preflight pod")
    _, p = both({**no_gpus, "worker": {"nodeSelector": {"pool": "h100"}}})
    cs, spec = containers(p[0])
    assert spec["nodeSelector"] == {"pool": "h100"}
    assert not any("nvidia.com/gpu" in str(c["resources"]) for c in cs.values())


def test_with_kueue_the_preflights_gpus_come_from_the_runs_queue():
    _, p = both({"queue": {"scheduler": "kueue", "name": "dapo"}})
    assert p[0]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "dapo"


def test_an_upgrade_runs_the_preflight_again_only_while_the_rayjob_does_not_exist():
    from test_chart_ops import helm_upgrade_render

    values = user_values(FULL)
    rendered, _ = helm_upgrade_render(values, {})  # a failed install (the hook failed), or the RayJob was deleted
    assert "name: dapo-preflight" in rendered["dapo/templates/preflight.yaml"]
    job = by_key(helm_objects(values))[("RayJob", "dapo-train")]
    live = {**copy.deepcopy(job), "status": {"jobDeploymentStatus": "Running"}}
    rendered, _ = helm_upgrade_render(values, {"dapo-train": live})  # a live run: never a preflight beside it
    assert "dapo-preflight" not in rendered["dapo/templates/preflight.yaml"]


def test_every_key_the_preflights_hints_name_exists_in_the_schema():
    """Its messages tell the user which value to change: each such key must be one values.schema.json accepts (the
    driver hint once named preflight.nodeSelector, which the schema refuses)."""
    import json
    import re

    from dapo.cluster import gpu_check, preflight

    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    text = "\n".join(Path(m.__file__).read_text() for m in (gpu_check, preflight))
    # the chart's own messages: the quoted text of its fail and printf calls
    text += "\n".join(q for p in (CHART_DIR / "templates").glob("*") if p.is_file()
                      for line in p.read_text().splitlines() if "fail" in line or "printf" in line
                      for q in re.findall(r'"((?:[^"\\]|\\.)*)"', line))
    keys = {k for k in re.findall(r"\b((?:preflight|worker|storage|podSecurityContext)\.[a-zA-Z.]*[a-zA-Z])", text)
            if not k.endswith((".yaml", ".py", ".md"))}
    assert "worker.nodeSelector" in keys and "preflight.storage.throughput" in keys

    def known(key: str) -> bool:
        node = schema
        for part in key.split("."):
            props = node.get("properties")
            if props is None:  # a free-form object (a Kubernetes securityContext, node selector, ...)
                return node.get("type") == "object" and node.get("additionalProperties", True) is not False
            if part not in props:
                return False
            node = props[part]
        return True
    assert not sorted(k for k in keys if not known(k))


def test_each_check_is_switched_off_by_its_value():
    _, p = both({"preflight": {"storage": {"throughput": False}}})
    cs, _ = containers(p[0])
    args = build_parser().parse_args(cs["storage"]["command"][3:])
    assert args.write_bytes == 0 and args.min_bytes_per_second == 0  # writability still checked
    _, p = both({"worker": {"minDriver": 0}, "preflight": {"storage": {"enabled": False}}})
    cs, spec = containers(p[0])
    assert list(cs) == ["image"] and "volumes" not in spec  # the image still has to pull onto the GPU pool
    _, p = both({"preflight": {"enabled": False}})
    assert ("Job", "dapo-preflight") not in by_key(p)
    _, p = both({"storage": {"fixOwnership": {"enabled": True}}})
    assert list(containers(p[0])[0]) == ["fix-ownership", "driver", "storage", "image"]


def test_a_cpu_run_has_no_preflight():
    files, release = set_files("tiny")
    assert not [o for o in helm_objects(user_values(files), release=release)
                if o["metadata"]["name"].endswith("-preflight")]

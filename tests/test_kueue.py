"""Gang admission with Kueue: the samples in k8s/kueue.yaml (ResourceFlavors, ClusterQueue, LocalQueue) validate
against Kueue v0.19.2's own CRDs (tests/fixtures/kueue, pinned here against every place that names the version);
the chart with values/kueue.yaml renders a RayJob with the LocalQueue's label that Kueue's RayJob webhook (v0.19.2,
pkg/controller/jobs/rayjob/rayjob_webhook.go and raycluster/common.go) admits, whose pods the ClusterQueue covers and
fits, the head on the CPU flavor and the workers on the GPU one; the manager's waitForPodsReady settings are the
ones docs/deadlines.md counts on; the admitted pods schedule on every cloud's GPU nodes (the flavors pin no cloud's
labels); and dapo doctor's queue check passes on exactly these objects."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from conftest import ROOT
from k8s_support import VALUES_DIR, by_key, chart_objects, helm_objects, user_values
from test_manifests_schema import _strict

KUEUE_VERSION = "0.19.2"
FIXTURES = ROOT / "tests" / "fixtures" / "kueue"
SAMPLES = list(yaml.safe_load_all((ROOT / "k8s" / "kueue.yaml").read_text()))
FILES = [VALUES_DIR / "full.yaml", VALUES_DIR / "eks-p5.yaml", VALUES_DIR / "kueue.yaml"]


def validator(kind: str, version: str = "v1beta2") -> jsonschema.Draft202012Validator:
    plural = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues"}[kind]
    crd = json.loads((FIXTURES / f"kueue.x-k8s.io_{plural}.json").read_text())
    (ver,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    return jsonschema.Draft202012Validator(_strict(ver["schema"]["openAPIV3Schema"]))


def test_the_samples_validate_against_kueues_crds():
    assert sorted(o["kind"] for o in SAMPLES) == ["ClusterQueue", "LocalQueue", "ResourceFlavor", "ResourceFlavor"]
    for obj in SAMPLES:
        assert obj["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(obj["kind"]).iter_errors(obj)]
        assert not errors, (obj["metadata"]["name"], errors)


def test_the_strict_validator_catches_a_misspelled_field():
    cq = next(o for o in SAMPLES if o["kind"] == "ClusterQueue")
    bad = json.loads(json.dumps(cq))
    bad["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuotas"] = "1"
    assert list(validator("ClusterQueue").iter_errors(bad))


def test_the_kueue_version_is_pinned_in_one_place_and_named_alike_everywhere():
    readme = (FIXTURES / "README.md").read_text()
    assert f"tag `v{KUEUE_VERSION}`" in readme
    for path in ("k8s/kueue.yaml", "k8s/kueue-values.yaml", "docs/deploy.md", "README.md"):
        text = (ROOT / path).read_text()
        versions = set(re.findall(r"kueue/charts/kueue --version (\S+)", text))
        assert versions == {KUEUE_VERSION}, (path, versions)


def test_the_rayjob_carries_the_local_queues_label_and_passes_kueues_rayjob_webhook():
    objs = by_key(helm_objects(user_values(FILES)))
    job = objs[("RayJob", "dapo-train")]
    lq = next(o for o in SAMPLES if o["kind"] == "LocalQueue")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == lq["metadata"]["name"]
    assert objs[("Job", "dapo-preflight")]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == lq["metadata"]["name"]
    spec = job["spec"]
    # Kueue v0.19.2's RayJob webhook: a RayClusterSpec of its own, shutdownAfterJobFinishes, no in-tree autoscaling,
    # at most 17 worker groups, none named "head"
    assert "clusterSelector" not in spec and spec["shutdownAfterJobFinishes"] is True
    cluster = spec["rayClusterSpec"]
    assert not cluster.get("enableInTreeAutoscaling")
    assert len(cluster["workerGroupSpecs"]) <= 17 and all(g["groupName"] != "head" for g in cluster["workerGroupSpecs"])
    assert not spec.get("suspend")  # Kueue's to set
    # no start guard with a gang scheduler: Kueue's waitForPodsReady is the authority
    assert not [k for k in objs if k[1].endswith("-train-start")]


def _requests(pod_spec: dict) -> dict:
    from dapo.k8s.capacity import pod_requests

    return pod_requests(pod_spec)


CLOUDS = ("eks-p5", "gke-a3-mega", "gke-a3-high", "gke-a3-ultra")
# One GPU node of each cloud as its provider labels and taints it: the instance type (Kubernetes' well-known label,
# the machines of docs/fabric.md), GKE's accelerator label (the values the cloud files select, from Google's installer
# manifests, docs/fabric.md), and GKE's GPU taint nvidia.com/gpu=present:NoSchedule. An EKS node group's taint is the
# cluster's choice: the one the samples name.
GPU_NODES = {
    "eks-p5": ({"node.kubernetes.io/instance-type": "p5.48xlarge"}, "true"),
    "gke-a3-mega": ({"node.kubernetes.io/instance-type": "a3-megagpu-8g",
                     "cloud.google.com/gke-accelerator": "nvidia-h100-mega-80gb"}, "present"),
    "gke-a3-high": ({"node.kubernetes.io/instance-type": "a3-highgpu-8g",
                     "cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}, "present"),
    "gke-a3-ultra": ({"node.kubernetes.io/instance-type": "a3-ultragpu-8g",
                      "cloud.google.com/gke-accelerator": "nvidia-h200-141gb"}, "present"),
}


def _admitted(pod_spec: dict, flavor: dict) -> dict:
    """The pod spec as Kueue admits it to a flavor: the flavor's nodeLabels added to its nodeSelector, its
    tolerations appended (Kueue v0.19.2, pkg/podset)."""
    return {**pod_spec, "nodeSelector": {**(pod_spec.get("nodeSelector") or {}), **(flavor.get("nodeLabels") or {})},
            "tolerations": [*(pod_spec.get("tolerations") or []), *(flavor.get("tolerations") or [])]}


def _flavor_for(pod_spec: dict, rg: dict, flavors: dict) -> str:
    """Kueue's first flavor, in the ClusterQueue's order, whose taints the pod set tolerates."""
    from dapo.k8s.capacity import tolerates

    return next(f["name"] for f in rg["flavors"] if all(
        tolerates(pod_spec.get("tolerations") or [], t) for t in flavors[f["name"]].get("nodeTaints") or []))


@pytest.mark.parametrize("cloud", CLOUDS)
def test_the_admitted_workers_and_preflight_schedule_on_every_clouds_gpu_nodes(cloud):
    """The sample is applied as written on every cloud: the GPU flavor Kueue admits the workers (and the preflight,
    queued too) to adds nothing to their nodeSelector that the cloud's GPU nodes lack -- an EKS instance type in its
    nodeLabels would leave GKE's workers Pending forever."""
    from dapo.k8s.capacity import refusal

    objs = by_key(chart_objects([VALUES_DIR / "full.yaml", VALUES_DIR / f"{cloud}.yaml", VALUES_DIR / "kueue.yaml"]))
    cluster = objs[("RayJob", "dapo-train")]["spec"]["rayClusterSpec"]
    cq = next(o for o in SAMPLES if o["kind"] == "ClusterQueue")
    (rg,) = cq["spec"]["resourceGroups"]
    flavors = {o["metadata"]["name"]: o["spec"] for o in SAMPLES if o["kind"] == "ResourceFlavor"}
    labels, taint_value = GPU_NODES[cloud]
    node = {"metadata": {"name": f"{cloud}-gpu-0", "labels": labels},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": taint_value, "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    preflight = objs[("Job", "dapo-preflight")]["spec"]["template"]["spec"]
    for name, spec in (("workers", cluster["workerGroupSpecs"][0]["template"]["spec"]), ("preflight", preflight)):
        flavor = _flavor_for(spec, rg, flavors)
        assert flavor == "gpu-pool", (name, flavor)
        why = refusal(node, _admitted(spec, flavors[flavor]))
        assert why is None, f"{cloud}: the {name} admitted to {flavor} cannot schedule on the cloud's GPU node: {why}"


def test_a_flavor_pinned_to_one_clouds_instance_type_is_caught():
    from dapo.k8s.capacity import refusal

    spec = {"nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-mega-80gb"}}
    node = {"metadata": {"labels": GPU_NODES["gke-a3-mega"][0]}, "status": {"conditions": [{"type": "Ready",
                                                                                            "status": "True"}]}}
    pinned = {"nodeLabels": {"node.kubernetes.io/instance-type": "p5.48xlarge"}}
    assert refusal(node, _admitted(spec, {})) is None
    assert refusal(node, _admitted(spec, pinned)) == "no label node.kubernetes.io/instance-type=p5.48xlarge"


@pytest.mark.parametrize("cloud", CLOUDS)
def test_the_cluster_queue_covers_and_fits_the_run_head_on_cpu_workers_on_gpu(cloud):
    from dapo.k8s.capacity import quantity

    files = [VALUES_DIR / "full.yaml", VALUES_DIR / f"{cloud}.yaml", VALUES_DIR / "kueue.yaml"]
    job = by_key(chart_objects(files))[("RayJob", "dapo-train")]
    cluster = job["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    group = cluster["workerGroupSpecs"][0]
    workers = group["template"]["spec"]
    cq = next(o for o in SAMPLES if o["kind"] == "ClusterQueue")
    flavors = {o["metadata"]["name"]: o["spec"] for o in SAMPLES if o["kind"] == "ResourceFlavor"}
    (rg,) = cq["spec"]["resourceGroups"]
    covered = set(rg["coveredResources"])
    assert set(_requests(head)) | set(_requests(workers)) <= covered
    lq = next(o for o in SAMPLES if o["kind"] == "LocalQueue")
    assert lq["spec"]["clusterQueue"] == cq["metadata"]["name"]

    assert _flavor_for(workers, rg, flavors) == "gpu-pool" and _flavor_for(head, rg, flavors) == "cpu-pool"
    quota = {f["name"]: {r["name"]: quantity(r["nominalQuota"]) for r in f["resources"]} for f in rg["flavors"]}
    replicas = int(group["replicas"])
    for name, need in _requests(workers).items():
        assert quota["gpu-pool"][name] >= need * replicas, name
    for name, need in _requests(head).items():
        assert quota["cpu-pool"][name] >= need, name


def test_wait_for_pods_ready_evicts_a_partial_admission_and_does_not_requeue_it():
    values = yaml.safe_load((ROOT / "k8s" / "kueue-values.yaml").read_text())
    config = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2" and config["kind"] == "Configuration"
    wait = config["waitForPodsReady"]
    assert (wait["timeout"], wait["recoveryTimeout"], wait["blockAdmission"]) == ("30m", "0s", True)
    assert wait["requeuingStrategy"]["backoffLimitCount"] == 0
    assert {"ray.io/rayjob", "batch/job"} <= set(config["integrations"]["frameworks"])
    # KubeRay's pre-running deadline is a later backstop than Kueue's eviction, not a race with it
    kueue = yaml.safe_load((VALUES_DIR / "kueue.yaml").read_text())
    assert kueue["train"]["preRunningDeadlineSeconds"] > 30 * 60


def test_dapo_doctor_passes_its_queue_check_on_these_objects(tmp_path):
    from api_standin import StandInApi
    from dapo.k8s.doctor import Cluster, Doctor
    from dapo.k8s.doctor_checks import kueue
    from k8s_support import STAND_IN, doctor_release
    from test_doctor import kueue_crd

    api = StandInApi([kueue_crd(p) for p in ("localqueues", "clusterqueues", "workloads")])
    try:
        for obj in SAMPLES:
            if obj["kind"] != "ResourceFlavor":
                api.put(json.loads(json.dumps(obj)))
        config = api.kubeconfig(tmp_path, namespace="dapo")
        (row,) = kueue(Doctor(doctor_release(FILES, extra=STAND_IN, namespace="dapo"), "dapo", Cluster(str(config))))
    finally:
        api.close()
    assert row.verdict == "ok", row
    assert row.found == "LocalQueue dapo -> ClusterQueue dapo: nvidia.com/gpu quota 128"

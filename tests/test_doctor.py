"""`dapo doctor` against the suite's stand-in API server (api_standin.StandInApi) that the real kubernetes client
talks to through a generated kubeconfig: a cluster shaped like an EKS one -- 16 p5.48xlarge nodes (8 GPUs, 32 EFA
devices, the GPU taint) beside two system nodes and a CPU node, their daemon pods, the KubeRay v1.7.0 operator and
its RayJob CRD, an FSx for Lustre StorageClass, a namespace enforcing Pod Security "restricted", the tokens' Secret,
Kueue's CRDs (v0.19.2) with a LocalQueue and a ClusterQueue -- passes every check; each check is then seen failing
on the cluster changed the way a real one goes wrong (the operator missing or an older one whose CRD prunes the
chart's fields, GPU nodes busy with no autoscaler able to add any, no node for the head, no EFA devices, a
ReadWriteOnce class, a namespace that refuses the pods, a Secret without its key, a queue too small), and the
command exits 1 naming it."""

from __future__ import annotations

import base64
import copy
import gzip
import json

import pytest

from api_standin import StandInApi
from conftest import ROOT
from k8s_support import VALUES_DIR

FIXTURES = ROOT / "tests" / "fixtures"
VALUES = [VALUES_DIR / "full.yaml", VALUES_DIR / "eks-p5.yaml"]
SETS = ["storage.storageClassName=fsx-lustre", "image.repository=registry.example.com/ml/dapo",
        "queue.scheduler=kueue", "queue.name=dapo"]
GIB = 2**30


def rayjob_crd(version: str) -> dict:
    return json.loads(gzip.decompress((FIXTURES / "kuberay" / f"ray.io_rayjobs-{version}.json.gz").read_bytes()))


def kueue_crd(plural: str) -> dict:
    if plural == "workloads":  # only its existence is read: the real object without its (150 KB) schemas
        crd = copy.deepcopy(kueue_crd("localqueues"))
        crd["metadata"]["name"] = "workloads.kueue.x-k8s.io"
        crd["spec"]["names"].update(kind="Workload", listKind="WorkloadList", plural="workloads", singular="workload")
        for v in crd["spec"]["versions"]:
            v["schema"] = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
        return crd
    return json.loads((FIXTURES / "kueue" / f"kueue.x-k8s.io_{plural}.json").read_text())


def node(name: str, *, cpu: str, memory: str, labels: dict, gpus: int = 0, efa: int = 0,
         taints: list | None = None) -> dict:
    alloc = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "95491281146"}
    if gpus:
        alloc["nvidia.com/gpu"] = str(gpus)
    if efa:
        alloc["vpc.amazonaws.com/efa"] = str(efa)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                  **labels}},
            "spec": {"taints": taints or []},
            "status": {"allocatable": alloc, "capacity": dict(alloc),
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}


def pod(name: str, node_name: str, namespace: str, requests: dict, phase: str = "Running") -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node_name, "containers": [{"name": "main", "image": "x",
                                                            "resources": {"requests": requests}}]},
            "status": {"phase": phase}}


GPU_TAINT = [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
P5 = {"node.kubernetes.io/instance-type": "p5.48xlarge"}


def healthy() -> StandInApi:
    api = StandInApi()
    api.put(rayjob_crd("v1.7.0"))
    api.put({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
        "name": "kuberay-operator", "namespace": "kuberay-system",
        "labels": {"app.kubernetes.io/name": "kuberay-operator", "app.kubernetes.io/version": "1.7.0"}},
        "spec": {"replicas": 1, "template": {"spec": {"containers": [
            {"name": "kuberay-operator", "image": "quay.io/kuberay/operator:v1.7.0"}]}}},
        "status": {"readyReplicas": 1, "replicas": 1}})
    for i in range(2):
        api.put(node(f"ip-10-0-0-{i}", cpu="7910m", memory="31482360Ki", labels={"role": "system"},
                     taints=[{"key": "CriticalAddonsOnly", "value": "true", "effect": "NoSchedule"}]))
    api.put(node("ip-10-0-1-0", cpu="15890m", memory="63194216Ki", labels={"role": "cpu"}))
    for i in range(16):
        name = f"ip-10-0-7-{i}"
        api.put(node(name, cpu="191450m", memory="2057366184Ki", labels=P5, gpus=8, efa=32, taints=GPU_TAINT))
        # the daemon pods every GPU node runs (CNI, kube-proxy, device plugins)
        api.put(pod(f"aws-node-{i}", name, "kube-system", {"cpu": "25m"}))
        api.put(pod(f"efa-plugin-{i}", name, "kube-system", {"cpu": "10m", "memory": "20Mi"}))
    api.put({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "fsx-lustre"},
             "provisioner": "fsx.csi.aws.com", "volumeBindingMode": "Immediate"})
    api.put({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {
        "name": "gp3", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "ebs.csi.aws.com"})
    api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml", "labels": {
        "kubernetes.io/metadata.name": "ml", "pod-security.kubernetes.io/enforce": "restricted"}}})
    api.put({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": {"name": "dapo-secrets",
                                                                                "namespace": "ml"},
             "data": {k: base64.b64encode(b"not-a-token").decode() for k in ("HF_TOKEN", "WANDB_API_KEY")}})
    for plural in ("localqueues", "clusterqueues", "workloads"):
        api.put(kueue_crd(plural))
    api.put({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "dapo",
                                                                                       "namespace": "ml"},
             "spec": {"clusterQueue": "dapo"}})
    api.put(cluster_queue(128))
    return api


def cluster_queue(gpus: int, efa: bool = True) -> dict:
    resources = [{"name": "cpu", "nominalQuota": "3072"}, {"name": "memory", "nominalQuota": "32Ti"},
                 {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}]
    if efa:
        resources.append({"name": "vpc.amazonaws.com/efa", "nominalQuota": "512"})
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "dapo"},
            "spec": {"namespaceSelector": {}, "resourceGroups": [{
                "coveredResources": [r["name"] for r in resources],
                "flavors": [{"name": "p5", "resources": resources}]}]}}


@pytest.fixture
def cluster(tmp_path):
    api = healthy()
    api.config = api.kubeconfig(tmp_path, namespace="ml")
    yield api
    api.close()


def doctor_rows(api: StandInApi, values=VALUES, sets=SETS) -> dict:
    """check -> [(verdict, found, fix)] of dapo doctor's checks on what the stand-in now serves."""
    from dapo.k8s.doctor import Cluster, Doctor
    from dapo.k8s.doctor_checks import run
    from k8s_support import doctor_release

    c = Cluster(str(api.config))
    found = doctor_release(values, sets)
    out: dict = {}
    for r in run(Doctor(found, "ml", c)):
        out.setdefault(r.check, []).append((r.verdict, r.found, r.fix))
    return out


def verdicts(rows: dict) -> dict:
    return {k: [v for v, _, _ in rs] for k, rs in rows.items()}


def test_a_healthy_cluster_passes_every_check_and_the_command_exits_0(cluster, capsys):
    from dapo.k8s.doctor_cli import main

    rows = doctor_rows(cluster)
    assert verdicts(rows) == {"kuberay": ["ok"], "rayjob fields": ["ok"], "gpu nodes": ["ok"], "head node": ["ok"],
                              "fabric": ["ok"], "storage": ["ok"], "pod security": ["ok"], "secret": ["ok"],
                              "kueue": ["ok"]}, rows
    assert rows["gpu nodes"][0][1].startswith("16 of 16 fit now")
    assert rows["kuberay"][0][1].startswith("kuberay-system/kuberay-operator 1.7.0")
    argv = ["-n", "ml", "--kubeconfig", str(cluster.config)] + [a for f in VALUES for a in ("-f", str(f))]
    argv += [a for s in SETS for a in ("--set", s)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split() == ["check", "verdict", "found", "needed", "how", "to", "fix"]
    assert "9 ok, 0 warn, 0 FAIL: nothing found that stops the run" in out
    assert "not-a-token" not in out and base64.b64encode(b"not-a-token").decode() not in out  # key names only
    # read-only: every request a GET the stand-in answered
    assert cluster.requests and all(r.startswith(("/api", "/version")) for r in cluster.requests)


def _older_operator(api):
    api.put(rayjob_crd("v1.4.2"))
    dep = api.store[("/apis/apps/v1", "deployments", "kuberay-system")]["kuberay-operator"]
    dep["metadata"]["labels"]["app.kubernetes.io/version"] = "1.4.2"
    dep["spec"]["template"]["spec"]["containers"][0]["image"] = "quay.io/kuberay/operator:v1.4.2"


def _busy_gpus(api):
    for i in range(4):  # another team's job holds four nodes' GPUs
        api.put(pod(f"other-{i}", f"ip-10-0-7-{i}", "team-b", {"cpu": "8", "nvidia.com/gpu": "8"}))


def _autoscaler_at_max(api):
    _busy_gpus(api)
    status = ("time: 2026-12-01 10:00:00.000000000 +0000 UTC\nautoscalerStatus: Running\nnodeGroups:\n"
              "- name: eks-p5-a\n  health:\n    status: Healthy\n    nodeCounts:\n      registered:\n        total: 16\n"
              "        ready: 16\n    cloudProviderTarget: 16\n    minSize: 0\n    maxSize: 16\n")
    api.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cluster-autoscaler-status",
                                                                   "namespace": "kube-system"},
             "data": {"status": status}})


def _no_head_node(api):
    api.remove("Node", "ip-10-0-1-0")


def _no_efa(api):
    for i in range(16):
        n = api.store[("/api/v1", "nodes", "")][f"ip-10-0-7-{i}"]
        del n["status"]["allocatable"]["vpc.amazonaws.com/efa"]


def _block_class(api):
    api.put({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "fsx-lustre"},
             "provisioner": "ebs.csi.aws.com"})


def _privileged_needed(api):
    pass  # the values ask for hostNetwork (privileged); the namespace enforces restricted


def _no_wandb_key(api):
    s = api.store[("/api/v1", "secrets", "ml")]["dapo-secrets"]
    del s["data"]["WANDB_API_KEY"]


def _small_queue(api):
    api.put(cluster_queue(64))


# check -> (how the cluster is changed, extra --set, the verdict, a phrase of what it found)
FAILURES = {
    "kuberay": (lambda api: api.remove("CustomResourceDefinition", "rayjobs.ray.io"), [], "FAIL",
                "no CustomResourceDefinition rayjobs.ray.io"),
    "rayjob fields": (_older_operator, [], "FAIL", "spec.preRunningDeadlineSeconds"),
    "gpu nodes": (_autoscaler_at_max, [], "FAIL", "12 of 16 fit now"),
    "head node": (_no_head_node, [], "FAIL", "0 node(s) can take it"),
    "fabric": (_no_efa, [], "FAIL", "vpc.amazonaws.com/efa >= 32 on 0 of the 16 node(s)"),
    "storage": (_block_class, [], "FAIL", "provisioner ebs.csi.aws.com"),
    "pod security": (_privileged_needed, ["hostNetwork=true"], "FAIL", "enforce=restricted"),
    "secret": (_no_wandb_key, [], "FAIL", "missing WANDB_API_KEY"),
    "kueue": (_small_queue, [], "FAIL", "nvidia.com/gpu quota 64"),
}


@pytest.mark.parametrize("check", sorted(FAILURES))
def test_each_check_fails_on_a_cluster_that_cannot_run_the_release(cluster, check, capsys):
    from dapo.k8s.doctor_cli import main

    change, extra, verdict, phrase = FAILURES[check]
    change(cluster)
    rows = doctor_rows(cluster, sets=SETS + extra)
    got = rows[check]
    assert any(v == verdict and phrase in found for v, found, _ in got), got
    assert all(fix for v, _, fix in got if v != "ok"), got  # every failure says how to fix it
    argv = ["-n", "ml", "--kubeconfig", str(cluster.config)] + [a for f in VALUES for a in ("-f", str(f))]
    argv += [a for s in SETS + extra for a in ("--set", s)]
    assert main(argv) == 1
    assert "the run cannot start as these values install it" in capsys.readouterr().out


def test_the_older_operator_is_named_with_every_field_its_crd_would_drop(cluster):
    _older_operator(cluster)
    rows = doctor_rows(cluster)
    (verdict, found, fix), = rows["rayjob fields"]
    assert "spec.rayClusterSpec.authOptions" in found and "spec.preRunningDeadlineSeconds" in found
    assert "kuberay/ray-operator/config/crd?ref=v1.7.0" in fix
    assert verdicts(rows)["kuberay"] == ["warn"]  # 1.4.2 runs, but is older than the chart's 1.7.0


def test_free_gpus_short_is_a_warning_when_an_autoscaler_may_add_them_and_unknown_is_said_plainly(cluster):
    _busy_gpus(cluster)
    (verdict, found, _), = doctor_rows(cluster)["gpu nodes"]
    assert verdict == "warn" and "12 of 16 fit now" in found and "4 node(s) busy: nvidia.com/gpu 0/8" in found
    assert "unknown: no cluster-autoscaler status ConfigMap or Karpenter NodePool is visible" in found
    cluster.put({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "gpu"},
                 "spec": {"limits": {"nvidia.com/gpu": "160"}, "template": {"spec": {"taints": GPU_TAINT}}},
                 "status": {"resources": {"nvidia.com/gpu": "128"}}})
    (verdict, found, _), = doctor_rows(cluster)["gpu nodes"]
    assert verdict == "warn" and "Karpenter NodePool(s) gpu: 32 GPUs below their limits" in found
    cluster.put({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "gpu"},
                 "spec": {"limits": {"nvidia.com/gpu": "128"}, "template": {"spec": {"taints": GPU_TAINT}}},
                 "status": {"resources": {"nvidia.com/gpu": "128"}}})
    assert doctor_rows(cluster)["gpu nodes"][0][0] == "FAIL"


def test_more_ways_a_check_fails(cluster):
    # no operator Deployment ready; an existing claim that is ReadWriteOnce; no namespace; no queue at all
    dep = cluster.store[("/apis/apps/v1", "deployments", "kuberay-system")]["kuberay-operator"]
    dep["status"]["readyReplicas"] = 0
    cluster.put({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "team", "namespace": "ml"},
                 "spec": {"accessModes": ["ReadWriteOnce"]}, "status": {"phase": "Bound",
                                                                         "accessModes": ["ReadWriteOnce"]}})
    rows = doctor_rows(cluster, sets=SETS + ["storage.existingClaim=team"])
    assert verdicts(rows)["kuberay"] == ["FAIL"] and "0/1 ready" in rows["kuberay"][0][1]
    assert rows["storage"][0][:2] == ("FAIL", "claim team: Bound, ReadWriteOnce")
    cluster.remove("Namespace", "ml")
    assert doctor_rows(cluster)["pod security"][0][:2] == ("FAIL", "no namespace ml")
    no_queue = [s for s in SETS if not s.startswith("queue.")]
    (verdict, found, fix), = doctor_rows(cluster, sets=no_queue)["kueue"]
    assert verdict == "warn" and "queue.scheduler: kueue" in fix
    cluster.put(cluster_queue(128, efa=False))  # Kueue admits only what its ClusterQueue covers
    (verdict, found, _), = doctor_rows(cluster)["kueue"]
    assert verdict == "FAIL" and "does not cover vpc.amazonaws.com/efa" in found


def test_a_check_this_user_may_not_read_says_so(cluster):
    cluster.forbid("nodes")
    rows = doctor_rows(cluster)
    (verdict, found, _), = rows["gpu nodes"]
    assert verdict == "warn" and found.startswith("cannot read: HTTP 403 for GET /api/v1/nodes")


def test_an_unreachable_api_server_or_refused_values_exit_2(cluster, tmp_path, capsys):
    from dapo.k8s.doctor_cli import main

    argv = ["--kubeconfig", str(cluster.config), "-f", str(VALUES_DIR / "full.yaml")]
    assert main(argv + ["--set", "storage.size=1Gi"] + [a for s in SETS for a in ("--set", s)]) == 2
    assert "storage.size: 1Gi is smaller than what preset full needs" in capsys.readouterr().err
    # Helm renders an override the preset does not have (the chart cannot load presets); dapo doctor loads it
    assert main(argv + ["-f", str(VALUES_DIR / "eks-p5.yaml"), "--set", "overrides={recipe.actor.optim.lrr=1e-5}"]
                + [a for s in SETS for a in ("--set", s)]) == 2
    assert "did you mean 'lr'" in capsys.readouterr().err
    # the values the install still needs: all of them in one message, render.py's (the same engine), no table
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("dapo doctor: 3 values still needed before this installs:\n")
    assert [ln.split(":")[0] for ln in out.err.splitlines()[1:]] == [
        "- fabric.expect", "- image.repository", "- storage.storageClassName"]
    cluster.close()
    assert main(argv) == 2
    assert "cannot be reached" in capsys.readouterr().err


def test_the_preset_is_loaded_from_what_the_workers_mount_with_the_entrypoints_own_arguments():
    """dapo doctor loads the preset as the rendered training entrypoint will: `dapo train`'s parser over its
    arguments (the chart's placement overrides included), the files of the ConfigMap mounted where --preset points."""
    from dapo.config import ConfigError
    from dapo.k8s import ValuesError
    from dapo.k8s.doctor_cli import validate_preset
    from k8s_support import doctor_release

    objects = doctor_release(VALUES, SETS).objects
    validate_preset(objects)
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap" and "full.yaml" in (o.get("data") or {})]
    # a value the mounted preset file holds is what is validated: the ConfigMap's copy, not this checkout's file
    broken = copy.deepcopy(objects)
    (bcm,) = [o for o in broken if o["metadata"]["name"] == cm["metadata"]["name"] and o["kind"] == "ConfigMap"]
    bcm["data"]["full.yaml"] += "\nrecipe:\n  actor:\n    optim:\n      lrr: 1.0e-6\n"
    with pytest.raises(ConfigError, match=r"unknown key 'recipe.actor.optim.lrr' in /etc/dapo/presets/full.yaml "):
        validate_preset(broken)
    # the chart's placement arguments reach the loader (0 nodes is refused by name)
    (job,) = [o for o in broken if o["kind"] == "RayJob" and "dapo.train" in o["spec"]["entrypoint"]]
    bcm["data"]["full.yaml"] = cm["data"]["full.yaml"]
    job["spec"]["entrypoint"] = job["spec"]["entrypoint"].replace("placement.nodes=16", "placement.nodes=0")
    with pytest.raises(ConfigError, match="placement.nodes"):
        validate_preset(broken)
    # an option `dapo train` does not take (an override written as a flag) is named, not an argparse exit
    flagged = job["spec"]["entrypoint"]
    job["spec"]["entrypoint"] = flagged + " --lr=1e-6"
    with pytest.raises(ValuesError, match="does not take --lr=1e-6"):
        validate_preset(broken)
    job["spec"]["entrypoint"] = flagged
    # a --preset outside the mounted folder is named
    job["spec"]["entrypoint"] = job["spec"]["entrypoint"].replace("/etc/dapo/presets/", "/opt/presets/")
    with pytest.raises(ValuesError, match="--preset /opt/presets/full.yaml is not in the ConfigMap"):
        validate_preset(broken)


def test_gke_multi_networks_the_pods_name_must_exist(tmp_path):
    """values/gke-a3-mega.yaml's workers name eight GKE networks (networking.gke.io/interfaces): each a Network
    object (networking.gke.io/v1) of the cluster, else the pods never start."""
    from dapo.k8s.doctor import Cluster, Doctor
    from dapo.k8s.doctor_checks import fabric
    from k8s_support import STAND_IN, doctor_release

    files = [VALUES_DIR / f for f in ("smoke.yaml", "smoke-2node.yaml", "gke-a3-mega.yaml")]
    found = doctor_release(files, extra=STAND_IN, release="dapo-smoke")
    api = StandInApi([{"apiVersion": "networking.gke.io/v1", "kind": "Network", "metadata": {"name": f"vpc{i}"},
                       "spec": {"type": "Device", "parametersRef": {"group": "networking.gke.io",
                                                                    "kind": "GKENetworkParamSet", "name": f"vpc{i}"}}}
                      for i in range(1, 9)])
    try:
        config = api.kubeconfig(tmp_path, namespace="ml")
        rows = fabric(Doctor(found, "ml", Cluster(str(config))))
        assert [(r.verdict, r.found) for r in rows] == [("ok", "GKE networks vpc1, vpc2, vpc3, vpc4, vpc5, vpc6, "
                                                               "vpc7, vpc8 exist")]
        api.remove("Network", "vpc5")
        (row,) = fabric(Doctor(found, "ml", Cluster(str(config))))
        assert (row.verdict, row.found) == ("FAIL", "GKE networks missing: vpc5") and "GKENetworkParamSet" in row.fix
    finally:
        api.close()


def test_gpu_nodes_with_a_noexecute_taint_the_workers_do_not_tolerate_are_not_counted(cluster, tmp_path):
    """A NoExecute taint repels a pod as NoSchedule does (and evicts a running one): four GPU nodes reserved with
    one leave 12 of the 16 workers a place; a toleration of it in the values gives them back. The chart's default
    toleration of the GPU taint names the effect NoSchedule, so the same key with NoExecute is not tolerated."""
    for i in range(4):
        n = cluster.store[("/api/v1", "nodes", "")][f"ip-10-0-7-{i}"]
        n["spec"]["taints"] = GPU_TAINT + [{"key": "dedicated", "value": "team-b", "effect": "NoExecute"}]
    (verdict, found, fix), = doctor_rows(cluster)["gpu nodes"]
    assert verdict != "ok" and "12 of 16 fit now (12 node(s) could take one)" in found, found
    assert "4 node(s) taint dedicated=team-b:NoExecute not tolerated" in found and "tolerations" in fix
    tolerate = tmp_path / "tolerate.yaml"
    tolerate.write_text("worker:\n  tolerations:\n  - {key: nvidia.com/gpu, operator: Exists}\n"
                        "  - {key: dedicated, value: team-b, effect: NoExecute}\n")
    assert doctor_rows(cluster, values=VALUES + [tolerate])["gpu nodes"][0][0] == "ok"
    for i in range(4):  # the GPU taint itself with NoExecute
        n = cluster.store[("/api/v1", "nodes", "")][f"ip-10-0-7-{i}"]
        n["spec"]["taints"] = [dict(GPU_TAINT[0], effect="NoExecute")]
    (verdict, found, _), = doctor_rows(cluster)["gpu nodes"]
    assert verdict != "ok" and "4 node(s) taint nvidia.com/gpu=true:NoExecute not tolerated" in found, found


def test_a_baseline_namespace_is_refused_for_ipc_lock_and_admitted_without_it(cluster, capsys):
    """IPC_LOCK (ipcLock, RDMA memory registration) is not among the capabilities Pod Security baseline allows: a
    namespace enforcing baseline refuses the workers, so doctor fails it naming ipcLock and the level to label."""
    from dapo.k8s.doctor import Cluster, Doctor
    from dapo.k8s.doctor_checks import pod_security
    from dapo.k8s.doctor_cli import main
    from k8s_support import doctor_release

    cluster.store[("/api/v1", "namespaces", "")]["ml"]["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] = "baseline"
    assert doctor_rows(cluster)["pod security"][0][0] == "ok"
    sets = SETS + ["ipcLock=true"]
    (row,) = pod_security(Doctor(doctor_release(VALUES, sets), "ml", Cluster(str(cluster.config))))
    assert (row.verdict, row.found) == ("FAIL", "namespace ml: enforce=baseline")
    assert row.needed == "admits privileged (ipcLock (IPC_LOCK is not among the capabilities baseline allows))"
    assert row.fix == "kubectl label namespace ml pod-security.kubernetes.io/enforce=privileged --overwrite"
    argv = ["-n", "ml", "--kubeconfig", str(cluster.config)] + [a for f in VALUES for a in ("-f", str(f))]
    assert main(argv + [a for s in sets for a in ("--set", s)]) == 1
    assert "1 FAIL: the run cannot start as these values install it" in capsys.readouterr().out


def _gpu_node(api, i: int) -> dict:
    return api.store[("/api/v1", "nodes", "")][f"ip-10-0-7-{i}"]


def test_one_worker_per_host_counts_a_node_with_room_for_two_once(cluster, tmp_path):
    """worker.onePerHost (a required pod anti-affinity on the hostname): a node with room for two workers takes
    one; without it, two."""
    for i in range(16):
        if i < 8:  # eight nodes twice the size, the other eight gone
            _gpu_node(cluster, i)["status"]["allocatable"].update({"cpu": "382900m", "memory": "4114732368Ki",
                                                                    "nvidia.com/gpu": "16", "vpc.amazonaws.com/efa": "64"})
        else:
            cluster.remove("Node", f"ip-10-0-7-{i}")
    (verdict, found, _), = doctor_rows(cluster)["gpu nodes"]
    assert verdict != "ok" and found.startswith("8 of 16 fit now (8 node(s) could take one)"), found
    (verdict, found, _), = doctor_rows(cluster, sets=SETS + ["worker.onePerHost=false"])["gpu nodes"]
    assert verdict == "ok" and found.startswith("16 of 16 fit now"), found


def test_a_finished_pod_holds_no_gpus_and_a_running_one_does(cluster):
    for i in range(4):
        cluster.put(pod(f"done-{i}", f"ip-10-0-7-{i}", "team-b", {"nvidia.com/gpu": "8"}, phase="Succeeded"))
        cluster.put(pod(f"failed-{i}", f"ip-10-0-7-{i}", "team-b", {"nvidia.com/gpu": "8"}, phase="Failed"))
    assert doctor_rows(cluster)["gpu nodes"][0][1].startswith("16 of 16 fit now")
    cluster.put(pod("running-0", "ip-10-0-7-0", "team-b", {"nvidia.com/gpu": "1"}))
    assert doctor_rows(cluster)["gpu nodes"][0][1].startswith("15 of 16 fit now")


def test_a_required_node_affinity_is_matched_with_its_operators(cluster, tmp_path):
    """nodeSelectorTerms' matchExpressions as the scheduler reads them: NotIn the nodes' instance type leaves none,
    In it all 16, Gt/Lt on a numeric label by its value."""
    def rows(expr: str):
        f = tmp_path / "affinity.yaml"
        f.write_text("worker:\n  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n"
                     f"        nodeSelectorTerms:\n        - matchExpressions:\n          - {expr}\n")
        return doctor_rows(cluster, values=VALUES + [f])["gpu nodes"][0]
    for i in range(16):
        _gpu_node(cluster, i)["metadata"]["labels"]["example.com/gpu-mem-gib"] = "80" if i < 12 else "40"
    verdict, found, _ = rows("{key: node.kubernetes.io/instance-type, operator: NotIn, values: [p5.48xlarge]}")
    assert verdict != "ok" and "0 of 16 fit now" in found and "16 node(s) node affinity does not match" in found
    assert rows("{key: node.kubernetes.io/instance-type, operator: In, values: [p5.48xlarge]}")[0] == "ok"
    assert rows("{key: example.com/gpu-mem-gib, operator: Gt, values: ['64']}")[1].startswith("12 of 16 fit now")
    assert rows("{key: example.com/gpu-mem-gib, operator: Lt, values: ['64']}")[1].startswith("4 of 16 fit now")


def test_a_pods_init_containers_count_as_the_largest_of_them_not_their_sum(cluster):
    """The scheduler's request of a pod: the largest init container or the sum of the containers, whichever is more
    (Kubernetes, "Resource sharing within containers"): a pod whose init container asked for nearly all that the
    worker leaves free still leaves the worker its room."""
    from dapo.k8s import capacity
    from dapo.k8s.doctor import Cluster, Doctor
    from k8s_support import doctor_release

    d = Doctor(doctor_release(VALUES, SETS), "ml", Cluster(str(cluster.config)))
    worker_cpu = capacity.pod_requests(d.worker()["spec"])["cpu"]
    free = capacity.free_resources(_gpu_node(cluster, 0), d.pods())["cpu"]
    init = free - worker_cpu - 0.5
    setup = pod("setup", "ip-10-0-7-0", "kube-system", {"cpu": "1"})
    setup["spec"]["initContainers"] = [{"name": "a", "image": "x", "resources": {"requests": {"cpu": f"{init}"}}},
                                       {"name": "b", "image": "x", "resources": {"requests": {"cpu": "1"}}}]
    cluster.put(setup)
    assert doctor_rows(cluster)["gpu nodes"][0][1].startswith("16 of 16 fit now")
    # the same CPUs asked by two containers that run side by side: their sum counts, the worker no longer fits
    setup["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
    setup["spec"]["initContainers"] = [{"name": "a", "image": "x", "resources": {"requests": {"cpu": "1"}}}]
    setup["spec"]["containers"].append({"name": "c", "image": "x", "resources": {"requests": {"cpu": f"{init}"}}})
    cluster.put(setup)
    assert doctor_rows(cluster)["gpu nodes"][0][1].startswith("15 of 16 fit now")

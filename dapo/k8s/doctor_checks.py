"""The checks of ``dapo doctor`` (:mod:`dapo.k8s.doctor` says what each compares), one function per row group,
each reading through the :class:`~dapo.k8s.doctor.Doctor` it is given; :func:`run` runs them in order, a check the
API does not let this user read becoming a "cannot read" row.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any, Callable

from dapo.k8s import capacity
from dapo.k8s.doctor import (FAIL, KUBERAY_INSTALL, KUEUE_GROUP, LEVELS, OK, RWO_PROVISIONERS, RWX_PROVISIONERS,
                             WARN, CannotRead, Doctor, Row, unknown_fields)
from dapo.k8s.versions import KUBERAY_VERSION

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
BASIC = ("cpu", "memory", "nvidia.com/gpu", "ephemeral-storage", "pods")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def kuberay(d: Doctor) -> list[Row]:
    crd = d.c.get(f"{CRDS}/rayjobs.ray.io")
    fix = KUBERAY_INSTALL.format(v=KUBERAY_VERSION)
    need = f"KubeRay {KUBERAY_VERSION}: its operator running, its RayJob CRD serving ray.io/v1"
    if crd is None:
        return [Row("kuberay", FAIL, "no CustomResourceDefinition rayjobs.ray.io: the operator is not installed", need,
                    fix)]
    served = [v["name"] for v in crd["spec"]["versions"] if v.get("served")]
    deps = d.c.items("/apis/apps/v1/deployments", labelSelector="app.kubernetes.io/name=kuberay-operator")
    if not deps:
        return [Row("kuberay", WARN, f"CRD rayjobs.ray.io serves {', '.join(served)}; no Deployment labelled "
                    "app.kubernetes.io/name=kuberay-operator", need, f"install the operator with Helm: {fix}")]
    dep = deps[0]
    meta = dep["metadata"]
    image = dep["spec"]["template"]["spec"]["containers"][0].get("image", "?")
    version = (meta.get("labels") or {}).get("app.kubernetes.io/version") or image.rpartition(":")[2]
    ready, want = int((dep.get("status") or {}).get("readyReplicas") or 0), int(dep["spec"].get("replicas", 1))
    found = (f"{meta.get('namespace')}/{meta['name']} {version} ({image}), {ready}/{want} ready; CRD serves "
             f"{', '.join(served)}")
    if "v1" not in served or ready == 0:
        return [Row("kuberay", FAIL, found, need, f"kubectl -n {meta.get('namespace')} describe deploy/{meta['name']}; "
                    + fix)]
    if _version(version) and _version(version) < _version(KUBERAY_VERSION):
        return [Row("kuberay", WARN, found, need, f"upgrade the operator and its CRDs: {fix}")]
    return [Row("kuberay", OK, found, need)]


def rayjob_fields(d: Doctor) -> list[Row]:
    crd = d.c.get(f"{CRDS}/rayjobs.ray.io")
    if crd is None or d.rayjob is None:
        return []
    version = d.rayjob["apiVersion"].rpartition("/")[2]
    schema = next((v.get("schema", {}).get("openAPIV3Schema") for v in crd["spec"]["versions"]
                   if v["name"] == version and v.get("served")), None)
    if schema is None:
        return [Row("rayjob fields", FAIL, f"the CRD does not serve ray.io/{version}", "ray.io/v1", "upgrade KubeRay")]
    missing, total = [], 0
    for job in (o for o in d.objects if o["kind"] == "RayJob"):
        missing += [f"{job['metadata']['name']}: {p}" for p in unknown_fields({"spec": job["spec"]}, schema)]
        total += 1
    needed = f"every field the chart renders in its {total} RayJob(s)"
    if missing:
        shown = "; ".join(missing[:6]) + (f"; and {len(missing) - 6} more" if len(missing) > 6 else "")
        return [Row("rayjob fields", FAIL, f"the served CRD lacks {len(missing)}: {shown} (the API server would drop "
                    "them without a word)", needed, f"upgrade the operator to KubeRay {KUBERAY_VERSION} and apply its "
                    f"CRDs (Helm does not upgrade CRDs): kubectl apply --server-side -k 'github.com/ray-project/kuberay/"
                    f"ray-operator/config/crd?ref=v{KUBERAY_VERSION}'")]
    return [Row("rayjob fields", OK, "the served CRD has all of them", needed)]


def _why(why: Counter) -> str:
    return "; ".join(f"{n} node(s) {reason}" for reason, n in why.most_common(3))


def _headroom(d: Doctor, spec: dict[str, Any]) -> tuple[Any, str]:
    try:
        cm = d.c.get("/api/v1/namespaces/kube-system/configmaps/cluster-autoscaler-status")
    except CannotRead:
        cm = None
    try:
        pools = d.c.items("/apis/karpenter.sh/v1/nodepools")
    except CannotRead:
        pools = []
    return capacity.autoscaler_headroom(((cm or {}).get("data") or {}).get("status"), pools, spec, d.gpus_per_worker())


def gpu_nodes(d: Doctor) -> list[Row]:
    spec = d.worker()["spec"]
    workers, gpus = d.worker_count(), d.gpus_per_worker()
    p = capacity.placements(spec, d.nodes(), d.pods())
    needed = f"{workers} workers at once, each {gpus} GPUs" + (" (one per node)" if capacity.one_per_host(spec) else "")
    found = f"{p['fit']} of {workers} fit now ({p['eligible']} node(s) could take one)"
    if p["why"]:
        found += f"; {_why(p['why'])}"
    if p["fit"] >= workers:
        return [Row("gpu nodes", OK, found, needed)]
    room, how = _headroom(d, spec)
    found += f"; can be added: {how}"
    fix = ("free or add GPU nodes (worker.nodeSelector / tolerations must reach them), or queue the run with Kueue "
           "(queue.scheduler: kueue, docs/deploy.md#4-kueue-gang-admission-for-the-multi-node-runs): it waits for the GPUs instead of holding some of them idle")
    if room is None:
        return [Row("gpu nodes", WARN, found, needed, fix)]
    return [Row("gpu nodes", WARN if p["fit"] + room >= workers else FAIL, found, needed, fix)]


def head_node(d: Doctor) -> list[Row]:
    spec = d.head()["spec"]
    p = capacity.placements(spec, d.nodes(), d.pods())
    need = capacity.pod_requests(spec)
    needed = f"one node with {need.get('cpu', 0):g} CPUs and {need.get('memory', 0) / 2**30:.0f} GiB free"
    found = f"{p['fit_nodes']} node(s) can take it" + (f"; {_why(p['why'])}" if p["why"] else "")
    if p["fit"] >= 1:
        return [Row("head node", OK, found, needed)]
    return [Row("head node", FAIL, found, needed, "head.nodeSelector / head.tolerations to a node with room, or "
                "lower head.resources (docs/chart.md#values-to-set-for-your-cluster)")]


def fabric(d: Doctor) -> list[Row]:
    spec, rows = d.worker()["spec"], []
    devices = {k: v for k, v in capacity.pod_requests(spec).items() if k not in BASIC and not k.startswith("hugepages")}
    selected = [n for n in d.nodes() if capacity.refusal(n, spec) is None]
    for key, want in devices.items():
        have = sum(1 for n in selected if capacity.quantity(((n.get("status") or {}).get("allocatable") or {})
                                                            .get(key, 0)) >= want)
        ok = have >= d.worker_count()
        rows.append(Row("fabric", OK if ok else FAIL,
                        f"{key} >= {want:g} on {have} of the {len(selected)} node(s) the workers select",
                        f"{want:g} per worker on {d.worker_count()} nodes", "" if ok else "install the fabric's device "
                        "plugin (EFA: aws-efa-k8s-device-plugin) on the GPU nodes, or fix worker.extraResources"))
    annotations = (d.worker().get("metadata") or {}).get("annotations") or {}
    try:
        nets = [i["network"] for i in json.loads(annotations.get("networking.gke.io/interfaces", "[]"))
                if i.get("network") != "default"]
    except (ValueError, TypeError, KeyError):
        nets = []
    if nets:
        missing = [n for n in nets if d.c.get(f"/apis/networking.gke.io/v1/networks/{n}") is None]
        rows.append(Row("fabric", FAIL if missing else OK, f"GKE networks missing: {', '.join(missing)}" if missing
                        else f"GKE networks {', '.join(nets)} exist", "the Network objects the pods' "
                        "networking.gke.io/interfaces name", "create the GKE multi-networks and their GKENetworkParamSets "
                        "(Google's GPUDirect guide for the machine type)"))
    if not rows and d.worker_count() > 1:
        expect = (d.v.get("fabric") or {}).get("expect") or ""
        rows.append(Row("fabric", OK if expect else WARN, f"no device resources; fabric.expect {expect or 'empty'}",
                        "a fabric for a multi-node run", "" if expect else "layer the cloud's fabric file "
                        "(values/eks-p5.yaml, gke-a3-*.yaml) or declare fabric.expect; else NCCL may run on TCP"))
    return rows


def storage(d: Doctor) -> list[Row]:
    s = d.v["storage"]
    if s.get("existingClaim"):
        pvc = d.c.get(f"/api/v1/namespaces/{d.ns}/persistentvolumeclaims/{s['existingClaim']}")
        if pvc is None:
            return [Row("storage", FAIL, f"no claim {s['existingClaim']} in {d.ns}", "storage.existingClaim bound "
                        "ReadWriteMany", "create it, or set storage.storageClassName and let the chart create one")]
        modes, phase = (pvc.get("status") or {}).get("accessModes") or [], (pvc.get("status") or {}).get("phase")
        ok = phase == "Bound" and "ReadWriteMany" in modes
        return [Row("storage", OK if ok else FAIL, f"claim {s['existingClaim']}: {phase}, {', '.join(modes) or '-'}",
                    "Bound, ReadWriteMany", "" if ok else "a claim of a ReadWriteMany class")]
    name = s.get("storageClassName") or ""
    classes = d.c.items("/apis/storage.k8s.io/v1/storageclasses")
    sc = next((c for c in classes if c["metadata"]["name"] == name), None) if name else next(
        (c for c in classes if ((c["metadata"].get("annotations") or {})
                                .get("storageclass.kubernetes.io/is-default-class") == "true")), None)
    needed = "a StorageClass whose provisioner gives ReadWriteMany"
    if sc is None:
        have = ", ".join(sorted(c["metadata"]["name"] for c in classes)) or "none"
        return [Row("storage", FAIL, f"no StorageClass {name or '(default)'}; classes: {have}", needed,
                    "storage.storageClassName: one of a ReadWriteMany driver (docs/storage.md)")]
    prov = sc.get("provisioner", "")
    found = f"{sc['metadata']['name']}: provisioner {prov}"
    if prov in RWX_PROVISIONERS:
        return [Row("storage", OK, found, needed)]
    if prov in RWO_PROVISIONERS:
        return [Row("storage", FAIL, found + " (block volumes: ReadWriteOnce only)", needed,
                    "a class of EFS, FSx for Lustre, Filestore, Managed Lustre, Azure Files or NFS")]
    return [Row("storage", WARN, found + " (its access modes are not known here)", needed,
                "the preflight's volume of this class shows whether it binds ReadWriteMany")]


def pod_security(d: Doctor) -> list[Row]:
    level, reasons = d.pod_security_needed()
    needed = f"admits {level}" + (f" ({'; '.join(reasons)})" if reasons else "")
    ns = d.c.get(f"/api/v1/namespaces/{d.ns}")
    if ns is None:
        return [Row("pod security", FAIL, f"no namespace {d.ns}", needed, f"kubectl create namespace {d.ns}")]
    enforce = ((ns["metadata"].get("labels") or {}).get("pod-security.kubernetes.io/enforce") or "")
    found = f"namespace {d.ns}: enforce={enforce or '(unset: the cluster default)'}"
    if enforce and LEVELS.get(enforce, 0) > LEVELS[level]:
        return [Row("pod security", FAIL, found, needed,
                    f"kubectl label namespace {d.ns} pod-security.kubernetes.io/enforce={level} --overwrite")]
    return [Row("pod security", OK, found, needed)]


def secret(d: Doctor) -> list[Row]:
    s = d.v["secret"]
    keys = [s["hfTokenKey"]] * (not s.get("hfTokenOptional")) + [s["wandbApiKeyKey"]] * (not s.get("wandbApiKeyOptional"))
    needed = f"Secret {s['name']} with {', '.join(keys) or 'no required key'}"
    obj = d.c.get(f"/api/v1/namespaces/{d.ns}/secrets/{s['name']}")
    fix = (f"kubectl -n {d.ns} create secret generic {s['name']} --from-literal={s['hfTokenKey']}=\"$HF_TOKEN\" "
           f"--from-literal={s['wandbApiKeyKey']}=\"$WANDB_API_KEY\"")
    if obj is None:
        return [Row("secret", FAIL, f"no Secret {s['name']} in {d.ns}", needed, fix)]
    have = sorted((obj.get("data") or {}).keys() | (obj.get("stringData") or {}).keys())
    missing = [k for k in keys if k not in have]
    found = f"keys {', '.join(have) or 'none'}"  # names only, never values
    return [Row("secret", FAIL if missing else OK, found + (f"; missing {', '.join(missing)}" if missing else ""),
                needed, fix if missing else "")]


def _kueue(d: Doctor, plural: str, name: str, ns: str = "") -> Any:
    for version in ("v1beta2", "v1beta1"):
        where = f"{KUEUE_GROUP}/{version}" + (f"/namespaces/{ns}" if ns else "") + f"/{plural}/{name}"
        try:
            obj = d.c.get(where)
        except CannotRead:
            obj = None
        if obj is not None:
            return obj
    return None


def kueue(d: Doctor) -> list[Row]:
    q = d.v["queue"]
    total = d.worker_count() * d.gpus_per_worker()
    if q.get("scheduler") != "kueue":
        if d.worker_count() > 1:
            return [Row("kueue", WARN, "no queue (queue.scheduler empty)", f"gang admission of {total} GPUs",
                        "queue.scheduler: kueue, queue.name: <LocalQueue> (k8s/kueue.yaml): without it a partial "
                        "schedule holds GPUs idle (docs/deadlines.md)")]
        return []
    needed = f"LocalQueue {q['name']} in {d.ns} whose ClusterQueue has >= {total} nvidia.com/gpu"
    absent = [c for c in ("localqueues", "clusterqueues", "workloads") if d.c.get(f"{CRDS}/{c}.kueue.x-k8s.io") is None]
    if absent:
        return [Row("kueue", FAIL, f"Kueue's CRDs missing: {', '.join(absent)}", needed,
                    "helm upgrade --install kueue oci://registry.k8s.io/kueue/charts/kueue (docs/deploy.md#4-kueue-gang-admission-for-the-multi-node-runs)")]
    lq = _kueue(d, "localqueues", q["name"], d.ns)
    if lq is None:
        return [Row("kueue", FAIL, f"no LocalQueue {q['name']} in {d.ns}", needed, "kubectl apply -f k8s/kueue.yaml")]
    cq_name = (lq.get("spec") or {}).get("clusterQueue", "")
    cq = _kueue(d, "clusterqueues", cq_name)
    if cq is None:
        return [Row("kueue", FAIL, f"LocalQueue {q['name']} -> ClusterQueue {cq_name}, which does not exist", needed,
                    "kubectl apply -f k8s/kueue.yaml")]
    groups = (cq.get("spec") or {}).get("resourceGroups") or []
    quota = sum(capacity.quantity(r.get("nominalQuota", 0)) for g in groups for f in g.get("flavors") or []
                for r in f.get("resources") or [] if r.get("name") == "nvidia.com/gpu")
    covered = {r for g in groups for r in g.get("coveredResources") or []}
    asked = {k for spec in (d.head()["spec"], d.worker()["spec"]) for k in capacity.pod_requests(spec)}
    uncovered = sorted(asked - covered)
    found = f"LocalQueue {q['name']} -> ClusterQueue {cq_name}: nvidia.com/gpu quota {quota:g}"
    if quota < total or uncovered:
        found += f", does not cover {', '.join(uncovered)}" if uncovered else ""
        return [Row("kueue", FAIL, found + " (the run could never be admitted)", needed,
                    "give the ClusterQueue the pool's GPUs as nvidia.com/gpu nominalQuota and cover every resource "
                    "the pods request (k8s/kueue.yaml)")]
    return [Row("kueue", OK, found, needed)]


CHECKS: list[tuple[str, Callable[[Doctor], list[Row]]]] = [
    ("kuberay", kuberay), ("rayjob fields", rayjob_fields), ("gpu nodes", gpu_nodes), ("head node", head_node),
    ("fabric", fabric), ("storage", storage), ("pod security", pod_security), ("secret", secret), ("kueue", kueue),
]


def run(d: Doctor) -> list[Row]:
    """Every check's rows, in order; a check the API does not let this user read is a "cannot read" row."""
    out: list[Row] = []
    for name, check in CHECKS:
        try:
            out += check(d)
        except CannotRead as exc:
            out.append(Row(name, WARN, f"cannot read: {exc}", "-", "run as a user who may read it, or check by hand"))
    return out

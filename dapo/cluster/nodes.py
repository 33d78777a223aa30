"""Which Kubernetes nodes a failed attempt names, and the RayJob's next attempt placed without them.

A failed attempt is attributed to nodes where the evidence names one (:func:`suspects`):

- the driver's end record (:mod:`dapo.train.attempts`): each entry of ``nodes`` names its node (``DAPO_NODE_NAME``,
  the downward API's ``spec.nodeName``), else its pod or IP, which the run's pods resolve to a node
  (:func:`resolve`) -- the watchdog's stuck rank, a dead worker's address, a non-finite metric's rank;
- what the follower sees of the attempt's own pods (``ray.io/cluster`` = the RayJob's ``status.rayClusterName``),
  :func:`cluster_suspects`: a container OOM-killed; a pod removed because its node failed (the ``DisruptionTarget``
  reasons ``DeletionByTaintManager`` -- the node unreachable or not ready --, ``TerminationByKubelet``,
  ``DeletionByPodGC`` -- the node deleted); a pod failed ``NodeLost``, ``Evicted`` or ``UnexpectedAdmissionError``
  (the device plugin's unhealthy GPU); and the pod's events that name the hardware -- the GPU check's failed
  postStart hook (:mod:`dapo.cluster.gpu_check`), ``NodeNotReady``, ``TaintManagerEviction``, any message with Xid,
  ECC, row-remapping or retired-page text. A preemption or an eviction through the API (a drain) is not the node's
  fault and names none.

The next attempt is placed without those nodes (:func:`placement_patch`): KubeRay v1.7.0 builds every retry's
RayCluster from the RayJob's ``spec.rayClusterSpec`` as it is when the retry starts
(``rayjob_controller.go`` ``getOrCreateRayClusterInstance`` -> ``constructRayClusterForRayJob``), so the follower
adds to every group's pod template (head and workers) the required node affinity ``matchFields metadata.name NotIn
[nodes]`` -- ANDed into each of the template's own ``nodeSelectorTerms``, or as the only term -- with one JSON merge
patch of the RayJob carrying the ``resourceVersion`` it was computed from. That ``matchFields`` entry is the
follower's: the chart never renders one, and the follower sets its values to the run's list of nodes left out
(:func:`excluded`). Kueue (v0.19.2, ``pkg/util/equality/podset.go``) compares a workload's pod sets by count,
containers, init containers and tolerations only: a changed affinity neither invalidates the admitted Workload nor
is restored when Kueue stops the job (``RestorePodSetsInfo`` restores node selectors, labels, annotations and
tolerations).

Pure functions of plain data (Kubernetes objects as JSON).
"""

from __future__ import annotations

import copy
import re
from typing import Any, Iterable, Mapping, Optional

from dapo.cluster.waits import decisive

NAME_FIELD = {"key": "metadata.name", "operator": "NotIn"}
# DisruptionTarget reasons of a node that failed (Kubernetes >= 1.26); PreemptionByScheduler and
# EvictionByEvictionAPI (a drain, a preemption) are not the node's fault
NODE_DISRUPTIONS = ("DeletionByTaintManager", "TerminationByKubelet", "DeletionByPodGC")
NODE_POD_REASONS = ("NodeLost", "Evicted", "UnexpectedAdmissionError")
NODE_EVENTS = ("FailedPostStartHook", "NodeNotReady", "TaintManagerEviction")
HARDWARE_TEXT = re.compile(r"\bXid\b|\bECC\b|row[- ]remap|retired pages?|uncorrectable|NVRM|fallen off the bus",
                           re.IGNORECASE)
RAY_CLUSTER_LABEL = "ray.io/cluster"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def pods_of_cluster(pods: Iterable[Mapping[str, Any]], cluster: str) -> list[Mapping[str, Any]]:
    """The pods of one RayCluster (KubeRay labels every pod it creates with ``ray.io/cluster``); all when unknown."""
    pods = list(pods)
    if not cluster:
        return pods
    return [p for p in pods if (_meta(p).get("labels") or {}).get(RAY_CLUSTER_LABEL) == cluster]


def resolve(entry: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> Optional[str]:
    """The node of one end-record entry: its ``node``, else the node of its ``pod`` (by name) or ``ip`` (the pod's
    IP, or the node's own with hostNetwork); None when nothing resolves it (a Ray node id alone)."""
    if entry.get("node"):
        return str(entry["node"])
    for p in pods:
        spec, st = p.get("spec") or {}, p.get("status") or {}
        if not spec.get("nodeName"):
            continue
        if entry.get("pod") and _meta(p).get("name") == entry["pod"]:
            return str(spec["nodeName"])
        if entry.get("ip") and entry["ip"] in (st.get("podIP"), st.get("hostIP")) and \
                (st.get("podIP") == entry["ip"] or spec.get("hostNetwork")):
            return str(spec["nodeName"])
    return None


def _pod_suspicion(pod: Mapping[str, Any]) -> Optional[str]:
    st = pod.get("status") or {}
    for cond in st.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True" \
                and cond.get("reason") in NODE_DISRUPTIONS:
            return f"pod {_meta(pod).get('name')} removed: {cond['reason']}: {decisive(cond.get('message'), 160)}"
    if st.get("phase") == "Failed" and st.get("reason") in NODE_POD_REASONS:
        return f"pod {_meta(pod).get('name')} failed: {st['reason']}: {decisive(st.get('message'), 160)}"
    for c in st.get("containerStatuses") or []:
        for state in ((c.get("state") or {}).get("terminated"), (c.get("lastState") or {}).get("terminated")):
            if state and state.get("reason") == "OOMKilled":
                return f"pod {_meta(pod).get('name')}: container {c.get('name')} OOMKilled"
    return None


def cluster_suspects(pods: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]],
                     known: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """node -> why, from the attempt's pods and their events (module doc); first reason per node. ``known``: pod ->
    node of the attempt's pods seen before (a pod deleted since, whose events are still listed)."""
    pods = list(pods)
    node_of = {**(known or {}), **{_meta(p).get("name"): (p.get("spec") or {}).get("nodeName") for p in pods}}
    out: dict[str, str] = {}
    for p in pods:
        why, node = _pod_suspicion(p), node_of.get(_meta(p).get("name"))
        if why and node:
            out.setdefault(node, why)
    for ev in events:
        obj = ev.get("involvedObject") or {}
        node = node_of.get(obj.get("name")) if obj.get("kind") == "Pod" else None
        text = str(ev.get("message") or "")
        if node and (ev.get("reason") in NODE_EVENTS or HARDWARE_TEXT.search(text)):
            out.setdefault(node, f"pod {obj.get('name')}: {ev.get('reason')}: {decisive(text, 160)}")
    return out


def suspects(end: Optional[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
             seen: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(node -> why, entries that name no node) for a failed attempt: its end record's nodes, resolved against the
    pods, then what the follower saw (``seen``, :func:`cluster_suspects` over the attempt)."""
    pods = list(pods)
    out: dict[str, str] = {}
    unresolved = []
    for entry in (end or {}).get("nodes") or []:
        node = resolve(entry, pods)
        why = str(entry.get("why") or (end or {}).get("cause") or "named by the driver")
        if node:
            out.setdefault(node, f"{why} (the driver's end record)")
        else:
            unresolved.append(", ".join(f"{k} {entry[k]}" for k in ("rank", "pod", "ip", "ray_node_id")
                                        if entry.get(k) is not None) + f": {why}")
    for node, why in seen.items():
        out.setdefault(node, why)
    return out, unresolved


# -- the placement --------------------------------------------------------------------------------------------------
def _terms(pod_spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    return list(required.get("nodeSelectorTerms") or [])


def _ours(field: Mapping[str, Any]) -> bool:
    return field.get("key") == NAME_FIELD["key"] and field.get("operator") == NAME_FIELD["operator"]


def excluded(pod_spec: Mapping[str, Any]) -> list[str]:
    """The nodes a pod template is kept off (the follower's ``matchFields`` entry; the first term's)."""
    for term in _terms(pod_spec):
        for field in term.get("matchFields") or []:
            if _ours(field):
                return sorted(field.get("values") or [])
    return []


def without(pod_spec: Mapping[str, Any], nodes: Iterable[str]) -> dict[str, Any]:
    """A copy of ``pod_spec`` kept off ``nodes`` (module doc); with no nodes, the follower's entry removed."""
    spec = copy.deepcopy(dict(pod_spec))
    nodes = sorted(set(nodes))
    terms = _terms(spec) or ([{}] if nodes else [])
    new_terms = []
    for term in terms:
        term = dict(term)
        fields = [f for f in term.get("matchFields") or [] if not _ours(f)]
        if nodes:
            fields.append({**NAME_FIELD, "values": nodes})
        if fields:
            term["matchFields"] = fields
        else:
            term.pop("matchFields", None)
        if term:
            new_terms.append(term)
    affinity = dict(spec.get("affinity") or {})
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    if new_terms:
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": new_terms}
    else:
        node_affinity.pop("requiredDuringSchedulingIgnoredDuringExecution", None)
    if node_affinity:
        affinity["nodeAffinity"] = node_affinity
    else:
        affinity.pop("nodeAffinity", None)
    if affinity:
        spec["affinity"] = affinity
    else:
        spec.pop("affinity", None)
    return spec


def merge_diff(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``: maps key by key, a key gone as null."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    out = {k: None for k in old if k not in new}
    out.update({k: merge_diff(old.get(k), v) for k, v in new.items() if old.get(k) != v})
    return out


def placement_patch(rayjob: Mapping[str, Any], nodes: Iterable[str]) -> Optional[dict[str, Any]]:
    """The JSON merge patch that keeps every group of ``rayjob`` (the live object) off exactly ``nodes``, or None
    when it already is. The worker groups are a list, which a merge patch replaces whole: the patch carries the
    object's ``resourceVersion``, so it applies only to the version it was computed from."""
    nodes = sorted(set(nodes))
    cluster = (rayjob.get("spec") or {}).get("rayClusterSpec") or {}
    head = cluster.get("headGroupSpec") or {}
    workers = list(cluster.get("workerGroupSpecs") or [])
    groups = [head, *workers]
    if all(excluded((g.get("template") or {}).get("spec") or {}) == nodes for g in groups):
        return None
    head_spec = without((head.get("template") or {}).get("spec") or {}, nodes)
    new_workers = []
    for g in workers:
        g = copy.deepcopy(g)
        g.setdefault("template", {})["spec"] = without((g.get("template") or {}).get("spec") or {}, nodes)
        new_workers.append(g)
    old_affinity = ((head.get("template") or {}).get("spec") or {}).get("affinity")
    head_patch = {"affinity": merge_diff(old_affinity, head_spec.get("affinity"))}
    body: dict[str, Any] = {"metadata": {"resourceVersion": _meta(rayjob).get("resourceVersion")},
                            "spec": {"rayClusterSpec": {"headGroupSpec": {"template": {"spec": head_patch}}}}}
    if workers:
        body["spec"]["rayClusterSpec"]["workerGroupSpecs"] = new_workers
    if not body["metadata"]["resourceVersion"]:
        del body["metadata"]
    return body


def live_exclusions(rayjob: Mapping[str, Any]) -> list[str]:
    """The nodes the live RayJob's worker groups are kept off (the head's when it has no worker group)."""
    cluster = (rayjob.get("spec") or {}).get("rayClusterSpec") or {}
    groups = list(cluster.get("workerGroupSpecs") or []) or [cluster.get("headGroupSpec") or {}]
    return excluded((groups[0].get("template") or {}).get("spec") or {})

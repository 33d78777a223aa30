"""Where a pod of the chart can run, from the cluster's nodes and pods as the API returns them (plain dicts): what
``dapo doctor`` (:mod:`dapo.k8s.doctor`) counts as free capacity before anything is installed.

A node takes a pod when the scheduler's basic filters pass: the node is Ready and not cordoned; the pod's
``nodeSelector`` labels match; its required node affinity (``nodeSelectorTerms``: OR of terms, AND of their
``matchExpressions`` with In, NotIn, Exists, DoesNotExist, Gt, Lt) matches; every ``NoSchedule`` / ``NoExecute``
taint is tolerated; and its requests fit what is left of the node's allocatable after the requests of the pods
bound to it that have not finished (a pod's request is what the scheduler counts: the sum of its containers and
restartable init containers, or its largest init container if that is more, plus its overhead). A pod template with
a required pod anti-affinity on ``kubernetes.io/hostname`` against itself (``worker.onePerHost``) takes at most one
per node. What it does not model: preemption of lower-priority pods, topology spread, inter-pod affinity other than
that, volume limits, and the scheduler's in-flight decisions.

What an autoscaler can add, where it says so: the cluster autoscaler's status ConfigMap (``kube-system/
cluster-autoscaler-status``, its ``nodeGroups[].health``: ``maxSize - cloudProviderTarget``; which groups have GPUs
is not in it) and Karpenter's NodePools (``karpenter.sh/v1``: ``spec.limits`` minus ``status.resources`` of the
pools whose taints the pod tolerates). Neither visible: unknown.

Pure functions of plain data: their callers read the cluster.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Optional

_Q = re.compile(r"^([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)(m|k|[KMGTPE]i?)?$")
_MULT = {None: 1, "m": 1e-3, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
         "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
HOSTNAME = "kubernetes.io/hostname"


def quantity(text: Any) -> float:
    """A Kubernetes quantity (``191450m``, ``2063828276Ki``, ``8``, ``1.5Gi``) as a number."""
    m = _Q.match(str(text).strip())
    if not m:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    return float(m.group(1)) * _MULT[m.group(2)]


def _add(total: dict[str, float], resources: dict[str, Any]) -> None:
    for k, v in (resources or {}).items():
        total[k] = total.get(k, 0.0) + quantity(v)


def pod_requests(spec: dict[str, Any]) -> dict[str, float]:
    """What the scheduler counts for a pod (module doc); a container's limits stand for its missing requests."""
    def req(c: dict[str, Any]) -> dict[str, Any]:
        r = c.get("resources") or {}
        return {**(r.get("limits") or {}), **(r.get("requests") or {})}
    total: dict[str, float] = {}
    for c in spec.get("containers") or []:
        _add(total, req(c))
    running_inits: dict[str, float] = {}
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":  # a sidecar runs beside the containers
            _add(total, req(c))
            _add(running_inits, req(c))
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") != "Always":
            one = dict(running_inits)
            _add(one, req(c))
            for k, v in one.items():
                total[k] = max(total.get(k, 0.0), v)
    _add(total, spec.get("overhead") or {})
    return total


def _term_matches(labels: dict[str, str], term: dict[str, Any]) -> bool:
    for e in term.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), [str(v) for v in e.get("values") or []]
        have = labels.get(key)
        if op == "In" and have not in values:
            return False
        if op == "NotIn" and have in values:
            return False
        if op == "Exists" and have is None:
            return False
        if op == "DoesNotExist" and have is not None:
            return False
        if op in ("Gt", "Lt"):
            try:
                ok = (int(have) > int(values[0])) if op == "Gt" else (int(have) < int(values[0]))
            except (TypeError, ValueError, IndexError):
                ok = False
            if not ok:
                return False
    for f in term.get("matchFields") or []:  # the one field the API allows: metadata.name
        if f.get("key") == "metadata.name" and (labels.get(HOSTNAME) in (f.get("values") or [])) != (
                f.get("operator") == "In"):
            return False
    return True


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    for t in tolerations or []:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and str(t.get("value") or "") == str(taint.get("value") or ""):
            return True
    return False


def refusal(node: dict[str, Any], spec: dict[str, Any]) -> Optional[str]:
    """Why ``node`` cannot take a pod of ``spec`` whatever its free resources (None: it can)."""
    meta, nspec, st = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    labels = meta.get("labels") or {}
    if nspec.get("unschedulable"):
        return "cordoned"
    if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or []):
        return "not Ready"
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != str(v):
            return f"no label {k}={v}"
    required = ((((spec.get("affinity") or {}).get("nodeAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")) or []
    if required and not any(_term_matches(labels, t) for t in required):
        return "node affinity does not match"
    for taint in nspec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(spec.get("tolerations") or [], taint):
            return f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} not tolerated"
    return None


def one_per_host(spec: dict[str, Any]) -> bool:
    """A required pod anti-affinity on the hostname topology (``worker.onePerHost``)."""
    anti = (((spec.get("affinity") or {}).get("podAntiAffinity") or {})
            .get("requiredDuringSchedulingIgnoredDuringExecution")) or []
    return any(t.get("topologyKey") == HOSTNAME for t in anti)


def free_resources(node: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, float]:
    """The node's allocatable minus the requests of its pods that have not finished."""
    name = (node.get("metadata") or {}).get("name")
    free = {k: quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
    for p in pods:
        if (p.get("spec") or {}).get("nodeName") != name:
            continue
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for k, v in pod_requests(p.get("spec") or {}).items():
            free[k] = free.get(k, 0.0) - v
    return free


def fit_count(need: dict[str, float], free: dict[str, float]) -> int:
    """How many pods of ``need`` fit into ``free`` (0 when a resource is short)."""
    counts = [int(free.get(k, 0.0) // v) for k, v in need.items() if v > 0]
    return max(0, min(counts)) if counts else 0


def short_of(need: dict[str, float], free: dict[str, float]) -> list[str]:
    """The resources a pod of ``need`` lacks on a node with ``free``, ``name free/needed``."""
    return [f"{k} {_fmt(max(free.get(k, 0.0), 0))}/{_fmt(v)}" for k, v in need.items() if free.get(k, 0.0) < v]


def _fmt(x: float) -> str:
    if x >= 2**30 and x % 2**30 == 0:
        return f"{int(x // 2**30)}Gi"
    if x >= 2**30:
        return f"{x / 2**30:.0f}Gi"
    return f"{x:g}"


def placements(spec: dict[str, Any], nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> dict[str, Any]:
    """How many pods of ``spec`` fit now: ``fit`` pods on ``fit_nodes`` nodes, the nodes that could take them if
    free (``eligible``), and why the others cannot (``why``: a reason -> node count)."""
    need = {k: v for k, v in pod_requests(spec).items() if v > 0}
    single = one_per_host(spec)
    fit, fit_nodes, eligible, why = 0, 0, 0, Counter()
    for node in nodes:
        no = refusal(node, spec)
        if no is not None:
            why[no] += 1
            continue
        alloc = {k: quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
        if fit_count(need, alloc) == 0:
            why["too small: " + ", ".join(short_of(need, alloc))] += 1
            continue
        eligible += 1
        n = fit_count(need, free_resources(node, pods))
        if single:
            n = min(n, 1)
        if n == 0:
            why["busy: " + ", ".join(short_of(need, free_resources(node, pods)))] += 1
        fit += n
        fit_nodes += n > 0
    return {"need": need, "fit": fit, "fit_nodes": fit_nodes, "eligible": eligible, "why": why}


def autoscaler_headroom(ca_status: Optional[str], nodepools: Optional[list[dict[str, Any]]], spec: dict[str, Any],
                        gpus_per_node: int) -> tuple[Optional[int], str]:
    """(nodes an autoscaler can add at most, None: unknown, and how that was read)."""
    import yaml

    if nodepools:
        gpus, unbounded, names = 0.0, False, []
        for np in nodepools:
            tmpl = ((np.get("spec") or {}).get("template") or {}).get("spec") or {}
            if not all(tolerates(spec.get("tolerations") or [], t) for t in tmpl.get("taints") or []):
                continue
            names.append((np.get("metadata") or {}).get("name"))
            limit = ((np.get("spec") or {}).get("limits") or {}).get("nvidia.com/gpu")
            if limit is None:
                unbounded = True
                continue
            used = ((np.get("status") or {}).get("resources") or {}).get("nvidia.com/gpu", 0)
            gpus += max(quantity(limit) - quantity(used), 0.0)
        if names:
            if unbounded:
                return None, f"Karpenter NodePool(s) {', '.join(names)}: no nvidia.com/gpu limit (the cloud's capacity decides)"
            return int(gpus // max(gpus_per_node, 1)), (f"Karpenter NodePool(s) {', '.join(names)}: {gpus:g} GPUs "
                                                         "below their limits")
    if ca_status:
        try:
            groups = (yaml.safe_load(ca_status) or {}).get("nodeGroups") or []
        except yaml.YAMLError:
            groups = []
        if groups:
            room = sum(max(int((g.get("health") or {}).get("maxSize", 0))
                           - int((g.get("health") or {}).get("cloudProviderTarget", 0)), 0) for g in groups)
            return room, (f"cluster autoscaler: its {len(groups)} node group(s) can add {room} node(s) "
                          "(maxSize - target; which groups have GPUs is not in its status)")
    return None, "unknown: no cluster-autoscaler status ConfigMap or Karpenter NodePool is visible"

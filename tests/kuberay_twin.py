"""KubeRay v1.7.0's RayJob retry path over the stand-in API (tests/api_standin.py), with the scheduler's node
affinity, for the tests of what the log follower does between attempts (dapo.cluster.keeper).

The RayJob's life as ray-operator/controllers/ray/rayjob_controller.go at v1.7.0 drives it:

- New -> Initializing: a RayCluster named anew (utils.GenerateRayClusterName) built from the RayJob's spec.rayClusterSpec
  AS IT IS NOW (getOrCreateRayClusterInstance -> constructRayClusterForRayJob); its pods are scheduled onto the
  stand-in's nodes by the pod template's nodeSelector and required node affinity (:func:`node_matches`, the rules of
  k8s.io/component-helpers/scheduling/corev1/nodeaffinity), one worker per node; status Running, rayClusterName set;
- the attempt runs (``driver(k, pods)``, the test's; its exit code is the Ray job's end);
- success: Complete / SUCCEEDED. A failure: JobDeploymentStatus Failed, then checkBackoffLimitAndUpdateStatusIfNeeded
  in the same reconcile -- status.failed + 1, and Retrying while failed < spec.backoffLimit + 1 with spec.backoffLimit
  read NOW -- written as one status update; Retrying deletes the cluster (its pods go: the twin waits ``rebuild_after``
  seconds, KubeRay's reconcile or two) and resets rayClusterName, then New; otherwise Failed (terminal);
- a deleted RayJob ends it (the finalizer stops the job, the cluster goes with its owner).

Every status write bumps the RayJob's resourceVersion (a patch computed before it gets 409, as on a real API server).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

from api_standin import StandInApi


def _expr_matches(expr: dict, value: Optional[str], present: bool) -> bool:
    op, values = expr["operator"], expr.get("values") or []
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present:
            return False
        return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])
    raise ValueError(f"unknown operator {op}")


def node_matches(pod_spec: dict, node: dict) -> bool:
    """The pod's nodeSelector (every label equal) and its required node affinity (any term; in a term every
    matchExpression on the labels and every matchField -- metadata.name only -- holds; an empty term matches no
    node)."""
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    for term in required.get("nodeSelectorTerms") or []:
        exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not exprs and not fields:
            continue
        if all(_expr_matches(e, labels.get(e["key"]), e["key"] in labels) for e in exprs) and \
                all(e["key"] == "metadata.name" and _expr_matches(e, node["metadata"]["name"], True) for e in fields):
            return True
    return False


class KubeRayTwin(threading.Thread):
    """The retry path of one RayJob (module doc). ``clusters`` records each attempt's cluster: its pods' nodes."""

    def __init__(self, api: StandInApi, rayjob: dict, nodes: list[dict], driver: Callable[[int, list[dict]], int], *,
                 namespace: str = "ml", release: str = "dapo", rebuild_after: float = 0.5, max_attempts: int = 10):
        super().__init__(daemon=True)
        self.api, self.namespace, self.release, self.driver = api, namespace, release, driver
        self.name, self.rebuild_after, self.max_attempts = rayjob["metadata"]["name"], rebuild_after, max_attempts
        for n in nodes:
            api.put(n)
        self.nodes = nodes
        rayjob = dict(rayjob)
        rayjob["metadata"] = {**rayjob["metadata"], "uid": "0c9e-rayjob-uid", "resourceVersion": "1",
                              "creationTimestamp": (datetime.now(timezone.utc) - timedelta(seconds=5))
                              .strftime("%Y-%m-%dT%H:%M:%SZ")}
        rayjob["status"] = {"jobDeploymentStatus": "New", "jobStatus": "", "failed": 0}
        api.put(rayjob, namespace)
        self.clusters: list[dict[str, Any]] = []
        self.error: Optional[BaseException] = None

    # -- the RayJob ---------------------------------------------------------------------------------------------------
    def live(self) -> Optional[dict]:
        return self.api.store.get(("/apis/ray.io/v1", "rayjobs", self.namespace), {}).get(self.name)

    def write_status(self, **status) -> Optional[dict]:
        with self.api.lock:
            obj = self.live()
            if obj is None:
                return None
            obj["status"].update(status)
            self.api.bump(obj)
            return obj

    # -- the cluster --------------------------------------------------------------------------------------------------
    def schedule(self, spec: dict, k: int) -> list[dict]:
        cluster = f"{self.name}-c{k}x"
        groups = [("head", spec["headGroupSpec"], 1)] + [
            ("worker", g, int(g.get("replicas") or 0)) for g in spec.get("workerGroupSpecs") or []]
        pods, used = [], set()
        for kind, group, count in groups:
            template = group["template"]["spec"]
            for i in range(count):
                fits = [n for n in self.nodes if node_matches(template, n) and n["metadata"]["name"] not in used]
                if not fits:
                    raise RuntimeError(f"attempt {k}: no node fits {kind} pod {i}: {template.get('affinity')}")
                node = fits[0]["metadata"]["name"]
                if kind == "worker":
                    used.add(node)
                labels = {"ray.io/cluster": cluster, "app.kubernetes.io/instance": self.release,
                          "app.kubernetes.io/component": f"train-{kind}"}
                pods.append({"kind": "Pod", "metadata": {"name": f"{cluster}-{kind}-{i}", "labels": labels},
                             "spec": {"nodeName": node}, "status": {"phase": "Running",
                                                                     "podIP": f"10.0.{k}.{len(pods) + 1}"}})
        return pods

    def attempt(self, k: int) -> bool:
        """One attempt; True when another may follow."""
        obj = self.live()
        if obj is None:
            return False
        pods = self.schedule(obj["spec"]["rayClusterSpec"], k)  # built from the spec as it is now
        self.clusters.append({"name": pods[0]["metadata"]["labels"]["ray.io/cluster"],
                              "nodes": [p["spec"]["nodeName"] for p in pods if "-worker-" in p["metadata"]["name"]],
                              "spec": obj["spec"]["rayClusterSpec"]})
        self.api.replace("Pod", pods, self.namespace)
        self.write_status(jobDeploymentStatus="Running", jobStatus="RUNNING",
                          rayClusterName=self.clusters[-1]["name"], reason="", message="")
        code = self.driver(k, pods)
        obj = self.live()
        if obj is None:
            return False
        if code == 0:
            self.write_status(jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")
            return False
        failed = int(obj["status"].get("failed") or 0) + 1
        retry = failed < int(obj["spec"].get("backoffLimit") or 0) + 1
        self.write_status(jobDeploymentStatus="Retrying" if retry else "Failed", jobStatus="FAILED", failed=failed,
                          reason="AppFailed", message=f"Job entrypoint command failed with exit code {code}")
        if not retry:
            return False
        time.sleep(self.rebuild_after)
        self.api.replace("Pod", [], self.namespace)
        self.write_status(jobDeploymentStatus="New", jobStatus="NEW", rayClusterName="")
        return True

    def run(self) -> None:
        try:
            k = 0
            while k < self.max_attempts:
                k += 1
                if not self.attempt(k):
                    return
        except BaseException as exc:  # surfaced by the test
            self.error = exc

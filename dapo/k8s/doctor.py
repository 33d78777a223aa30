"""``dapo doctor``: whether the cluster can run the release, checked from the user's machine before anything is
installed -- so that no GPU waits for an operator, a class, a Secret or nodes that are not there. It reads the
values exactly as ``helm upgrade --install`` and ``scripts/render.py`` do (the same ``-f`` / ``--set``), renders
the release's objects with Helm's engine (:func:`dapo.k8s.helm.render`), and compares what they ask
for with what the API server says, through the ``kubernetes`` client and the user's kubeconfig (read-only ``GET``\\ s):

- ``kuberay``: the KubeRay operator's Deployment (``app.kubernetes.io/name=kuberay-operator``, ready, its version)
  and its RayJob CRD; ``rayjob fields``: every field the rendered RayJob sets is in the schema the CRD serves -- an
  older operator's API server prunes unknown fields (``authOptions``, ``preRunningDeadlineSeconds``) without a word;
- ``gpu nodes`` / ``head node``: how many of the workers (and the head) fit on the nodes now
  (:mod:`dapo.k8s.capacity`: selectors, affinity, taints, allocatable minus the requests of running pods), against
  nodes x GPUs; plus what an autoscaler can add where it says so, else "unknown";
- ``fabric``: the workers' device resources (``worker.extraResources``, e.g. ``vpc.amazonaws.com/efa``) on the nodes
  that take them, and GKE's multi-network ``Network`` objects the pods' ``networking.gke.io/interfaces`` name;
- ``storage``: the StorageClass exists and its provisioner gives ReadWriteMany (:data:`RWX_PROVISIONERS`), or the
  existing claim is bound ReadWriteMany;
- ``pod security``: the namespace exists and its ``pod-security.kubernetes.io/enforce`` level admits the level the
  chart's NOTES name (read from them: :func:`dapo.k8s.security.pod_security_profile`);
- ``secret``: the Secret and the keys the pods read (key names only: values are never printed);
- ``kueue``: with ``queue.scheduler: kueue``, Kueue's CRDs, the LocalQueue, its ClusterQueue and its
  ``nvidia.com/gpu`` quota against the run.

One table (check, verdict, found, needed, how to fix); :func:`exit_code` is 1 when a check failed (the run cannot
start as installed), 0 otherwise. A check the API does not let this user read says so ("cannot read ...") instead
of guessing.

Provisioners that give ReadWriteMany, from the vendors' CSI driver pages (read 2026-12-01): AWS EFS CSI
(``efs.csi.aws.com``) and FSx for Lustre CSI (``fsx.csi.aws.com``); GKE Filestore CSI
(``filestore.csi.storage.gke.io``) and Managed Lustre CSI (``lustre.csi.storage.gke.io``: RWX, ROX, RWO); Azure
Files CSI (``file.csi.azure.com``); csi-driver-nfs (``nfs.csi.k8s.io``), Ceph CSI CephFS (``cephfs.csi.ceph.com``),
NFS subdir external provisioner (``k8s-sigs.io/nfs-subdir-external-provisioner``). Block-volume drivers that do not:
AWS EBS (``ebs.csi.aws.com``), GKE Persistent Disk (``pd.csi.storage.gke.io``), Azure Disk (``disk.csi.azure.com``).

The checks themselves are :mod:`dapo.k8s.doctor_checks`, the command line ``dapo.k8s.doctor_cli``.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from typing import Any, Optional

from dapo.k8s import capacity
from dapo.k8s.security import pod_security_profile

OK, WARN, FAIL = "ok", "warn", "FAIL"
RWX_PROVISIONERS = ("efs.csi.aws.com", "fsx.csi.aws.com", "filestore.csi.storage.gke.io", "lustre.csi.storage.gke.io",
                    "file.csi.azure.com", "nfs.csi.k8s.io", "cephfs.csi.ceph.com",
                    "k8s-sigs.io/nfs-subdir-external-provisioner")
RWO_PROVISIONERS = ("ebs.csi.aws.com", "pd.csi.storage.gke.io", "disk.csi.azure.com", "kubernetes.io/aws-ebs",
                    "kubernetes.io/gce-pd", "kubernetes.io/azure-disk")
LEVELS = {"privileged": 0, "baseline": 1, "restricted": 2}
KUBERAY_INSTALL = ("helm upgrade --install kuberay-operator kuberay-operator --repo https://ray-project.github.io/"
                   "kuberay-helm/ --version {v} -n kuberay-system --create-namespace -f k8s/kuberay-operator-values.yaml")
KUEUE_GROUP = "/apis/kueue.x-k8s.io"


class CannotRead(Exception):
    """The API server refused a read (401, 403) or could not be reached."""


@dataclass
class Row:
    check: str
    verdict: str
    found: str
    needed: str
    fix: str = ""


class Cluster:
    """Read-only ``GET``\\ s with the user's kubeconfig through the ``kubernetes`` client; JSON as the API server sends
    it."""

    def __init__(self, kubeconfig: Optional[str] = None, context: Optional[str] = None):
        from kubernetes import config

        try:
            self.client = config.new_client_from_config(config_file=kubeconfig, context=context)
            _, active = config.list_kube_config_contexts(config_file=kubeconfig)
        except (config.ConfigException, OSError) as exc:
            raise CannotRead(f"no usable kubeconfig ({exc})") from None
        if context:
            active = next((c for c in config.list_kube_config_contexts(config_file=kubeconfig)[0]
                           if c["name"] == context), active)
        self.namespace = ((active or {}).get("context") or {}).get("namespace") or "default"

    def get(self, path: str, **query: str) -> Optional[dict[str, Any]]:
        """The object at ``path``; None when the API says 404."""
        import urllib3

        method, url, headers, body, post = self.client.param_serialize(
            "GET", path, query_params=list(query.items()), header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"])
        try:
            resp = self.client.call_api(method, url, headers, body, post, _request_timeout=30)
            resp.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise CannotRead(f"the API server at {self.client.configuration.host} cannot be reached ({exc})") from None
        if resp.status == 404:
            return None
        if resp.status in (401, 403):
            raise CannotRead(f"HTTP {resp.status} for GET {path}: this user may not read it")
        if resp.status >= 300:
            raise CannotRead(f"HTTP {resp.status} for GET {path}")
        return json.loads(resp.data or b"{}")

    def items(self, path: str, **query: str) -> list[dict[str, Any]]:
        return list((self.get(path, **query) or {}).get("items") or [])


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """The paths of ``obj`` a structural CRD schema does not have (what the API server prunes)."""
    if not isinstance(schema, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out = []
    if isinstance(obj, dict):
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        if props is None and extra is None:
            return []
        for key, value in obj.items():
            where = f"{path}.{key}" if path else key
            if props is not None and key in props:
                out += unknown_fields(value, props[key], where)
            elif isinstance(extra, dict):
                out += unknown_fields(value, extra, where)
            elif extra is not True:
                out.append(where)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, value in enumerate(obj):
            out += unknown_fields(value, schema["items"], f"{path}[{i}]")
    return out


def _template(rayjob: dict[str, Any], role: str) -> dict[str, Any]:
    spec = rayjob["spec"]["rayClusterSpec"]
    group = spec["headGroupSpec"] if role == "head" else spec["workerGroupSpecs"][0]
    return group["template"]


@dataclass
class Release:
    """One release as Helm renders it: ``.Values``, the objects ``helm upgrade --install`` would create but the
    ``helm test`` pods, and the NOTES it prints."""

    values: dict[str, Any]
    objects: list[dict[str, Any]]
    notes: str


class Doctor:
    """What the checks of one release read (module doc); :func:`dapo.k8s.doctor_checks.run` runs them."""

    def __init__(self, release: Release, namespace: str, cluster: Cluster):
        self.v, self.objects, self.notes = release.values, release.objects, release.notes
        self.ns, self.c = namespace, cluster
        jobs = [o for o in self.objects if o["kind"] == "RayJob"]
        self.rayjob = next((o for o in jobs if o["metadata"]["name"].endswith("-train")), jobs[0] if jobs else None)
        self._nodes: Optional[list[dict[str, Any]]] = None
        self._pods: Optional[list[dict[str, Any]]] = None

    # -- what several checks read ----------------------------------------------------------------------------------
    def nodes(self) -> list[dict[str, Any]]:
        if self._nodes is None:
            self._nodes = self.c.items("/api/v1/nodes")
        return self._nodes

    def pods(self) -> list[dict[str, Any]]:
        if self._pods is None:
            self._pods = self.c.items("/api/v1/pods", fieldSelector="status.phase!=Succeeded,status.phase!=Failed")
        return self._pods

    def worker(self) -> dict[str, Any]:
        """The workers' pod template (of the training RayJob, else the evaluation's)."""
        return _template(self.rayjob, "worker")

    def head(self) -> dict[str, Any]:
        return _template(self.rayjob, "head")

    def worker_count(self) -> int:
        return int(self.rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].get("replicas") or 0)

    def gpus_per_worker(self) -> int:
        need = capacity.pod_requests(self.worker()["spec"])
        return int(need.get("nvidia.com/gpu", 0))

    def pod_security_needed(self) -> tuple[str, list[str]]:
        return pod_security_profile(self.notes)


def table(rows: list[Row], width: int = 118) -> str:
    """The rows as one plain-text table, long cells wrapped."""
    cols = [("check", 14), ("verdict", 7), ("found", 38), ("needed", 24), ("how to fix", 0)]
    fixed = sum(w for _, w in cols[:-1]) + 2 * (len(cols) - 1)
    cols[-1] = ("how to fix", max(width - fixed, 20))
    out = ["  ".join(name.ljust(w) for name, w in cols).rstrip(), "  ".join("-" * w for _, w in cols)]
    for r in rows:
        cells = [textwrap.wrap(str(text), w) or [""] for text, (_, w) in
                 zip((r.check, r.verdict, r.found, r.needed, r.fix), cols)]
        for i in range(max(len(c) for c in cells)):
            out.append("  ".join((c[i] if i < len(c) else "").ljust(w) for c, (_, w) in zip(cells, cols)).rstrip())
    return "\n".join(out)


def exit_code(rows: list[Row]) -> int:
    return 1 if any(r.verdict == FAIL for r in rows) else 0

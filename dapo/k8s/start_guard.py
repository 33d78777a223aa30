"""The start guard (``train.startGuard``): a Job ``K-train-start`` that stops a run whose pods never started instead
of letting KubeRay retry it blindly (``python -m dapo.cluster.start_guard``, whose docstring says what KubeRay v1.7.0
does and what the guard does about it) -- the chart's ``start-guard.yaml``.

It exists only without a gang scheduler (``queue.scheduler`` empty: with Kueue the RayJob waits suspended in its
queue, and Kueue's ``waitForPodsReady`` evicts a partial admission, ``k8s/kueue-values.yaml``), for a GPU training run
with ``train.preRunningDeadlineSeconds`` set (KubeRay's verdict that an attempt did not start is what it acts on). A
Helm ``post-install`` / ``post-upgrade`` hook: Helm creates it after the RayJob and waits for it, so ``helm upgrade
--install`` returns when the run has started -- or fails naming ``K-train-start``, whose log names the causes and the
next step. Its deadline is ``preRunningDeadlineSeconds`` + 10 minutes (give Helm a ``--timeout`` above both the
preflight's and this one).

Its identity (hooks created before it, deleted after it succeeded): ServiceAccount ``K-train-start``, a Role with
``get`` and ``delete`` on the one RayJob, ``delete`` on the one log follower Job and ``list`` on pods and events, a
RoleBinding; the token is projected into its one container only (``automountServiceAccountToken: false``). The pod
runs where the log follower runs (the head's node selector and tolerations), in the follower's image, restricted.

Without a namespace (``scripts/render.py`` without ``--namespace``) it is left out: a RoleBinding names its
ServiceAccount's namespace.
"""

from __future__ import annotations

import copy
from typing import Any

from dapo.k8s.followers import LogFollowers
from dapo.k8s.context import image_ref
from dapo.k8s.security import PREFLIGHT_SKIPS, RESTRICTED_CONTAINER, checkov_skips, tag_only

START_HOOK = {"helm.sh/hook": "post-install,post-upgrade", "helm.sh/hook-weight": "0",
              "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded"}
START_RBAC_HOOK = {**START_HOOK, "helm.sh/hook-weight": "-1"}
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
GRACE = 600  # seconds the guard waits past preRunningDeadlineSeconds (KubeRay's verdict, the pods' deletion)


class StartGuard(LogFollowers):
    """The start guard Job and its RBAC (module doc)."""

    @property
    def start_name(self) -> str:
        return f"{self.fullname}-train-start"

    @property
    def start_guard_active(self) -> bool:
        v, pl = self.v, self.placement
        return bool(v["train"]["enabled"] and v["train"]["startGuard"] and not v["queue"]["scheduler"]
                    and v["train"].get("preRunningDeadlineSeconds") is not None and pl["backend"] != "local"
                    and not pl["cpu"] and self.namespace is not None)

    def start_guard_objects(self) -> list[dict[str, Any]]:
        return self.start_guard_rbac() + [self.start_guard_job()] if self.start_guard_active else []

    def start_guard_rbac(self) -> list[dict[str, Any]]:
        name = self.start_name

        def meta() -> dict[str, Any]:
            m = self.metadata(name, "train-start")
            m["annotations"] = dict(START_RBAC_HOOK)
            return m
        rules = [{"apiGroups": ["ray.io"], "resources": ["rayjobs"], "resourceNames": [self.train_job_name],
                  "verbs": ["get", "delete"]},
                 {"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["list"]}]
        if "train" in self.followed():
            rules.insert(1, {"apiGroups": ["batch"], "resources": ["jobs"],
                             "resourceNames": [self.follower_name("train")], "verbs": ["delete"]})
        return [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(), "automountServiceAccountToken": False},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(), "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": self.namespace}]},
        ]

    def start_guard_args(self) -> list[str]:
        deadline = int(self.v["train"]["preRunningDeadlineSeconds"])
        args = ["--rayjob", self.train_job_name]
        if "train" in self.followed():
            args += ["--follower", self.follower_name("train")]
        return args + ["--release", self.release, "--kind", "train", "--claim", self.claim_name,
                       "--timeout", str(deadline + GRACE // 2)]

    def start_guard_job(self) -> dict[str, Any]:
        v, lg = self.v, self.v["logs"]
        pinned = self.follower_image("train")
        container = {
            "name": "guard", "image": image_ref(pinned), "imagePullPolicy": v["image"]["pullPolicy"],
            "command": ["python", "-m", "dapo.cluster.start_guard"], "args": self.start_guard_args(),
            "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
            "resources": copy.deepcopy(lg["resources"]),
            "securityContext": {**copy.deepcopy(RESTRICTED_CONTAINER), "readOnlyRootFilesystem": True},
            "volumeMounts": [{"name": "api-token", "mountPath": TOKEN_PATH, "readOnly": True}],
        }
        pod: dict[str, Any] = {"restartPolicy": "Never", "serviceAccountName": self.start_name,
                               "automountServiceAccountToken": False}
        if v.get("imagePullSecrets"):
            pod["imagePullSecrets"] = copy.deepcopy(v["imagePullSecrets"])
        if v.get("podSecurityContext"):
            pod["securityContext"] = copy.deepcopy(v["podSecurityContext"])
        for key in ("nodeSelector", "tolerations"):
            if v["head"].get(key):
                pod[key] = copy.deepcopy(v["head"][key])
        pod["containers"] = [container]
        pod["volumes"] = [{"name": "api-token", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}]
        meta = self.metadata(self.start_name, "train-start")
        meta["annotations"] = {**START_HOOK, **checkov_skips(PREFLIGHT_SKIPS + tag_only(pinned))}  # a hook pod that runs to its end
        spec = {"backoffLimit": 0,
                "activeDeadlineSeconds": int(v["train"]["preRunningDeadlineSeconds"]) + GRACE,
                "template": {"metadata": {"labels": self.selector_labels("train-start")}, "spec": pod}}
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}

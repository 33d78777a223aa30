"""The preflight (``preflight.enabled``): one Job, ``K-preflight``, that runs before any RayJob holds a GPU -- a Helm
``pre-install`` hook, so that ``helm install`` creates the release's objects (the claim, the followers, the RayJobs)
only after it succeeded, and fails naming the check otherwise -- the chart's ``preflight.yaml``. It is also a
``pre-upgrade`` hook while the training RayJob does not exist (the chart's ``lookup``): ``helm upgrade --install``
after a failed install, or after the RayJob was deleted, checks again; an upgrade of a live run does not.

Its pod runs where a GPU worker runs: the workers' node selector, affinity, tolerations and runtime class, and, with
``preflight.requestGpus`` (default), the workers' GPUs per node and ``worker.extraResources`` for its few minutes --
so it lands on a node a worker could use (on a scale-from-zero pool the autoscaler adds one; the README's values
select no node, and a pod that only tolerates the GPU taint would land on a CPU node) and pulls the training image
there (the reproduction image with ``train.runner: reference``), as the image's user. With ``queue.scheduler: kueue``
it carries the queue label (its GPUs come out of the same quota). That it starts shows the image can be pulled there;
its init containers then run, in order, each with its own log:

- ``fix-ownership`` (with ``storage.fixOwnership.enabled``): the head's own init container, on the preflight's
  volume, so that a claim whose root cannot be given to the image's user (EFS access points refuse ``chown``) fails
  here and not in a crash-looping head;
- ``driver`` (``preflight.driver``): ``python -m dapo.cluster.preflight driver --min-driver <worker.minDriver>``;
- ``storage`` (``preflight.storage.enabled``): ``python -m dapo.cluster.preflight storage`` on a volume like the
  run's: a generic ephemeral volume of ``storage.storageClassName``, ``storage.size`` and ``storage.accessModes``
  (created for the pod and deleted with it: a pre-install hook cannot mount the release's own claim, which Helm
  creates after the hooks; it is ReadWriteMany or it stays Pending and the deadline fails the Job), or
  ``storage.existingClaim`` itself, whose access modes the check reads from the API (``--claim``: the hook
  ServiceAccount ``K-preflight`` with a Role allowing ``get`` on that claim only, its token projected into this
  container only); writable by the image's uid/gid; with ``preflight.storage.throughput``, as many parallel writers as
  the save has ranks (``writeStreams``) reach the preset's aggregate floor (``minWriteBytesPerSecond`` of ``dapo
  plan``, :func:`dapo.plan.memory.checkpoint_write`).

The Job runs for a GPU training run only (the verl backend on GPUs). The hook is deleted when it succeeded and kept
when it failed (``kubectl logs job/K-preflight --all-containers``; each failed check ends with the next step), until
the next install or upgrade replaces it.
"""

from __future__ import annotations

import copy
from typing import Any

from dapo.k8s.context import ChartContext, image_ref
from dapo.k8s.presets import ValuesError
from dapo.k8s.security import PREFLIGHT_SKIPS, RESTRICTED_CONTAINER, checkov_skips, tag_only

PREFLIGHT_HOOK = {"helm.sh/hook": "pre-install,pre-upgrade", "helm.sh/hook-weight": "0",
                  "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded"}
# the ServiceAccount, Role and RoleBinding that let the storage check read storage.existingClaim: hooks created first
RBAC_HOOK = {**PREFLIGHT_HOOK, "helm.sh/hook-weight": "-1"}
# where a container expects its service-account token (the kubelet's own mount point)
SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
# checkov's findings on the fix-ownership step (root, CHOWN/DAC_OVERRIDE/FOWNER: dapo.k8s.security) when it runs here
FIX_SKIPS = ("CKV_K8S_25",)
NO_PLACEMENT = ("preflight.requestGpus: false leaves the preflight pod nothing that keeps it off CPU nodes: set "
                "worker.nodeSelector or worker.affinity to the GPU pool (the preflight uses the workers'), or keep "
                "preflight.requestGpus: true")
PASSED = "print('preflight: passed: the image runs on a node of the GPU pool and every enabled check passed')"


class PreflightJob(ChartContext):
    """The preflight Job (module doc)."""

    @property
    def preflight_name(self) -> str:
        return f"{self.fullname}-preflight"

    @property
    def preflight_active(self) -> bool:
        pl = self.placement
        return bool(self.v["preflight"]["enabled"] and self.v["train"]["enabled"] and pl["backend"] != "local"
                    and not pl["cpu"])

    @property
    def preflight_reads_claim(self) -> bool:
        """The storage check reads ``storage.existingClaim``'s access modes (a created claim is the ephemeral
        volume's, ReadWriteMany by construction)."""
        v = self.v
        return bool(v["preflight"]["storage"]["enabled"] and v["storage"]["existingClaim"])

    def preflight_objects(self) -> list[dict[str, Any]]:
        if not self.preflight_active:
            return []
        w = self.v["worker"]
        if not self.v["preflight"]["requestGpus"] and not (w.get("nodeSelector") or w.get("affinity")):
            raise ValuesError(NO_PLACEMENT)
        return (self.preflight_rbac() if self.preflight_reads_claim else []) + [self.preflight_job()]

    def preflight_image(self) -> str:
        return image_ref(self.train_image())

    def preflight_rbac(self) -> list[dict[str, Any]]:
        """``get`` on storage.existingClaim only, for the storage check's access-mode read (hooks, before the Job)."""
        name, claim = self.preflight_name, self.v["storage"]["existingClaim"]

        def meta() -> dict[str, Any]:
            m = self.metadata(name, "preflight")
            m["annotations"] = dict(RBAC_HOOK)
            return m
        subject = {"kind": "ServiceAccount", "name": name}
        if self.namespace is not None:
            subject["namespace"] = self.namespace
        return [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(), "automountServiceAccountToken": False},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(),
             "rules": [{"apiGroups": [""], "resources": ["persistentvolumeclaims"], "resourceNames": [claim],
                        "verbs": ["get"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
             "subjects": [subject]},
        ]

    def storage_check_args(self) -> list[str]:
        """The storage check's command line: the floor, the parallel writers and the numbers of the message from
        ``dapo plan``."""
        from dapo.config import load_preset
        from dapo.plan.memory import checkpoint_write, storage

        v, pf = self.v, self.v["preflight"]
        o = v["storage"]["fixOwnership"]
        need: dict[str, Any] = {}
        if pf["storage"]["throughput"]:
            preset = load_preset(v["preset"])
            need = checkpoint_write(preset, storage(preset)["per_checkpoint"])
        args = ["python", "-m", "dapo.cluster.preflight", "storage", "--job", self.preflight_name,
                "--dir", v["storage"]["mountPath"], "--uid", str(int(o["uid"])), "--gid", str(int(o["gid"])),
                "--write-bytes", str(int(pf["storage"]["writeBytes"]) if need else 0),
                "--streams", str(need.get("writeStreams", 1)),
                "--min-bytes-per-second", str(need.get("minWriteBytesPerSecond", 0)),
                "--checkpoint-bytes", str(need.get("checkpointBytes", 0)),
                "--seconds-between-saves", str(need.get("secondsBetweenSaves", 0))]
        if self.preflight_reads_claim:
            args += ["--claim", v["storage"]["existingClaim"]]
        return args

    def preflight_volume(self) -> dict[str, Any]:
        s = self.v["storage"]
        if s["existingClaim"]:
            return {"name": "shared", "persistentVolumeClaim": {"claimName": s["existingClaim"]}}
        spec: dict[str, Any] = {"accessModes": list(s["accessModes"])}
        if s.get("storageClassName"):
            spec["storageClassName"] = s["storageClassName"]
        spec["resources"] = {"requests": {"storage": s["size"]}}
        return {"name": "shared", "ephemeral": {"volumeClaimTemplate": {
            "metadata": {"labels": self.selector_labels("preflight")}, "spec": spec}}}

    def preflight_gpu_resources(self) -> dict[str, Any]:
        """The main container's resources: preflight.resources, plus (preflight.requestGpus) the workers' GPUs per
        node and worker.extraResources as requests = limits -- the pod then fits only where a worker fits."""
        v = self.v
        res = copy.deepcopy(v["preflight"]["resources"])
        if v["preflight"]["requestGpus"]:
            devices = {"nvidia.com/gpu": str(self.placement["gpus"]),
                       **copy.deepcopy(v["worker"].get("extraResources") or {})}
            for section in ("requests", "limits"):
                res[section] = {**(res.get(section) or {}), **devices}
        return res

    def preflight_containers(self, image: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """(init containers, the main container ``image``)."""
        v, pf = self.v, self.v["preflight"]
        env = [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
        common = {"image": image, "imagePullPolicy": v["image"]["pullPolicy"],
                  "terminationMessagePolicy": "FallbackToLogsOnError",
                  "securityContext": {**copy.deepcopy(RESTRICTED_CONTAINER), "readOnlyRootFilesystem": True},
                  "resources": copy.deepcopy(pf["resources"])}
        init = []
        if pf["storage"]["enabled"] and v["storage"]["fixOwnership"]["enabled"]:
            fix = self.fix_ownership_init_container(image)  # type: ignore[attr-defined]  (PodTemplates)
            fix["securityContext"]["readOnlyRootFilesystem"] = True  # it writes only on the volume
            init.append(fix)
        if pf["driver"] and int(v["worker"].get("minDriver") or 0) > 0:
            init.append({"name": "driver", **copy.deepcopy(common), "env": copy.deepcopy(env), "command": [
                "python", "-m", "dapo.cluster.preflight", "driver", "--job", self.preflight_name, "--min-driver",
                str(int(v["worker"]["minDriver"]))]})
        if pf["storage"]["enabled"]:
            mounts = [{"name": "shared", "mountPath": v["storage"]["mountPath"]}]
            if self.preflight_reads_claim:
                mounts.append({"name": "api-token", "mountPath": SA_PATH, "readOnly": True})
            init.append({"name": "storage", **copy.deepcopy(common), "env": copy.deepcopy(env),
                         "command": self.storage_check_args(), "volumeMounts": mounts})
        main = {"name": "image", **copy.deepcopy(common), "command": ["python", "-c", PASSED]}
        main["resources"] = self.preflight_gpu_resources()
        return init, main

    def preflight_pod(self, image: str) -> dict[str, Any]:
        v, pf = self.v, self.v["preflight"]
        # no API access but the storage check's own projected token (with storage.existingClaim)
        pod: dict[str, Any] = {"restartPolicy": "Never", "automountServiceAccountToken": False}
        if self.preflight_reads_claim:
            pod["serviceAccountName"] = self.preflight_name
        if v.get("imagePullSecrets"):
            pod["imagePullSecrets"] = copy.deepcopy(v["imagePullSecrets"])
        if v.get("podSecurityContext"):
            pod["securityContext"] = copy.deepcopy(v["podSecurityContext"])
        w = v["worker"]
        if w.get("runtimeClassName"):
            pod["runtimeClassName"] = w["runtimeClassName"]
        for key in ("nodeSelector", "tolerations", "affinity"):
            if w.get(key):
                pod[key] = copy.deepcopy(w[key])
        init, main = self.preflight_containers(image)
        if init:
            pod["initContainers"] = init
        pod["containers"] = [main]
        volumes = [self.preflight_volume()] if pf["storage"]["enabled"] else []
        if self.preflight_reads_claim:
            volumes.append({"name": "api-token", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                                            "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}})
        if volumes:
            pod["volumes"] = volumes
        return pod

    def preflight_job(self) -> dict[str, Any]:
        v, pf = self.v, self.v["preflight"]
        meta = self.metadata(self.preflight_name, "preflight")
        if v["queue"]["scheduler"] == "kueue":  # its GPUs are admitted from the run's queue
            meta["labels"]["kueue.x-k8s.io/queue-name"] = v["queue"]["name"]
        fix = pf["storage"]["enabled"] and v["storage"]["fixOwnership"]["enabled"]
        meta["annotations"] = {**PREFLIGHT_HOOK, **checkov_skips(
            PREFLIGHT_SKIPS + tag_only(self.train_image()) + (FIX_SKIPS if fix else ()))}
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {
            "backoffLimit": 0, "activeDeadlineSeconds": int(pf["activeDeadlineSeconds"]),
            "template": {"metadata": {"labels": self.selector_labels("preflight")},
                         "spec": self.preflight_pod(self.preflight_image())}}}

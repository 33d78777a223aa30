"""The preflight (``preflight.enabled``): one Job, ``K-preflight``, that runs before any RayJob holds a GPU -- a Helm
``pre-install`` hook, so that ``helm install`` creates the release's objects (the claim, the followers, the RayJobs)
only after it succeeded, and fails naming the check otherwise -- the chart's ``preflight.yaml``.

Its pod runs on a node of the GPU pool (the workers' node selector, tolerations and affinity; no GPU requested), in
the training image (the reproduction image with ``train.runner: reference``), as the image's user. That it starts
shows the image can be pulled there; its init containers then run, in order, each with its own log:

- ``fix-ownership`` (with ``storage.fixOwnership.enabled``): the head's own init container, on the preflight's
  volume, so that a claim whose root cannot be given to the image's user (EFS access points refuse ``chown``) fails
  here and not in a crash-looping head;
- ``driver`` (``preflight.driver``): ``python -m dapo.cluster.preflight driver --min-driver <worker.minDriver>``;
- ``storage`` (``preflight.storage.enabled``): ``python -m dapo.cluster.preflight storage`` on a volume like the
  run's: a generic ephemeral volume of ``storage.storageClassName``, ``storage.size`` and ``storage.accessModes``
  (created for the pod and deleted with it: a pre-install hook cannot mount the release's own claim, which Helm
  creates after the hooks), or ``storage.existingClaim`` itself. It is ReadWriteMany or it stays Pending (the
  deadline fails the Job), writable by the image's uid/gid, and, with ``preflight.storage.throughput``, fast enough
  for the preset's checkpoints (``minWriteBytesPerSecond`` of ``dapo plan``, :func:`dapo.plan.memory.checkpoint_write`).

The Job runs for a GPU training run only (the verl backend on GPUs). The hook is deleted when it succeeded and kept
when it failed (``kubectl logs job/K-preflight --all-containers``), until the next install replaces it.

Imports :mod:`dapo.k8s.context`, :mod:`dapo.k8s.security`, :mod:`dapo.plan.memory` and :mod:`dapo.config` (the preset's checkpoint numbers).
"""

from __future__ import annotations

import copy
from typing import Any

from dapo.k8s.context import ChartContext, image_ref
from dapo.k8s.security import PREFLIGHT_SKIPS, RESTRICTED_CONTAINER, checkov_skips, tag_only

PREFLIGHT_HOOK = {"helm.sh/hook": "pre-install", "helm.sh/hook-weight": "0",
                  "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded"}
# checkov's findings on the fix-ownership step (root, CHOWN/DAC_OVERRIDE/FOWNER: dapo.k8s.security) when it runs here
FIX_SKIPS = ("CKV_K8S_25",)
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

    def preflight_objects(self) -> list[dict[str, Any]]:
        return [self.preflight_job()] if self.preflight_active else []

    def preflight_image(self) -> str:
        return image_ref(self.train_image())

    def storage_check_args(self) -> list[str]:
        """The storage check's command line: the floor and the numbers of the message from ``dapo plan``."""
        from dapo.config import load_preset
        from dapo.plan.memory import checkpoint_write, storage

        v, pf = self.v, self.v["preflight"]
        o = v["storage"]["fixOwnership"]
        need: dict[str, Any] = {}
        if pf["storage"]["throughput"]:
            preset = load_preset(v["preset"])
            need = checkpoint_write(preset, storage(preset)["per_checkpoint"])
        return ["python", "-m", "dapo.cluster.preflight", "storage", "--dir", v["storage"]["mountPath"],
                "--uid", str(int(o["uid"])), "--gid", str(int(o["gid"])),
                "--write-bytes", str(int(pf["storage"]["writeBytes"]) if need else 0),
                "--min-bytes-per-second", str(need.get("minWriteBytesPerSecond", 0)),
                "--checkpoint-bytes", str(need.get("checkpointBytes", 0)),
                "--seconds-between-saves", str(need.get("secondsBetweenSaves", 0))]

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

    def preflight_job(self) -> dict[str, Any]:
        v, pf = self.v, self.v["preflight"]
        image, pull = self.preflight_image(), v["image"]["pullPolicy"]
        mounts = [{"name": "shared", "mountPath": v["storage"]["mountPath"]}]
        common = {"image": image, "imagePullPolicy": pull, "terminationMessagePolicy": "FallbackToLogsOnError",
                  "securityContext": {**copy.deepcopy(RESTRICTED_CONTAINER), "readOnlyRootFilesystem": True},
                  "resources": copy.deepcopy(pf["resources"])}
        init = []
        if pf["storage"]["enabled"] and v["storage"]["fixOwnership"]["enabled"]:
            fix = self.fix_ownership_init_container(image)  # type: ignore[attr-defined]  (PodTemplates)
            fix["securityContext"]["readOnlyRootFilesystem"] = True  # it writes only on the volume
            init.append(fix)
        if pf["driver"] and int(v["worker"].get("minDriver") or 0) > 0:
            init.append({"name": "driver", **copy.deepcopy(common), "command": [
                "python", "-m", "dapo.cluster.preflight", "driver", "--min-driver", str(int(v["worker"]["minDriver"]))]})
        if pf["storage"]["enabled"]:
            init.append({"name": "storage", **copy.deepcopy(common), "command": self.storage_check_args(),
                         "volumeMounts": copy.deepcopy(mounts)})
        pod: dict[str, Any] = {"restartPolicy": "Never", "automountServiceAccountToken": False}  # no API access
        if v.get("imagePullSecrets"):
            pod["imagePullSecrets"] = copy.deepcopy(v["imagePullSecrets"])
        if v.get("podSecurityContext"):
            pod["securityContext"] = copy.deepcopy(v["podSecurityContext"])
        for key in ("nodeSelector", "tolerations", "affinity"):
            if v["worker"].get(key):
                pod[key] = copy.deepcopy(v["worker"][key])
        if init:
            pod["initContainers"] = init
        pod["containers"] = [{"name": "image", **copy.deepcopy(common), "command": ["python", "-c", PASSED]}]
        if pf["storage"]["enabled"]:
            pod["volumes"] = [self.preflight_volume()]
        meta = self.metadata(self.preflight_name, "preflight")
        fix = pf["storage"]["enabled"] and v["storage"]["fixOwnership"]["enabled"]
        meta["annotations"] = {**PREFLIGHT_HOOK, **checkov_skips(
            PREFLIGHT_SKIPS + tag_only(self.train_image()) + (FIX_SKIPS if fix else ()))}
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {
            "backoffLimit": 0, "activeDeadlineSeconds": int(pf["activeDeadlineSeconds"]),
            "template": {"metadata": {"labels": self.selector_labels("preflight")}, "spec": pod}}}

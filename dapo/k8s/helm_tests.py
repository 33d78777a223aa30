"""The ``helm test`` hook pods (not among the release's objects): ``K-test-shared`` writes and reads back the shared
volume, ``K-test-gpu`` (``test.gpu``) checks one GPU worker's driver and devices -- the chart's ``test-*.yaml``.
"""

from __future__ import annotations

import copy
from typing import Any

from dapo.k8s.context import ChartContext, image_ref
from dapo.k8s.security import RESTRICTED_CONTAINER, TEST_POD_SKIPS, checkov_skips, tag_only

TEST_HOOK = {"helm.sh/hook": "test", "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded"}


class HelmTestPods(ChartContext):
    """The helm test pods and the shared-volume test script."""

    def test_pods(self) -> list[dict[str, Any]]:
        """The ``helm test`` hook pods: the shared volume, and (test.gpu) one GPU worker's driver and devices."""
        v = self.v
        pinned = {"repository": v["image"]["repository"], "tag": v["image"]["tag"],
                  "digest": v["image"].get("digest") or ""}
        image = image_ref(pinned)
        pods = []
        # neither pod talks to the API server
        common: dict[str, Any] = {"restartPolicy": "Never", "automountServiceAccountToken": False}
        if v.get("serviceAccountName"):
            common["serviceAccountName"] = v["serviceAccountName"]
        if v.get("imagePullSecrets"):
            common["imagePullSecrets"] = copy.deepcopy(v["imagePullSecrets"])
        if v.get("podSecurityContext"):
            common["securityContext"] = copy.deepcopy(v["podSecurityContext"])
        shared = dict(common)
        for key in ("nodeSelector", "tolerations"):
            if v["head"].get(key):
                shared[key] = copy.deepcopy(v["head"][key])
        shared["containers"] = [{
            "name": "shared-volume", "image": image, "imagePullPolicy": v["image"]["pullPolicy"],
            "command": ["/bin/sh", "-c", self.shared_test_script()],
            "securityContext": {**copy.deepcopy(RESTRICTED_CONTAINER), "readOnlyRootFilesystem": True},
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "100m", "memory": "128Mi"}},
            "volumeMounts": [{"name": "shared", "mountPath": v["storage"]["mountPath"]}],
        }]
        shared["volumes"] = [{"name": "shared", "persistentVolumeClaim": {"claimName": self.claim_name}}]
        pods.append(self._test_pod("shared", shared))
        pl = self.placement
        gpus = 0
        if v["train"]["enabled"] and pl["backend"] != "local":
            gpus = pl["gpus"]
        elif v["eval"]["enabled"]:
            gpus = pl["evalGpus"]
        if v["test"]["gpu"] and gpus > 0:
            spec = dict(common)
            w = v["worker"]
            if w.get("runtimeClassName"):
                spec["runtimeClassName"] = w["runtimeClassName"]
            for key in ("nodeSelector", "tolerations", "affinity"):
                if w.get(key):
                    spec[key] = copy.deepcopy(w[key])
            res = {"cpu": "1", "memory": "8Gi", "nvidia.com/gpu": str(gpus)}
            spec["containers"] = [{
                "name": "gpu", "image": image, "imagePullPolicy": v["image"]["pullPolicy"],
                "command": ["python", "-m", "dapo.cluster.gpu_check", "--min-driver", str(int(w.get("minDriver") or 0)),
                            "--gpus", str(gpus), "--torch"],
                "securityContext": copy.deepcopy(RESTRICTED_CONTAINER),
                "resources": {"requests": dict(res), "limits": dict(res)},
            }]
            pods.append(self._test_pod("gpu", spec))
        return sorted(pods, key=lambda pod: pod["metadata"]["name"])  # Helm's order: the template file names

    def _test_pod(self, what: str, spec: dict[str, Any]) -> dict[str, Any]:
        meta = self.metadata(f"{self.fullname}-test-{what}", "test")
        v = self.v
        pinned = {"repository": v["image"]["repository"], "tag": v["image"]["tag"], "digest": v["image"].get("digest")}
        meta["annotations"] = {**TEST_HOOK, **checkov_skips(TEST_POD_SKIPS[what] + tag_only(pinned))}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}

    def shared_test_script(self) -> str:
        v = self.v
        m = v["storage"]["mountPath"]
        m = m[:-1] if m.endswith("/") else m
        return (
            f'set -u; f={m}/.dapo-helm-test-$(hostname); want="written by uid $(id -u) gid $(id -g)"; '
            f'if ! echo "$want" > "$f"; then echo "cannot write {m} as uid $(id -u) gid $(id -g): set '
            'podSecurityContext.fsGroup or storage.fixOwnership.enabled (docs/storage.md#permissions)" >&2; exit 1; fi; '
            f'if [ "$(cat "$f")" != "$want" ]; then echo "{m}: read back differs from what was written" >&2; exit 1; '
            f'fi; rm -f "$f"; for d in {v["dataPrep"]["outDir"]} {v["storage"]["hfHome"]}; do if [ -e "$d" ] && '
            '[ ! -w "$d" ]; then echo "$d is not writable by uid $(id -u)" >&2; exit 1; fi; done; '
            f'echo "{m}: write and read back OK as uid $(id -u)"'
        )

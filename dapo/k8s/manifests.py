"""The chart's objects as pure functions: (values, preset, release, namespace) -> Kubernetes objects (dicts).

``charts/dapo/templates`` and this module describe the same objects; ``tests/test_render.py`` renders both for every
preset and compares them (Helm-only labels aside). Nothing here talks to a cluster.

Objects (K = fullname), and the module that builds each:

- Job ``K-preflight`` (``preflight.enabled``, a pre-install hook, :mod:`dapo.k8s.preflight`): the image pulls onto a
  GPU-pool node, the driver, the storage class -- before any RayJob holds a GPU.
- ConfigMap ``K-preset``: the preset file and the files it ``extends:``, verbatim (here).
- PersistentVolumeClaim ``K-shared`` (unless ``storage.existingClaim``): ReadWriteMany, kept on uninstall (here).
- RayJob ``K-train`` (:mod:`dapo.k8s.rayjobs`): ``python -m dapo.train --preset <presetDir>/<preset>.yaml
  placement.nodes=N placement.gpus_per_node=G [overrides]`` on a CPU head + one worker group (replicas = min = max =
  N; pod templates in :mod:`dapo.k8s.pods`): GPU workers for the verl backend, CPU workers (no ``nvidia.com/gpu``)
  for the local backend. ``entrypointNumCpus: TRAIN_ENTRYPOINT_NUM_CPUS`` makes Ray start the job driver -- the DAPO
  loop -- on a worker: the head has ``num-cpus: 0``, so the driver's CPU cannot be found there (without entrypoint
  resources Ray runs a driver on the head whatever the head's resources).
  With ``train.runner: reference``: the upstream DAPO recipe of verl 4f80e46 (:mod:`dapo.reference.translate`) on
  the reproduction image, ``python3 -m dapo.reference.attempt_log --log-dir <ckpt>/logs -- python3 -m
  recipe.dapo.src.main_dapo <args>``.
- RayJob ``K-eval`` (``eval.enabled``, :mod:`dapo.k8s.rayjobs`): ``dapo eval run --checkpoint-dir ... --step ...
  --test-file ... --output ...``.
- ServiceAccount, Role, RoleBinding ``K-logs`` and Jobs ``K-train-logs`` / ``K-eval-logs`` (``logs.enabled``,
  :mod:`dapo.k8s.followers`): one log follower per RayJob, ``kubectl logs -f job/K-train-logs``.
- NetworkPolicy ``K-ray`` (``networkPolicy.enabled``, :mod:`dapo.k8s.security`): the Ray pods accept ingress only
  from the release's pods and the KubeRay operator (dashboard port).
- PodDisruptionBudget ``K-train`` (``disruption.podDisruptionBudget``): maxUnavailable 0 over the training pods (here).
- ServiceAccount, Role, RoleBinding and Job ``K-train-start`` (``train.startGuard`` without a queue, post-install /
  post-upgrade hooks, :mod:`dapo.k8s.start_guard`): a first attempt that fails before it ran is deleted, not retried.
- helm test pods (:mod:`dapo.k8s.helm_tests`; :meth:`Chart.test_pods`, not in :meth:`Chart.objects`):
  ``K-test-shared``, ``K-test-gpu``.

Every RayJob and follower Job carries the annotation ``dapo-k8s.github.io/spec-sha256``
(:func:`dapo.k8s.upgrade.spec_sha256`); an upgrade that would change it while the object exists is refused
(:func:`dapo.k8s.upgrade.upgrade_refusal`, :func:`~dapo.k8s.upgrade.follower_refusal`, the chart's
``dapo.upgradeGuard`` and ``dapo.followerGuard``).

Names, labels and the merged values live in :mod:`dapo.k8s.context`; this module imports the builders above and
:mod:`dapo.k8s.presets`.
"""

from __future__ import annotations

from typing import Any

from dapo.k8s.helm_tests import HelmTestPods
from dapo.k8s.preflight import PreflightJob
from dapo.k8s.start_guard import StartGuard
from dapo.k8s.presets import preset_files
from dapo.k8s.security import NetworkPolicies

# Labels only Helm writes; scripts/render.py output has none of them.
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")


class Chart(StartGuard, HelmTestPods, NetworkPolicies, PreflightJob):
    """Every object of the chart: the ConfigMap, PDB and PVC here, the RayJobs (:class:`dapo.k8s.rayjobs.RayJobs`),
    their log followers (:class:`dapo.k8s.followers.LogFollowers`), the helm test pods
    (:class:`dapo.k8s.helm_tests.HelmTestPods`)."""

    # -- objects -------------------------------------------------------------------------------------------------

    def objects(self) -> list[dict[str, Any]]:
        """Every object but the helm test pods: the preflight (a pre-install hook, which Helm creates first), then
        in template order ConfigMap, log followers, NetworkPolicy, PDB, PVC, RayJobs."""
        out = self.preflight_objects()
        if self.v["train"]["enabled"]:
            out.append(self.preset_configmap())
        out += self.follower_objects()
        policy = self.network_policy()
        if policy:
            out.append(policy)
        if self.v["train"]["enabled"] and self.v["disruption"]["podDisruptionBudget"]:
            out.append(self.pdb())
        if not self.v["storage"]["existingClaim"]:
            out.append(self.pvc())
        if self.v["train"]["enabled"]:
            out.append(self.train_rayjob())
        if self.v["eval"]["enabled"]:
            out.append(self.eval_rayjob())
        return out + self.start_guard_objects()

    def preset_configmap(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": self.metadata(self.preset_cm_name, "preset"),
            "data": dict(sorted(preset_files(self.v["preset"]).items())),
        }

    def pdb(self) -> dict[str, Any]:
        return {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": self.metadata(self.train_job_name, "train"),
            "spec": {"maxUnavailable": 0, "selector": {
                "matchLabels": {"app.kubernetes.io/name": self.name, "app.kubernetes.io/instance": self.release},
                "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In",
                                      "values": ["train-head", "train-worker"]}],
            }},
        }

    def pvc(self) -> dict[str, Any]:
        s = self.v["storage"]
        meta = self.metadata(self.claim_name, "storage")
        if s["keep"]:
            meta["annotations"] = {"helm.sh/resource-policy": "keep"}
        spec: dict[str, Any] = {"accessModes": list(s["accessModes"])}
        if s.get("storageClassName"):
            spec["storageClassName"] = s["storageClassName"]
        spec["resources"] = {"requests": {"storage": s["size"]}}
        return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec}


def build(values: dict[str, Any], *, release: str = "dapo", namespace: str | None = None, chart_name: str = "dapo",
          app_version: str = "0.1.0") -> list[dict[str, Any]]:
    """All objects for coalesced chart values. Raises :class:`ValuesError` naming the offending key."""
    return Chart(values, release=release, namespace=namespace, chart_name=chart_name,
                 app_version=app_version).objects()


__all__ = ["Chart", "HELM_ONLY_LABELS", "build"]

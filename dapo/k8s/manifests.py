"""The chart's objects as pure functions: (values, preset, release, namespace) -> Kubernetes objects (dicts).

``charts/dapo/templates`` and this module describe the same objects; ``tests/test_render.py`` renders both for every
preset and compares them (Helm-only labels aside). Nothing here talks to a cluster.

Objects (K = fullname):

- ConfigMap ``K-preset``: the preset file and the files it ``extends:``, verbatim.
- PersistentVolumeClaim ``K-shared`` (unless ``storage.existingClaim``): ReadWriteMany, kept on uninstall.
- RayJob ``K-train``: ``python -m dapo.train --preset <presetDir>/<preset>.yaml placement.nodes=N
  placement.gpus_per_node=G [overrides]`` on a CPU head + one worker group (replicas = min = max = N): GPU workers
  for the verl backend, CPU workers (no ``nvidia.com/gpu``) for the local backend. ``entrypointNumCpus:
  TRAIN_ENTRYPOINT_NUM_CPUS`` makes Ray start the job driver -- the DAPO loop -- on a worker: the head has
  ``num-cpus: 0``, so the driver's CPU cannot be found there (without entrypoint resources Ray runs a driver on the
  head whatever the head's resources).
  With ``train.runner: reference``: the upstream DAPO recipe of verl 4f80e46 (:mod:`dapo.reference.translate`) on the reproduction
  image, ``python3 -m dapo.reference.attempt_log --log-dir <ckpt>/logs -- python3 -m recipe.dapo.src.main_dapo <args>``.
- RayJob ``K-eval`` (``eval.enabled``): ``dapo eval run --checkpoint-dir ... --step ... --test-file ... --output ...``.
- PodDisruptionBudget ``K-train`` (``disruption.podDisruptionBudget``): maxUnavailable 0 over the training pods.
- helm test pods (:meth:`Chart.test_pods`, not in :meth:`Chart.objects`): ``K-test-shared``, ``K-test-gpu``.

Every RayJob carries the annotation ``dapo-k8s.github.io/spec-sha256`` (:func:`spec_sha256`); an upgrade that would
change it while the RayJob exists is refused (:func:`upgrade_refusal`, the chart's ``dapo.upgradeGuard``).
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from dapo.k8s.presets import (
    ValuesError,
    effective_preset,
    go_quote,
    go_string,
    merged_preset,
    model_repo,
    preset_files,
    q,
    trainer_path,
)
from dapo.k8s.values import check, fullname, hub_offline, placement

# Every job's runtime env: a driver calling ray.init(runtime_env=...) merges with it (Ray 2.60 refuses keys set in
# both otherwise).
JOB_ENV = {"RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"}

# spec.entrypointNumCpus of the training RayJob: the driver (the DAPO loop) needs a Ray CPU, and only workers have
# any (the chart requires head num-cpus "0"). KubeRay v1.7 has no entrypointMemory, and Ray refuses "memory" in
# entrypointResources, so memory is checked by `dapo plan` against the worker pod instead of reserved in Ray.
TRAIN_ENTRYPOINT_NUM_CPUS = 1

# Labels only Helm writes; scripts/render.py output has none of them.
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")

SPEC_HASH_ANNOTATION = "dapo-k8s.github.io/spec-sha256"
DO_NOT_DISRUPT = {"karpenter.sh/do-not-disrupt": "true", "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
TEST_HOOK = {"helm.sh/hook": "test", "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded"}
SMALL = {"cpu": "100m", "memory": "64Mi"}


def go_json(data: Any) -> str:
    """Go's encoding/json (Helm's ``toJson``): keys sorted, no spaces, <, >, &, U+2028, U+2029 escaped."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def spec_sha256(spec: dict[str, Any], preset_files_: dict[str, str] | None = None) -> str:
    """The RayJob's ``dapo-k8s.github.io/spec-sha256``: SHA-256 of the JSON of its spec (and of the preset files the
    training job reads), computed as the chart's ``dapo.rayJobWithHash`` does."""
    content: dict[str, Any] = {"spec": spec}
    if preset_files_ is not None:
        content["presetFiles"] = preset_files_
    return hashlib.sha256(go_json(content).encode()).hexdigest()


def upgrade_refusal(kind: str, new: dict[str, Any], live: dict[str, Any] | None, namespace: str) -> str | None:
    """The chart's ``dapo.upgradeGuard``: the message refusing to replace a live RayJob ``live`` by ``new`` when that
    changes its spec (KubeRay ignores the change now and builds the next retry from it); None when allowed."""
    if not live:
        return None
    name = new["metadata"]["name"]
    old = ((live.get("metadata") or {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION) or ""
    if old == new["metadata"]["annotations"][SPEC_HASH_ANNOTATION]:
        return None
    status = (live.get("status") or {}).get("jobDeploymentStatus") or "unknown"
    return (
        f"{kind}: the RayJob {name} already exists in namespace {namespace} (deployment status {status}) and this "
        "release would change its spec; KubeRay ignores the change now but builds the next retry from it. Delete the "
        f"RayJob first (kubectl -n {namespace} delete rayjob {name}; a new attempt resumes from the latest "
        "checkpoint) or install the change as a new release with its own recipe.trainer.experiment_name"
    )


def runtime_env_yaml(env: dict[str, str]) -> str | None:
    """The RayJob's runtimeEnvYAML (env only: the code is in the image), or None when empty."""
    if not env:
        return None
    return "env_vars:\n" + "".join(f"  {go_quote(k)}: {go_quote(env[k])}\n" for k in sorted(env))


class Chart:
    """What the templates know: values (already coalesced with the chart defaults), release, namespace."""

    def __init__(self, values: dict[str, Any], *, release: str, namespace: str | None, chart_name: str = "dapo",
                 app_version: str = "0.1.0"):
        self.v = values
        self.release = release
        self.namespace = namespace
        self.chart_name = chart_name
        self.app_version = app_version
        self.fullname = fullname(values, release, chart_name)
        self.name = (values.get("nameOverride") or chart_name)[:63]
        self.name = self.name[:-1] if self.name.endswith("-") else self.name
        self.train_job_name = f"{self.fullname}-train"
        self.eval_job_name = f"{self.fullname}-eval"
        self.preset_cm_name = f"{self.fullname}-preset"
        check(values, train_job_name=self.train_job_name, eval_job_name=self.eval_job_name)
        self.preset = merged_preset(values["preset"])
        self.placement = placement(values, self.preset)
        # the preset after the preset-key overrides: paths, experiment name and model of the run
        self.effective = effective_preset(self.preset, list(values["overrides"]))

    # -- names and labels ----------------------------------------------------------------------------------------

    @property
    def claim_name(self) -> str:
        return self.v["storage"]["existingClaim"] or f"{self.fullname}-shared"

    def selector_labels(self, component: str) -> dict[str, str]:
        return {
            "app.kubernetes.io/name": self.name,
            "app.kubernetes.io/instance": self.release,
            "app.kubernetes.io/component": component,
        }

    def labels(self, component: str) -> dict[str, str]:
        return {
            **self.selector_labels(component),
            "app.kubernetes.io/version": self.app_version,
            "app.kubernetes.io/part-of": "dapo",
        }

    def metadata(self, name: str, component: str) -> dict[str, Any]:
        """Object metadata; without a namespace (None) the objects go to kubectl's current namespace."""
        meta: dict[str, Any] = {"name": name}
        if self.namespace is not None:
            meta["namespace"] = self.namespace
        meta["labels"] = self.labels(component)
        return meta

    # -- objects -------------------------------------------------------------------------------------------------

    def objects(self) -> list[dict[str, Any]]:
        """Every object but the helm test pods, in template order (ConfigMap, PDB, PVC, RayJobs)."""
        out = []
        if self.v["train"]["enabled"]:
            out.append(self.preset_configmap())
        if self.v["train"]["enabled"] and self.v["disruption"]["podDisruptionBudget"]:
            out.append(self.pdb())
        if not self.v["storage"]["existingClaim"]:
            out.append(self.pvc())
        if self.v["train"]["enabled"]:
            out.append(self.train_rayjob())
        if self.v["eval"]["enabled"]:
            out.append(self.eval_rayjob())
        return out

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

    def test_pods(self) -> list[dict[str, Any]]:
        """The ``helm test`` hook pods: the shared volume, and (test.gpu) one GPU worker's driver and devices."""
        v = self.v
        image = f"{v['image']['repository']}:{v['image']['tag']}"
        pods = []
        common: dict[str, Any] = {"restartPolicy": "Never"}
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
                "command": ["python", "-m", "dapo.train.gpu_check", "--min-driver", str(int(w.get("minDriver") or 0)),
                            "--gpus", str(gpus), "--torch"],
                "resources": {"requests": dict(res), "limits": dict(res)},
            }]
            pods.append(self._test_pod("gpu", spec))
        return sorted(pods, key=lambda pod: pod["metadata"]["name"])  # Helm's order: the template file names

    def _test_pod(self, what: str, spec: dict[str, Any]) -> dict[str, Any]:
        meta = self.metadata(f"{self.fullname}-test-{what}", "test")
        meta["annotations"] = dict(TEST_HOOK)
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}

    def shared_test_script(self) -> str:
        v = self.v
        m = v["storage"]["mountPath"]
        m = m[:-1] if m.endswith("/") else m
        return (
            f'set -u; f={m}/.dapo-helm-test-$(hostname); want="written by uid $(id -u) gid $(id -g)"; '
            f'if ! echo "$want" > "$f"; then echo "cannot write {m} as uid $(id -u) gid $(id -g): set '
            'podSecurityContext.fsGroup or storage.fixOwnership.enabled (docs/deploy.md)" >&2; exit 1; fi; '
            f'if [ "$(cat "$f")" != "$want" ]; then echo "{m}: read back differs from what was written" >&2; exit 1; '
            f'fi; rm -f "$f"; for d in {v["dataPrep"]["outDir"]} {v["storage"]["hfHome"]}; do if [ -e "$d" ] && '
            '[ ! -w "$d" ]; then echo "$d is not writable by uid $(id -u)" >&2; exit 1; fi; done; '
            f'echo "{m}: write and read back OK as uid $(id -u)"'
        )

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

    def train_entrypoint(self) -> str:
        v, pl = self.v, self.placement
        preset_dir = v["train"]["presetDir"]
        preset_dir = preset_dir[:-1] if preset_dir.endswith("/") else preset_dir
        args = ["python", "-m", "dapo.train", "--preset", f"{preset_dir}/{v['preset']}.yaml"]
        if pl["backend"] != "local":
            args += [f"placement.nodes={pl['nodes']}", f"placement.gpus_per_node={pl['gpus']}"]
        return " ".join(args + list(v["overrides"]))

    def reference_args(self) -> list[str]:
        """``train.runner: reference``: the preset as the reference recipe's arguments, the placement and the
        overrides (Hydra overrides in 4f80e46's key names) replacing generated keys in place."""
        from dapo.config import load_preset
        from dapo.reference.translate import ReferenceError, apply_overrides, check_override, translate

        try:
            args = translate(load_preset(self.v["preset"])).texts()
        except ReferenceError as exc:
            raise ValuesError(
                f"train.runner: preset {q(self.v['preset'])} cannot run on the reference recipe: {exc}"
            ) from None
        for o in self.v["overrides"]:
            try:
                check_override(o)
            except ReferenceError as exc:
                raise ValuesError(str(exc)) from None
        pl = self.placement
        return apply_overrides(args, [f"trainer.nnodes={pl['nodes']}", f"trainer.n_gpus_per_node={pl['gpus']}"]
                               + list(self.v["overrides"]))

    def train_runtime_env(self) -> dict[str, str]:
        """RAY_OVERRIDE_JOB_RUNTIME_ENV=1, the preset's placement.env, then train.runtimeEnv. The override flag lets
        the driver's own ray.init(runtime_env=...) (the verl backend sets the preset env and its loss module
        there) merge with this job-level env instead of failing on keys both set; the driver's values win."""
        env = dict(JOB_ENV)
        env.update({k: go_string(val) for k, val in ((self.preset.get("placement") or {}).get("env") or {}).items()})
        if self.v["train"]["runner"] == "reference":
            # recipe/dapo/runtime_env.yaml's working_dir: the recipe's source tree, in the image
            env["PYTHONPATH"] = self.v["train"]["reference"]["sourceDir"]
        env.update(self.v["train"]["runtimeEnv"])
        return env

    def train_rayjob(self) -> dict[str, Any]:
        v, pl = self.v, self.placement
        image, ray_version = f"{v['image']['repository']}:{v['image']['tag']}", v["rayVersion"]
        entrypoint = None
        if v["train"]["runner"] == "reference":
            from dapo.reference.translate import entrypoint as reference_entrypoint

            ref = v["train"]["reference"]
            image, ray_version = f"{ref['image']['repository']}:{ref['image']['tag']}", ref["rayVersion"]
            entrypoint = reference_entrypoint(self.reference_args())
        return self.rayjob(
            kind="train",
            name=self.train_job_name,
            job=v["train"],
            entrypoint=entrypoint or self.train_entrypoint(),
            runtime_env=self.train_runtime_env(),
            image=image,
            nodes=pl["nodes"],
            gpus=0 if pl["backend"] == "local" else pl["gpus"],
            presets=True,
            ray_version=ray_version,
            entrypoint_num_cpus=TRAIN_ENTRYPOINT_NUM_CPUS,
        )

    def eval_paths(self) -> dict[str, str]:
        ev = self.v["eval"]
        recipe = self.effective.get("recipe") or {}
        trainer = recipe.get("trainer") or {}
        ckpt = ev.get("checkpointDir") or trainer_path(trainer["default_local_dir"], trainer)
        test = ev.get("testFile") or recipe["data"]["val_files"][0]
        out = ev.get("outputDir") or f"{ckpt[:-1] if ckpt.endswith('/') else ckpt}/eval"
        return {"checkpointDir": ckpt, "testFile": test, "outputDir": out}

    def eval_entrypoint(self) -> str:
        ev = self.v["eval"]
        p = self.eval_paths()
        args = ["dapo", "eval", "run", "--checkpoint-dir", p["checkpointDir"], "--step", go_string(ev["step"]),
                "--test-file", p["testFile"], "--output", p["outputDir"]]
        if ev.get("benchmarks"):  # one serving per checkpoint, every benchmark (files beside the test file)
            args += ["--benchmarks", ",".join(ev["benchmarks"])]
        if ev.get("stride") is not None:
            args += ["--stride", go_string(ev["stride"])]
        return " ".join(args + list(ev["extraArgs"]))

    def eval_rayjob(self) -> dict[str, Any]:
        v = self.v
        ev = v["eval"]
        image = f"{ev['image'].get('repository') or v['image']['repository']}:{ev['image'].get('tag') or v['image']['tag']}"
        return self.rayjob(
            kind="eval",
            name=self.eval_job_name,
            job=ev,
            entrypoint=self.eval_entrypoint(),
            runtime_env={**JOB_ENV, **ev["runtimeEnv"]},
            image=image,
            nodes=int(ev["nodes"]),
            gpus=self.placement["evalGpus"],
            presets=False,
        )

    # -- pieces --------------------------------------------------------------------------------------------------

    def env(self, *, head: bool, kind: str = "train") -> list[dict[str, Any]]:
        v = self.v
        s = v["secret"]
        env: list[dict[str, Any]] = [
            {"name": "HF_HOME", "value": v["storage"]["hfHome"]},
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
                "name": s["name"], "key": s["hfTokenKey"], "optional": s["hfTokenOptional"]}}},
            # the evaluation never needs wandb
            {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {
                "name": s["name"], "key": s["wandbApiKeyKey"],
                "optional": bool(s["wandbApiKeyOptional"] or kind == "eval")}}},
        ]
        if hub_offline(v, self.preset):
            env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
        if (v.get("wandb") or {}).get("entity"):
            env.append({"name": "WANDB_ENTITY", "value": v["wandb"]["entity"]})
        env.append({"name": "RAY_memory_monitor_refresh_ms", "value": "0"})
        if head:
            env.append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"})
        env += [{"name": k, "value": v["nccl"][k]} for k in sorted(v["nccl"])]
        env += [{"name": k, "value": v["env"][k]} for k in sorted(v["env"])]
        return env

    def pod_common(self) -> dict[str, Any]:
        v = self.v
        out: dict[str, Any] = {}
        if v.get("serviceAccountName"):
            out["serviceAccountName"] = v["serviceAccountName"]
        if v.get("imagePullSecrets"):
            out["imagePullSecrets"] = copy.deepcopy(v["imagePullSecrets"])
        if v.get("hostNetwork"):
            out["hostNetwork"] = True
            out["dnsPolicy"] = "ClusterFirstWithHostNet"
        if v.get("priorityClassName"):
            out["priorityClassName"] = v["priorityClassName"]
        if v.get("schedulerName"):
            out["schedulerName"] = v["schedulerName"]
        if v.get("podSecurityContext"):
            out["securityContext"] = copy.deepcopy(v["podSecurityContext"])
        return out

    def pod_annotations(self, own: dict[str, str] | None) -> dict[str, str]:
        out = dict(DO_NOT_DISRUPT) if self.v["disruption"]["doNotDisrupt"] else {}
        out.update(own or {})
        return out

    def ray_container_common(self, *, gpu_check: bool = False) -> dict[str, Any]:
        lifecycle: dict[str, Any] = {}
        min_driver = int(self.v["worker"].get("minDriver") or 0)
        if gpu_check and min_driver > 0:
            lifecycle["postStart"] = {"exec": {"command": ["python", "-m", "dapo.train.gpu_check", "--min-driver",
                                                           str(min_driver)]}}
        lifecycle["preStop"] = {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}
        out: dict[str, Any] = {"lifecycle": lifecycle}
        sc = copy.deepcopy(self.v.get("securityContext") or {})
        if self.v.get("ipcLock"):
            caps = sc.setdefault("capabilities", {})
            add = list(caps.get("add") or [])
            if "IPC_LOCK" not in add:
                add.append("IPC_LOCK")
            caps["add"] = add
        if sc:
            out["securityContext"] = sc
        return out

    def volumes(self, *, shm: str, presets: bool, extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        vols: list[dict[str, Any]] = [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
            {"name": "shared", "persistentVolumeClaim": {"claimName": self.claim_name}},
        ]
        if presets:
            vols.append({"name": "presets", "configMap": {"name": self.preset_cm_name}})
        return vols + copy.deepcopy(extra or [])

    def volume_mounts(self, *, presets: bool, extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        mounts: list[dict[str, Any]] = [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "shared", "mountPath": self.v["storage"]["mountPath"]},
        ]
        if presets:
            mounts.append({"name": "presets", "mountPath": self.v["train"]["presetDir"], "readOnly": True})
        return mounts + copy.deepcopy(extra or [])

    def hub_env(self) -> list[dict[str, Any]]:
        v = self.v
        s = v["secret"]
        return [
            {"name": "HF_HOME", "value": v["storage"]["hfHome"]},
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
                "name": s["name"], "key": s["hfTokenKey"], "optional": s["hfTokenOptional"]}}},
        ] + [{"name": k, "value": v["env"][k]} for k in sorted(v["env"])]

    def head_init_containers(self, image: str) -> list[dict[str, Any]]:
        """fix-ownership (storage.fixOwnership, as root), data-prepare, model-fetch (dataPrep.fetchModel)."""
        v = self.v
        out = []
        if v["storage"]["fixOwnership"]["enabled"]:
            out.append(self.fix_ownership_init_container(image))
        if v["dataPrep"]["enabled"]:
            out.append(self.data_prep_init_container(image))
            repo = model_repo(self.effective)
            if repo and v["dataPrep"].get("fetchModel"):
                out.append({
                    "name": "model-fetch", "image": image, "imagePullPolicy": v["image"]["pullPolicy"],
                    "command": ["hf", "download", repo], "env": self.hub_env(),
                    "resources": copy.deepcopy(v["dataPrep"]["resources"]),
                    "volumeMounts": [{"name": "shared", "mountPath": v["storage"]["mountPath"]}],
                })
        return out

    def fix_ownership_init_container(self, image: str) -> dict[str, Any]:
        v = self.v
        o = v["storage"]["fixOwnership"]
        dirs = " ".join(dict.fromkeys(
            p[:-1] if p.endswith("/") else p for p in (v["storage"]["mountPath"], v["dataPrep"]["outDir"],
                                                       v["storage"]["hfHome"])))
        script = (f'set -eu; for d in {dirs}; do mkdir -p "$d"; chown {int(o["uid"])}:{int(o["gid"])} "$d"; '
                  f'chmod 2775 "$d"; done; ls -ld {dirs}')
        return {
            "name": "fix-ownership", "image": image, "imagePullPolicy": v["image"]["pullPolicy"],
            "command": ["/bin/sh", "-c", script],
            "securityContext": {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False},
            "resources": {"requests": dict(SMALL), "limits": dict(SMALL)},
            "volumeMounts": [{"name": "shared", "mountPath": v["storage"]["mountPath"]}],
        }

    def data_prep_init_container(self, image: str) -> dict[str, Any]:
        v = self.v
        d = v["dataPrep"]
        cmd = ["dapo", "data", "prepare", "--out", d["outDir"]] + (["--dedup"] if d["dedup"] else []) + list(
            d["extraArgs"]
        )
        s = v["secret"]
        return {
            "name": "data-prepare",
            "image": image,
            "imagePullPolicy": v["image"]["pullPolicy"],
            "command": cmd,
            "env": [
                {"name": "HF_HOME", "value": v["storage"]["hfHome"]},
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
                    "name": s["name"], "key": s["hfTokenKey"], "optional": s["hfTokenOptional"]}}},
            ] + [{"name": k, "value": v["env"][k]} for k in sorted(v["env"])],
            "resources": copy.deepcopy(d["resources"]),
            "volumeMounts": [{"name": "shared", "mountPath": v["storage"]["mountPath"]}],
        }

    def head_group(self, *, kind: str, image: str, presets: bool) -> dict[str, Any]:
        v = self.v
        h = v["head"]
        meta: dict[str, Any] = {"labels": {**self.selector_labels(f"{kind}-head"), **(h.get("labels") or {})}}
        annotations = self.pod_annotations(h.get("annotations"))
        if annotations:
            meta["annotations"] = annotations
        spec: dict[str, Any] = self.pod_common()
        if h.get("restartPolicy"):
            spec["restartPolicy"] = h["restartPolicy"]
        if h.get("runtimeClassName"):
            spec["runtimeClassName"] = h["runtimeClassName"]
        for key in ("nodeSelector", "tolerations", "affinity"):
            if h.get(key):
                spec[key] = copy.deepcopy(h[key])
        init = self.head_init_containers(image)
        if init:
            spec["initContainers"] = init
        container = {
            "name": "ray-head",
            "image": image,
            "imagePullPolicy": v["image"]["pullPolicy"],
            "ports": [
                {"name": "gcs-server", "containerPort": 6379},
                {"name": "dashboard", "containerPort": 8265},
                {"name": "client", "containerPort": 10001},
                {"name": "serve", "containerPort": 8000},
            ],
            "env": self.env(head=True, kind=kind),
            "resources": copy.deepcopy(h["resources"]),
            "volumeMounts": self.volume_mounts(presets=presets, extra=h.get("extraVolumeMounts")),
            **self.ray_container_common(),
        }
        spec["containers"] = [container] + copy.deepcopy(h.get("sidecarContainers") or [])
        spec["volumes"] = self.volumes(shm=h["shmSize"], presets=presets, extra=h.get("extraVolumes"))
        return {"rayStartParams": dict(h["rayStartParams"]), "template": {"metadata": meta, "spec": spec}}

    def worker_group(self, *, kind: str, image: str, nodes: int, gpus: int, presets: bool) -> dict[str, Any]:
        v = self.v
        w = v["worker"]
        meta: dict[str, Any] = {"labels": {**self.selector_labels(f"{kind}-worker"), **(w.get("labels") or {})}}
        annotations = self.pod_annotations(w.get("annotations"))
        if annotations:
            meta["annotations"] = annotations
        spec: dict[str, Any] = self.pod_common()
        if w.get("runtimeClassName"):
            spec["runtimeClassName"] = w["runtimeClassName"]
        for key in ("nodeSelector", "tolerations"):
            if w.get(key):
                spec[key] = copy.deepcopy(w[key])
        affinity = copy.deepcopy(w.get("affinity") or {})
        if w["onePerHost"]:
            affinity["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": self.selector_labels(f"{kind}-worker")},
            }]}
        if affinity:
            spec["affinity"] = affinity
        resources = copy.deepcopy(w["resources"])
        for section in ("requests", "limits"):
            r = resources.get(section) or {}
            if gpus > 0:  # a CPU worker group (local backend) requests no GPU
                r["nvidia.com/gpu"] = str(gpus)
            r.update(copy.deepcopy(w.get("extraResources") or {}))
            resources[section] = r
        container = {
            "name": "ray-worker",
            "image": image,
            "imagePullPolicy": v["image"]["pullPolicy"],
            "env": self.env(head=False, kind=kind),
            "resources": resources,
            "volumeMounts": self.volume_mounts(presets=presets, extra=w.get("extraVolumeMounts")),
            **self.ray_container_common(gpu_check=gpus > 0),
        }
        spec["containers"] = [container] + copy.deepcopy(w.get("sidecarContainers") or [])
        spec["volumes"] = self.volumes(shm=w["shmSize"], presets=presets, extra=w.get("extraVolumes"))
        return {
            "groupName": w["groupName"],
            "replicas": nodes,
            "minReplicas": nodes,
            "maxReplicas": nodes,
            "rayStartParams": dict(w.get("rayStartParams") or {}),
            "template": {"metadata": meta, "spec": spec},
        }

    def rayjob(self, *, kind: str, name: str, job: dict[str, Any], entrypoint: str, runtime_env: dict[str, str],
               image: str, nodes: int, gpus: int, presets: bool, ray_version: str | None = None,
               entrypoint_num_cpus: int | None = None) -> dict[str, Any]:
        v = self.v
        meta = self.metadata(name, kind)
        queue_label = {"kueue": "kueue.x-k8s.io/queue-name", "volcano": "volcano.sh/queue-name",
                       "kai": "kai.scheduler/queue"}.get(v["queue"]["scheduler"])
        if queue_label:
            meta["labels"][queue_label] = v["queue"]["name"]
        spec: dict[str, Any] = {"entrypoint": entrypoint}
        if entrypoint_num_cpus is not None:
            spec["entrypointNumCpus"] = entrypoint_num_cpus
        renv = runtime_env_yaml(runtime_env)
        if renv:
            spec["runtimeEnvYAML"] = renv
        spec["submissionMode"] = job["submissionMode"]
        spec["backoffLimit"] = int(job["backoffLimit"])
        if job.get("activeDeadlineSeconds") is not None:
            spec["activeDeadlineSeconds"] = int(job["activeDeadlineSeconds"])
        if job.get("preRunningDeadlineSeconds") is not None:
            spec["preRunningDeadlineSeconds"] = int(job["preRunningDeadlineSeconds"])
        spec["shutdownAfterJobFinishes"] = bool(job["shutdownAfterJobFinishes"])
        spec["ttlSecondsAfterFinished"] = int(job["ttlSecondsAfterFinished"])
        if job.get("deletionRules"):
            spec["deletionStrategy"] = {"deletionRules": copy.deepcopy(job["deletionRules"])}
        if job["submissionMode"] == "K8sJobMode":
            spec["submitterConfig"] = {"backoffLimit": int(job["submitter"]["backoffLimit"])}
            pod_spec: dict[str, Any] = {"restartPolicy": "Never"}
            for key in ("serviceAccountName", "priorityClassName"):
                if v.get(key):
                    pod_spec[key] = v[key]
            if v.get("podSecurityContext"):
                pod_spec["securityContext"] = copy.deepcopy(v["podSecurityContext"])
            if v.get("imagePullSecrets"):
                pod_spec["imagePullSecrets"] = copy.deepcopy(v["imagePullSecrets"])
            for key in ("nodeSelector", "tolerations"):
                if v["head"].get(key):
                    pod_spec[key] = copy.deepcopy(v["head"][key])
            # no command: KubeRay fills in its submitter script, which checks `ray job status` before submitting
            pod_spec["containers"] = [{
                "name": "ray-job-submitter",
                "image": image,
                "imagePullPolicy": v["image"]["pullPolicy"],
                "resources": copy.deepcopy(job["submitter"]["resources"]),
            }]
            spec["submitterPodTemplate"] = {"metadata": {"labels": self.selector_labels(f"{kind}-submitter")},
                                            "spec": pod_spec}
        cluster: dict[str, Any] = {
            "rayVersion": ray_version or v["rayVersion"],
            "enableInTreeAutoscaling": False,
            "headGroupSpec": self.head_group(kind=kind, image=image, presets=presets),
        }
        if nodes > 0:
            cluster["workerGroupSpecs"] = [
                self.worker_group(kind=kind, image=image, nodes=nodes, gpus=gpus, presets=presets)
            ]
        spec["rayClusterSpec"] = cluster
        files = preset_files(v["preset"]) if presets else None
        meta["annotations"] = {SPEC_HASH_ANNOTATION: spec_sha256(spec, files)}
        return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": meta, "spec": spec}


def build(values: dict[str, Any], *, release: str = "dapo", namespace: str | None = None, chart_name: str = "dapo",
          app_version: str = "0.1.0") -> list[dict[str, Any]]:
    """All objects for coalesced chart values. Raises :class:`ValuesError` naming the offending key."""
    return Chart(values, release=release, namespace=namespace, chart_name=chart_name,
                 app_version=app_version).objects()


__all__ = ["Chart", "HELM_ONLY_LABELS", "SPEC_HASH_ANNOTATION", "ValuesError", "build", "go_json", "go_quote",
           "runtime_env_yaml", "spec_sha256", "upgrade_refusal"]

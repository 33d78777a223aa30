"""The chart's objects as pure functions: (values, preset, release, namespace) -> Kubernetes objects (dicts).

``charts/dapo/templates`` and this module describe the same objects; ``tests/test_render.py`` renders both for every
preset and compares them (Helm-only labels aside). Nothing here talks to a cluster.

Objects (K = fullname):

- ConfigMap ``K-preset``: the preset file and the files it ``extends:``, verbatim.
- PersistentVolumeClaim ``K-shared`` (unless ``storage.existingClaim``): ReadWriteMany, kept on uninstall.
- RayJob ``K-train``: ``python -m dapo.train --preset <presetDir>/<preset>.yaml placement.nodes=N
  placement.gpus_per_node=G [overrides]`` on a CPU head + one GPU worker group (replicas = min = max = N).
- RayJob ``K-eval`` (``eval.enabled``): ``dapo eval run --checkpoint-dir ... --step ... --test-file ... --output ...``.
"""

from __future__ import annotations

import copy
from typing import Any

from dapo.k8s.presets import ValuesError, go_quote, go_string, merged_preset, preset_files, trainer_path
from dapo.k8s.values import check, fullname, placement

# Every job's runtime env: a driver calling ray.init(runtime_env=...) merges with it (Ray 2.60 refuses keys set in
# both otherwise).
JOB_ENV = {"RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"}

# Labels only Helm writes; scripts/render.py output has none of them.
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")


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
        """Every object, in Helm's install order (ConfigMap, PVC, RayJobs)."""
        out = []
        if self.v["train"]["enabled"]:
            out.append(self.preset_configmap())
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

    def train_runtime_env(self) -> dict[str, str]:
        """RAY_OVERRIDE_JOB_RUNTIME_ENV=1, the preset's placement.env, then train.runtimeEnv. The override flag lets
        the driver's own ray.init(runtime_env=...) (the verl backend sets the preset env and its loss module
        there) merge with this job-level env instead of failing on keys both set; the driver's values win."""
        env = dict(JOB_ENV)
        env.update({k: go_string(val) for k, val in ((self.preset.get("placement") or {}).get("env") or {}).items()})
        env.update(self.v["train"]["runtimeEnv"])
        return env

    def train_rayjob(self) -> dict[str, Any]:
        v, pl = self.v, self.placement
        return self.rayjob(
            kind="train",
            name=self.train_job_name,
            job=v["train"],
            entrypoint=self.train_entrypoint(),
            runtime_env=self.train_runtime_env(),
            image=f"{v['image']['repository']}:{v['image']['tag']}",
            nodes=0 if pl["backend"] == "local" else pl["nodes"],
            gpus=pl["gpus"],
            presets=True,
        )

    def eval_paths(self) -> dict[str, str]:
        ev = self.v["eval"]
        recipe = self.preset.get("recipe") or {}
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

    def env(self, *, head: bool) -> list[dict[str, Any]]:
        v = self.v
        s = v["secret"]
        env: list[dict[str, Any]] = [
            {"name": "HF_HOME", "value": v["storage"]["hfHome"]},
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
                "name": s["name"], "key": s["hfTokenKey"], "optional": s["hfTokenOptional"]}}},
            {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {
                "name": s["name"], "key": s["wandbApiKeyKey"], "optional": s["wandbApiKeyOptional"]}}},
        ]
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
        return out

    def ray_container_common(self) -> dict[str, Any]:
        out: dict[str, Any] = {"lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}}}
        if self.v.get("ipcLock"):
            out["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
        return out

    def volumes(self, *, shm: str, presets: bool) -> list[dict[str, Any]]:
        vols: list[dict[str, Any]] = [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
            {"name": "shared", "persistentVolumeClaim": {"claimName": self.claim_name}},
        ]
        if presets:
            vols.append({"name": "presets", "configMap": {"name": self.preset_cm_name}})
        return vols

    def volume_mounts(self, *, presets: bool) -> list[dict[str, Any]]:
        mounts: list[dict[str, Any]] = [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "shared", "mountPath": self.v["storage"]["mountPath"]},
        ]
        if presets:
            mounts.append({"name": "presets", "mountPath": self.v["train"]["presetDir"], "readOnly": True})
        return mounts

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
        if h.get("annotations"):
            meta["annotations"] = dict(h["annotations"])
        spec: dict[str, Any] = self.pod_common()
        if h.get("restartPolicy"):
            spec["restartPolicy"] = h["restartPolicy"]
        for key in ("nodeSelector", "tolerations", "affinity"):
            if h.get(key):
                spec[key] = copy.deepcopy(h[key])
        if v["dataPrep"]["enabled"]:
            spec["initContainers"] = [self.data_prep_init_container(image)]
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
            "env": self.env(head=True),
            "resources": copy.deepcopy(h["resources"]),
            "volumeMounts": self.volume_mounts(presets=presets),
            **self.ray_container_common(),
        }
        spec["containers"] = [container]
        spec["volumes"] = self.volumes(shm=h["shmSize"], presets=presets)
        return {"rayStartParams": dict(h["rayStartParams"]), "template": {"metadata": meta, "spec": spec}}

    def worker_group(self, *, kind: str, image: str, nodes: int, gpus: int, presets: bool) -> dict[str, Any]:
        v = self.v
        w = v["worker"]
        meta: dict[str, Any] = {"labels": {**self.selector_labels(f"{kind}-worker"), **(w.get("labels") or {})}}
        if w.get("annotations"):
            meta["annotations"] = dict(w["annotations"])
        spec: dict[str, Any] = self.pod_common()
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
            r["nvidia.com/gpu"] = str(gpus)
            r.update(copy.deepcopy(w.get("extraResources") or {}))
            resources[section] = r
        container = {
            "name": "ray-worker",
            "image": image,
            "imagePullPolicy": v["image"]["pullPolicy"],
            "env": self.env(head=False),
            "resources": resources,
            "volumeMounts": self.volume_mounts(presets=presets),
            **self.ray_container_common(),
        }
        spec["containers"] = [container]
        spec["volumes"] = self.volumes(shm=w["shmSize"], presets=presets)
        return {
            "groupName": w["groupName"],
            "replicas": nodes,
            "minReplicas": nodes,
            "maxReplicas": nodes,
            "rayStartParams": dict(w.get("rayStartParams") or {}),
            "template": {"metadata": meta, "spec": spec},
        }

    def rayjob(self, *, kind: str, name: str, job: dict[str, Any], entrypoint: str, runtime_env: dict[str, str],
               image: str, nodes: int, gpus: int, presets: bool) -> dict[str, Any]:
        v = self.v
        meta = self.metadata(name, kind)
        queue_label = {"kueue": "kueue.x-k8s.io/queue-name", "volcano": "volcano.sh/queue-name",
                       "kai": "kai.scheduler/queue"}.get(v["queue"]["scheduler"])
        if queue_label:
            meta["labels"][queue_label] = v["queue"]["name"]
        spec: dict[str, Any] = {"entrypoint": entrypoint}
        renv = runtime_env_yaml(runtime_env)
        if renv:
            spec["runtimeEnvYAML"] = renv
        spec["submissionMode"] = job["submissionMode"]
        spec["backoffLimit"] = int(job["backoffLimit"])
        if job.get("activeDeadlineSeconds") is not None:
            spec["activeDeadlineSeconds"] = int(job["activeDeadlineSeconds"])
        spec["shutdownAfterJobFinishes"] = bool(job["shutdownAfterJobFinishes"])
        spec["ttlSecondsAfterFinished"] = int(job["ttlSecondsAfterFinished"])
        if job.get("deletionRules"):
            spec["deletionStrategy"] = {"deletionRules": copy.deepcopy(job["deletionRules"])}
        if job["submissionMode"] == "K8sJobMode":
            spec["submitterConfig"] = {"backoffLimit": int(job["submitter"]["backoffLimit"])}
            pod_spec: dict[str, Any] = {"restartPolicy": "Never"}
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
            "rayVersion": v["rayVersion"],
            "enableInTreeAutoscaling": False,
            "headGroupSpec": self.head_group(kind=kind, image=image, presets=presets),
        }
        if nodes > 0:
            cluster["workerGroupSpecs"] = [
                self.worker_group(kind=kind, image=image, nodes=nodes, gpus=gpus, presets=presets)
            ]
        spec["rayClusterSpec"] = cluster
        return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": meta, "spec": spec}


def build(values: dict[str, Any], *, release: str = "dapo", namespace: str | None = None, chart_name: str = "dapo",
          app_version: str = "0.1.0") -> list[dict[str, Any]]:
    """All objects for coalesced chart values. Raises :class:`ValuesError` naming the offending key."""
    return Chart(values, release=release, namespace=namespace, chart_name=chart_name,
                 app_version=app_version).objects()


__all__ = ["Chart", "HELM_ONLY_LABELS", "ValuesError", "build", "go_quote", "runtime_env_yaml"]

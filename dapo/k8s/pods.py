"""The Ray pods of a RayJob: head and worker group templates, their containers (environment, lifecycle,
securityContext), volumes and mounts, and the head's init containers (fix-ownership, data-prepare, model-fetch) --
the chart's ``dapo.rayJob`` pod parts.
"""

from __future__ import annotations

import copy
from typing import Any

from dapo.backends.verl.settings import CPU_RAY_CPUS_PER_GPU
from dapo.k8s.context import ChartContext
from dapo.k8s.presets import model_repo
from dapo.k8s.security import FIX_OWNERSHIP_CONTAINER, RESTRICTED_CONTAINER, checkov_skips, ray_pod_skips
from dapo.k8s.values import hub_offline

DO_NOT_DISRUPT = {"karpenter.sh/do-not-disrupt": "true", "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
SMALL = {"cpu": "100m", "memory": "64Mi"}


# the head's init containers: a failed run's last log lines become its termination message, which the log follower
# prints while the run waits (dapo.cluster.waits) without reading pod logs
TERMINATION_MESSAGE = "FallbackToLogsOnError"

# The Hugging Face token as a file, never an environment variable: huggingface_hub (0.30 in the reproduction image,
# 1.33 in the others; constants.py) reads HF_TOKEN, else the file HF_TOKEN_PATH (default $HF_HOME/token). Only the
# containers that download from the hub mount it (see PodTemplates.hub_reads).
HF_TOKEN_VOLUME = "hf-token"
HF_TOKEN_DIR = "/var/run/secrets/dapo/hf"
HF_TOKEN_PATH = f"{HF_TOKEN_DIR}/token"


def split_sidecars(sidecars: list[dict[str, Any]] | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(native, plain): the sidecars with ``restartPolicy: Always`` -- Kubernetes native sidecars, init containers
    that keep running and are started (startupProbe passed) before the main containers -- and the others (more
    containers). The chart's ``dapo.splitSidecars``."""
    native = [copy.deepcopy(c) for c in sidecars or [] if str(c.get("restartPolicy")) == "Always"]
    plain = [copy.deepcopy(c) for c in sidecars or [] if str(c.get("restartPolicy")) != "Always"]
    return native, plain


def sidecar_names(group: dict[str, Any]) -> list[str]:
    """The names of a group's sidecarContainers (the values' containers, not the chart's)."""
    return [str(c.get("name")) for c in group.get("sidecarContainers") or []]


def env_profile_command(values: dict[str, Any]) -> str:
    """``fabric.ncclEnvProfile``: what a Ray worker container runs before KubeRay's generated ``ulimit ...; ray
    start ...`` (KubeRay v1.7 ``BuildPod`` runs ``<container args> && <generated command>`` in ``bash -c``), so that
    every Ray process of the pod inherits the profile's variables; a missing profile ends the container. "" without
    a profile. The chart's ``dapo.envProfileCommand``."""
    path = (values.get("fabric") or {}).get("ncclEnvProfile") or ""
    if not path:
        return ""
    return (f'if [ -r "{path}" ]; then . "{path}"; echo "dapo: sourced {path} (fabric.ncclEnvProfile)"; else echo '
            f'"dapo: fabric.ncclEnvProfile {path} does not exist on this node: the NCCL plugin installer DaemonSet '
            f'has not installed it (docs/fabric.md)" >&2; exit 1; fi')


class PodTemplates(ChartContext):
    """The pod templates of the head and worker groups, and the pieces they share."""

    def hub_reads(self) -> bool:
        """Whether the training run downloads its model from the hub at run time (a hub model that the data
        preparation does not fetch beforehand): then the driver and verl's workers, on the training workers, need the
        HF token. The evaluation reads only the exported checkpoint; the heads run no hub download but their init
        containers'."""
        return bool(model_repo(self.effective)) and not hub_offline(self.v, self.preset)

    def eval_logs_wandb(self) -> bool:
        """Whether ``dapo eval run`` logs to wandb (``--wandb-project`` in eval.extraArgs or WANDB_PROJECT in
        eval.runtimeEnv, dapo.eval.scoring.log_wandb): only then does its driver, on the evaluation head, get the key."""
        ev = self.v["eval"]
        return any(str(a).split("=", 1)[0] == "--wandb-project" for a in ev["extraArgs"]) or \
            "WANDB_PROJECT" in (ev.get("runtimeEnv") or {})

    def wandb_key(self, *, head: bool, kind: str) -> bool:
        """Whether a Ray container gets WANDB_API_KEY: the training workers (the driver -- our loop, or the
        reference recipe's TaskRunner -- runs on one of them: entrypointNumCpus, head num-cpus 0) and the evaluation
        head when the evaluation logs to wandb (its driver runs on the head)."""
        return (kind == "train" and not head) or (kind == "eval" and head and self.eval_logs_wandb())

    def hf_token_here(self, *, head: bool, kind: str) -> bool:
        """Whether a Ray container gets the HF token file: the training workers when the run reads the hub."""
        return kind == "train" and not head and self.hub_reads()

    def hf_token_volume(self) -> dict[str, Any]:
        s = self.v["secret"]
        return {"name": HF_TOKEN_VOLUME, "secret": {"secretName": s["name"], "optional": bool(s["hfTokenOptional"]),
                                                  "items": [{"key": s["hfTokenKey"], "path": "token"}]}}

    def env(self, *, head: bool, kind: str = "train") -> list[dict[str, Any]]:
        v = self.v
        s = v["secret"]
        env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": v["storage"]["hfHome"]}]
        if self.hf_token_here(head=head, kind=kind):
            env.append({"name": "HF_TOKEN_PATH", "value": HF_TOKEN_PATH})
        if self.wandb_key(head=head, kind=kind):  # wandb reads its key only from WANDB_API_KEY or a netrc file
            env.append({"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {
                "name": s["name"], "key": s["wandbApiKeyKey"], "optional": bool(s["wandbApiKeyOptional"])}}})
        if hub_offline(v, self.preset):
            env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
        if (v.get("wandb") or {}).get("entity"):
            env.append({"name": "WANDB_ENTITY", "value": v["wandb"]["entity"]})
        env.append({"name": "RAY_memory_monitor_refresh_ms", "value": "0"})
        # the node and pod of this Ray process (downward API): the run names a failing or slow node by them
        env += [{"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
                for name, path in (("DAPO_NODE_NAME", "spec.nodeName"), ("DAPO_POD_NAME", "metadata.name"))]
        if head:
            env.append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"})
        env += [{"name": k, "value": v["nccl"][k]} for k in sorted(v["nccl"])]
        env += [{"name": k, "value": v["env"][k]} for k in sorted(v["env"])]
        return env

    def pod_common(self) -> dict[str, Any]:
        v = self.v
        # no Ray process calls the Kubernetes API (the autoscaler is off): no token for job code to act with
        out: dict[str, Any] = {"automountServiceAccountToken": bool(v["automountServiceAccountToken"])}
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

    def ray_container_common(self, *, gpu_check: bool = False, pre_stop: str = "ray stop") -> dict[str, Any]:
        lifecycle: dict[str, Any] = {}
        min_driver = int(self.v["worker"].get("minDriver") or 0)
        if gpu_check and min_driver > 0:
            lifecycle["postStart"] = {"exec": {"command": ["python", "-m", "dapo.cluster.gpu_check", "--min-driver",
                                                           str(min_driver)]}}
        lifecycle["preStop"] = {"exec": {"command": ["/bin/sh", "-c", pre_stop]}}
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

    def volumes(self, *, shm: str, presets: bool, hf_token: bool = False,
                extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        vols: list[dict[str, Any]] = [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
            {"name": "shared", "persistentVolumeClaim": {"claimName": self.claim_name}},
        ]
        if presets:
            vols.append({"name": "presets", "configMap": {"name": self.preset_cm_name}})
        if hf_token:
            vols.append(self.hf_token_volume())
        return vols + copy.deepcopy(extra or [])

    def volume_mounts(self, *, presets: bool, hf_token: bool = False,
                      extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        mounts: list[dict[str, Any]] = [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "shared", "mountPath": self.v["storage"]["mountPath"]},
        ]
        if presets:
            mounts.append({"name": "presets", "mountPath": self.v["train"]["presetDir"], "readOnly": True})
        if hf_token:
            mounts.append({"name": HF_TOKEN_VOLUME, "mountPath": HF_TOKEN_DIR, "readOnly": True})
        return mounts + copy.deepcopy(extra or [])

    def hub_env(self) -> list[dict[str, Any]]:
        """HF_HOME and the token file of the download steps (data preparation, model download), then ``env``."""
        v = self.v
        return [
            {"name": "HF_HOME", "value": v["storage"]["hfHome"]},
            {"name": "HF_TOKEN_PATH", "value": HF_TOKEN_PATH},
        ] + [{"name": k, "value": v["env"][k]} for k in sorted(v["env"])]

    def hub_mounts(self) -> list[dict[str, Any]]:
        return [{"name": "shared", "mountPath": self.v["storage"]["mountPath"]},
                {"name": HF_TOKEN_VOLUME, "mountPath": HF_TOKEN_DIR, "readOnly": True}]

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
                    "terminationMessagePolicy": TERMINATION_MESSAGE,
                    "command": ["hf", "download", repo], "env": self.hub_env(),
                    "securityContext": copy.deepcopy(RESTRICTED_CONTAINER),
                    "resources": copy.deepcopy(v["dataPrep"]["resources"]),
                    "volumeMounts": self.hub_mounts(),
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
            "terminationMessagePolicy": TERMINATION_MESSAGE,
            "command": ["/bin/sh", "-c", script],
            "securityContext": copy.deepcopy(FIX_OWNERSHIP_CONTAINER),
            "resources": {"requests": dict(SMALL), "limits": dict(SMALL)},
            "volumeMounts": [{"name": "shared", "mountPath": v["storage"]["mountPath"]}],
        }

    def data_prep_init_container(self, image: str) -> dict[str, Any]:
        v = self.v
        d = v["dataPrep"]
        cmd = ["dapo", "data", "prepare", "--out", d["outDir"]] + (["--dedup"] if d["dedup"] else []) + list(
            d["extraArgs"]
        )
        return {
            "name": "data-prepare",
            "image": image,
            "imagePullPolicy": v["image"]["pullPolicy"],
            "terminationMessagePolicy": TERMINATION_MESSAGE,
            "command": cmd,
            "env": self.hub_env(),
            "securityContext": copy.deepcopy(RESTRICTED_CONTAINER),
            "resources": copy.deepcopy(d["resources"]),
            "volumeMounts": self.hub_mounts(),
        }

    def evidence_grace(self, kind: str) -> dict[str, Any]:
        """terminationGracePeriodSeconds of the training RayJob's pods when they copy their logs (train.evidence):
        the copy and ``ray stop`` must end within it."""
        ev = self.v["train"]["evidence"]
        return {"terminationGracePeriodSeconds": int(ev["terminationGracePeriodSeconds"])} \
            if kind == "train" and ev["enabled"] else {}

    def head_group(self, *, kind: str, image: str, presets: bool, pre_stop: str = "ray stop") -> dict[str, Any]:
        v = self.v
        h = v["head"]
        meta: dict[str, Any] = {"labels": {**self.selector_labels(f"{kind}-head"), **(h.get("labels") or {})}}
        spec: dict[str, Any] = {**self.pod_common(), **self.evidence_grace(kind)}
        if h.get("restartPolicy"):
            spec["restartPolicy"] = h["restartPolicy"]
        if h.get("runtimeClassName"):
            spec["runtimeClassName"] = h["runtimeClassName"]
        for key in ("nodeSelector", "tolerations", "affinity"):
            if h.get(key):
                spec[key] = copy.deepcopy(h[key])
        native, plain = split_sidecars(h.get("sidecarContainers"))
        init = native + self.head_init_containers(image)
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
                # no serve port: the evaluation's Serve proxy listens on the head's loopback (dapo.eval.serve)
            ],
            "env": self.env(head=True, kind=kind),
            "resources": copy.deepcopy(h["resources"]),
            "volumeMounts": self.volume_mounts(presets=presets, extra=h.get("extraVolumeMounts")),
            **self.ray_container_common(pre_stop=pre_stop),
        }
        spec["containers"] = [container] + plain
        spec["volumes"] = self.volumes(shm=h["shmSize"], presets=presets, hf_token=bool(v["dataPrep"]["enabled"]),
                                       extra=h.get("extraVolumes"))
        # checkov's findings that stay on the pod, each with its reason (the template's containers are complete here)
        meta["annotations"] = {**self.pod_annotations(h.get("annotations")), **checkov_skips(ray_pod_skips(spec, sidecar_names(h)))}
        return {"rayStartParams": dict(h["rayStartParams"]), "template": {"metadata": meta, "spec": spec}}

    def worker_group(self, *, kind: str, image: str, nodes: int, gpus: int, presets: bool,
                     logical_gpus: int = 0, pre_stop: str = "ray stop") -> dict[str, Any]:
        """One worker group of ``nodes`` pods: ``gpus`` devices each (``nvidia.com/gpu``; 0: a CPU pod), or, for
        verl on CPU, ``logical_gpus`` logical Ray GPUs and ``CPU_RAY_CPUS_PER_GPU`` logical CPUs per logical GPU
        declared in ``rayStartParams`` (KubeRay passes them to ``ray start``; no device is requested)."""
        v = self.v
        w = v["worker"]
        meta: dict[str, Any] = {"labels": {**self.selector_labels(f"{kind}-worker"), **(w.get("labels") or {})}}
        spec: dict[str, Any] = {**self.pod_common(), **self.evidence_grace(kind)}
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
        native, plain = split_sidecars(w.get("sidecarContainers"))
        if native:
            spec["initContainers"] = native
        resources = copy.deepcopy(w["resources"])
        for section in ("requests", "limits"):
            r = resources.get(section) or {}
            if gpus > 0:  # a CPU worker group (local backend) requests no GPU
                r["nvidia.com/gpu"] = str(gpus)
            r.update(copy.deepcopy(w.get("extraResources") or {}))
            resources[section] = r
        hf = self.hf_token_here(head=False, kind=kind)
        container: dict[str, Any] = {"name": "ray-worker", "image": image, "imagePullPolicy": v["image"]["pullPolicy"]}
        if env_profile_command(v):
            container["args"] = [env_profile_command(v)]
        container |= {
            "env": self.env(head=False, kind=kind),
            "resources": resources,
            "volumeMounts": self.volume_mounts(presets=presets, hf_token=hf, extra=w.get("extraVolumeMounts")),
            **self.ray_container_common(gpu_check=gpus > 0, pre_stop=pre_stop),
        }
        spec["containers"] = [container] + plain
        spec["volumes"] = self.volumes(shm=w["shmSize"], presets=presets, hf_token=hf, extra=w.get("extraVolumes"))
        params = dict(w.get("rayStartParams") or {})
        if logical_gpus > 0:
            params["num-gpus"] = str(logical_gpus)
            params["num-cpus"] = str(CPU_RAY_CPUS_PER_GPU * logical_gpus)
        return {
            "groupName": w["groupName"],
            "replicas": nodes,
            "minReplicas": nodes,
            "maxReplicas": nodes,
            "rayStartParams": params,
            "template": {"metadata": {**meta, "annotations": {**self.pod_annotations(w.get("annotations")),
                                                              **checkov_skips(ray_pod_skips(spec, sidecar_names(w)))}},
                         "spec": spec},
        }

"""The RayJob objects: the training RayJob (``python -m dapo.train`` or, with ``train.runner: reference``, the
upstream recipe through :mod:`dapo.reference`), the evaluation RayJob (``dapo eval run``), and the RayJob spec they
share (submitter, cluster of :mod:`dapo.k8s.pods`, spec hash of :mod:`dapo.k8s.upgrade`).
"""

from __future__ import annotations

import copy
from typing import Any

from dapo.k8s.context import image_ref
from dapo.k8s.fabric import entrypoint_args
from dapo.k8s.pods import PodTemplates
from dapo.k8s.presets import ValuesError, preset_files, trainer_path
from dapo.k8s.security import RESTRICTED_CONTAINER, auth_options, checkov_skips, submitter_skips
from dapo.util.gofmt import go_quote, go_string, q
from dapo.k8s.upgrade import SPEC_HASH_ANNOTATION, spec_sha256

# Every job's runtime env: a driver calling ray.init(runtime_env=...) merges with it (Ray 2.60 refuses keys set in
# both otherwise).
JOB_ENV = {"RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"}

# spec.entrypointNumCpus of the training RayJob: the driver (the DAPO loop) needs a Ray CPU, and only workers have
# any (the chart requires head num-cpus "0"). KubeRay v1.7 has no entrypointMemory, and Ray refuses "memory" in
# entrypointResources, so memory is checked by `dapo plan` against the worker pod instead of reserved in Ray.
TRAIN_ENTRYPOINT_NUM_CPUS = 1


def runtime_env_yaml(env: dict[str, str]) -> str | None:
    """The RayJob's runtimeEnvYAML (env only: the code is in the image), or None when empty."""
    if not env:
        return None
    return "env_vars:\n" + "".join(f"  {go_quote(k)}: {go_quote(env[k])}\n" for k in sorted(env))


class RayJobs(PodTemplates):
    """The training and evaluation RayJobs: entrypoints, runtime envs, and the spec both share."""

    def train_entrypoint(self) -> str:
        v, pl = self.v, self.placement
        preset_dir = v["train"]["presetDir"]
        preset_dir = preset_dir[:-1] if preset_dir.endswith("/") else preset_dir
        args = ["python", "-m", "dapo.train", "--preset", f"{preset_dir}/{v['preset']}.yaml"]
        args += entrypoint_args(v, pl)  # the all-reduce and transport check before training (dapo.train.fabric)
        if pl["backend"] != "local":
            args += [f"placement.nodes={pl['nodes']}", f"placement.gpus_per_node={pl['gpus']}"]
        return " ".join(args + list(v["overrides"]))

    def reference_args(self) -> list[str]:
        """``train.runner: reference``: the preset as the reference recipe's arguments, the placement and the
        overrides (Hydra overrides in 4f80e46's key names) replacing generated keys in place."""
        from dapo.config import load_preset
        from dapo.reference.command import apply_overrides, check_override
        from dapo.reference.translate import ReferenceError, translate

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

    def log_dir(self, kind: str) -> str:
        """Where the driver of each attempt of the ``kind`` RayJob writes ``attempt-<N>.log``."""
        if kind == "eval":
            out = self.eval_paths()["outputDir"]
        elif self.v["train"]["runner"] == "reference":
            from dapo.reference.command import log_dir

            return log_dir(self.reference_args())
        else:
            trainer = (self.effective.get("recipe") or {}).get("trainer") or {}
            out = trainer_path(trainer["default_local_dir"], trainer)
        return (out[:-1] if out.endswith("/") else out) + "/logs"

    @property
    def follower_acts(self) -> bool:
        """Whether the training RayJob's follower acts between attempts (train.retries, dapo.cluster.keeper)."""
        v, r = self.v, self.v["train"]["retries"]
        return bool(v["logs"]["enabled"] and v["train"]["enabled"] and (
            r["leaveOutNodes"]["enabled"] or r["failureBudget"]["enabled"] or int(r["heartbeatTimeoutSeconds"]) > 0))

    def pre_stop_command(self, kind: str) -> str:
        """The Ray containers' preStop: the training RayJob's pods copy their Ray logs to the run's volume first
        (train.evidence, dapo.cluster.evidence), then ``ray stop``."""
        ev = self.v["train"]["evidence"]
        if kind != "train" or not ev["enabled"]:
            return "ray stop"
        return (f"python -m dapo.cluster.evidence --log-dir '{self.log_dir('train')}' --max-bytes "
                f"{int(ev['maxBytesPerPod'])} --seconds {go_string(ev['seconds'])}; ray stop")

    def train_runtime_env(self) -> dict[str, str]:
        """RAY_OVERRIDE_JOB_RUNTIME_ENV=1, the preset's placement.env, then train.runtimeEnv. The override flag lets
        the driver's own ray.init(runtime_env=...) (the verl backend sets the preset env and its loss module
        there) merge with this job-level env instead of failing on keys both set; the driver's values win."""
        env = dict(JOB_ENV)
        env.update({k: go_string(val) for k, val in ((self.preset.get("placement") or {}).get("env") or {}).items()})
        if self.v["train"]["runner"] == "reference":
            # recipe/dapo/runtime_env.yaml's working_dir: the recipe's source tree, in the image
            env["PYTHONPATH"] = self.v["train"]["reference"]["sourceDir"]
        ack = int(self.v["train"]["retries"]["ackTimeoutSeconds"])
        # our driver, having recorded why its attempt ends, waits for the answer; the reference recipe records nothing
        if self.follower_acts and ack > 0 and self.v["train"]["runner"] != "reference":
            env["DAPO_ACK_TIMEOUT_S"] = str(ack)
        env.update(self.v["train"]["runtimeEnv"])
        return env

    def train_rayjob(self) -> dict[str, Any]:
        v, pl = self.v, self.placement
        image, ray_version = image_ref(self.train_image()), v["rayVersion"]
        entrypoint = None
        if v["train"]["runner"] == "reference":
            from dapo.reference.command import entrypoint as reference_entrypoint

            ray_version = v["train"]["reference"]["rayVersion"]
            entrypoint = reference_entrypoint(self.reference_args())
        return self.rayjob(
            kind="train",
            name=self.train_job_name,
            job=v["train"],
            entrypoint=entrypoint or self.train_entrypoint(),
            runtime_env=self.train_runtime_env(),
            image=image,
            nodes=pl["nodes"],
            gpus=0 if pl["backend"] == "local" or pl["cpu"] else pl["gpus"],
            presets=True,
            ray_version=ray_version,
            entrypoint_num_cpus=TRAIN_ENTRYPOINT_NUM_CPUS,
            logical_gpus=pl["gpus"] if pl["cpu"] else 0,
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
        image = image_ref(self.eval_image())
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

    def rayjob(self, *, kind: str, name: str, job: dict[str, Any], entrypoint: str, runtime_env: dict[str, str],
               image: str, nodes: int, gpus: int, presets: bool, ray_version: str | None = None,
               entrypoint_num_cpus: int | None = None, logical_gpus: int = 0) -> dict[str, Any]:
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
            # KubeRay's submitter script only talks to the head's dashboard: no API token
            pod_spec: dict[str, Any] = {"restartPolicy": "Never",
                                        "automountServiceAccountToken": bool(v["automountServiceAccountToken"])}
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
                # the Ray CLI's submit and log follow write no file (an HTTP client; docs/security.md)
                "securityContext": {**copy.deepcopy(RESTRICTED_CONTAINER), "readOnlyRootFilesystem": True},
                "resources": copy.deepcopy(job["submitter"]["resources"]),
            }]
            spec["submitterPodTemplate"] = {"metadata": {"labels": self.selector_labels(f"{kind}-submitter"),
                                                         "annotations": checkov_skips(submitter_skips(image))},
                                            "spec": pod_spec}
        cluster: dict[str, Any] = {
            "rayVersion": ray_version or v["rayVersion"],
            "enableInTreeAutoscaling": False,
        }
        auth = auth_options(v)
        if auth:  # KubeRay sets RAY_AUTH_MODE / RAY_AUTH_TOKEN on every Ray container, its client sends the token
            cluster["authOptions"] = auth
        cluster.update({
            "headGroupSpec": self.head_group(kind=kind, image=image, presets=presets,
                                             pre_stop=self.pre_stop_command(kind)),
        })
        if nodes > 0:
            cluster["workerGroupSpecs"] = [
                self.worker_group(kind=kind, image=image, nodes=nodes, gpus=gpus, presets=presets,
                                  logical_gpus=logical_gpus, pre_stop=self.pre_stop_command(kind))
            ]
        spec["rayClusterSpec"] = cluster
        files = preset_files(v["preset"]) if presets else None
        meta["annotations"] = {SPEC_HASH_ANNOTATION: spec_sha256(spec, files)}
        return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": meta, "spec": spec}

"""Chart values without Helm: merging, ``--set``, the JSON schema and the chart's cross-field rules.

The defaults are the chart's own ``values.yaml`` (read by the caller, never copied here). Merging follows Helm:
mappings merge recursively, lists and scalars are replaced, and a ``null`` removes the key. The rules in
:func:`check` are those of ``charts/dapo/templates/_validate.tpl``, with the same messages: each starts with the
offending key.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml

from dapo.k8s.presets import ValuesError, effective_preset, merged_preset, model_repo, preset_chain
from dapo.k8s.fabric import check_fabric, missing_fabric
from dapo.k8s.install_rules import missing_images, missing_storage_class
from dapo.k8s.rules import check_deletion_rules
from dapo.k8s.security import check_security
from dapo.util.gofmt import go_string, q
from dapo.k8s.versions import MAX_RAYJOB_NAME

DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
PLACEMENT_KEYS = ("placement.nodes", "placement.gpus_per_node", "placement.backend", "trainer.nnodes",
                  "trainer.n_gpus_per_node")
TOKEN_ENV = ("HF_TOKEN", "WANDB_API_KEY")
MANAGED_ENV = ("HF_HOME", "HF_TOKEN_PATH", "WANDB_ENTITY", "RAY_memory_monitor_refresh_ms", "NVIDIA_VISIBLE_DEVICES")
SELECTOR_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component")


def _drop_nulls(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _drop_nulls(v) for k, v in data.items() if v is not None}
    return copy.deepcopy(data)


def coalesce(base: dict[str, Any], *overs: dict[str, Any]) -> dict[str, Any]:
    """Helm's value coalescing: later mappings win, maps merge, ``null`` deletes the key."""
    out = _drop_nulls(base)
    for over in overs:
        out = _merge(out, over)
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = _drop_nulls(value)
    return out


def parse_set(text: str) -> dict[str, Any]:
    """``a.b.c=VALUE`` (VALUE parsed as YAML, like ``helm --set`` for scalars) -> ``{"a": {"b": {"c": VALUE}}}``."""
    if "=" not in text:
        raise ValuesError(f"--set {q(text)}: expected key.path=value")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ValuesError(f"--set {q(text)}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ValuesError(f"--set {q(text)}: value is not valid YAML ({exc})") from exc
    out: dict[str, Any] = {}
    node = out
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def validate_schema(values: dict[str, Any], schema: dict[str, Any]) -> None:
    """Check values against the chart's values.schema.json; the message names the key like Helm does."""
    try:
        import jsonschema
    except ImportError as exc:  # pragma: no cover - part of the k8s extra
        raise ValuesError(
            "values: checking values.schema.json needs the jsonschema package (pip install 'dapo-k8s[k8s]')"
        ) from exc

    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(values), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for err in errors:
            where = "/" + "/".join(str(p) for p in err.absolute_path)
            lines.append(f"at '{where if where != '/' else ''}': {err.message}")
        raise ValuesError("values do not match values.schema.json:\n- " + "\n- ".join(lines))


# ----------------------------------------------------------------------------------------------------------------
# What the templates derive from values + preset
# ----------------------------------------------------------------------------------------------------------------


def fullname(values: dict[str, Any], release: str, chart_name: str) -> str:
    """The chart's ``dapo.fullname``."""

    def trim(s: str) -> str:
        s = s[:63]
        return s[:-1] if s.endswith("-") else s

    if values.get("fullnameOverride"):
        return trim(values["fullnameOverride"])
    name = values.get("nameOverride") or chart_name
    return trim(release) if name in release else trim(f"{release}-{name}")


def placement(values: dict[str, Any], preset: dict[str, Any]) -> dict[str, Any]:
    """The chart's ``dapo.placement``: backend, nodes, gpus (training), evalGpus, cpu (verl on CPU)."""
    pl = preset.get("placement") or {}
    for key in ("backend", "nodes", "gpus_per_node"):
        if key not in pl:
            raise ValuesError(
                f"preset: {q(values['preset'])} does not set placement.{key} (the chart reads it from the preset chain)"
            )
    nodes = int(values["nodes"]) if values.get("nodes") is not None else int(pl["nodes"])
    gpus = int(values["gpusPerNode"]) if values.get("gpusPerNode") is not None else int(pl["gpus_per_node"])
    ev = values["eval"].get("gpusPerNode")
    # verl's own workers on CPU (placement.accelerator: cpu): the GPUs are logical Ray slots
    cpu = pl["backend"] != "local" and str(pl.get("accelerator") or "h100") == "cpu"
    return {"backend": pl["backend"], "nodes": nodes, "gpus": gpus, "evalGpus": int(ev) if ev is not None else gpus,
            "cpu": cpu}


# ----------------------------------------------------------------------------------------------------------------
# Cross-field rules (charts/dapo/templates/_validate.tpl)
# ----------------------------------------------------------------------------------------------------------------


def check_verl_on_cpu(v: dict[str, Any]) -> None:
    """A verl preset on CPU (placement.accelerator: cpu): its worker pods declare logical GPUs (its image, vLLM's CPU
    build: :func:`dapo.k8s.install_rules.missing_images`)."""
    for key in ("num-gpus", "num-cpus"):
        if key in (v["worker"].get("rayStartParams") or {}):
            raise ValuesError(
                f"worker.rayStartParams.{key}: preset {q(v['preset'])} runs verl on CPU; the chart declares the "
                "worker's logical GPUs (gpusPerNode) and CPUs (8 per GPU) itself"
            )


def check(values: dict[str, Any], *, train_job_name: str, eval_job_name: str) -> None:
    """Raise :class:`ValuesError` for the first impossible combination, with the chart's message; then, past every
    one, for all the values the install still needs at once (:func:`missing_values`).

    By concern, in the chart's order: the job names, the placement, the jobs' lifecycle and queue, the Ray pods'
    resources, environment and labels, the head's QoS class, host network and storage, evaluation, the fabric
    check, security (:func:`dapo.k8s.security.check_security`); last, the missing values."""
    _check_job_names(values, train_job_name, eval_job_name)
    preset, pl = _check_placement(values)
    _check_jobs(values)
    _check_ray_resources(values)
    _check_env_and_labels(values, preset)
    _check_guaranteed_head(values)
    _check_host_and_storage(values)
    _check_eval(values, pl)
    check_fabric(values, pl)
    check_security(values)
    lines = missing_values(values, preset, pl)
    if lines:
        head = f"{len(lines)} {'value' if len(lines) == 1 else 'values'} still needed before this installs:"
        raise ValuesError("\n".join([head] + lines))


def _check_job_names(v: dict[str, Any], train_job_name: str, eval_job_name: str) -> None:
    """Something to deploy, and RayJob names KubeRay accepts."""
    if not v["train"]["enabled"] and not v["eval"]["enabled"]:
        raise ValuesError("train.enabled: train.enabled and eval.enabled are both false; nothing to deploy")
    for kind, name in (("train", train_job_name), ("eval", eval_job_name)):
        if not v[kind]["enabled"]:
            continue
        if len(name) > MAX_RAYJOB_NAME:
            raise ValuesError(
                f"fullnameOverride: the RayJob name {q(name)} has {len(name)} characters; KubeRay allows at most "
                f"{MAX_RAYJOB_NAME} (use a shorter release name or set fullnameOverride)"
            )
        if not DNS1035.fullmatch(name):
            raise ValuesError(
                f"fullnameOverride: the RayJob name {q(name)} is not a DNS-1035 label (lower-case letters, digits, "
                "'-', starting with a letter)"
            )


def _check_placement(v: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The preset resolves, nodes and GPUs are possible, overrides leave the placement alone; returns the merged
    preset and the placement."""
    preset_chain(v["preset"])  # the preset exists and its chain resolves
    preset = merged_preset(v["preset"])
    pl = placement(v, preset)
    if pl["nodes"] < 1:
        raise ValuesError(f"nodes: must be >= 1, got {pl['nodes']} (values nodes or the preset's placement.nodes)")
    if pl["backend"] == "local":
        if v.get("gpusPerNode") is not None:
            raise ValuesError(
                f"gpusPerNode: preset {q(v['preset'])} runs on the local backend in a CPU worker pod; gpusPerNode "
                "does not apply"
            )
    else:
        if pl["gpus"] < 1:
            raise ValuesError(
                f"gpusPerNode: must be >= 1 for the verl backend, got {pl['gpus']} (values gpusPerNode or the "
                "preset's placement.gpus_per_node)"
            )
        if pl["cpu"]:
            check_verl_on_cpu(v)
    for o in v["overrides"]:
        key = o.split("=", 1)[0].lstrip("+")
        if key in PLACEMENT_KEYS:
            raise ValuesError(
                f"overrides: {q(o)} changes the placement; set the values nodes / gpusPerNode instead (the worker "
                "group is sized from them)"
            )
    return preset, pl


def _check_jobs(v: dict[str, Any]) -> None:
    """Each enabled job's lifecycle (shutdown, TTL, deletion rules) against KubeRay's rules and the queue."""
    for kind in ("train", "eval"):
        job = v[kind]
        if not job["enabled"]:
            continue
        if not job["shutdownAfterJobFinishes"] and int(job["ttlSecondsAfterFinished"]) > 0:
            raise ValuesError(
                f"{kind}.ttlSecondsAfterFinished: must be 0 when {kind}.shutdownAfterJobFinishes is false (KubeRay "
                "rejects the RayJob)"
            )
        rules = job.get("deletionRules") or []
        if rules:
            if job["shutdownAfterJobFinishes"]:
                raise ValuesError(
                    f"{kind}.deletionRules: mutually exclusive with {kind}.shutdownAfterJobFinishes: true (KubeRay "
                    "v1.7); set shutdownAfterJobFinishes: false and ttlSecondsAfterFinished: 0"
                )
            check_deletion_rules(kind, rules)
        if v["queue"]["scheduler"] == "kueue" and not job["shutdownAfterJobFinishes"]:
            raise ValuesError(
                f"queue.scheduler: kueue suspends RayJobs, which KubeRay allows only with "
                f"{kind}.shutdownAfterJobFinishes: true"
            )
        if v["queue"]["scheduler"] == "kai" and job["submissionMode"] == "K8sJobMode":
            raise ValuesError(
                f"queue.scheduler: kai does not support {kind}.submissionMode K8sJobMode (the submitter pod escapes "
                "the gang); use HTTPMode or SidecarMode"
            )
        restart = v["head"].get("restartPolicy", "")
        if job["submissionMode"] == "SidecarMode" and restart not in ("", "Never"):
            raise ValuesError(
                f"head.restartPolicy: must be empty or Never with {kind}.submissionMode SidecarMode, got {q(restart)}"
            )
    ev = v["train"]["evidence"]
    if v["train"]["enabled"] and ev["enabled"] and float(ev["seconds"]) >= float(ev["terminationGracePeriodSeconds"]):
        raise ValuesError(f"train.evidence.seconds: the copy of the logs ({go_string(ev['seconds'])} s) must end within "
                          f"train.evidence.terminationGracePeriodSeconds ({go_string(ev['terminationGracePeriodSeconds'])}"
                          " s), which also holds `ray stop`")


def _check_ray_resources(v: dict[str, Any]) -> None:
    """GPUs only on the workers, from gpusPerNode; nothing schedulable on the head; extraResources for devices."""
    for section in ("requests", "limits"):
        if "nvidia.com/gpu" in (v["head"]["resources"].get(section) or {}):
            raise ValuesError(
                f"head.resources.{section}: the Ray head must not hold GPUs (it runs GCS, the dashboard and the "
                "driver; GPUs belong to the worker group)"
            )
        if "nvidia.com/gpu" in (v["worker"]["resources"].get(section) or {}):
            raise ValuesError(
                f"worker.resources.{section}: nvidia.com/gpu is set from gpusPerNode / the preset's "
                "placement.gpus_per_node; remove it here"
            )
    if str(v["head"]["rayStartParams"].get("num-cpus")) != "0":
        raise ValuesError(
            'head.rayStartParams.num-cpus: must be "0" so that the training driver (the DAPO loop, entrypointNumCpus '
            '1) and every Ray task and actor run on the workers, not on the head'
        )
    if str(v["head"]["rayStartParams"].get("num-gpus")) != "0":
        raise ValuesError(
            'head.rayStartParams.num-gpus: must be "0" so that no GPU work (verl\'s driver task, vLLM) lands on the head'
        )
    for key in sorted(v["worker"].get("extraResources") or {}):
        if key in ("cpu", "memory", "nvidia.com/gpu"):
            raise ValuesError(
                f"worker.extraResources.{key}: extraResources is for device resources (RDMA, EFA); cpu/memory go in "
                "worker.resources, GPUs come from gpusPerNode"
            )


def _check_env_and_labels(v: dict[str, Any], preset: dict[str, Any]) -> None:
    """Tokens only from the Secret; variables and selector labels the chart sets are not set twice."""
    for where, mapping in (("env", v["env"]), ("nccl", v["nccl"]), ("train.runtimeEnv", v["train"]["runtimeEnv"]),
                           ("eval.runtimeEnv", v["eval"]["runtimeEnv"])):
        for key in sorted(mapping):
            if key in TOKEN_ENV:
                raise ValuesError(
                    f"{where}.{key}: tokens come only from the Secret (secret.name, secret.hfTokenKey / "
                    "secret.wandbApiKeyKey), never from values"
                )
            if where in ("env", "nccl") and key in MANAGED_ENV:
                raise ValuesError(f"{where}.{key}: set by the chart (see storage.hfHome, wandb.entity); remove it here")
            if where == "env" and key in v["nccl"]:
                raise ValuesError(f"env.{key}: also set in nccl; set it in one place")
    for group in ("head", "worker"):
        for key in sorted(v[group].get("labels") or {}):
            if key in SELECTOR_LABELS:
                raise ValuesError(f"{group}.labels.{key}: set by the chart (selector label); remove it here")

    if hub_offline(v, preset) and "HF_HUB_OFFLINE" in v["env"]:
        raise ValuesError("env.HF_HUB_OFFLINE: set by the chart when dataPrep.fetchModel downloads the model; remove it here")


def _check_guaranteed_head(v: dict[str, Any]) -> None:
    """Every container of the Ray head with equal requests and limits (the Guaranteed QoS class)."""
    guaranteed = [("head.resources", v["head"]["resources"])]
    if v["dataPrep"]["enabled"]:
        guaranteed.append(("dataPrep.resources", v["dataPrep"]["resources"]))
    for i, c in enumerate(v["head"].get("sidecarContainers") or []):
        guaranteed.append((f"head.sidecarContainers[{i}].resources", c.get("resources") or {}))
    for where, r in guaranteed:
        for res in ("cpu", "memory"):
            req, lim = (r.get("requests") or {}).get(res), (r.get("limits") or {}).get(res)
            if req is None or lim is None or go_string(req) != go_string(lim):
                raise ValuesError(
                    f"{where}: requests.{res} and limits.{res} must both be set and equal (got "
                    f"{go_string(req if req is not None else 'unset')} and {go_string(lim if lim is not None else 'unset')}): "
                    "every container of the Ray head must keep the pod in the Guaranteed QoS class, the last to be "
                    "evicted"
                )


def _check_host_and_storage(v: dict[str, Any]) -> None:
    """One worker per host with hostNetwork; data and HF cache under the mount; the volume as large as the run
    needs (unless an existing claim is used)."""
    if v["hostNetwork"] and not v["worker"]["onePerHost"]:
        raise ValuesError(
            "worker.onePerHost: must be true with hostNetwork (two Ray workers on one host would collide on ports)"
        )
    mount = v["storage"]["mountPath"]
    for key, path in (("dataPrep.outDir", v["dataPrep"]["outDir"]), ("storage.hfHome", v["storage"]["hfHome"])):
        prefix = (mount[:-1] if mount.endswith("/") else mount) + "/"
        if not path.startswith(prefix):
            raise ValuesError(f"{key}: {q(path)} is not under storage.mountPath {q(mount)} (it would not survive the pod)")

    if v["train"]["enabled"] and not v["storage"]["existingClaim"]:
        from dapo.plan import memory as sizing
        from dapo.config import load_preset

        need = sizing.storage(load_preset(v["preset"]))
        if need["bytes"] is not None and sizing.parse_quantity(v["storage"]["size"]) < need["bytes"]:
            raise ValuesError(sizing.storage_message(v["preset"], v["storage"]["size"], need["summary"]))


def _check_eval(v: dict[str, Any], pl: dict[str, Any]) -> None:
    """An evaluation has GPUs (its test file and checkpoint directory: :func:`missing_values`)."""
    if v["eval"]["enabled"] and pl["evalGpus"] < 1:
        raise ValuesError(
            f"eval.gpusPerNode: the evaluation serves the model on GPUs; must be >= 1, got {pl['evalGpus']}"
        )


def missing_values(v: dict[str, Any], preset: dict[str, Any], pl: dict[str, Any]) -> list[str]:
    """The chart's ``dapo.missingValues``: what a documented values file leaves to the user, one line each (the key,
    what is missing, the fix): the fabric of a multi-node GPU run, the images, a ReadWriteMany class, what an
    evaluation reads, the queue's name."""
    lines = missing_fabric(v, pl) + missing_images(v, pl) + missing_storage_class(v, pl)
    if v["eval"]["enabled"]:
        recipe = effective_preset(preset, v["overrides"]).get("recipe") or {}
        if not v["eval"].get("testFile") and not (recipe.get("data") or {}).get("val_files"):
            lines.append(f"- eval.testFile: preset {q(v['preset'])} has no recipe.data.val_files: --set "
                         "eval.testFile=<the test file>")
        if not v["eval"].get("checkpointDir") and not (recipe.get("trainer") or {}).get("default_local_dir"):
            lines.append(f"- eval.checkpointDir: preset {q(v['preset'])} has no recipe.trainer.default_local_dir: "
                         "--set eval.checkpointDir=<the checkpoints' directory>")
    if v["queue"]["scheduler"] and not v["queue"]["name"]:
        lines.append(f"- queue.name: required with queue.scheduler {q(v['queue']['scheduler'])}: --set "
                     "queue.name=<queue>")
    return lines


def hub_offline(values: dict[str, Any], preset: dict[str, Any]) -> bool:
    """The chart's ``dapo.hubOffline``: the data preparation downloads the model, Ray pods run HF_HUB_OFFLINE=1."""
    d = values["dataPrep"]
    return bool(d["enabled"] and d.get("fetchModel") and model_repo(effective_preset(preset, values["overrides"])))

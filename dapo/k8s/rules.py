"""Rules the KubeRay v1.7 controller enforces that its CRD schemas do not encode.

The CRD OpenAPI schemas check types and enums; the operator's validation (ray-operator
``controllers/ray/utils/validation.go``) and the CRDs' CEL rules reject more, but only once the object reaches the
cluster -- often after GPUs are booked. :func:`problems` checks a rendered object for those rules offline:
``scripts/render.py`` runs it on every object it renders (the chart's ``_validate.tpl`` refuses the values that would
break them, with messages that name the values' keys).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from dapo.k8s.versions import MAX_RAYCLUSTER_NAME, MAX_RAYJOB_NAME, MAX_RAYSERVICE_NAME

DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")
RAY_START_RESOURCE_KEYS = ("num-cpus", "num-gpus", "memory", "resources")
DELETION_ORDER = ("DeleteWorkers", "DeleteCluster", "DeleteSelf")
MAX_NAME = {"RayJob": MAX_RAYJOB_NAME, "RayService": MAX_RAYSERVICE_NAME, "RayCluster": MAX_RAYCLUSTER_NAME}


def problems(obj: dict[str, Any]) -> list[str]:
    """Controller-side problems of a ray.io object (empty list: none found)."""
    kind = obj.get("kind")
    out: list[str] = []
    name = (obj.get("metadata") or {}).get("name", "")
    if kind in MAX_NAME:
        if len(name) > MAX_NAME[kind]:
            out.append(f"metadata.name: {kind} name {name!r} is longer than {MAX_NAME[kind]} characters")
        if not DNS1035.fullmatch(name):
            out.append(f"metadata.name: {kind} name {name!r} is not a DNS-1035 label")
    spec = obj.get("spec") or {}
    if kind == "RayJob":
        out += _rayjob(spec)
        if spec.get("rayClusterSpec"):
            out += [f"spec.rayClusterSpec.{p}" for p in _cluster(spec["rayClusterSpec"])]
    elif kind == "RayCluster":
        out += _cluster(spec)
    elif kind == "RayService" and spec.get("rayClusterConfig"):
        out += [f"spec.rayClusterConfig.{p}" for p in _cluster(spec["rayClusterConfig"])]
    return out


def _rayjob(spec: dict[str, Any]) -> list[str]:
    out = []
    mode = spec.get("submissionMode", "K8sJobMode")
    if mode not in SUBMISSION_MODES:
        out.append(f"spec.submissionMode: {mode!r} is not one of {list(SUBMISSION_MODES)}")
    shutdown = bool(spec.get("shutdownAfterJobFinishes", False))
    if spec.get("suspend") and not shutdown:
        out.append("spec.suspend: a RayJob with shutdownAfterJobFinishes false cannot be suspended")
    if (spec.get("ttlSecondsAfterFinished") or 0) < 0:
        out.append("spec.ttlSecondsAfterFinished: must be >= 0")
    if not shutdown and (spec.get("ttlSecondsAfterFinished") or 0) > 0:
        out.append("spec.ttlSecondsAfterFinished: requires shutdownAfterJobFinishes true")
    ds = spec.get("deletionStrategy")
    if ds is not None:
        legacy = "onSuccess" in ds or "onFailure" in ds
        rules = ds.get("deletionRules") or []
        if rules and shutdown:
            out.append("spec.deletionStrategy.deletionRules: mutually exclusive with shutdownAfterJobFinishes")
        if rules and legacy:
            out.append("spec.deletionStrategy: legacy onSuccess/onFailure and deletionRules together")
        if not rules and not ("onSuccess" in ds and "onFailure" in ds):
            out.append("spec.deletionStrategy: needs both onSuccess and onFailure, or deletionRules")
        out += _deletion_rules(rules)
    if not spec.get("rayClusterSpec") and not spec.get("clusterSelector"):
        out.append("spec: one of rayClusterSpec and clusterSelector must be set")
    if mode == "InteractiveMode" and (spec.get("backoffLimit") or 0) > 0:
        out.append("spec.backoffLimit: incompatible with InteractiveMode")
    if mode == "SidecarMode":
        if "submitterPodTemplate" in spec:
            out.append("spec.submitterPodTemplate: not supported in SidecarMode")
        if "submitterConfig" in spec:
            out.append("spec.submitterConfig: not supported in SidecarMode")
        head = ((spec.get("rayClusterSpec") or {}).get("headGroupSpec") or {}).get("template") or {}
        if (head.get("spec") or {}).get("restartPolicy", "") not in ("", "Never"):
            out.append("spec.rayClusterSpec.headGroupSpec.template.spec.restartPolicy: must be Never in SidecarMode")
    if spec.get("clusterSelector") and (spec.get("backoffLimit") or 0) > 0:
        out.append("spec.backoffLimit: incompatible with clusterSelector")
    if "runtimeEnvYAML" in spec:
        try:
            renv = yaml.safe_load(spec["runtimeEnvYAML"])
        except yaml.YAMLError as exc:
            out.append(f"spec.runtimeEnvYAML: not valid YAML ({exc})")
        else:
            if renv is not None and not isinstance(renv, dict):
                out.append("spec.runtimeEnvYAML: must be a mapping")
    for key in ("activeDeadlineSeconds", "preRunningDeadlineSeconds"):
        if key in spec and spec[key] <= 0:
            out.append(f"spec.{key}: must be a positive integer")
    if (spec.get("backoffLimit") or 0) < 0:
        out.append("spec.backoffLimit: must be >= 0")
    return out


def _deletion_rules(rules: list[dict[str, Any]]) -> list[str]:
    out = []
    ttl: dict[tuple[str, str], int] = {}
    for i, rule in enumerate(rules):
        c = rule.get("condition") or {}
        if ("jobStatus" in c) == ("jobDeploymentStatus" in c):
            out.append(f"spec.deletionStrategy.deletionRules[{i}].condition: exactly one of jobStatus, "
                       "jobDeploymentStatus")
            continue
        cond = c.get("jobStatus") or c.get("jobDeploymentStatus")
        key = (cond, rule.get("policy"))
        if key in ttl:
            out.append(f"spec.deletionStrategy.deletionRules[{i}]: duplicate rule {key}")
        ttl[key] = c.get("ttlSeconds", 0)
    for (cond, policy), seconds in ttl.items():
        if policy in DELETION_ORDER:
            for earlier in DELETION_ORDER[: DELETION_ORDER.index(policy)]:
                if (cond, earlier) in ttl and seconds < ttl[(cond, earlier)]:
                    out.append(f"spec.deletionStrategy.deletionRules: {cond}: {policy} TTL must be >= {earlier} TTL")
    return out


def _cluster(spec: dict[str, Any]) -> list[str]:
    out = []
    autoscaling = bool(spec.get("enableInTreeAutoscaling"))
    head = spec.get("headGroupSpec") or {}
    if not ((head.get("template") or {}).get("spec") or {}).get("containers"):
        out.append("headGroupSpec: needs at least one container")
    out += _group_resources("headGroupSpec", head)
    for i, g in enumerate(spec.get("workerGroupSpecs") or []):
        where = f"workerGroupSpecs[{i}]"
        if not ((g.get("template") or {}).get("spec") or {}).get("containers"):
            out.append(f"{where}: needs at least one container")
        lo, hi = g.get("minReplicas"), g.get("maxReplicas")
        if not autoscaling and (lo is None or hi is None):
            out.append(f"{where}: minReplicas and maxReplicas are required without autoscaling")
        lo = 0 if lo is None else lo
        hi = 2147483647 if hi is None else hi
        if lo < 0 or hi < 0:
            out.append(f"{where}: negative minReplicas/maxReplicas")
        if lo > hi:
            out.append(f"{where}: minReplicas {lo} > maxReplicas {hi}")
        replicas = g.get("replicas")
        if replicas is not None and not lo <= replicas <= hi:
            out.append(f"{where}.replicas: {replicas} is not within [minReplicas {lo}, maxReplicas {hi}]")
        out += _group_resources(where, g)
    return out


def _group_resources(where: str, group: dict[str, Any]) -> list[str]:
    params = group.get("rayStartParams") or {}
    out = []
    if group.get("resources") and any(params.get(k) for k in RAY_START_RESOURCE_KEYS):
        out.append(f"{where}: resources set both in rayStartParams and in resources")
    if "labels" in params:
        out.append(f"{where}.rayStartParams.labels: not supported; use the group's labels field")
    for key, value in params.items():
        if not isinstance(value, str):
            out.append(f"{where}.rayStartParams.{key}: values must be strings")
    return out

"""The spec hash every RayJob carries and the upgrade guard built on it (the chart's ``dapo.rayJobWithHash`` and
``dapo.upgradeGuard``): ``dapo-k8s.github.io/spec-sha256`` is the SHA-256 of the Go JSON of the RayJob's spec (and of
the preset files the training job reads); replacing a live RayJob by one with another hash is refused.

Pure functions of plain data; imports nothing of the project.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

SPEC_HASH_ANNOTATION = "dapo-k8s.github.io/spec-sha256"


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


__all__ = ["SPEC_HASH_ANNOTATION", "go_json", "spec_sha256", "upgrade_refusal"]

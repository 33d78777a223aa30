"""The spec hash every RayJob carries and the upgrade guard built on it (the chart's ``dapo.rayJobWithHash`` and
``dapo.upgradeGuard``): ``dapo-k8s.github.io/spec-sha256`` is the SHA-256 of the Go JSON of the RayJob's spec (and of
the preset files the training job reads); replacing a live RayJob by one with another hash is refused. The log
follower Jobs carry the hash of their own spec (a Job's pod template cannot change): an upgrade is refused while one
exists and would change, or while the RayJob it follows is gone (``dapo.followerGuard``).

The chart's guards read the live objects with Helm's ``lookup`` during ``helm upgrade --install``;
``scripts/render.py`` renders without a cluster, where ``lookup`` finds nothing, so ``--apply`` reads them with the
``kubernetes`` client and refuses with these functions, word for word the chart's messages (tests/test_chart_ops.py). Pure functions of plain data: their callers read the cluster.
"""

from __future__ import annotations

from typing import Any

SPEC_HASH_ANNOTATION = "dapo-k8s.github.io/spec-sha256"


def delete_command(namespace: str, rayjob: str, follower: str | None) -> str:
    """``kubectl`` deleting a RayJob and, when there is one, its log follower Job."""
    if follower:
        return f"kubectl -n {namespace} delete rayjob/{rayjob} job/{follower}"
    return f"kubectl -n {namespace} delete rayjob {rayjob}"


def upgrade_refusal(kind: str, new: dict[str, Any], live: dict[str, Any] | None, namespace: str,
                    follower: str | None = None) -> str | None:
    """The chart's ``dapo.upgradeGuard``: the message refusing to replace a live RayJob ``live`` by ``new`` when that
    changes its spec (KubeRay ignores the change now and builds the next retry from it); None when allowed.
    ``follower``: the name of its log follower Job (deleted with it)."""
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
        f"RayJob first ({delete_command(namespace, name, follower)}; a new attempt resumes from the latest "
        "checkpoint) or install the change as a new release with its own recipe.trainer.experiment_name"
    )


def follower_refusal(new: dict[str, Any], live: dict[str, Any] | None, rayjob: str, rayjob_live: bool,
                     namespace: str) -> str | None:
    """The chart's ``dapo.followerGuard``: the message refusing an upgrade while the log follower Job ``live`` exists
    and ``new`` would change it (a Job's pod template is immutable) or its RayJob is gone (the upgrade creates a new
    run, which needs a new follower); None when allowed."""
    if not live:
        return None
    name = new["metadata"]["name"]
    old = ((live.get("metadata") or {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION) or ""
    if old == new["metadata"]["annotations"][SPEC_HASH_ANNOTATION] and rayjob_live:
        return None
    why = (f"follows the RayJob {rayjob}, which no longer exists (this upgrade creates it again: a new run)"
           if not rayjob_live else "would change, and a Job's pod template cannot")
    return (
        f"logs: the log follower Job {name} already exists in namespace {namespace} and {why}. Delete it first "
        f"(kubectl -n {namespace} delete job {name}; only the log follower goes, the run is not touched), or with "
        f"its RayJob ({delete_command(namespace, rayjob, name)}), then upgrade"
    )


__all__ = ["SPEC_HASH_ANNOTATION", "delete_command", "follower_refusal", "upgrade_refusal"]

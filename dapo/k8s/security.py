"""The Pod Security Standard level a namespace needs for the chart's values, and why: ``dapo doctor`` compares it with
the namespace's ``pod-security.kubernetes.io/enforce`` label before the install. The chart's NOTES name the same level
(``dapo.podSecurityProfile`` in ``charts/dapo/templates/_security.tpl``); tests/test_security.py holds the two equal on
every values file and on each value that changes the level.

Everything else about what keeps a run to itself -- Ray token authentication, the NetworkPolicy, the securityContexts,
the refusals, the checkov skips -- is the chart's alone (``_security.tpl``).
"""

from __future__ import annotations

from typing import Any


def pod_security_profile(v: dict[str, Any]) -> tuple[str, list[str]]:
    """The Pod Security Standard level the namespace needs for these values ("restricted", "baseline" or
    "privileged") and why, in NOTES' words."""
    privileged, baseline = [], []
    if v.get("hostNetwork"):
        privileged.append("hostNetwork (host namespaces; NetworkPolicies do not apply to hostNetwork pods)")
    if v.get("ipcLock"):
        privileged.append("ipcLock (IPC_LOCK is not among the capabilities baseline allows)")
    privileged += _extra_pod_parts(v)
    ctr = v.get("securityContext") or {}
    if str(ctr.get("runAsUser")) == "0" or ctr.get("runAsNonRoot") is False:
        baseline.append("securityContext runs the Ray containers as root")
    baseline += _root_sidecars(v)
    if v["storage"]["fixOwnership"]["enabled"]:
        baseline.append("storage.fixOwnership (an init container runs as root with CHOWN, DAC_OVERRIDE, FOWNER)")
    modes = {v[k]["submissionMode"] for k in ("train", "eval") if v[k]["enabled"]}
    if "SidecarMode" in modes:
        baseline.append("SidecarMode (KubeRay adds its submitter container to the head without a securityContext)")
    if privileged:
        return "privileged", privileged + baseline
    return ("baseline", baseline) if baseline else ("restricted", [])


# Pod Security Standards, baseline: the capabilities a container may add
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                         "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}


def _extra_pod_parts(v: dict[str, Any]) -> list[str]:
    """What the user's extra volumes and sidecars bring that baseline refuses (a cloud's fabric files: hostPath
    plugin directories, a privileged or NET_ADMIN network daemon)."""
    out = []
    for role in ("head", "worker"):
        if any("hostPath" in vol for vol in v[role].get("extraVolumes") or []):
            out.append(f"{role}.extraVolumes (hostPath volumes)")
        for c in v[role].get("sidecarContainers") or []:
            sc = c.get("securityContext") or {}
            added = {str(x).removeprefix("CAP_") for x in (sc.get("capabilities") or {}).get("add") or []}
            if sc.get("privileged") or added - BASELINE_CAPABILITIES:
                out.append(f"{role}.sidecarContainers {c.get('name')} (privileged or capabilities beyond baseline)")
    return out


def _root_sidecars(v: dict[str, Any]) -> list[str]:
    """Sidecars that run as root in their own securityContext (restricted refuses them, baseline allows them): the
    GKE fabric daemons, which Google's manifests run as root while the Ray container stays uid 1000."""
    out = []
    for role in ("head", "worker"):
        for c in v[role].get("sidecarContainers") or []:
            sc = c.get("securityContext") or {}
            if str(sc.get("runAsUser")) == "0" or sc.get("runAsNonRoot") is False:
                out.append(f"{role}.sidecarContainers {c.get('name')} (runs as root)")
    return out

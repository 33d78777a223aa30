"""A run no one else can enter, on the rendered objects of every preset, values file and ci values file:

- every pod the chart renders, as KubeRay creates it (its `wait-gcs-ready` init container in workers copies the Ray
  container's securityContext; SidecarMode adds a submitter container without one), passes the Pod Security
  Standard "restricted" -- each rule named as kubernetes.io/docs/concepts/security/pod-security-standards names it --
  or, where the values need more, the level NOTES names, and fails the stricter one;
- Ray token auth is on in both RayJobs (KubeRay authOptions), no object holds a token, and a run without it is refused
  unless the NetworkPolicy fences the Ray head (the policy itself: tests/test_network_policy.py).
"""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from dapo.k8s import ValuesError
from dapo.k8s.security import pod_security_profile
from k8s_support import (RWX, by_key, chart_objects, doctor_release, helm_notes, helm_objects, on_stand_in, rendered_pods,
                          value_sets)

SETS = value_sets()
# each setting that raises the level, alone on the defaults (in SETS they come together: hostNetwork with ipcLock in
# the RDMA values, so one of them could stop counting unseen)
_SIDECAR = {"name": "fabric-daemon", "image": "registry.example.com/daemon:1",
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}
ONE_SETTING = [
    ("only-hostNetwork", {**RWX, "hostNetwork": True}, "privileged"),
    ("only-ipcLock", {**RWX, "ipcLock": True}, "privileged"),
    ("only-hostPath-volume", {**RWX, "worker": {"extraVolumes": [{"name": "plugins", "hostPath": {"path": "/opt/x"}}]}},
     "privileged"),
    ("only-privileged-sidecar", {**RWX, "worker": {"sidecarContainers": [
        {**_SIDECAR, "securityContext": {"privileged": True}}]}}, "privileged"),
    ("only-net-admin-sidecar", {**RWX, "worker": {"sidecarContainers": [
        {**_SIDECAR, "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]}}, "privileged"),
    ("only-root-ray", {**RWX, "securityContext": {"runAsUser": 0, "runAsNonRoot": False}}, "baseline"),
    ("only-root-sidecar", {**RWX, "worker": {"sidecarContainers": [
        {**_SIDECAR, "securityContext": {"runAsUser": 0, "runAsNonRoot": False}}]}}, "baseline"),
    ("only-fixOwnership", {**RWX, "storage": {**RWX["storage"], "fixOwnership": {"enabled": True}}}, "baseline"),
    ("only-SidecarMode", {**RWX, "train": {"submissionMode": "SidecarMode"}}, "baseline"),
]

# -- Pod Security Standards (Kubernetes v1.30), the rules by their names in the docs --------------------------------

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
SELINUX_TYPES = {None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def _containers(spec):
    return spec.get("initContainers", []) + spec.get("containers", []) + spec.get("ephemeralContainers", [])


def baseline_violations(spec) -> list[str]:
    out = []
    if any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")):
        out.append("Host Namespaces")
    if any((c.get("securityContext") or {}).get("privileged") for c in _containers(spec)):
        out.append("Privileged Containers")
    if any(set((((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or [])) -
           BASELINE_CAPABILITIES for c in _containers(spec)):
        out.append("Capabilities")
    if any("hostPath" in v for v in spec.get("volumes", [])):
        out.append("HostPath Volumes")
    if any(p.get("hostPort") for c in _containers(spec) for p in c.get("ports", [])):
        out.append("Host Ports")
    contexts = [spec.get("securityContext") or {}] + [c.get("securityContext") or {} for c in _containers(spec)]
    if any((sc.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost")
           for sc in contexts):
        out.append("AppArmor")
    if any((sc.get("seLinuxOptions") or {}).get("type") not in SELINUX_TYPES or
           {"user", "role"} & set(sc.get("seLinuxOptions") or {}) for sc in contexts):
        out.append("SELinux")
    if any(sc.get("procMount") not in (None, "Default") for sc in contexts[1:]):
        out.append("/proc Mount Type")
    if any((sc.get("seccompProfile") or {}).get("type") == "Unconfined" for sc in contexts):
        out.append("Seccomp")
    if any(x["name"] not in SAFE_SYSCTLS for x in (spec.get("securityContext") or {}).get("sysctls") or []):
        out.append("Sysctls")
    return out


def restricted_violations(spec) -> list[str]:
    """The baseline rules, then restricted's own (a container setting overrides the pod's)."""
    out = baseline_violations(spec)
    pod_sc = spec.get("securityContext") or {}
    if any(not (set(v) - {"name"}) <= RESTRICTED_VOLUMES for v in spec.get("volumes", [])):
        out.append("Volume Types")
    for c in _containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"Privilege Escalation ({c['name']})")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            out.append(f"Running as Non-root ({c['name']})")
        if str(sc.get("runAsUser", pod_sc.get("runAsUser"))) == "0":
            out.append(f"Running as Non-root user ({c['name']})")
        seccomp = sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            out.append(f"Seccomp ({c['name']})")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []) or set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"Capabilities ({c['name']})")
    return out


@pytest.mark.parametrize("case", SETS, ids=[s[0] for s in SETS])
def test_every_rendered_pod_meets_the_pod_security_level_notes_names(case):
    _, values, release = case
    notes = helm_notes(values, release=release)
    level, reasons = pod_security_profile(notes)
    pods = rendered_pods(values, release)
    assert pods
    if level == "restricted":
        bad = {what: restricted_violations(t["spec"]) for what, t in pods if restricted_violations(t["spec"])}
        assert not bad, bad
        assert "pod-security.kubernetes.io/enforce" not in notes
        return
    assert reasons and f"pod-security.kubernetes.io/enforce={level}" in notes
    assert any(restricted_violations(t["spec"]) for _, t in pods), "NOTES asks for more than restricted needs"
    if level == "baseline":
        bad = {what: baseline_violations(t["spec"]) for what, t in pods if baseline_violations(t["spec"])}
        assert not bad, bad
    else:
        assert any(baseline_violations(t["spec"]) for _, t in pods), "NOTES asks for privileged, baseline would do"


@pytest.mark.parametrize("case", ONE_SETTING, ids=[c[0] for c in ONE_SETTING])
def test_each_setting_that_needs_more_than_restricted_raises_the_level_on_its_own(case):
    """One setting on the defaults: the level NOTES names (and `dapo doctor` checks) is the one the rendered pods
    need -- the pods break the next stricter level's rules and meet this one's."""
    name, values, want = case
    test_every_rendered_pod_meets_the_pod_security_level_notes_names((name, values, "dapo"))
    # what dapo doctor reads: the NOTES of its own render of the release
    level, reasons = pod_security_profile(doctor_release(extra=on_stand_in(values)).notes)
    assert level == want and len(reasons) == 1


def test_the_checker_names_the_rule_each_setting_breaks():
    ok = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
          "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": False,
                                                           "capabilities": {"drop": ["ALL"]}}}],
          "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "x"}}]}
    assert restricted_violations(ok) == []
    for change, rule in [({"hostNetwork": True}, "Host Namespaces"),
                         ({"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}, "HostPath Volumes"),
                         ({"volumes": [{"name": "n", "nfs": {"server": "s", "path": "/"}}]}, "Volume Types"),
                         ({"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}, "Running as Non-root (c)"),
                         ({"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"},
                                               "sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}, "Sysctls")]:
        assert rule in restricted_violations({**copy.deepcopy(ok), **change}), change
    for sc, rule in [({"allowPrivilegeEscalation": True}, "Privilege Escalation (c)"),
                     ({"capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}}, "Capabilities"),
                     ({"runAsUser": 0}, "Running as Non-root user (c)"),
                     ({"privileged": True}, "Privileged Containers"),
                     ({"seccompProfile": {"type": "Unconfined"}}, "Seccomp"),
                     ({"appArmorProfile": {"type": "Unconfined"}}, "AppArmor"),
                     ({"seLinuxOptions": {"user": "system_u"}}, "SELinux"),
                     ({"procMount": "Unmasked"}, "/proc Mount Type")]:
        spec = copy.deepcopy(ok)
        spec["containers"][0]["securityContext"].update(sc)
        assert rule in restricted_violations(spec), sc


# -- Ray token authentication -------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", SETS, ids=[s[0] for s in SETS])
def test_both_rayjobs_have_token_auth_and_no_object_holds_a_token(case):
    _, values, release = case
    objects = helm_objects(values, release=release) + helm_objects(values, release=release, hooks=True)
    reference = values.get("train", {}).get("runner") == "reference"
    for job in [o for o in objects if o["kind"] == "RayJob"]:
        auth = job["spec"]["rayClusterSpec"].get("authOptions")
        assert auth == (None if reference else {"mode": "token"}), job["metadata"]["name"]
    assert not [o for o in objects if o["kind"] == "Secret"]
    text = json.dumps(objects)
    assert "RAY_AUTH_TOKEN" not in text and "auth_token" not in text  # KubeRay injects the reference, not the chart


def test_a_user_secret_reaches_authoptions_and_opting_out_warns():
    values = {**RWX, "eval": {"enabled": True}, "rayAuth": {"secretName": "ray-token"}}
    h = by_key(helm_objects(values))
    for kind in ("train", "eval"):
        assert h[("RayJob", f"dapo-{kind}")]["spec"]["rayClusterSpec"]["authOptions"] == {
            "mode": "token", "secretName": "ray-token"}
    notes = helm_notes(values)
    assert "get secret -n ml ray-token -o jsonpath='{.data.auth_token}' | base64 -d)\"" in notes
    assert "WARNING: rayAuth" not in notes
    off = helm_notes({**RWX, "rayAuth": {"enabled": False}})
    assert "WARNING: rayAuth.enabled is false" in off and "CVE-2023-48022" in off and "RAY_AUTH_TOKEN" not in off


@pytest.mark.parametrize("values, message", [
    ({"train": {"runner": "reference"}, "rayAuth": {"enabled": True}},
     "rayAuth.enabled: train.reference.rayVersion 2.43.0 has no token authentication"),
    ({"rayVersion": "2.51.0"}, "rayAuth.enabled: rayVersion 2.51.0 has no token authentication"),
    ({"securityContext": {"runAsUser": 0}}, "securityContext.runAsUser: 0 under podSecurityContext.runAsNonRoot"),
])
def test_what_kuberay_or_the_kubelet_would_refuse_is_refused_at_install(values, message):
    from helm_python.errors import HelmRenderError

    values = {**RWX, **values}
    with pytest.raises(HelmRenderError, match=message.replace(".", r"\.")):
        helm_objects(values)


OPEN_RAY = [
    ({"rayAuth": {"enabled": False}, "networkPolicy": {"enabled": False}},
     "networkPolicy.enabled: false together with rayAuth.enabled: false leaves the Ray head open: whoever reaches"),
    ({"rayAuth": {"enabled": False}, "hostNetwork": True},
     "hostNetwork: true together with rayAuth.enabled: false leaves the Ray head open on the node's address, where no "
     "NetworkPolicy applies: whoever reaches"),
]


@pytest.mark.parametrize("files, values, message", [
    (files, values, message) for files in ([], ["full.yaml", "reference.yaml"]) for values, message in OPEN_RAY])
def test_a_ray_without_token_auth_and_without_the_network_policy_is_refused_naming_the_risk_and_the_fix(
        files, values, message):
    """Token auth off (the reference runner's Ray 2.43 has none) is refused with the NetworkPolicy off or hostNetwork,
    naming the risk (CVE-2023-48022) and both ways out."""
    from k8s_support import VALUES_DIR, user_values

    paths = [VALUES_DIR / f for f in files]
    with pytest.raises(ValuesError) as p:
        chart_objects(paths, extra={**RWX, **values})
    assert str(p.value).startswith(message), p.value
    for words in ("CVE-2023-48022", "rayAuth.enabled: true", "networkPolicy.enabled: true and no hostNetwork"):
        assert words in str(p.value)
    # the reference preset as shipped renders, fenced: the policy on, no hostNetwork
    ok = user_values(paths, RWX) if files else {**RWX, "rayAuth": {"enabled": False}}
    (policy,) = [o for o in helm_objects(ok) if o["kind"] == "NetworkPolicy"]
    assert policy["spec"]["ingress"] and not ok.get("hostNetwork")


@pytest.mark.parametrize("preset", ["full", "verl-tiny"])
def test_dry_run_does_not_print_the_ray_token_of_the_pod(preset, monkeypatch, capsys):
    """`dapo train --dry-run` in a pod (RAY_AUTH_TOKEN set by KubeRay) prints the resolved config, not the token."""
    from dapo.train.cli import main

    token = "c2VjcmV0LXRva2VuLW9mLXRoZS1wb2QtMDEyMzQ1Njc4OQ=="
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", token)
    assert main(["--preset", preset, "--dry-run"]) == 0
    out = capsys.readouterr()
    assert "policy_loss" in out.out and token not in out.out + out.err

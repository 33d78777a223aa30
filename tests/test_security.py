"""A run no one else can enter, on the rendered objects of every preset, values file and ci values file:

- every pod the chart renders, as KubeRay creates it (its `wait-gcs-ready` init container in workers copies the Ray
  container's securityContext; SidecarMode adds a submitter container without one), passes the Pod Security
  Standard "restricted" -- each rule named as kubernetes.io/docs/concepts/security/pod-security-standards names it --
  or, where the values need more, the level NOTES names, and fails the stricter one;
- the NetworkPolicy selects exactly the Ray pods of the release, admits every pod of the release, the KubeRay
  operator's pods on the port KubeRay's dashboard client uses, and nothing of another release;
- Ray token auth is on in both RayJobs (KubeRay authOptions), and no object holds a token.
"""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from dapo.k8s import ValuesError
from dapo.k8s.security import pod_security_profile
from k8s_support import CHART_DIR, RWX, by_key, helm_notes, helm_objects, python_objects, rendered_pods, value_sets

SETS = value_sets()

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
    level, reasons = pod_security_profile(_coalesced(values))
    notes = helm_notes(values, release=release)
    assert f'the pods need the Pod Security Standard "{level}"' in notes
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


def _coalesced(values):
    from dapo.k8s import load_values

    return load_values(CHART_DIR, extra=copy.deepcopy(values))


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


# -- NetworkPolicy ------------------------------------------------------------------------------------------------

def selects(selector, labels) -> bool:
    """A Kubernetes LabelSelector against a label set (matchLabels and matchExpressions ANDed; {} selects all)."""
    if not (selector.get("matchLabels") or {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions") or []:
        op, key, vals = e["operator"], e["key"], e.get("values") or []
        if not {"In": lambda: labels.get(key) in vals, "NotIn": lambda: labels.get(key) not in vals,
                "Exists": lambda: key in labels, "DoesNotExist": lambda: key not in labels}[op]():
            return False
    return True


def admits(rule, labels, namespace_labels, port, same_namespace) -> bool:
    """Whether one NetworkPolicyIngressRule admits a pod (labels, its namespace's labels) on a TCP port."""
    if rule.get("ports") and not any(p.get("protocol", "TCP") == "TCP" and p.get("port") == port
                                     for p in rule["ports"]):
        return False
    peers = rule.get("from")
    if not peers:
        return True
    for peer in peers:
        ns_ok = selects(peer["namespaceSelector"], namespace_labels) if "namespaceSelector" in peer else same_namespace
        if ns_ok and selects(peer.get("podSelector") or {}, labels):
            return True
    return False


OPERATOR_LABELS = {"app.kubernetes.io/name": "kuberay-operator", "app.kubernetes.io/instance": "kuberay-operator",
                   "app.kubernetes.io/component": "kuberay-operator"}  # kuberay-operator chart v1.7.0, deployment.yaml


@pytest.mark.parametrize("case", SETS, ids=[s[0] for s in SETS])
def test_network_policy_selects_the_ray_pods_and_admits_the_release_and_the_operator(case):
    _, values, release = case
    objects = by_key(helm_objects(values, release=release))
    pods = rendered_pods(values, release)
    (policy,) = [o for k, o in objects.items() if k[0] == "NetworkPolicy"]
    spec = policy["spec"]
    ray = [(w, t) for w, t in pods if w.startswith("RayJob") and not w.endswith("submitter")]
    chosen = [w for w, t in pods if selects(spec["podSelector"], t["metadata"]["labels"])]
    assert chosen == [w for w, _ in ray] and chosen, "the policy must select exactly the Ray pods"
    ns = {"kubernetes.io/metadata.name": "ml"}
    for what, t in pods:  # every pod of the release reaches the Ray pods on every port (GCS 6379, raylets, ...)
        assert any(admits(r, t["metadata"]["labels"], ns, 6379, True) for r in spec["ingress"]), what
    for rayjob in [o for k, o in objects.items() if k[0] == "RayJob"]:
        head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        # utils.FindContainerPort(head, "dashboard", 8265): where KubeRay's dashboard client connects
        port = next((p["containerPort"] for p in head.get("ports", []) if p["name"] == "dashboard"), 8265)
        op_ns = {"kubernetes.io/metadata.name": values.get("networkPolicy", {}).get("operator", {}).get(
            "namespace", "kuberay-system")}
        assert any(admits(r, OPERATOR_LABELS, op_ns, port, False) for r in spec["ingress"]), "operator shut out"
        assert not any(admits(r, OPERATOR_LABELS, op_ns, 6379, False) for r in spec["ingress"])
    stranger = {"app.kubernetes.io/name": "dapo", "app.kubernetes.io/instance": "someone-else",
                "app.kubernetes.io/component": "train-head"}
    for port in (6379, 8265, 10001, 8000):
        assert not any(admits(r, stranger, ns, port, True) for r in spec["ingress"]), port
        assert not any(admits(r, {}, {"kubernetes.io/metadata.name": "other"}, port, False) for r in spec["ingress"])


def test_restricted_egress_keeps_dns_and_the_release_and_opting_out_renders_no_policy():
    values = {**RWX, "networkPolicy": {"restrictEgress": True}}
    h, p = by_key(helm_objects(values)), by_key(python_objects([], extra=values, namespace="ml"))
    assert h == p
    egress = h[("NetworkPolicy", "dapo-ray")]["spec"]["egress"]
    assert {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]} in egress
    assert {"to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "dapo",
                                                    "app.kubernetes.io/instance": "dapo"}}}]} in egress
    off = {**RWX, "networkPolicy": {"enabled": False}}
    assert not [k for k in by_key(helm_objects(off)) if k[0] == "NetworkPolicy"]
    assert "WARNING: networkPolicy.enabled is false" in helm_notes(off)


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
    assert h == by_key(python_objects([], extra=values, namespace="ml"))
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
    with pytest.raises(ValuesError, match=message.replace(".", r"\.")):
        python_objects([], extra=values)


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

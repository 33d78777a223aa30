"""The NetworkPolicy, evaluated as the Kubernetes API defines it (networking.k8s.io/v1: a pod is isolated for a
direction once a policy of that type selects it; then only what a rule of a selecting policy admits gets through;
peers, ports and selectors as below), against the pods as KubeRay v1.7.0 and the Job controller create them
(tests/k8s_support.kuberay_pods: their labels), for every preset, values file and ci values file:

- it selects this release's Ray pods and nothing else, and admits this release's Ray pods (every port), its
  K8sJobMode submitters and the KubeRay operator -- installed either way KubeRay ships it -- on the dashboard port,
  and no other pod: not the log follower, the preflight or helm test pods, and nothing of another release, even in the
  same namespace (two releases rendered side by side);
- egress: the cloud's instance metadata service (IPv4 and IPv6) is denied by default and opened by its opt-out; with
  restrictEgress, DNS goes only to the cluster's DNS pods.

What only a cluster shows: that its CNI enforces NetworkPolicy at all, and how it treats ipBlock for addresses inside
the cluster (the evaluator below gives ipBlock only to addresses that are not pods, the API's intent).
"""

from __future__ import annotations

import copy
import ipaddress

import pytest

from k8s_support import RWX, objects_by_key, by_key, helm_notes, helm_objects, rendered_pods, value_sets

SETS = value_sets()
RAY_PORTS = (6379, 8265, 10001, 8080, 8000, 52365, 20000)  # GCS, dashboard, client, metrics, serve, agent, workers

# The operator's pod labels, per install method of KubeRay v1.7.0 (fetched from ray-project/kuberay at tag v1.7.0):
# helm-chart/kuberay-operator/templates/deployment.yaml (name/instance/component from values nameOverride and
# componentOverride, both kuberay-operator) and ray-operator/config/manager/manager.yaml + kustomization.yaml.
OPERATOR_PODS = {
    "helm": {"app.kubernetes.io/name": "kuberay-operator", "app.kubernetes.io/instance": "kuberay-operator",
             "app.kubernetes.io/component": "kuberay-operator"},
    "kustomize": {"app.kubernetes.io/name": "kuberay", "app.kubernetes.io/component": "kuberay-operator"},
}
OPERATOR_NS = {"kubernetes.io/metadata.name": "kuberay-system"}


def selects(selector, labels) -> bool:
    """A LabelSelector against a label set (matchLabels and matchExpressions ANDed; {} selects all)."""
    if not (selector.get("matchLabels") or {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions") or []:
        op, key, vals = e["operator"], e["key"], e.get("values") or []
        if not {"In": lambda: labels.get(key) in vals, "NotIn": lambda: labels.get(key) not in vals,
                "Exists": lambda: key in labels, "DoesNotExist": lambda: key not in labels}[op]():
            return False
    return True


def _port_ok(rule, port, protocol) -> bool:
    return not rule.get("ports") or any(p.get("protocol", "TCP") == protocol and p.get("port") == port
                                        for p in rule["ports"])


def _peer_is_pod(peer, pod, own_ns) -> bool:
    """A pod peer (podSelector and/or namespaceSelector) against a pod {"labels", "ns", "ns_labels"}."""
    if "ipBlock" in peer or pod is None:
        return False
    if "namespaceSelector" in peer:
        ns_ok = selects(peer["namespaceSelector"], pod["ns_labels"])
    else:
        ns_ok = pod["ns"] == own_ns
    return ns_ok and selects(peer.get("podSelector") or {}, pod["labels"])


def _peer_is_ip(peer, ip) -> bool:
    if "ipBlock" not in peer or ip is None:
        return False
    addr = ipaddress.ip_address(ip)
    block = ipaddress.ip_network(peer["ipBlock"]["cidr"])
    return addr.version == block.version and addr in block and not any(
        addr in ipaddress.ip_network(c) for c in peer["ipBlock"].get("except") or []
        if ipaddress.ip_network(c).version == addr.version)


def admits(spec, pod, port, protocol="TCP", own_ns="ml") -> bool:
    """Whether the policy lets `pod` (a pod dict) reach a pod it selects on port/protocol."""
    return any(_port_ok(r, port, protocol) and (not r.get("from") or any(_peer_is_pod(p, pod, own_ns)
                                                                          for p in r["from"]))
               for r in spec.get("ingress") or [])


def allows_egress(spec, port, protocol="TCP", pod=None, ip=None, own_ns="ml") -> bool:
    """Whether a pod the policy selects may reach a pod or an address outside the cluster on port/protocol."""
    if "Egress" not in spec.get("policyTypes", []):
        return True
    return any(_port_ok(r, port, protocol) and (not r.get("to") or any(
        _peer_is_pod(p, pod, own_ns) or _peer_is_ip(p, ip) for p in r["to"])) for r in spec.get("egress") or [])


def pod(labels, ns="ml"):
    return {"labels": labels, "ns": ns, "ns_labels": {"kubernetes.io/metadata.name": ns}}


def policy_of(values, release):
    (policy,) = [o for o in helm_objects(values, release=release) if o["kind"] == "NetworkPolicy"]
    return policy["spec"]


@pytest.mark.parametrize("case", SETS, ids=[s[0] for s in SETS])
def test_the_policy_selects_this_releases_ray_pods_and_admits_only_them_their_submitters_and_the_operator(case):
    _, values, release = case
    spec = policy_of(values, release)
    pods = rendered_pods(values, release)
    ray = [w for w, _ in pods if w.startswith("RayJob") and not w.endswith("submitter")]
    assert [w for w, t in pods if selects(spec["podSelector"], t["metadata"]["labels"])] == ray and ray
    extra_ingress = bool(values.get("networkPolicy", {}).get("extraIngress"))
    for what, t in pods:
        p = pod(t["metadata"]["labels"])
        if what in ray:
            assert all(admits(spec, p, port) for port in RAY_PORTS), what  # GCS, raylets, object store, workers
        elif what.endswith("submitter"):
            assert admits(spec, p, 8265) and not any(admits(spec, p, port) for port in RAY_PORTS if port != 8265)
        elif not extra_ingress:  # the follower, the preflight, helm test pods: no business with Ray
            assert not any(admits(spec, p, port) for port in RAY_PORTS), what
    ns = values.get("networkPolicy", {}).get("operator", {}).get("namespace", "kuberay-system")
    for method, labels in OPERATOR_PODS.items():
        operator = pod(labels, ns)
        assert admits(spec, operator, 8265), f"the operator installed with {method} is shut out"
        assert not any(admits(spec, operator, port) for port in RAY_PORTS if port != 8265), method
        assert not admits(spec, pod(labels, "elsewhere"), 8265), method
    if not extra_ingress:
        assert not any(admits(spec, pod({}, "other"), port) for port in RAY_PORTS)


def _two_release_values():
    return {**RWX, "eval": {"enabled": True, "submissionMode": "K8sJobMode"}, "train": {"submissionMode": "K8sJobMode"}}


def admitted(spec, pods) -> dict[str, set[int]]:
    """{pod: the ports on which the policy admits it} over a list of (what, pod template), the ports it is shut out
    of left out."""
    out = {}
    for what, t in pods:
        ports = {port for port in RAY_PORTS if admits(spec, pod(t["metadata"]["labels"]), port)}
        if ports:
            out[what] = ports
    return out


def test_two_releases_in_one_namespace_each_admit_only_their_own_ray_pods_and_submitters():
    """alpha and beta in namespace ml, each with both RayJobs, their submitter Jobs, log followers, preflight and helm
    test pods: each policy selects its own Ray pods, admits them on every port and its own submitters on the
    dashboard port, and nothing else of the namespace -- no pod of the other release, and none of its own pods that
    have no business with Ray."""
    values = _two_release_values()
    pods = {r: rendered_pods(values, r) for r in ("alpha", "beta")}
    everyone = pods["alpha"] + pods["beta"]
    assert len(everyone) == len({w for w, _ in everyone}) > 12
    for mine in ("alpha", "beta"):
        spec = policy_of(values, mine)
        ray = [w for w, _ in pods[mine] if w.startswith("RayJob") and not w.endswith("submitter")]
        submitters = [w for w, _ in pods[mine] if w.endswith("submitter")]
        assert len(ray) == 4 and len(submitters) == 2  # train and eval: head, worker; their submitter Jobs
        assert [w for w, t in everyone if selects(spec["podSelector"], t["metadata"]["labels"])] == ray
        assert admitted(spec, everyone) == {**{w: set(RAY_PORTS) for w in ray}, **{w: {8265} for w in submitters}}


def test_the_policy_fails_the_two_release_test_when_it_selects_by_the_name_label_alone():
    """The evaluator catches a policy that admits the namespace's pods of the chart (the selector before this
    issue): beta's pods are admitted by it. Proves the test above can fail."""
    values = _two_release_values()
    spec = copy.deepcopy(policy_of(values, "alpha"))
    spec["ingress"][0]["from"][0]["podSelector"] = {"matchLabels": {"app.kubernetes.io/name": "dapo"}}
    beta = rendered_pods(values, "beta")
    assert [w for w in admitted(spec, beta) if w.startswith("RayJob beta")]


METADATA = [("169.254.169.254", 80), ("169.254.169.252", 988), ("fd00:ec2::254", 80), ("fd20:ce::254", 80)]


def test_job_code_cannot_reach_the_instance_metadata_service_by_default_and_the_opt_out_opens_it():
    h = objects_by_key(RWX)
    spec = h[("NetworkPolicy", "dapo-ray")]["spec"]
    for ip, port in METADATA:
        assert not allows_egress(spec, port, ip=ip), ip
    assert allows_egress(spec, 53, "UDP", ip="169.254.169.254")  # DNS of GKE's Cloud DNS answers there
    for ip in ("104.16.0.1", "2606:4700::6810:1", "10.0.0.7"):  # the hub, wandb, object stores: open
        assert allows_egress(spec, 443, ip=ip), ip
    other = pod({"app": "minio"}, "storage")
    assert allows_egress(spec, 9000, pod=other)  # any pod of the cluster
    notes = helm_notes(RWX)
    assert "egress open but for the instance metadata service" in notes
    opt_out = {**RWX, "networkPolicy": {"instanceMetadata": {"deny": False}}}
    h = objects_by_key(opt_out)
    spec = h[("NetworkPolicy", "dapo-ray")]["spec"]
    assert all(allows_egress(spec, port, ip=ip) for ip, port in METADATA)
    assert "WARNING: networkPolicy.instanceMetadata.deny is false" in helm_notes(opt_out)


def test_restricted_egress_resolves_names_only_at_the_cluster_dns_and_keeps_metadata_shut():
    values = {**RWX, "networkPolicy": {"restrictEgress": True}}
    h = objects_by_key(values)
    spec = h[("NetworkPolicy", "dapo-ray")]["spec"]
    coredns = pod({"k8s-app": "kube-dns"}, "kube-system")
    assert allows_egress(spec, 53, "UDP", pod=coredns) and allows_egress(spec, 53, "TCP", pod=coredns)
    assert not allows_egress(spec, 443, pod=coredns)
    for ip in ("8.8.8.8", "169.254.169.254", "10.96.0.10"):  # a resolver outside the cluster, metadata, any address
        assert not allows_egress(spec, 53, "UDP", ip=ip), ip
    assert not allows_egress(spec, 53, "UDP", pod=pod({"k8s-app": "kube-dns"}, "ml"))  # a look-alike elsewhere
    for ip, port in METADATA:
        assert not allows_egress(spec, port, ip=ip), ip
    ray = [t for w, t in rendered_pods(values, "dapo") if w.startswith("RayJob")]
    assert all(allows_egress(spec, 6379, pod=pod(t["metadata"]["labels"])) for t in ray)
    beta = [t for w, t in rendered_pods(values, "beta") if w.startswith("RayJob")]
    assert not any(allows_egress(spec, 6379, pod=pod(t["metadata"]["labels"])) for t in beta)
    # NodeLocal DNSCache / Cloud DNS: the resolver's address added to networkPolicy.dns
    extra = {**RWX, "networkPolicy": {"restrictEgress": True, "dns": [{"ipBlock": {"cidr": "169.254.20.10/32"}}]}}
    spec = by_key(helm_objects(extra))[("NetworkPolicy", "dapo-ray")]["spec"]
    assert allows_egress(spec, 53, "UDP", ip="169.254.20.10") and not allows_egress(spec, 53, "UDP", pod=coredns)

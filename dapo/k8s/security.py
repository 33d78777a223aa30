"""What keeps a run to itself -- the chart's ``_security.tpl``: Ray token authentication through KubeRay's
``authOptions``, the NetworkPolicy over the Ray pods, the securityContext of the chart's own helper containers, the
rules that refuse combinations that cannot work, and the Pod Security Standard profile a namespace needs for the
chosen values.

- Token auth (``rayAuth``): ``rayClusterSpec.authOptions: {mode: token[, secretName]}``. KubeRay v1.7.0 then sets
  ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` (a secretKeyRef to key ``auth_token`` of ``secretName``, or of the
  Secret it generates per RayCluster, named after it) on the Ray container of every pod, and its dashboard client
  sends ``x-ray-authorization: Bearer <token>`` (HTTPMode submission and status). The chart never holds the token.
  KubeRay refuses token mode below Ray 2.52 (``utils/validation.go``).
- NetworkPolicy ``<fullname>-ray`` (``networkPolicy``, the chart's own object, so it needs no operator feature gate):
  it selects this release's Ray pods only (its labels and KubeRay's ``ray.io/node-type``), which accept ingress from
  this release's Ray pods (every port: GCS, raylets, object store, workers), from its K8sJobMode submitters and the
  KubeRay operator's pods on the dashboard port, and from ``networkPolicy.extraIngress``. Egress goes everywhere but
  the cloud's instance metadata service (``networkPolicy.instanceMetadata``), or with ``networkPolicy.restrictEgress``
  only to this release's Ray pods, DNS to the cluster's resolvers (``networkPolicy.dns``) and
  ``networkPolicy.extraEgress``. Token auth off is refused without this fence (:func:`check_open_ray`).
- Restricted Pod Security: the helper containers (data preparation, model download, the K8sJobMode submitter, the
  helm test pods) always run with :data:`RESTRICTED_CONTAINER`; the Ray containers with ``securityContext`` and every
  pod with ``podSecurityContext`` (both restricted by default).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from dapo.k8s.presets import ValuesError

# The container half of the "restricted" profile (the pod half, runAsNonRoot and seccompProfile, is set on the pod).
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
# storage.fixOwnership: root, with only what chown/chmod of directories it does not own need (baseline allows these)
FIX_OWNERSHIP_CONTAINER = {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": False,
                           "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]}}
# The lowest Ray with token authentication (KubeRay v1.7.0 refuses authOptions.mode token below it).
MIN_RAY_FOR_TOKEN_AUTH = (2, 52, 0)
DASHBOARD_PORT = 8265
DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
# KubeRay v1.7.0's labels (ray-operator/controllers/ray/utils/constant.go): ray.io/node-type on every Ray pod (a pod
# template cannot override it: common/pod.go labelPod), ray.io/originated-from-* on the K8sJobMode submitter
# (rayjob_controller.go getSubmitterTemplate)
RAY_NODE_TYPE = "ray.io/node-type"
ORIGIN_CRD = "ray.io/originated-from-crd"
ORIGIN_NAME = "ray.io/originated-from-cr-name"


# checkov (make test) findings on the chart's Jobs and Pods and on the Ray pod templates that stay, with the reason;
# each object (each Ray pod template) carries its skips as annotations `checkov.io/skipN: <check>=<reason>` (the
# chart's dapo.checkovSkips is the same text). A key `<check>:ray` is that check's reason on a Ray pod.
CHECKOV_REASONS = {
    "CKV_K8S_8": "a hook pod (preflight, start guard, helm test) runs its checks to completion and serves nothing: no "
                 "liveness probe",
    "CKV_K8S_9": "a hook pod (preflight, start guard, helm test) runs its checks to completion and serves nothing: no "
                 "readiness probe",
    "CKV_K8S_15": "image.pullPolicy IfNotPresent: a pod starts without asking the registry once its node holds the "
                  "image; pinned by digest that copy is the pushed image, pinned by tag NOTES warns that it may be "
                  "an older push under the same tag",
    "CKV_K8S_22": "torch's import and the CUDA check write caches under HOME and /tmp",
    "CKV_K8S_25": "storage.fixOwnership: the preflight runs the head's ownership step, root with only CHOWN, "
                  "DAC_OVERRIDE and FOWNER, to fail the install where it would fail the head",
    "CKV_K8S_38": "the follower reads the API server: get on this release's RayJobs (by name) and list on the "
                  "namespace's pods and events (why a run waits); with train.retries the training follower also "
                  "patches or deletes its RayJob (by name) and deletes the pod of a frozen driver",
    "CKV_K8S_40": "the images' user is uid 1000 as in Ray's own images; runAsNonRoot is enforced",
    "CKV_K8S_43": "the image is pinned by tag only (no digest value set; NOTES warns): make images prints the --set "
                  "of its digest",
    # the K8sJobMode submitter
    "CKV_K8S_8:submitter": "KubeRay's K8sJobMode submitter runs ray job submit, then follows the job's logs to its end, "
                           "and serves nothing: no liveness probe",
    "CKV_K8S_9:submitter": "KubeRay's K8sJobMode submitter runs ray job submit, then follows the job's logs to its end, "
                           "and serves nothing: no readiness probe",
    # the Ray pod templates
    "CKV_K8S_8:ray": "KubeRay v1.7.0 gives the Ray container its liveness probe when it creates the pod "
                     "(common/pod.go initLivenessAndReadinessProbe, unless the operator sets ENABLE_PROBES_INJECTION to "
                     "false); a sidecar of the values has the probes of its own manifest",
    "CKV_K8S_9:ray": "KubeRay v1.7.0 gives the Ray container its readiness probe when it creates the pod "
                     "(common/pod.go initLivenessAndReadinessProbe, unless the operator sets ENABLE_PROBES_INJECTION to "
                     "false); a sidecar of the values has the probes of its own manifest",
    "CKV_K8S_22:ray": "Ray writes its session directory (/tmp/ray: logs, sockets, spilled objects) and the job's "
                      "libraries their caches under HOME in the container's file system",
    "CKV_K8S_40:ray": "the images' user is uid 1000 as in Ray's own images, runAsNonRoot enforced; only "
                      "storage.fixOwnership's init container, when on, runs as root to hand the volume's directories "
                      "to it",
    "CKV_K8S_19": "hostNetwork: true (values, for an RDMA or EFA fabric that needs the host's network): no "
                  "NetworkPolicy applies to these pods, the chart requires token authentication with it, NOTES names "
                  "the privileged Pod Security level",
    "CKV_K8S_10": "a sidecar of the values (head/worker.sidecarContainers) without a CPU request: the chart runs the "
                  "values' sidecars as given (a cloud's fabric daemon as its vendor's manifest has it)",
    "CKV_K8S_11": "a sidecar of the values (head/worker.sidecarContainers) without a CPU limit: the chart runs the "
                  "values' sidecars as given (a cloud's fabric daemon as its vendor's manifest has it)",
    "CKV_K8S_12": "a sidecar of the values (head/worker.sidecarContainers) without a memory request: the chart runs "
                  "the values' sidecars as given (a cloud's fabric daemon as its vendor's manifest has it)",
    "CKV_K8S_13": "a sidecar of the values (head/worker.sidecarContainers) without a memory limit: the chart runs "
                  "the values' sidecars as given (a cloud's fabric daemon as its vendor's manifest has it)",
    "CKV_K8S_16": "a privileged sidecar of the values (head/worker.sidecarContainers): the chart runs the values' "
                  "sidecars as given (a cloud's fabric daemon as its vendor's manifest has it); NOTES names the "
                  "privileged Pod Security level",
    "CKV_K8S_20": "a sidecar of the values (head/worker.sidecarContainers) without allowPrivilegeEscalation: false: "
                  "the chart runs the values' sidecars as given (a cloud's fabric daemon as its vendor's manifest "
                  "has it)",
    "CKV_K8S_25:ray": "capabilities the values add: ipcLock (IPC_LOCK, RDMA memory registration), storage.fixOwnership "
                      "(CHOWN, DAC_OVERRIDE, FOWNER in its root init container) or a sidecar's own "
                      "(head/worker.sidecarContainers); NOTES names the Pod Security level they need",
    "CKV_K8S_28": "a sidecar of the values (head/worker.sidecarContainers) that drops neither NET_RAW nor ALL: the "
                  "chart runs the values' sidecars as given (a cloud's fabric daemon as its vendor's manifest has "
                  "it)",
    "CKV_K8S_30": "a sidecar of the values (head/worker.sidecarContainers) without a securityContext: the chart runs "
                  "the values' sidecars as given (a cloud's fabric daemon as its vendor's manifest has it)",
    "CKV_K8S_35": "WANDB_API_KEY: wandb reads an API key from that variable or a netrc file (wandb 0.31, "
                  "wandb/sdk/lib/wbauth) and the Secret holds the bare key, so the containers where the driver runs "
                  "get the variable (the HF token is a mounted file); or a sidecar of the values that takes a secret "
                  "as a variable",
    "CKV_K8S_37": "a sidecar of the values (head/worker.sidecarContainers) that does not drop ALL capabilities: the "
                  "chart runs the values' sidecars as given (a cloud's fabric daemon as its vendor's manifest has "
                  "it)",
}
# (CKV_K8S_43, the image by tag, is added by tag_only where the object's image has no digest)
FOLLOWER_SKIPS = ("CKV_K8S_15", "CKV_K8S_38", "CKV_K8S_40")
PREFLIGHT_SKIPS = ("CKV_K8S_8", "CKV_K8S_9", "CKV_K8S_15", "CKV_K8S_40")
TEST_POD_SKIPS = {"shared": ("CKV_K8S_8", "CKV_K8S_9", "CKV_K8S_15", "CKV_K8S_40"),
                  "gpu": ("CKV_K8S_8", "CKV_K8S_9", "CKV_K8S_15", "CKV_K8S_22", "CKV_K8S_40")}
SUBMITTER_SKIPS = ("CKV_K8S_8:submitter", "CKV_K8S_9:submitter", "CKV_K8S_15", "CKV_K8S_40")
# every Ray pod template: KubeRay's probes, the pull policy, Ray's writable file system, uid 1000
RAY_POD_SKIPS = ("CKV_K8S_8:ray", "CKV_K8S_9:ray", "CKV_K8S_15", "CKV_K8S_22:ray", "CKV_K8S_40:ray")


def tag_only(image: dict[str, Any]) -> tuple[str, ...]:
    """("CKV_K8S_43",) for an image pinned by tag only, () for one pinned by digest."""
    return () if image.get("digest") else ("CKV_K8S_43",)


def submitter_skips(image: str) -> tuple[str, ...]:
    """What checkov finds in the K8sJobMode submitter's pod template that stays (the chart's dapo.submitterSkips)."""
    return SUBMITTER_SKIPS + (() if "@" in image else ("CKV_K8S_43",))


def checkov_skips(checks: tuple[str, ...]) -> dict[str, str]:
    """The annotations that skip ``checks`` on an object, each with its reason."""
    return {f"checkov.io/skip{i}": f"{check.split(':')[0]}={CHECKOV_REASONS[check]}"
            for i, check in enumerate(checks, 1)}


def _caps(c: dict[str, Any]) -> dict[str, Any]:
    return (c.get("securityContext") or {}).get("capabilities") or {}


def _res(c: dict[str, Any], section: str, key: str) -> Any:
    return ((c.get("resources") or {}).get(section) or {}).get(key)


def _drops(c: dict[str, Any], *names: str) -> bool:
    return any(n in d for d in _caps(c).get("drop") or [] for n in names)


# checkov 3.3's checks of a pod's containers and init containers that a Ray pod's containers can fail, each as checkov
# evaluates it (checkov/kubernetes/checks/resource/k8s: CPURequests ... MinimizeCapabilities); in this order
CONTAINER_CHECKS = {
    "CKV_K8S_10": lambda c: not _res(c, "requests", "cpu"),
    "CKV_K8S_11": lambda c: not _res(c, "limits", "cpu"),
    "CKV_K8S_12": lambda c: not _res(c, "requests", "memory"),
    "CKV_K8S_13": lambda c: not _res(c, "limits", "memory"),
    "CKV_K8S_16": lambda c: bool((c.get("securityContext") or {}).get("privileged")),
    "CKV_K8S_20": lambda c: (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False,
    "CKV_K8S_25:ray": lambda c: bool(_caps(c).get("add")),
    "CKV_K8S_28": lambda c: not _drops(c, "ALL", "all", "NET_RAW"),
    "CKV_K8S_30": lambda c: not c.get("securityContext"),
    "CKV_K8S_35": lambda c: any("secretKeyRef" in (e.get("valueFrom") or {}) for e in c.get("env") or [])
    or any("secretRef" in e for e in c.get("envFrom") or []),
    "CKV_K8S_37": lambda c: not _drops(c, "ALL", "all"),
}
# the checks the chart's own containers may fail, each for what the values ask: capabilities (ipcLock,
# storage.fixOwnership) and wandb's key as a variable; any other finding on them fails the scan
OWN_CONTAINER_CHECKS = ("CKV_K8S_25:ray", "CKV_K8S_35")


def ray_pod_skips(spec: dict[str, Any], sidecars: list[str]) -> tuple[str, ...]:
    """What checkov finds in a Ray pod template (exported as a Pod) that stays: :data:`RAY_POD_SKIPS`, hostNetwork,
    each of :data:`CONTAINER_CHECKS` that one of the values' ``sidecars`` (their names) fails, each of
    :data:`OWN_CONTAINER_CHECKS` that one of the chart's own containers fails, and the image by tag (the chart's
    dapo.rayPodSkips)."""
    containers = spec.get("initContainers", []) + spec.get("containers", [])

    def fails(check: str, c: dict[str, Any]) -> bool:
        return (c["name"] in sidecars or check in OWN_CONTAINER_CHECKS) and CONTAINER_CHECKS[check](c)

    found = tuple(check for check in CONTAINER_CHECKS if any(fails(check, c) for c in containers))
    host = ("CKV_K8S_19",) if spec.get("hostNetwork") else ()
    by_tag = () if "@" in spec["containers"][0]["image"] else ("CKV_K8S_43",)
    return RAY_POD_SKIPS + host + found + by_tag


def auth_options(values: dict[str, Any]) -> dict[str, Any] | None:
    """``rayClusterSpec.authOptions`` of both RayJobs, or None with ``rayAuth.enabled: false``."""
    auth = values["rayAuth"]
    if not auth["enabled"]:
        return None
    out: dict[str, Any] = {"mode": "token"}
    if auth.get("secretName"):
        out["secretName"] = auth["secretName"]
    return out


def _version(text: str) -> tuple[int, ...]:
    """major.minor.patch of a Ray version ("2.60.0", "2.52", "2.53.0rc1"); (0, 0, 0) if it is none."""
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    return (int(m[1]), int(m[2]), int(m[3] or 0)) if m else (0, 0, 0)


def check_security(v: dict[str, Any]) -> None:
    """Refuse what KubeRay or the kubelet would refuse later: token auth on a Ray without it (the reference runner's
    Ray 2.43), a root Ray container under a pod that demands non-root."""
    if v["rayAuth"]["enabled"]:
        versions = []
        if v["train"]["enabled"]:
            ref = v["train"]["runner"] == "reference"
            versions.append(("train.reference.rayVersion" if ref else "rayVersion",
                             v["train"]["reference"]["rayVersion"] if ref else v["rayVersion"]))
        if v["eval"]["enabled"]:
            versions.append(("rayVersion", v["rayVersion"]))
        for key, ver in versions:
            if _version(ver) < MIN_RAY_FOR_TOKEN_AUTH:
                raise ValuesError(
                    f"rayAuth.enabled: {key} {ver} has no token authentication (Ray >= 2.52.0; KubeRay refuses "
                    "authOptions.mode token below it). Set rayAuth.enabled: false (values/reference.yaml does) and "
                    "keep networkPolicy.enabled: the NetworkPolicy is then the run's only fence"
                )
    check_open_ray(v)
    pod, ctr = v.get("podSecurityContext") or {}, v.get("securityContext") or {}
    if str(ctr.get("runAsUser")) == "0" and pod.get("runAsNonRoot") and ctr.get("runAsNonRoot") is not False:
        raise ValuesError(
            "securityContext.runAsUser: 0 under podSecurityContext.runAsNonRoot: true: the kubelet refuses to start "
            "the Ray containers; also set securityContext.runAsNonRoot: false (the namespace then needs the "
            "privileged Pod Security profile)"
        )


def check_open_ray(v: dict[str, Any]) -> None:
    """Token auth off leaves the NetworkPolicy as the Ray head's only fence: refused without it (networkPolicy off,
    or hostNetwork, where no NetworkPolicy applies)."""
    if v["rayAuth"]["enabled"]:
        return
    if not v["networkPolicy"]["enabled"]:
        key, where = "networkPolicy.enabled", "false together with rayAuth.enabled: false leaves the Ray head open"
    elif v.get("hostNetwork"):
        key, where = "hostNetwork", ("true together with rayAuth.enabled: false leaves the Ray head open on the "
                                     "node's address, where no NetworkPolicy applies")
    else:
        return
    raise ValuesError(
        f"{key}: {where}: whoever reaches its dashboard (8265) submits code that runs with this run's tokens and "
        "checkpoints (CVE-2023-48022, \"ShadowRay\"). Turn token authentication on (rayAuth.enabled: true, Ray >= "
        "2.52) or keep the NetworkPolicy as the fence: networkPolicy.enabled: true and no hostNetwork "
        "(values/reference.yaml, whose Ray 2.43 has no token authentication, does)"
    )


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


class NetworkPolicies:
    """The release's NetworkPolicy (mixed into :class:`dapo.k8s.manifests.Chart`; uses its names and labels)."""

    v: dict[str, Any]
    name: str
    release: str
    fullname: str

    def ray_components(self) -> list[str]:
        return [f"{k}-{role}" for k in ("train", "eval") if self.v[k]["enabled"] for role in ("head", "worker")]

    def ray_pods(self) -> dict[str, Any]:
        """This release's Ray pods: its labels on the head and worker templates, and ray.io/node-type, which
        KubeRay v1.7.0 sets on every Ray pod and a template cannot override (common/pod.go labelPod)."""
        return {"matchLabels": {"app.kubernetes.io/name": self.name, "app.kubernetes.io/instance": self.release},
                "matchExpressions": [
                    {"key": "app.kubernetes.io/component", "operator": "In", "values": self.ray_components()},
                    {"key": RAY_NODE_TYPE, "operator": "In", "values": ["head", "worker"]}]}

    def submitters(self) -> dict[str, Any] | None:
        """This release's K8sJobMode submitter pods: their template's labels and ray.io/originated-from-cr-name /
        -crd, which KubeRay v1.7.0 sets on the submitter (rayjob_controller.go getSubmitterTemplate); None when no
        RayJob submits from a Job."""
        jobs = [k for k in ("train", "eval") if self.v[k]["enabled"] and self.v[k]["submissionMode"] == "K8sJobMode"]
        if not jobs:
            return None
        return {"matchLabels": {"app.kubernetes.io/name": self.name, "app.kubernetes.io/instance": self.release,
                                ORIGIN_CRD: "RayJob"},
                "matchExpressions": [
                    {"key": "app.kubernetes.io/component", "operator": "In", "values": [f"{k}-submitter" for k in jobs]},
                    {"key": ORIGIN_NAME, "operator": "In", "values": [f"{self.fullname}-{k}" for k in jobs]}]}

    def egress(self) -> list[dict[str, Any]] | None:
        """The egress rules, or None for open egress (restrictEgress off and instanceMetadata.deny off)."""
        np = self.v["networkPolicy"]
        meta = np["instanceMetadata"]
        cidrs = list(meta["cidrs"])
        dns_ports = copy.deepcopy(DNS_PORTS)
        if np["restrictEgress"]:
            rules = [{"to": [{"podSelector": self.ray_pods()}]},
                     {"to": copy.deepcopy(np["dns"]), "ports": dns_ports}]
            if not meta["deny"]:
                rules.append({"to": [{"ipBlock": {"cidr": c}} for c in cidrs]})
            return rules + copy.deepcopy(np.get("extraEgress") or [])
        if not meta["deny"]:
            return None
        v4 = [c for c in cidrs if ":" not in c]
        v6 = [c for c in cidrs if ":" in c]
        return [
            # everywhere but the instance metadata service; every pod of the cluster (CNIs that match ipBlock
            # only outside the cluster's pod network)
            {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": v4}}, {"ipBlock": {"cidr": "::/0", "except": v6}},
                    {"namespaceSelector": {}}]},
            # DNS on the metadata address: the name server of GKE's Cloud DNS
            {"to": [{"ipBlock": {"cidr": c}} for c in cidrs], "ports": dns_ports},
        ]

    def network_policy(self) -> dict[str, Any] | None:
        np = self.v["networkPolicy"]
        if not np["enabled"] or not self.ray_components():
            return None
        ingress: list[dict[str, Any]] = [{"from": [{"podSelector": self.ray_pods()}]}]
        submitters = self.submitters()
        if submitters:
            ingress.append({"from": [{"podSelector": submitters}],
                            "ports": [{"protocol": "TCP", "port": DASHBOARD_PORT}]})
        ingress.append({"from": [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": np["operator"]["namespace"]}},
            "podSelector": {"matchLabels": dict(np["operator"]["podLabels"])}}],
            "ports": [{"protocol": "TCP", "port": DASHBOARD_PORT}]})
        ingress += copy.deepcopy(np.get("extraIngress") or [])
        spec: dict[str, Any] = {"podSelector": self.ray_pods(), "policyTypes": ["Ingress"], "ingress": ingress}
        egress = self.egress()
        if egress is not None:
            spec["policyTypes"] = ["Ingress", "Egress"]
            spec["egress"] = egress
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": self.metadata(f"{self.fullname}-ray", "network"), "spec": spec}  # type: ignore[attr-defined]

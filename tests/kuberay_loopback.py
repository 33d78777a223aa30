"""A KubeRay-shaped Ray cluster on loopback, built from a rendered RayJob: what the KubeRay v1.7 operator would start
(one `ray start --block` per pod, its flags derived from the group's rayStartParams and container resources) and
how it would submit (the K8sJobMode / SidecarMode submitter shell command, or the HTTPMode request), as twins of
KubeRay's Go code (ray-operator/controllers/ray/common/pod.go generateRayStartCommand, common/job.go
BuildJobSubmitCommand, utils/dashboardclient ConvertRayJobToReq).

A "pod" here is the process tree of one `ray start --block`; losing a pod is SIGKILL to its raylet and then to every
other process of the tree (driver included), since on Kubernetes they all die with the pod. What the loopback cannot
keep from the manifest, and replaces: listening ports (free ports instead of 6379/8265/10001/8080/52365), the
dashboard host (127.0.0.1 instead of 0.0.0.0), one private temp dir per pod, and faster GCS health checks (so a lost
node is declared dead in seconds, not ~30 s). The env vars KubeRay adds to Ray containers (RAY_IP, RAY_ADDRESS,
RAY_CLUSTER_NAME, ...) are left out: the pod's own env from the manifest is passed.

Token authentication (``rayClusterSpec.authOptions.mode: token``) is what KubeRay v1.7.0 does with it: the token of
the user's Secret (``secretName``; the test hands its value in as ``secrets``) or of the Secret the operator generates
per RayCluster (RayClusterReconciler.createAuthSecret: base64 of 32 random bytes), set as ``RAY_AUTH_MODE=token`` and
``RAY_AUTH_TOKEN`` on the Ray container of every pod unless the manifest sets them (common/pod.go
SetContainerTokenAuthEnvVars) and on the K8sJobMode/SidecarMode submitter (rayjob_controller.go
configureSubmitterContainer); the operator's dashboard client sends ``x-ray-authorization: Bearer <token>`` on every
request (utils/dashboardclient/dashboard_httpclient.go setAuthHeader), so does the HTTPMode submission here, and so
do this module's own observers (job client, state API).
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from conftest import free_ports
from dapo.util.gofmt import go_quote

VENV_BIN = Path(sys.executable).parent
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}

# KubeRay v1.7 constants (ray-operator/controllers/ray/utils/constant.go)
DEFAULT_METRICS_PORT = 8080
DEFAULT_DASHBOARD_AGENT_LISTEN_PORT = 52365
GCS_HEALTH_PATH = "api/gcs_healthz"
GCS_HEALTH_TIMEOUT_S = 10
BASE_PYTHON_HEALTH_COMMAND = ('python -c "import urllib.request; r=urllib.request.urlopen(\'%s\', timeout=%d); '
                              'exit(0 if b\'success\' in r.read() else 1)"')

# A lost node is declared dead after ~3 s instead of ~30 s (GCS health checks of the raylets).
FAST_HEALTH_CHECKS = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_initial_delay_ms": "1000",
}


# ---------------------------------------------------------------------------------------------------------------------
# Twins of KubeRay's Go code
# ---------------------------------------------------------------------------------------------------------------------

def _quantity_value(q: Any) -> int:
    """resource.Quantity.Value(): the quantity as an integer, rounded up ("500m" -> 1, "4Gi" -> 4294967296)."""
    import math

    from kubernetes.utils.quantity import parse_quantity

    return int(math.ceil(parse_quantity(str(q))))


def _is_gpu_resource_key(key: str) -> bool:
    """utils.IsGPUResourceKey."""
    import re

    return key.endswith("gpu") or re.search(r"nvidia\.com/mig-\d+g\.\d+gb$", key) is not None


# customAcceleratorToRayResourceMap: container resource -> Ray resource
CUSTOM_ACCELERATORS = {"aws.amazon.com/neuroncore": "neuron_cores", "google.com/tpu": "TPU"}


def _go_json_number(x: float) -> Any:
    return int(x) if float(x).is_integer() else x


def _add_well_known_accelerator_resources(params: dict[str, str], limits: dict[str, Any]) -> None:
    """addWellKnownAcceleratorResources: num-gpus from the first *gpu limit, and the first custom accelerator
    (TPU, Neuron cores) into the `resources` JSON, unless already given."""
    if not limits:
        return
    try:
        resources = json.loads(params["resources"].strip("'\"` ")) if "resources" in params else {}
    except json.JSONDecodeError:
        return  # KubeRay logs the error and leaves the parameters as they are
    custom_added = any(r in resources for r in CUSTOM_ACCELERATORS.values())
    for key in sorted(limits):
        value = _quantity_value(limits[key])
        if "num-gpus" not in params and _is_gpu_resource_key(key) and value != 0:
            params["num-gpus"] = str(value)
        if not custom_added and key in CUSTOM_ACCELERATORS and value != 0:
            if CUSTOM_ACCELERATORS[key] not in resources:
                from kubernetes.utils.quantity import parse_quantity

                resources[CUSTOM_ACCELERATORS[key]] = float(parse_quantity(str(limits[key])))
                body = json.dumps({k: _go_json_number(v) for k, v in sorted(resources.items())},
                                  separators=(",", ":"))
                params["resources"] = f"'{body}'"
            custom_added = True


def generate_ray_start_command(head: bool, params: dict[str, str], resources: dict[str, Any]) -> str:
    """generateRayStartCommand: num-cpus from the CPU limit (else request), memory from the memory limit, and the
    accelerators, unless given; then `ray start [--head]` + convertParamMap. Updates ``params`` in place."""
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    if "num-cpus" not in params:
        for cpu in (limits.get("cpu"), requests.get("cpu")):
            if cpu is not None and _quantity_value(cpu) != 0:
                params["num-cpus"] = str(_quantity_value(cpu))
                break
    if "memory" not in params and limits.get("memory") is not None and _quantity_value(limits["memory"]) != 0:
        params["memory"] = str(_quantity_value(limits["memory"]))
    _add_well_known_accelerator_resources(params, limits)
    return ("ray start --head " if head else "ray start ") + convert_param_map(params)


def ray_container_command(container: dict[str, Any], ray_start: str) -> tuple[list[str], list[str]]:
    """BuildPod's command of the Ray container (common/pod.go, KubeRay v1.7): unless the container's own command and
    args already hold `ray start`, the command becomes `/bin/bash -c --` and the args one string, `<command and args
    as convertCmdToString joins them> && ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}; <ray start ...>` (without
    a command and args: the generated part alone)."""
    cmd = "".join(f" {c} " for c in (container.get("command") or []))
    cmd += "".join(f" {a} " for a in (container.get("args") or []))
    if "ray start" in cmd:
        return list(container.get("command") or []), list(container.get("args") or [])
    generated = f"ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {ray_start}"
    return ["/bin/bash", "-c", "--"], [f"{cmd} && {generated}" if cmd else generated]


def convert_param_map(params: dict[str, str]) -> str:
    """convertParamMap: sorted keys; "true" is a bare switch and "false" is dropped, but for the flags that take an
    explicit boolean; everything else is ` --key=value `."""
    special = {"log-color", "include-dashboard", "include-log-monitor"}
    out = []
    for key in sorted(params):
        value = params[key]
        if value.lower() in ("true", "false") and key not in special:
            if value.lower() == "true":
                out.append(f" --{key} ")
        else:
            out.append(f" --{key}={value} ")
    return "".join(out)


def set_missing_ray_start_params(params: dict[str, str], *, head: bool, address: str = "") -> dict[str, str]:
    """setMissingRayStartParams: a worker's GCS address, the head's dashboard-host 0.0.0.0, metrics-export-port
    8080, block, dashboard-agent-listen-port 52365 -- unless given. Updates ``params`` in place."""
    if not head:
        params.setdefault("address", address)
    else:
        params.setdefault("dashboard-host", "0.0.0.0")
    params.setdefault("metrics-export-port", str(DEFAULT_METRICS_PORT))
    params["block"] = "true"
    params.setdefault("dashboard-agent-listen-port", str(DEFAULT_DASHBOARD_AGENT_LISTEN_PORT))
    return params


def kuberay_job_id(rayjob: dict[str, Any]) -> str:
    """initRayJobStatusIfNeed: spec.jobId, else GenerateRayJobId(name) = name + "-" + 5 random lowercase
    alphanumerics; a retry clears Status.JobId, so every attempt gets a new one."""
    if rayjob["spec"].get("jobId"):
        return rayjob["spec"]["jobId"]
    alphabet = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery rand.String's alphabet
    return f"{rayjob['metadata']['name']}-{''.join(random.choice(alphabet) for _ in range(5))}"


def go_json(obj: Any) -> str:
    """Go's json.Marshal of a decoded YAML/JSON value: compact, map keys sorted, <>& and U+2028/9 escaped."""
    text = json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def _dashboard_port(rayjob: dict[str, Any]) -> int:
    """utils.FindContainerPort(head container, "dashboard", 8265)."""
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    ports = [p["containerPort"] for p in head.get("ports", []) if p.get("name") == "dashboard"]
    return int(ports[0]) if ports else 8265


def kuberay_submit_args(rayjob: dict[str, Any], job_id: str, dashboard_url: str = "",
                        mode: Optional[str] = None, sidecar_port: Optional[int] = None) -> list[str]:
    """BuildJobSubmitCommand for K8sJobMode (address: Status.DashboardURL) or SidecarMode (address: 127.0.0.1 and
    the head container's dashboard port, or ``sidecar_port``; no SidecarSubmitterRestart feature gate): wait for the
    dashboard, then -- in K8sJobMode only if the job id is unknown -- submit with the runtime env, metadata and
    entrypoint resources, then follow the logs. The submitter runs `/bin/bash -ce -- "<args joined by spaces>"`."""
    import yaml

    spec = rayjob["spec"]
    mode = mode or spec.get("submissionMode", "K8sJobMode")
    if mode == "SidecarMode":
        port = sidecar_port or _dashboard_port(rayjob)
        address, health_url = f"http://127.0.0.1:{port}", f"http://localhost:{port}/{GCS_HEALTH_PATH}"
    elif mode == "K8sJobMode":
        address = dashboard_url if dashboard_url.startswith("http://") else "http://" + dashboard_url
        health_url = f"{address}/{GCS_HEALTH_PATH}"
    else:
        raise ValueError(f"no submitter command in submissionMode {mode!r}")
    needs_status_check = mode == "K8sJobMode"
    health = BASE_PYTHON_HEALTH_COMMAND % (health_url, GCS_HEALTH_TIMEOUT_S)
    cmd = ["until", health, ">/dev/null", "2>&1", ";", "do", "echo",
           go_quote(f"Waiting for Ray Dashboard GCS to become healthy at {address} ..."), ";", "sleep", "2", ";",
           "done", ";"]
    if needs_status_check:
        cmd += ["if", "!", "ray", "job", "status", "--address", address, job_id, ">/dev/null", "2>&1", ";", "then"]
    cmd += ["ray", "job", "submit", "--address", address]
    if needs_status_check:
        cmd.append("--no-wait")
    if spec.get("runtimeEnvYAML"):
        cmd += ["--runtime-env-json", go_quote(go_json(yaml.safe_load(spec["runtimeEnvYAML"])))]
    if spec.get("metadata"):
        cmd += ["--metadata-json", go_quote(go_json(spec["metadata"]))]
    if job_id:
        cmd += ["--submission-id", job_id]
    if float(spec.get("entrypointNumCpus") or 0) > 0:
        cmd += ["--entrypoint-num-cpus", f"{float(spec['entrypointNumCpus']):f}"]  # fmt.Sprintf("%f", float32)
    if float(spec.get("entrypointNumGpus") or 0) > 0:
        cmd += ["--entrypoint-num-gpus", f"{float(spec['entrypointNumGpus']):f}"]
    if spec.get("entrypointResources"):
        cmd += ["--entrypoint-resources", go_quote(spec["entrypointResources"])]
    cmd += ["--", spec["entrypoint"].strip(), ";"]
    if needs_status_check:
        cmd += ["fi", ";", "ray", "job", "logs", "--address", address, "--follow", job_id]
    return cmd


def kuberay_submit_request(rayjob: dict[str, Any], job_id: str) -> dict[str, Any]:
    """ConvertRayJobToReq (HTTPMode): the JSON body the operator POSTs to the dashboard's /api/jobs/ (zero and empty
    fields are omitted, as Go's `omitempty` does)."""
    import yaml

    spec = rayjob["spec"]
    req: dict[str, Any] = {"entrypoint": spec["entrypoint"], "submission_id": job_id}
    if spec.get("metadata"):
        req["metadata"] = spec["metadata"]
    if spec.get("runtimeEnvYAML"):
        req["runtime_env"] = yaml.safe_load(spec["runtimeEnvYAML"])
    if float(spec.get("entrypointNumCpus") or 0):
        req["entrypoint_num_cpus"] = float(spec["entrypointNumCpus"])
    if float(spec.get("entrypointNumGpus") or 0):
        req["entrypoint_num_gpus"] = float(spec["entrypointNumGpus"])
    if spec.get("entrypointResources"):
        req["entrypoint_resources"] = {k: float(v) for k, v in json.loads(spec["entrypointResources"]).items()}
    return req


def kuberay_auth_token(rayjob: dict[str, Any], secrets: Optional[dict[str, str]] = None) -> Optional[str]:
    """The token KubeRay puts into the cluster's pods: None without ``authOptions.mode: token`` (utils.IsAuthEnabled);
    the ``auth_token`` of the user's Secret ``secretName`` (``secrets``: name -> token, what the test created); else
    a generated one (createAuthSecret: base64.StdEncoding of 32 random bytes)."""
    import base64
    import secrets as random_source

    auth = rayjob["spec"]["rayClusterSpec"].get("authOptions") or {}
    if auth.get("mode") != "token":
        return None
    if auth.get("secretName"):
        if auth["secretName"] not in (secrets or {}):
            raise KeyError(f"authOptions.secretName {auth['secretName']!r}: no such Secret (the pods would not start)")
        return secrets[auth["secretName"]]
    return base64.b64encode(random_source.token_bytes(32)).decode()


def auth_env(token: Optional[str], container_env_names: set[str] = frozenset()) -> dict[str, str]:
    """SetContainerTokenAuthEnvVars: RAY_AUTH_MODE=token and RAY_AUTH_TOKEN, each unless the container sets it."""
    if token is None:
        return {}
    return {k: v for k, v in (("RAY_AUTH_MODE", "token"), ("RAY_AUTH_TOKEN", token))
            if k not in container_env_names}


def worker_count(group: dict[str, Any]) -> int:
    return int(group.get("replicas", group.get("minReplicas", 0)) or 0)


# ---------------------------------------------------------------------------------------------------------------------
# Pods and the cluster
# ---------------------------------------------------------------------------------------------------------------------

# the downward API's fields the kubelet resolves for a pod (env valueFrom.fieldRef.fieldPath); on loopback every pod
# is its own stand-in node, named after the pod
def _field(path: str, pod: str) -> Optional[str]:
    return {"metadata.name": pod, "spec.nodeName": f"node-{pod}", "status.podIP": "127.0.0.1",
            "status.hostIP": "127.0.0.1"}.get(path)


def container_env(group: dict[str, Any], pod: str = "pod") -> dict[str, str]:
    """The env of a group's Ray container as the kubelet sets it: plain values, and the downward API's fields of
    this pod (:func:`_field`); secretKeyRef entries are optional ones here and are left out."""
    container = group["template"]["spec"]["containers"][0]
    out = {}
    for e in container.get("env", []):
        if "value" in e:
            out[e["name"]] = str(e["value"])
        elif (ref := (e.get("valueFrom") or {}).get("fieldRef")) and _field(ref.get("fieldPath", ""), pod):
            out[e["name"]] = _field(ref["fieldPath"], pod)
    return out


class Pod:
    """One `ray start --block` with its own temp dir, started in its own session like a container's PID 1."""

    def __init__(self, name: str, group: dict[str, Any], *, head: bool, root: Path, env: dict[str, str],
                 gcs_port: int, dashboard_port: Optional[int] = None, token: Optional[str] = None):
        self.name, self.group, self.head = name, group, head
        self.temp_dir = root / name
        container = group["template"]["spec"]["containers"][0]  # utils.RayContainerIndex
        # what KubeRay writes into the pod's command ...
        params = {k: str(v) for k, v in (group.get("rayStartParams") or {}).items()}
        set_missing_ray_start_params(params, head=head, address=f"127.0.0.1:{gcs_port}")
        generate_ray_start_command(head, params, container.get("resources") or {})
        # ... with what must differ on one shared host: free ports, loopback, a private temp dir
        metrics, agent, client = free_ports(3)
        params.update({"metrics-export-port": str(metrics), "dashboard-agent-listen-port": str(agent),
                       "temp-dir": str(self.temp_dir)})
        if head:
            params.update({"dashboard-host": "127.0.0.1", "port": str(gcs_port), "dashboard-port": str(dashboard_port),
                           "ray-client-server-port": str(client)})
        self.params = params
        names = {e["name"] for e in container.get("env", [])}
        self.env = {**env, **container_env(group, name), **auth_env(token, names)}
        self.argv = shlex.split(("ray start --head " if head else "ray start ") + convert_param_map(params))
        self.log = root / f"{name}.out"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, cwd=root, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.node_id: Optional[str] = None
        self.raylet_pid: Optional[int] = None

    def wait_raylet(self, timeout: float = 90) -> str:
        """The raylet of this pod (a descendant of its `ray start`): its pid and node id."""
        import psutil

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: ray start exited {self.proc.returncode}:\n{self.log.read_text()}")
            for p in self.tree():
                try:
                    cmd = p.cmdline()
                except psutil.Error:
                    continue
                if cmd and Path(cmd[0]).name == "raylet":
                    ids = [a.split("=", 1)[1] for a in cmd if a.startswith("--node_id=")]
                    if ids:
                        self.raylet_pid, self.node_id = p.pid, ids[0]
                        return self.node_id
            time.sleep(0.5)
        raise TimeoutError(f"{self.name}: no raylet after {timeout}s:\n{self.log.read_text()}")

    def tree(self) -> list:
        """`ray start` and every process below it (raylet, agents, workers, job supervisor, job driver ...)."""
        import psutil

        try:
            top = psutil.Process(self.proc.pid)
            return [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def lose(self) -> list[int]:
        """The pod is lost: SIGKILL its raylet, then every other process of the pod (the job driver is one; Ray's
        own fate-sharing does not end it when its node goes, the kubelet does). Returns the pids killed."""
        import psutil

        procs = self.tree()  # taken before the kill: orphans are re-parented afterwards
        os.kill(self.raylet_pid, signal.SIGKILL)
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=30)
        if alive:
            raise RuntimeError(f"{self.name}: processes survived SIGKILL: {alive}")
        self.proc.wait(timeout=10)
        return [p.pid for p in procs]

    def stop(self) -> None:
        import psutil

        procs = self.tree()
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


class LoopbackRayCluster:
    """The RayCluster of a rendered RayJob on loopback: a head pod and each worker group's `replicas` pods."""

    def __init__(self, rayjob: dict[str, Any], root: Path, env: dict[str, str], min_workers: int = 0,
                 secrets: Optional[dict[str, str]] = None):
        self.rayjob, self.root = rayjob, root
        self.spec = rayjob["spec"]["rayClusterSpec"]
        self.token = kuberay_auth_token(rayjob, secrets)  # None: authOptions off
        # what KubeRay's dashboard client sends (and this module's observers: job client, state API)
        self.auth_headers = {"x-ray-authorization": f"Bearer {self.token}"} if self.token else {}
        self.env = {**env, **FAST_HEALTH_CHECKS}
        self.gcs_port, self.dashboard_port = free_ports(2)
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        self.pods: list[Pod] = []
        self._serial = 0
        self.head = self._add("head", self.spec["headGroupSpec"], head=True)
        self.head.wait_raylet()
        started = [self.add_worker(group, wait=False) for group in self.spec.get("workerGroupSpecs", [])
                   for _ in range(worker_count(group))]
        for pod in started:  # the workers start side by side, as KubeRay creates their pods at once
            pod.wait_raylet()
        self.wait_nodes()

    def _add(self, name: str, group: dict[str, Any], *, head: bool) -> Pod:
        pod = Pod(name, group, head=head, root=self.root, env=self.env, gcs_port=self.gcs_port,
                  dashboard_port=self.dashboard_port, token=self.token)
        self.pods.append(pod)
        return pod

    def add_worker(self, group: dict[str, Any], wait: bool = True) -> Pod:
        self._serial += 1
        pod = self._add(f"w{self._serial}", group, head=False)  # short: AF_UNIX paths under the temp dir
        if wait:
            pod.wait_raylet()
        return pod

    def workers(self) -> list[Pod]:
        return [p for p in self.pods if not p.head and p.proc.poll() is None]

    def pod_of(self, node_id: str) -> Pod:
        (pod,) = [p for p in self.pods if p.node_id == node_id]
        return pod

    def state(self, resource: str, filters: Optional[list] = None, detail: bool = False) -> list[Any]:
        """Ray's own state of the cluster (state API through the dashboard, with the token): ``resource`` is a
        ``StateResource`` name ("NODES", "ACTORS", "PLACEMENT_GROUPS", ...)."""
        from ray.util.state import StateApiClient
        from ray.util.state.common import ListApiOptions, StateResource

        client = StateApiClient(address=self.address, headers={"Content-Type": "application/json",
                                                               **self.auth_headers})
        return client.list(StateResource[resource], options=ListApiOptions(filters=filters or [], detail=detail),
                           raise_on_missing_output=False)

    def nodes(self) -> dict[str, Any]:
        """Alive nodes by id, as the GCS sees them (state API through the dashboard)."""
        return {n.node_id: n for n in self.state("NODES", [("state", "=", "ALIVE")])}

    def wait_nodes(self, timeout: float = 90) -> dict[str, Any]:
        """Wait until exactly the running pods are the alive nodes (a lost pod's node declared dead)."""
        want = {p.node_id for p in self.pods if p.proc.poll() is None}
        deadline = time.monotonic() + timeout
        while True:
            try:
                nodes = self.nodes()
                if set(nodes) == want:
                    return nodes
            except Exception:  # dashboard not up yet
                nodes = {}
            if time.monotonic() > deadline:
                raise TimeoutError(f"alive nodes {sorted(nodes)} != pods {sorted(want)}")
            time.sleep(1)

    def client(self):
        from ray.job_submission import JobSubmissionClient

        deadline = time.monotonic() + 60
        while True:
            try:
                client = JobSubmissionClient(self.address, headers=dict(self.auth_headers))
                client.list_jobs()
                return client
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def submit(self, job_id: str) -> Optional[subprocess.Popen]:
        """Submit the RayJob as KubeRay does in its submissionMode: the submitter command in its own process
        (returned, it follows the logs until the job ends), or the HTTPMode request from the "operator"."""
        mode = self.rayjob["spec"].get("submissionMode", "K8sJobMode")
        if mode == "HTTPMode":
            import urllib.request

            body = json.dumps(kuberay_submit_request(self.rayjob, job_id)).encode()
            req = urllib.request.Request(f"{self.address}/api/jobs/", data=body, method="POST",
                                         headers={"Content-Type": "application/json", **self.auth_headers})
            with urllib.request.urlopen(req, timeout=30) as resp:
                assert json.load(resp)["submission_id"] == job_id
            return None
        script = " ".join(kuberay_submit_args(self.rayjob, job_id, self.address, sidecar_port=self.dashboard_port))
        out = open(self.root / f"submit-{job_id}.out", "w")
        try:
            return subprocess.Popen(["/bin/bash", "-ce", "--", script],
                                    env={**self.env, "PYTHONUNBUFFERED": "1", **auth_env(self.token)},
                                    cwd=self.root, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            out.close()

    def submitter_output(self, job_id: str) -> str:
        out = self.root / f"submit-{job_id}.out"
        return out.read_text()[-4000:] if out.exists() else "(HTTPMode: no submitter)"

    def close(self) -> None:
        for pod in reversed(self.pods):
            pod.stop()


def unauthenticated_refusals(cluster: LoopbackRayCluster, timeout: float = 60) -> dict[str, str]:
    """What the head answers to someone without the token (token auth on): a job submission without a header and
    with a wrong token (the dashboard's Jobs API: code execution on the cluster), and ``ray.init`` to the GCS
    without a token, from a fresh process and HOME, and -- the control -- with it. Returns what each got ("401",
    "403", "REFUSED <error>", "JOINED"; the refused client's stderr under "ray.init stderr")."""
    import urllib.error
    import urllib.request

    body = json.dumps({"entrypoint": "echo owned", "submission_id": "intruder"}).encode()
    out = {}
    for what, headers in (("no token", {}), ("wrong token", {"x-ray-authorization": "Bearer not-the-token"})):
        req = urllib.request.Request(f"{cluster.address}/api/jobs/", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **headers})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                out[what] = str(resp.status)
        except urllib.error.HTTPError as exc:
            out[what] = str(exc.code)
    script = ("import ray\ntry:\n    ray.init(address=%r, log_to_driver=False)\n    print('JOINED')\n"
              "except Exception as exc:\n    print('REFUSED', type(exc).__name__, str(exc).splitlines()[0][:200])\n"
              % f"127.0.0.1:{cluster.gcs_port}")
    for what, auth in (("ray.init", {"RAY_AUTH_MODE": "disabled"}), ("ray.init with the token", auth_env(cluster.token))):
        home = cluster.root / f"client-home-{len(out)}"  # a fresh HOME: no ~/.ray/auth_token to fall back on
        home.mkdir(exist_ok=True)
        env = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_AUTH")}
        env.update(HOME=str(home), **auth)
        r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
        out[what] = (r.stdout.strip().splitlines() or [f"exit {r.returncode}: {r.stderr[-300:]}"])[-1]
        if what == "ray.init":
            out["ray.init stderr"] = r.stderr
    return out


def files_containing(root: Path, needle: str) -> list[Path]:
    """Files under root (Ray's logs, driver logs, the submitter's output ...) whose bytes contain needle."""
    data = needle.encode()
    hits = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and data in path.read_bytes():
                hits.append(path)
        except OSError:
            continue
    return hits


def stop_marked_processes(marker: str) -> None:
    """Kill what is left of this test's processes: those whose command line names its private temp dir (job drivers
    run in their own session, outside any pod tree once orphaned). Never `ray stop`, which is machine-wide."""
    import psutil

    mine = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid != os.getpid() and any(marker in part for part in (p.info["cmdline"] or [])):
                mine.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    for p in mine:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(mine, timeout=10)


"""The loopback cluster's twins of KubeRay v1.7.0 give what KubeRay gives: the expected values are KubeRay's own test
vectors (ray-operator/controllers/ray/common/job_test.go TestBuildJobSubmitCommandWith{K8sJobMode,SidecarMode},
common/pod_test.go TestGenerateRayStartCommand, utils/dashboardclient/dashboard_httpclient_test.go
ConvertRayJobToReq), transcribed; Go's strconv.Quote is written out as Python string literals."""

from __future__ import annotations

import shlex
import socket
from pathlib import Path

import pytest
from kubernetes.utils.quantity import parse_quantity

from conftest import free_ports
from k8s_support import by_key, helm_objects, set_files, user_values
from kuberay_loopback import (
    auth_env,
    convert_param_map,
    generate_ray_start_command,
    kuberay_auth_token,
    kuberay_job_id,
    kuberay_submit_args,
    kuberay_submit_request,
    set_missing_ray_start_params,
)

HEALTH = ('python -c "import urllib.request; r=urllib.request.urlopen(\'{url}\', timeout=10); '
          'exit(0 if b\'success\' in r.read() else 1)"')


def _template_rayjob():
    """job_test.go rayJobTemplate()."""
    return {"metadata": {"name": "x"}, "spec": {
        "runtimeEnvYAML": "test: test",
        "metadata": {"testKey": "testValue"},
        "rayClusterSpec": {"rayVersion": "2.6.0", "headGroupSpec": {"template": {"spec": {"containers": [
            {"ports": [{"name": "dashboard", "containerPort": 8265}]}]}}}},
        "entrypoint": "echo no quote 'single quote' \"double quote\"",
        "entrypointNumCpus": 1,
        "entrypointNumGpus": 0.5,
        "entrypointResources": '{"Custom_1": 1, "Custom_2": 5.5}',
    }}


def test_submit_command_is_kuberays_in_k8s_job_mode():
    expected = [
        "until", HEALTH.format(url="http://127.0.0.1:8265/api/gcs_healthz"), ">/dev/null", "2>&1", ";",
        "do", "echo", '"Waiting for Ray Dashboard GCS to become healthy at http://127.0.0.1:8265 ..."', ";",
        "sleep", "2", ";", "done", ";",
        "if", "!", "ray", "job", "status", "--address", "http://127.0.0.1:8265", "testJobId", ">/dev/null", "2>&1",
        ";", "then",
        "ray", "job", "submit", "--address", "http://127.0.0.1:8265", "--no-wait",
        "--runtime-env-json", '"{\\"test\\":\\"test\\"}"',
        "--metadata-json", '"{\\"testKey\\":\\"testValue\\"}"',
        "--submission-id", "testJobId",
        "--entrypoint-num-cpus", "1.000000",
        "--entrypoint-num-gpus", "0.500000",
        "--entrypoint-resources", '"{\\"Custom_1\\": 1, \\"Custom_2\\": 5.5}"',
        "--",
        "echo no quote 'single quote' \"double quote\"",
        ";", "fi", ";",
        "ray", "job", "logs", "--address", "http://127.0.0.1:8265", "--follow", "testJobId",
    ]
    assert kuberay_submit_args(_template_rayjob(), "testJobId", "http://127.0.0.1:8265", "K8sJobMode") == expected


def test_submit_command_is_kuberays_in_sidecar_mode():
    expected = [
        "until", HEALTH.format(url="http://localhost:8265/api/gcs_healthz"), ">/dev/null", "2>&1", ";",
        "do", "echo", '"Waiting for Ray Dashboard GCS to become healthy at http://127.0.0.1:8265 ..."', ";",
        "sleep", "2", ";", "done", ";",
        "ray", "job", "submit", "--address", "http://127.0.0.1:8265",
        "--runtime-env-json", '"{\\"test\\":\\"test\\"}"',
        "--metadata-json", '"{\\"testKey\\":\\"testValue\\"}"',
        "--submission-id", "testJobId",
        "--entrypoint-num-cpus", "1.000000",
        "--entrypoint-num-gpus", "0.500000",
        "--entrypoint-resources", '"{\\"Custom_1\\": 1, \\"Custom_2\\": 5.5}"',
        "--",
        "echo no quote 'single quote' \"double quote\"",
        ";",
    ]
    assert kuberay_submit_args(_template_rayjob(), "testJobId", mode="SidecarMode") == expected


def test_http_mode_request_is_kuberays():
    req = kuberay_submit_request({"spec": {"entrypoint": "python samply.py", "entrypointNumCpus": 1.1,
                                           "entrypointNumGpus": 2.2,
                                           "entrypointResources": '{"r1": 0.1, "r2": 0.2}'}}, "raysubmit_test001")
    assert req == {"entrypoint": "python samply.py", "submission_id": "raysubmit_test001",
                   "entrypoint_num_cpus": 1.1, "entrypoint_num_gpus": 2.2,
                   "entrypoint_resources": {"r1": 0.1, "r2": 0.2}}
    with pytest.raises(ValueError):
        kuberay_submit_request({"spec": {"entrypoint": "x", "entrypointResources": '{"r1": "string"}'}}, "id")


@pytest.mark.parametrize("head, params, limits, expected", [
    (False, {}, {"nvidia.com/gpu": "1"}, "ray start  --num-gpus=1 "),
    (False, {}, {"nvidia.com/mig-2g.32gb": "1"}, "ray start  --num-gpus=1 "),
    (False, {}, {"google.com/tpu": "4"}, "ray start  --resources='{\"TPU\":4}' "),
    (True, {}, {"aws.amazon.com/neuroncore": "4"}, "ray start --head  --resources='{\"neuron_cores\":4}' "),
    (True, {}, {"aws.amazon.com/neuroncore": "4", "nvidia.com/gpu": "1"},
     "ray start --head  --num-gpus=1  --resources='{\"neuron_cores\":4}' "),
    (True, {}, {"google.com/tpu": "8", "aws.amazon.com/neuroncore": "4", "nvidia.com/gpu": "1"},
     "ray start --head  --num-gpus=1  --resources='{\"neuron_cores\":4}' "),
    (True, {"resources": '"{"custom_resource":2}"'}, {"aws.amazon.com/neuroncore": "4"},
     "ray start --head  --resources='{\"custom_resource\":2,\"neuron_cores\":4}' "),
    (True, {"resources": "'{\"custom_resource\":2,\"neuron_cores\":3}'"}, {"aws.amazon.com/neuroncore": "4"},
     "ray start --head  --resources='{\"custom_resource\":2,\"neuron_cores\":3}' "),
    (True, {"resources": "'{\"custom_resource\":2,\"TPU\":4}'"}, {"google.com/tpu": "8"},
     "ray start --head  --resources='{\"custom_resource\":2,\"TPU\":4}' "),
    (True, {"resources": "{"}, {"aws.amazon.com/neuroncore": "4"}, "ray start --head  --resources={ "),
    (True, {"include-log-monitor": "false"}, {}, "ray start --head  --include-log-monitor=false "),
    (True, {"include-log-monitor": "true"}, {}, "ray start --head  --include-log-monitor=true "),
])
def test_ray_start_command_is_kuberays(head, params, limits, expected):
    assert generate_ray_start_command(head, dict(params), {"limits": limits}) == expected


def test_ray_start_of_the_rendered_tiny_pods():
    """What KubeRay runs in the tiny RayJob's pods: the head takes no CPU, a worker its CPU and memory limits."""
    files, release = set_files("tiny")
    job = by_key(helm_objects(user_values(files), release=release))[("RayJob", f"{release}-train")]
    spec = job["spec"]["rayClusterSpec"]

    def argv(group, head):
        params = set_missing_ray_start_params(dict(group.get("rayStartParams") or {}), head=head,
                                              address="dapo-tiny-train-head-svc.ml.svc.cluster.local:6379")
        container = group["template"]["spec"]["containers"][0]
        return shlex.split(generate_ray_start_command(head, params, container.get("resources") or {}))

    head = argv(spec["headGroupSpec"], True)
    assert "--num-cpus=0" in head and "--block" in head and "--dashboard-host=0.0.0.0" in head
    (group,) = spec["workerGroupSpecs"]
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    worker = argv(group, False)
    memory = int(parse_quantity(limits["memory"]))
    assert f"--num-cpus={int(parse_quantity(limits['cpu']))}" in worker and f"--memory={memory}" in worker, worker
    assert not any(a.startswith("--num-gpus") for a in worker), worker


def test_every_attempt_gets_a_new_job_id_unless_the_spec_pins_one():
    job = {"metadata": {"name": "dapo-tiny-train"}, "spec": {}}
    ids = {kuberay_job_id(job) for _ in range(20)}
    assert len(ids) > 1 and all(i.startswith("dapo-tiny-train-") and len(i) == len("dapo-tiny-train-") + 5
                                for i in ids)
    assert kuberay_job_id({"metadata": {"name": "a"}, "spec": {"jobId": "fixed"}}) == "fixed"


def test_convert_param_map_drops_false_switches():
    assert convert_param_map({"block": "true", "disable-usage-stats": "false", "num-cpus": "0"}) == \
        " --block  --num-cpus=0 "


def test_auth_token_is_kuberays_generated_secret_or_the_users():
    """RayClusterReconciler.reconcileAuthSecret / createAuthSecret and common/pod.go SetContainerTokenAuthEnvVars:
    no token without authOptions.mode token; base64 of 32 random bytes, a new one per cluster; the user's Secret as
    is (a missing one keeps the pods from starting); RAY_AUTH_MODE / RAY_AUTH_TOKEN only where the container does not
    set them."""
    import base64

    job = _template_rayjob()
    assert kuberay_auth_token(job) is None and auth_env(None) == {}
    job["spec"]["rayClusterSpec"]["authOptions"] = {"mode": "disabled"}
    assert kuberay_auth_token(job) is None
    job["spec"]["rayClusterSpec"]["authOptions"] = {"mode": "token"}
    a, b = kuberay_auth_token(job), kuberay_auth_token(job)
    assert len(base64.b64decode(a, validate=True)) == 32 and a != b
    assert auth_env(a) == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": a}
    assert auth_env(a, {"RAY_AUTH_MODE"}) == {"RAY_AUTH_TOKEN": a}
    job["spec"]["rayClusterSpec"]["authOptions"]["secretName"] = "ray-token"
    assert kuberay_auth_token(job, {"ray-token": "s3cret"}) == "s3cret"
    with pytest.raises(KeyError, match="ray-token"):
        kuberay_auth_token(job, {})


def test_the_rendered_rayjobs_turn_token_auth_on_for_the_loopback():
    files, release = set_files("tiny")
    job = by_key(helm_objects(user_values(files), release=release))[("RayJob", f"{release}-train")]
    assert kuberay_auth_token(job)


def test_the_ports_tests_give_servers_are_below_the_ephemeral_range_free_and_never_given_twice():
    first, second = free_ports(2), free_ports(40)
    start = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if start > 20000:  # an outgoing connection never takes one of these
        assert all(20000 <= p < start for p in first + second)
    assert len(set(first + second)) == 42
    for port in first + second:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))

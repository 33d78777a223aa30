"""The follower's backstop for a frozen driver, and the Ray pods' evidence hook, on the KubeRay-shaped Ray cluster on
loopback (tests/kuberay_loopback.py), where what Ray does decides the outcome: the rendered tiny RayJob's cluster
(head, two CPU workers, the driver on a worker), its entrypoint a driver that speaks the attempt protocol
(tests/attempt_driver.py), frozen with SIGSTOP; the follower -- the rendered follower Job's own command line --
against the stand-in API serving the RayJob and the loopback's pods; the "kubelet" runs a deleted pod's rendered
preStop hook, then kills the pod. The Ray job must end FAILED (KubeRay retries it), not STOPPED (KubeRay would call
the RayJob Complete and retry nothing), and the pod's Ray logs must be on the run's volume."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from api_standin import StandInApi
from conftest import ROOT
from kuberay_loopback import VENV_BIN, LoopbackRayCluster, kuberay_job_id, stop_marked_processes
from test_rehearsal import _render
from dapo.cluster.follow import build_parser as follow_parser
from dapo.train import attempts

pytestmark = pytest.mark.slow
DRIVER = Path(__file__).with_name("attempt_driver.py")


def _pods_as_the_api_serves_them(cluster, rayjob, name: str) -> list[dict]:
    spec = rayjob["spec"]["rayClusterSpec"]
    out = []
    for pod in cluster.pods:
        template = spec["headGroupSpec"] if pod.head else spec["workerGroupSpecs"][0]
        labels = {**template["template"]["metadata"]["labels"], "ray.io/cluster": name}
        out.append({"kind": "Pod", "metadata": {"name": pod.name, "labels": labels},
                    "spec": {"nodeName": f"node-{pod.name}"}, "status": {"phase": "Running", "podIP": "127.0.0.1"}})
    return out


def _kubelet(cluster, log: list[str]):
    """A DELETE of a pod: its preStop hook as rendered (the copy to the run's volume; the loopback's private Ray
    temp dir for /tmp/ray, never `ray stop`, which is machine-wide), then every process of the pod killed."""
    def delete(path: str) -> None:
        name = path.rsplit("/", 1)[-1]
        pods = [p for p in cluster.pods if p.name == name]
        if "/pods/" not in path or not pods:
            return
        pod = pods[0]

        def run():
            container = pod.group["template"]["spec"]["containers"][0]
            script = container["lifecycle"]["preStop"]["exec"]["command"][2]
            copy, stop = script.split("; ")
            assert stop == "ray stop"
            argv = shlex.split(copy) + ["--ray-logs", str(pod.temp_dir / "session_latest" / "logs")]
            r = subprocess.run(argv, env={**pod.env, "DAPO_POD_NAME": name}, capture_output=True, text=True,
                               timeout=60)
            log.append(r.stderr)
            pod.lose()
        threading.Thread(target=run, daemon=True).start()
    return delete


def test_a_frozen_driver_is_ended_through_its_pod_whose_logs_are_kept_and_the_ray_job_fails():
    if shutil.which("ray", path=str(VENV_BIN)) is None:
        pytest.skip("the ray CLI is not installed next to this Python")
    root = Path(tempfile.mkdtemp(prefix="dapo-kl-", dir="/tmp"))  # short: AF_UNIX socket paths <= 107 bytes
    cluster = follower = api = None
    try:
        rayjob, _, follower_job, shared, _ = _render(root)
        follow = follower_job["spec"]["template"]["spec"]["initContainers"][0]
        args = follow_parser().parse_args(follow["args"])
        assert args.heartbeat_timeout > 0, "the chart's follower has the backstop on"
        log_dir = args.log_dir
        run_dir = log_dir.parent
        assert run_dir.is_relative_to(shared)
        rayjob["spec"]["entrypoint"] = f"{sys.executable} {DRIVER} --log-dir {log_dir} --hang"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "HF_TOKEN", "WANDB_", "DAPO_"))}
        env.update({"HOME": str(root / "home"), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                    "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)})
        (root / "home").mkdir()
        cluster = LoopbackRayCluster(rayjob, root, env)
        client = cluster.client()
        job_id = kuberay_job_id(rayjob)
        cluster.submit(job_id)

        deadline = time.monotonic() + 120
        while not (progress := attempts.read_progress(run_dir)):
            assert time.monotonic() < deadline, client.get_job_logs(job_id)[-2000:]
            time.sleep(0.2)
        driver_node = client.get_job_info(job_id).driver_node_id
        driver_pod = cluster.pod_of(driver_node)
        assert not driver_pod.head and progress["pod"] == driver_pod.name  # the downward API's metadata.name
        os.kill(progress["pid"], signal.SIGSTOP)  # frozen: no heartbeat, no end record, no exit

        api = StandInApi()
        live = {**rayjob, "metadata": {**rayjob["metadata"], "uid": "loop-uid", "resourceVersion": "1",
                                       "creationTimestamp": (datetime.now(timezone.utc) - timedelta(minutes=5))
                                       .strftime("%Y-%m-%dT%H:%M:%SZ")},
                "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "failed": 0,
                           "rayClusterName": "loop"}}
        api.put(live, "ml")
        api.replace("Pod", _pods_as_the_api_serves_them(cluster, rayjob, "loop"), "ml")
        hooks: list[str] = []
        api.on_delete.append(_kubelet(cluster, hooks))
        argv = ["python", "-m", "dapo.cluster.follow", *follow["args"], "--api-server", api.url, "--namespace", "ml",
                "--state-dir", str(root / "state"), "--heartbeat-timeout", "3", "--poll", "0.2",
                "--status-every", "0.5", "--waits-every", "0.5"]
        follower = subprocess.Popen([sys.executable if a == "python" else a for a in argv], env=env,
                                    stdout=open(root / "follower.out", "w"), stderr=open(root / "follower.err", "w"),
                                    start_new_session=True)

        deadline = time.monotonic() + 120
        while (status := client.get_job_status(job_id).value) not in ("FAILED", "STOPPED", "SUCCEEDED"):
            assert time.monotonic() < deadline, (root / "follower.err").read_text()[-3000:]
            time.sleep(0.5)
        err = (root / "follower.err").read_text()
        assert status == "FAILED", client.get_job_info(job_id).message  # KubeRay retries a FAILED job
        assert f"/api/v1/namespaces/ml/pods/{driver_pod.name}?propagationPolicy=Background" in api.deleted, err
        end = attempts.read_end(log_dir, 1)
        assert end["cause"] == "stalled" and end["by"] == "follower", end
        copied = attempts.evidence_dir(run_dir, 1) / driver_pod.name
        deadline = time.monotonic() + 30
        while not (copied / "COPIED.json").exists():
            assert time.monotonic() < deadline, hooks
            time.sleep(0.2)
        assert (copied / "raylet.out").is_file() and any(copied.glob("job-driver-*.log")), sorted(copied.iterdir())
        assert "dapo evidence: attempt 1:" in hooks[0], hooks
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
        if cluster is not None:
            cluster.close()
        if api is not None:
            api.close()
        stop_marked_processes(str(root))

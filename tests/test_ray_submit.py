"""The submission path for real: the rendered training RayJob's entrypoint and runtime env, taken from the Helm
output, submitted to a Ray head on loopback the way KubeRay's K8sJobMode submitter does it, runs the tiny preset
to SUCCEEDED; a retried submitter does not submit it twice; and a driver that calls ray.init(runtime_env=...) like
the verl backend does merges with the rendered job env.

What stands in for Kubernetes: the ConfigMap is written where the kubelet would mount it, and the shared volume's
mount point is a temporary directory (values storage.mountPath / train.presetDir / WANDB_DIR point there). The
entrypoint, the runtime env and the submit script are otherwise exactly what the cluster runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import free_ports
from k8s_support import by_key, helm_objects, set_files, user_values
from kuberay_loopback import TERMINAL, VENV_BIN, kuberay_submit_args, stop_marked_processes

pytestmark = pytest.mark.slow


DRIVER = """\
import os
import ray
from dapo.config import load_preset

preset = load_preset("full")
env_vars = {**preset.placement.env, "VERL_USE_EXTERNAL_MODULES": "dapo.backends.verl.loss"}
ray.init(runtime_env={"env_vars": env_vars})


@ray.remote(num_cpus=0)
def probe():
    return {k: os.environ.get(k) for k in env_vars}


assert ray.get(probe.remote()) == env_vars, ray.get(probe.remote())
print("worker env ok")
"""


def _stop_own_processes(head: subprocess.Popen, marker: str) -> None:
    """Stop only what this test started: the `ray start --block` session, then any process whose command line
    names this test's private temp dir (job drivers run in their own session). Never `ray stop`, which would end
    every Ray process on a shared machine."""
    if head.poll() is None:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=5)
        except subprocess.TimeoutExpired:  # `ray start --block` is slow to notice; this cluster is private
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=10)
    stop_marked_processes(marker)


def test_rendered_tiny_rayjob_runs_to_succeeded_through_ray_job_submit():
    if shutil.which("ray", path=str(VENV_BIN)) is None:
        pytest.skip("the ray CLI is not installed next to this Python")
    root = Path(tempfile.mkdtemp(prefix="dapo-rj-", dir="/tmp"))  # short: Ray's unix socket paths are limited
    marker = str(root)
    shared = root / "shared"
    presets_dir = root / "etc" / "dapo" / "presets"
    files, release = set_files("tiny")
    base = user_values(files)
    values = user_values(files, {
        "storage": {"mountPath": str(shared), "hfHome": f"{shared}/hf"},
        "dataPrep": {"outDir": f"{shared}/data"},
        "train": {"presetDir": str(presets_dir), "runtimeEnv": {"WANDB_DIR": f"{shared}/wandb"}},
        "overrides": base["overrides"] + [
            f"recipe.trainer.default_local_dir={shared}/checkpoints/tiny",
            "recipe.trainer.total_training_steps=1",
            "local.warm_start.steps=5",
            "local.task.n_val=32",
            # 5 warm-start steps leave every group all-wrong: dynamic sampling would (rightly) give up
            "recipe.filter_groups.enable=false",
            "recipe.data.gen_batch_size=16",
        ],
    })
    objects = by_key(helm_objects(values, release=release))
    job = objects[("RayJob", f"{release}-train")]
    configmap = objects[("ConfigMap", f"{release}-preset")]
    presets_dir.mkdir(parents=True)
    for key, text in configmap["data"].items():  # what the kubelet mounts at train.presetDir
        (presets_dir / key).write_text(text)
    (shared / "wandb").mkdir(parents=True)
    entrypoint = job["spec"]["entrypoint"]
    runtime_env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])
    assert set(runtime_env) == {"env_vars"}  # env only: the code is in the image
    # the head container's plain env (secrets are optional here: the tiny values allow a missing wandb key)
    (head,) = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"]
    pod_env = {e["name"]: e["value"] for e in head["env"] if "value" in e}

    gcs, dashboard, agent, client_port = free_ports(4)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "HF_TOKEN", "WANDB_"))}
    env.update(pod_env)
    env.update({"HOME": str(root / "home"), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"})
    (root / "home").mkdir()
    address = f"http://127.0.0.1:{dashboard}"
    head_proc = subprocess.Popen(
        ["ray", "start", "--head", "--block", "--num-cpus", "2", "--dashboard-host", "127.0.0.1",
         "--port", str(gcs), "--dashboard-port", str(dashboard), "--dashboard-agent-listen-port", str(agent),
         "--ray-client-server-port", str(client_port), "--temp-dir", str(root / "ray"), "--disable-usage-stats"],
        env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True,
    )
    t0 = time.monotonic()

    def phase(msg):
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", file=sys.stderr)

    try:
        from ray.job_submission import JobStatus, JobSubmissionClient

        client = None
        deadline = time.monotonic() + 90
        while client is None:
            if head_proc.poll() is not None:
                pytest.fail(f"ray start exited early:\n{head_proc.stdout.read()}")
            try:
                client = JobSubmissionClient(address)
                client.list_jobs()
            except Exception:  # dashboard not up yet
                client = None
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

        phase("dashboard up")
        job_id = "dapo-tiny-train-test"
        # KubeRay v1.7's K8sJobMode submitter command (common.BuildJobSubmitCommand) for this RayJob
        script = " ".join(kuberay_submit_args(job, job_id, address, mode="K8sJobMode"))
        first = subprocess.run(["bash", "-c", script], env=env, cwd=root, capture_output=True, text=True,
                               timeout=300)
        deadline = time.monotonic() + 300
        while (status := client.get_job_status(job_id)) not in {JobStatus(s) for s in TERMINAL}:
            assert time.monotonic() < deadline, "the tiny run did not finish in 300 s"
            time.sleep(2)
        phase(f"job {status}")
        logs = client.get_job_logs(job_id)
        assert status == JobStatus.SUCCEEDED, f"{status}\n--- submitter ---\n{first.stdout}{first.stderr}\n" \
                                              f"--- job logs ---\n{logs[-6000:]}"
        info = client.get_job_info(job_id)
        assert info.entrypoint == entrypoint
        assert info.runtime_env["env_vars"] == runtime_env["env_vars"]
        assert any((shared / "checkpoints" / "tiny").iterdir()), "no checkpoint on the shared volume"

        # a retried submitter pod (K8sJobMode backoff) re-attaches instead of submitting a second run
        again = subprocess.run(["bash", "-c", script], env=env, cwd=root, capture_output=True, text=True,
                               timeout=120)
        assert again.returncode == 0, again.stderr
        assert [j.submission_id for j in client.list_jobs()] == [job_id]
        phase("resubmission checked")

        # The verl backend's driver calls ray.init(runtime_env=<preset env + its loss module>) inside the job; with
        # the full preset's rendered job env (same keys) Ray 2.60 merges only because the chart sets
        # RAY_OVERRIDE_JOB_RUNTIME_ENV=1 there. A driver doing the same merge must reach its workers' env.
        full_files, full_release = set_files("full")
        full_job = by_key(helm_objects(user_values(full_files), release=full_release))[("RayJob", "dapo-train")]
        driver = root / "driver.py"
        driver.write_text(DRIVER)
        merge_id = "dapo-runtime-env-merge"
        merge_job = {"spec": {"entrypoint": f"python {driver}", "runtimeEnvYAML": full_job["spec"]["runtimeEnvYAML"]}}
        subprocess.run(["bash", "-c", " ".join(kuberay_submit_args(merge_job, merge_id, address, mode="K8sJobMode"))],
                       env=env, cwd=root, capture_output=True, text=True, timeout=180)
        status = client.get_job_status(merge_id)
        assert status == JobStatus.SUCCEEDED, client.get_job_logs(merge_id)[-4000:]
        assert "worker env ok" in client.get_job_logs(merge_id)
        phase("driver ray.init merge checked")
    finally:
        _stop_own_processes(head_proc, marker)
        phase("stopped")
        shutil.rmtree(root, ignore_errors=True)

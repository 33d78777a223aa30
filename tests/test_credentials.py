"""No stray credentials in a run, on the rendered objects of every preset, values file and ci values file, as Helm
renders them:

- no pod that does not call the Kubernetes API mounts a service-account token: the Ray heads and workers of both
  RayJobs, the K8sJobMode submitter, the preflight and the helm test pods (the log follower, which reads its RayJob's
  status, keeps one);
- each secret reaches only the containers whose process reads it, and the Hugging Face token as a file: the data
  preparation and the model download read the hub; the training workers read it only when the run downloads its model
  itself; wandb's key goes to the training workers, where the driver runs, and to the evaluation head only when the
  evaluation logs to wandb;
- huggingface_hub itself finds the token at the path the pods get.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from k8s_support import RWX, chart_objects, helm_objects, objects_by_key, pod_templates, rendered_pods, value_sets

SETS = value_sets()
HF_DIR = "/var/run/secrets/dapo/hf"


def _containers(spec):
    return spec.get("initContainers", []) + spec.get("containers", [])


def _secret_keys(container, spec) -> set[str]:
    """The Secret keys a container can read: secretKeyRef variables and mounted secret volumes."""
    keys = {e["valueFrom"]["secretKeyRef"]["key"] for e in container.get("env", [])
            if "secretKeyRef" in (e.get("valueFrom") or {})}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for m in container.get("volumeMounts", []):
        secret = volumes.get(m["name"], {}).get("secret")
        if secret:
            keys |= {item["key"] for item in secret.get("items") or [{"key": "<every key>"}]}
    return keys


def secret_holders(objects) -> dict[str, set[str]]:
    """{secret key: {"<RayJob or Job> <role> <container>"}} over every pod template of the objects."""
    out: dict[str, set[str]] = {}
    for obj in objects:
        if obj["kind"] == "RayJob":
            templates = [(f"{obj['metadata']['name']} {role}", t) for role, t in pod_templates(obj)]
        elif obj["kind"] == "Job":
            templates = [(obj["metadata"]["name"], obj["spec"]["template"])]
        elif obj["kind"] == "Pod":
            templates = [(obj["metadata"]["name"], obj)]
        else:
            continue
        for what, t in templates:
            for c in _containers(t["spec"]):
                for key in _secret_keys(c, t["spec"]):
                    out.setdefault(key, set()).add(f"{what} {c['name']}")
    return out


@pytest.mark.parametrize("case", SETS, ids=[s[0] for s in SETS])
def test_no_pod_but_the_log_follower_mounts_a_service_account_token(case):
    _, values, release = case
    pods = rendered_pods(values, release)
    with_token = sorted(what for what, t in pods if t["spec"].get("automountServiceAccountToken") is not False)
    followers = sorted(what for what, _ in pods if what.startswith("Job ") and what.endswith("-logs"))
    assert with_token == followers, "only the follower calls the API server"
    assert any(w.startswith("RayJob") for w, _ in pods)


def test_the_submitter_mounts_no_token_and_a_job_that_needs_the_api_can_have_one():
    values = {**RWX, "train": {"submissionMode": "K8sJobMode"}, "eval": {"enabled": True,
                                                                          "submissionMode": "K8sJobMode"}}
    p = objects_by_key(values)
    jobs = [o for o in p.values() if o["kind"] == "RayJob"]
    for job in jobs:
        roles = dict(pod_templates(job))
        assert "submitter" in roles and len(roles) == 3
        assert all(t["spec"]["automountServiceAccountToken"] is False for t in roles.values()), job["metadata"]
    p = objects_by_key({**values, "automountServiceAccountToken": True})
    for job in [o for o in p.values() if o["kind"] == "RayJob"]:
        assert all(t["spec"]["automountServiceAccountToken"] is True for _, t in pod_templates(job))


def _expected(values, release, model_from_hub: bool) -> dict[str, set[str]]:
    """Who reads what, from the code: dapo data prepare and `hf download` (init containers of both heads) read the
    hub; the training driver (our loop or the reference recipe's TaskRunner, on a worker: entrypointNumCpus 1, head
    num-cpus 0) and verl's workers load the model from the hub unless the model download fetched it (then
    HF_HUB_OFFLINE=1); the driver logs to wandb (dapo.train.metrics, verl's Tracking); the evaluation's driver on its
    head reads only the exported checkpoint and logs to wandb only with --wandb-project."""
    objects = chart_objects([], release=release, extra=values)
    jobs = {o["metadata"]["name"].rsplit("-", 1)[1]: o for o in objects if o["kind"] == "RayJob"}
    hf, wandb = set(), set()
    for kind, job in jobs.items():
        name = job["metadata"]["name"]
        head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        hf |= {f"{name} head {c['name']}" for c in head.get("initContainers", [])
               if c["name"] in ("data-prepare", "model-fetch")}
        workers = [f"{name} worker:{g['groupName']} ray-worker" for g in
                   job["spec"]["rayClusterSpec"].get("workerGroupSpecs", [])]
        if kind == "train":
            wandb |= set(workers)
            env = {e["name"]: e.get("value") for e in job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0][
                "template"]["spec"]["containers"][0]["env"]}
            if model_from_hub and env.get("HF_HUB_OFFLINE") != "1":
                hf |= set(workers)
        elif "--wandb-project" in values.get("eval", {}).get("extraArgs", []):
            wandb.add(f"{name} head ray-head")
    return {k: v for k, v in {"HF_TOKEN": hf, "WANDB_API_KEY": wandb}.items() if v}


@pytest.mark.parametrize("values, model_from_hub", [
    ({"preset": "full"}, True),  # the model download fetches Qwen2.5-32B: the workers run offline
    ({"preset": "full", "dataPrep": {"fetchModel": False}}, True),  # the workers download it
    ({"preset": "full", "dataPrep": {"enabled": False}}, True),
    ({"preset": "tiny"}, False),  # a built-in model: nothing reads the hub at run time
    ({"preset": "full", "eval": {"enabled": True}}, True),
    ({"preset": "full", "eval": {"enabled": True, "extraArgs": ["--wandb-project", "dapo-eval"]}}, True),
    ({"preset": "smoke", "train": {"runner": "reference"}, "rayAuth": {"enabled": False},
      "dataPrep": {"fetchModel": False}}, True),
])
def test_each_secret_reaches_only_the_containers_that_read_it(values, model_from_hub):
    values = {**RWX, **values}
    p = objects_by_key(values)
    objects = list(p.values())
    want = _expected(values, "dapo", model_from_hub)
    assert secret_holders(objects) == want
    # no token is an environment variable but wandb's (wandb reads WANDB_API_KEY or a netrc file, nothing else)
    for obj in objects:
        for _, t in (pod_templates(obj) if obj["kind"] == "RayJob" else []):
            for c in _containers(t["spec"]):
                env = {e["name"]: e for e in c.get("env", [])}
                assert "HF_TOKEN" not in env and "HUGGING_FACE_HUB_TOKEN" not in env, c["name"]
                if "HF_TOKEN_PATH" in env:  # the path points into the mounted Secret
                    mount = [m for m in c["volumeMounts"] if m["name"] == "hf-token"]
                    assert mount == [{"name": "hf-token", "mountPath": HF_DIR, "readOnly": True}], c["name"]
                    assert env["HF_TOKEN_PATH"]["value"] == f"{HF_DIR}/token"
                    volume, = [v for v in t["spec"]["volumes"] if v["name"] == "hf-token"]
                    assert volume["secret"]["items"] == [{"key": "HF_TOKEN", "path": "token"}]
                    assert volume["secret"]["optional"] is True  # secret.hfTokenOptional


@pytest.mark.parametrize("case", SETS, ids=[s[0] for s in SETS])
def test_no_eval_pod_and_no_head_container_holds_the_wandb_key(case):
    _, values, release = case
    holders = secret_holders(helm_objects(values, release=release)).get("WANDB_API_KEY", set())
    assert not [h for h in holders if "-eval " in h or " head " in h], holders
    assert all(h.endswith(" ray-worker") for h in holders), holders


def test_huggingface_hub_reads_the_token_from_the_file_the_pods_get(tmp_path):
    """The mounted Secret as the kubelet lays it out (one file named after the item's path), the container's
    environment as rendered (HF_TOKEN_PATH re-rooted under tmp_path, no HF_TOKEN): huggingface_hub finds the token,
    and so do `hf download` and dapo data prepare (both leave the token to huggingface_hub)."""
    objects = chart_objects([], extra={**RWX, "preset": "full"})
    job, = [o for o in objects if o["kind"] == "RayJob"]
    init = {c["name"]: c for c in job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["initContainers"]}
    env = {e["name"]: e["value"] for e in init["model-fetch"]["env"] if "value" in e}
    token = "hf_" + "k" * 34
    secret_file = tmp_path / env["HF_TOKEN_PATH"].lstrip("/")
    secret_file.parent.mkdir(parents=True)
    secret_file.write_text(token)
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    child_env.update(HF_TOKEN_PATH=str(secret_file), HF_HOME=str(tmp_path / "hf-home"))
    code = "import huggingface_hub, json; print(json.dumps(huggingface_hub.get_token()))"
    out = subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == token
    child_env["HF_TOKEN_PATH"] = str(tmp_path / "nowhere")  # without the file: no token, not the environment's
    out = subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) is None

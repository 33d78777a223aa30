"""Every rendered object is valid for the cluster: built-in kinds (and the pod templates inside the RayJobs) against
Kubernetes 1.30 strictly, ray.io kinds against the KubeRay v1.7.0 CRD schemas (strict: a field the API server would
prune is an error) plus the controller rules the schemas do not encode. And the operational defaults hold for every
Ray pod: memory-backed /dev/shm, the shared volume, tokens only through secretKeyRef, a GPU-free head."""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from dapo.config import load_preset
from dapo.k8s import rules
from dapo.k8s.presets import merged_preset
from dapo.config import split_overrides
from dapo.train.cli import build_parser
from k8s_support import (
    CHART_DIR,
    by_key,
    helm_notes,
    helm_objects,
    helm_render,
    pod_templates,
    chart_objects,
    ray_pod_templates,
    render_script,
    set_files,
    user_values,
)

SETS = sorted(render_script().RENDER_SETS)
CI_VALUES = sorted((CHART_DIR / "ci").glob("*.yaml"))


CASES = [("set", n) for n in SETS] + [("ci", p) for p in CI_VALUES]
CASE_IDS = SETS + [f"ci/{p.stem}" for p in CI_VALUES]


@functools.lru_cache(maxsize=None)
def rendering(index: int):
    """(name, objects) of one values set: a broken preset fails only its own cases."""
    kind, item = CASES[index]
    if kind == "set":
        files, release = set_files(item)
        return item, chart_objects(files, release=release, namespace="ml")
    return f"ci/{item.stem}", helm_objects(yaml.safe_load(item.read_text()) or {})


def renderings():
    return [rendering(i) for i in range(len(CASES))]


def _strict(schema):
    """What the API server prunes becomes an error: objects with properties get additionalProperties: false."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.lru_cache(maxsize=None)
def crd_validator(crd_path: str, version: str = "v1"):
    crd = yaml.load(Path(crd_path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (ver,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return jsonschema.Draft202012Validator(_strict(ver["schema"]["openAPIV3Schema"]))


def _errors(validator, obj):
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]


@pytest.mark.parametrize("index", range(len(CASES)), ids=CASE_IDS)
def test_builtin_kinds_and_pod_templates_are_valid_kubernetes_1_30(index):
    name, objects = rendering(index)
    for obj in objects:
        if obj["apiVersion"] == "ray.io/v1":
            for role, template in pod_templates(obj):
                wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{name}-{role}"},
                           "template": template}
                kubernetes_validate.validate(wrapped, "1.30", strict=True)
        else:
            kubernetes_validate.validate(obj, "1.30", strict=True)


@pytest.mark.parametrize("index", range(len(CASES)), ids=CASE_IDS)
def test_rayjobs_match_the_kuberay_v1_7_crd_and_controller_rules(index, crd_dir):
    validator = crd_validator(str(crd_dir / "ray.io_rayjobs.yaml"))
    name, objects = rendering(index)
    jobs = [o for o in objects if o["kind"] == "RayJob"]
    assert jobs
    for job in jobs:
        assert _errors(validator, job) == [], name
        assert rules.problems(job) == [], name


def test_strict_crd_schema_catches_a_misspelled_field(crd_dir):
    validator = crd_validator(str(crd_dir / "ray.io_rayjobs.yaml"))
    job = copy.deepcopy(by_key(chart_objects(set_files("full")[0]))[("RayJob", "dapo-train")])
    job["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParam"] = {"num-gpus": "0"}
    job["spec"]["preRunningDeadlineSecond"] = 3600
    errors = _errors(validator, job)
    assert any("rayStartParam'" in e for e in errors) and any("preRunningDeadlineSecond'" in e for e in errors)


@pytest.mark.parametrize(
    "mutate, problem",
    [
        (lambda j: j["metadata"].update(name="x" * 48), "longer than 47"),
        (lambda j: j["metadata"].update(name="7b-train"), "DNS-1035"),
        (lambda j: j["spec"].update(submissionMode="K8sJob"), "spec.submissionMode"),
        (lambda j: j["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].update(minReplicas=17), "minReplicas 17 >"),
        (lambda j: j["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].update(replicas=20), "replicas: 20"),
        (lambda j: j["spec"].update(deletionStrategy={"deletionRules": [
            {"policy": "DeleteCluster", "condition": {"jobStatus": "FAILED"}}]}), "mutually exclusive"),
        (lambda j: j["spec"].update(submissionMode="SidecarMode", submitterConfig={"backoffLimit": 2}),
         "not supported in SidecarMode"),
        (lambda j: j["spec"].update(shutdownAfterJobFinishes=False), "requires shutdownAfterJobFinishes"),
        (lambda j: j["spec"].update(runtimeEnvYAML="env_vars: [unclosed"), "runtimeEnvYAML"),
        (lambda j: j["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"].update(labels="a=b"),
         "rayStartParams.labels"),
    ],
)
def test_controller_rules_catch_what_the_crd_schema_accepts(crd_dir, mutate, problem):
    validator = crd_validator(str(crd_dir / "ray.io_rayjobs.yaml"))
    job = copy.deepcopy(by_key(chart_objects(set_files("full")[0]))[("RayJob", "dapo-train")])
    mutate(job)
    assert _errors(validator, job) == []  # the schema alone lets it through
    assert any(problem in p for p in rules.problems(job)), rules.problems(job)


@pytest.mark.parametrize("name", SETS)
def test_every_ray_pod_has_shm_the_shared_volume_and_secrets_only_by_reference(name):
    files, release = set_files(name)
    values = user_values(files)
    for job in (o for o in chart_objects(files, release=release) if o["kind"] == "RayJob"):
        for role, template in ray_pod_templates(job):
            spec = template["spec"]
            (container,) = [c for c in spec["containers"] if c["name"].startswith("ray-")]
            volumes = {v["name"]: v for v in spec["volumes"]}
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            shm = volumes[mounts["/dev/shm"]]["emptyDir"]
            assert shm["medium"] == "Memory" and shm["sizeLimit"] not in ("", "64Mi"), role
            claim = volumes[mounts["/shared"]]["persistentVolumeClaim"]["claimName"]
            assert claim == (values.get("storage", {}).get("existingClaim") or f"{release}-shared")
            env = {e["name"]: e for e in container["env"]}
            assert len(env) == len(container["env"]), (role, "a variable set twice")
            for token in ("HF_TOKEN", "WANDB_API_KEY"):  # who gets which: tests/test_credentials.py
                if token in env:
                    assert set(env[token]) == {"name", "valueFrom"}, (role, token)
                    assert env[token]["valueFrom"]["secretKeyRef"]["name"] == "dapo-secrets"
            assert env["RAY_memory_monitor_refresh_ms"]["value"] == "0"
            assert env["HF_HOME"]["value"].startswith("/shared/")
            assert env["NCCL_SOCKET_IFNAME"]["value"] == values.get("nccl", {}).get("NCCL_SOCKET_IFNAME", "eth0")
            # a pod being deleted stops Ray last (the training pods first copy their logs: tests/test_chart_retries.py)
            assert container["lifecycle"]["preStop"]["exec"]["command"][-1].split("; ")[-1] == "ray stop"
            for name, field in (("DAPO_NODE_NAME", "spec.nodeName"), ("DAPO_POD_NAME", "metadata.name")):
                assert env[name]["valueFrom"] == {"fieldRef": {"fieldPath": field}}, (role, name)


@pytest.mark.parametrize("name", SETS)
def test_head_holds_no_gpu_and_workers_match_the_preset_placement(name):
    files, release = set_files(name)
    values = user_values(files)
    placement = merged_preset(values.get("preset", "full"))["placement"]
    for job in (o for o in chart_objects(files, release=release) if o["kind"] == "RayJob"):
        cluster = job["spec"]["rayClusterSpec"]
        head = cluster["headGroupSpec"]
        assert head["rayStartParams"]["num-gpus"] == "0"
        (head_container,) = head["template"]["spec"]["containers"]
        for section in ("requests", "limits"):
            assert "nvidia.com/gpu" not in head_container["resources"].get(section, {})
        assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in head_container["env"]
        groups = cluster.get("workerGroupSpecs", [])
        if job["metadata"]["name"].endswith("-eval"):
            nodes, gpus = values["eval"]["nodes"], placement["gpus_per_node"]
        else:  # the values' nodes (values/smoke-2node.yaml) or the preset's
            nodes, gpus = values.get("nodes") or placement["nodes"], placement["gpus_per_node"]
        (group,) = groups
        assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == nodes
        worker = group["template"]["spec"]["containers"][0]  # then the values' sidecars (a GKE fabric daemon)
        sidecars = values.get("worker", {}).get("sidecarContainers", [])
        assert [c["name"] for c in group["template"]["spec"]["containers"][1:]] == [
            c["name"] for c in sidecars if c.get("restartPolicy") != "Always"]
        # native sidecars (restartPolicy Always) are init containers: started before the Ray container
        assert [c["name"] for c in group["template"]["spec"].get("initContainers", [])] == [
            c["name"] for c in sidecars if c.get("restartPolicy") == "Always"]
        if placement["backend"] == "local" and not job["metadata"]["name"].endswith("-eval"):
            # CPU workers: the local backend's loop runs in one of them (the driver, entrypointNumCpus)
            assert "nvidia.com/gpu" not in worker["resources"]["limits"]
            assert job["spec"]["entrypointNumCpus"] == 1
            continue
        assert worker["resources"]["limits"]["nvidia.com/gpu"] == str(gpus)
        anti = group["template"]["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
        assert anti[0]["labelSelector"]["matchLabels"].items() <= group["template"]["metadata"]["labels"].items()


# (the reference runner's entrypoint is checked against the reference scripts in tests/test_reference.py)
@pytest.mark.parametrize("name", [n for n in SETS if n != "eval" and not n.startswith("reference-")])
def test_training_entrypoint_reads_the_recipe_from_the_mounted_configmap(name, tmp_path):
    """Write the ConfigMap where the kubelet would mount it; the entrypoint then loads exactly the package preset
    plus the placement of the worker group."""
    files, release = set_files(name)
    objects = by_key(chart_objects(files, release=release))
    cm = objects[("ConfigMap", f"{release}-preset")]
    job = objects[("RayJob", f"{release}-train")]
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    (mount,) = [m for m in head["containers"][0]["volumeMounts"] if m["name"] == "presets"]
    mounted = tmp_path / mount["mountPath"].lstrip("/")
    mounted.mkdir(parents=True)
    for key, text in cm["data"].items():
        (mounted / key).write_text(text)
    argv = job["spec"]["entrypoint"].split()
    assert argv[:3] == ["python", "-m", "dapo.train"]
    args = build_parser().parse_args(argv[3:])
    args.preset = str(tmp_path / args.preset.lstrip("/"))
    ours, verl = split_overrides(args.overrides)
    from_cm = load_preset(args.preset, ours)
    from_package = load_preset(Path(args.preset).stem, ours)
    assert from_cm.to_dict() == from_package.to_dict()
    groups = job["spec"]["rayClusterSpec"].get("workerGroupSpecs", [])
    if from_cm.placement.backend == "verl":
        assert from_cm.placement.nodes == groups[0]["replicas"]
        assert str(from_cm.placement.gpus_per_node) == groups[0]["template"]["spec"]["containers"][0]["resources"][
            "limits"]["nvidia.com/gpu"]


def test_no_secret_value_reaches_any_output(monkeypatch):
    """Tokens in the environment of whoever renders never appear in manifests, NOTES or rendered files."""
    sentinels = {"HF_TOKEN": "hf_SENTINEL_d41d8cd9", "WANDB_API_KEY": "wandb_SENTINEL_8f00b204"}
    for k, v in sentinels.items():
        monkeypatch.setenv(k, v)
    texts = []
    for name in SETS:
        files, release = set_files(name)
        values = user_values(files)
        texts += list(helm_render(values, release=release).values())
        texts.append(helm_notes(values, release=release))
        texts.append(render_script().to_yaml(render_script().render_set(name)))
    for path in (CHART_DIR.parent.parent / "k8s" / "rendered").glob("*.yaml"):
        texts.append(path.read_text())
    blob = "\n".join(texts)
    assert sentinels["HF_TOKEN"] not in blob and sentinels["WANDB_API_KEY"] not in blob
    # and every secret-looking variable in every container comes from a secretKeyRef
    for name, objects in renderings():
        for job in (o for o in objects if o["kind"] == "RayJob"):
            for role, template in pod_templates(job):
                for c in template["spec"].get("containers", []) + template["spec"].get("initContainers", []):
                    for e in c.get("env", []):
                        if e["name"] == "HF_TOKEN_PATH":  # a path into the mounted Secret, not a token
                            assert e["value"] == "/var/run/secrets/dapo/hf/token", (name, role, e)
                        elif any(w in e["name"] for w in ("TOKEN", "API_KEY", "PASSWORD", "SECRET")):
                            assert "value" not in e and "secretKeyRef" in e["valueFrom"], (name, role, e)
    assert os.environ["HF_TOKEN"] == sentinels["HF_TOKEN"]


def test_data_preparation_runs_before_the_head_with_the_shared_volume():
    files, release = set_files("full")
    job = by_key(chart_objects(files, release=release))[("RayJob", "dapo-train")]
    init, fetch = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["initContainers"]
    assert init["command"] == ["dapo", "data", "prepare", "--out", "/shared/data"]
    assert {"name": "shared", "mountPath": "/shared"} in init["volumeMounts"]
    # the model is fetched once into the shared Hugging Face cache, after the data
    assert fetch["name"] == "model-fetch" and fetch["command"] == ["hf", "download", "Qwen/Qwen2.5-32B"]
    assert {"name": "HF_HOME", "value": "/shared/hf"} in fetch["env"]
    preset = load_preset("full")
    for f in preset.recipe.data.train_files + preset.recipe.data.val_files:
        assert f.startswith("/shared/data/"), f
    # the eval release reads the training run's checkpoints and the AIME file from the same claim
    files, release = set_files("eval")
    ev = by_key(chart_objects(files, release=release))[("RayJob", "dapo-aime-eval")]["spec"]["entrypoint"].split()
    ckpt = ev[ev.index("--checkpoint-dir") + 1]
    assert ckpt == preset.recipe.trainer.default_local_dir.replace(
        "${trainer.project_name}", preset.recipe.trainer.project_name).replace(
        "${trainer.experiment_name}", preset.recipe.trainer.experiment_name)
    assert ev[ev.index("--test-file") + 1] == preset.recipe.data.val_files[0]


def test_submitter_keeps_kuberays_idempotent_submit_command():
    """No command in the submitter template: KubeRay's own script runs `ray job status` before `ray job submit`,
    so a retried submitter pod never starts a second training run."""
    for name, objects in renderings():
        for job in (o for o in objects if o["kind"] == "RayJob"):
            spec = job["spec"]
            if spec.get("submissionMode", "K8sJobMode") == "K8sJobMode":
                (c,) = spec["submitterPodTemplate"]["spec"]["containers"]
                assert "command" not in c and "args" not in c, name
                assert spec["submitterConfig"]["backoffLimit"] >= 0
                assert spec["submitterPodTemplate"]["spec"]["restartPolicy"] == "Never"

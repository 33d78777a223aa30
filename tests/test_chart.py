"""The Helm chart with real Helm (helm_python, the Helm SDK): it lints strictly and renders for every values file,
bad values are refused with a message that names the key -- by Helm and, with the same rule, by scripts/render.py."""

from __future__ import annotations

import re
import tarfile

import pytest
import yaml

from conftest import ROOT
from dapo.k8s import ValuesError, load_values, versions
from dapo.k8s.presets import runnable_presets
from k8s_support import (
    CHART_DIR,
    on_stand_in,
    VALUES_DIR,
    by_key,
    chart,
    helm,
    helm_notes,
    helm_objects,
    render_script,
    set_files,
    user_values,
)

CI_VALUES = sorted((CHART_DIR / "ci").glob("*.yaml"))
# a GPU preset needs a ReadWriteMany StorageClass by name (the chart refuses the cluster default)
RWX = {"storage": {"storageClassName": "rwx-class"}}


def _lint(values):
    report = helm().lint(str(CHART_DIR), values=values, strict=True, kube_version="v1.30.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    return report, problems


@pytest.mark.parametrize("name", sorted(render_script().RENDER_SETS))
def test_every_values_file_lints_strict_and_renders_its_preset(name):
    files, release = set_files(name)
    values = user_values(files)
    report, problems = _lint(values)
    assert problems == [], problems
    assert report["total_charts_linted"] == 1
    objects = by_key(helm_objects(values, release=release))
    kinds = sorted(k for k, _ in objects)
    follower = ["Job", "Role", "RoleBinding", "ServiceAccount"]  # every RayJob's log follower (logs.enabled)
    assert ("Job", f"{release}-{'eval' if name == 'eval' else 'train'}-logs") in objects
    if name == "eval":
        assert kinds == sorted(["NetworkPolicy", "RayJob"] + follower)
        return
    pdb = ["PodDisruptionBudget"] if values.get("disruption", {}).get("podDisruptionBudget") else []
    preflight = ["Job"] if name != "tiny" else []  # a GPU training run's preflight (tests/test_preflight_chart.py)
    # and, without a queue, its start guard and the guard's RBAC (tests/test_start_guard.py)
    guard = ["Job", "Role", "RoleBinding", "ServiceAccount"] if preflight and not values.get("queue") else []
    assert kinds == sorted(["ConfigMap", "NetworkPolicy", "PersistentVolumeClaim", "RayJob"] + pdb + follower
                           + preflight + guard)
    assert (("Job", f"{release}-preflight") in objects) == bool(preflight)
    assert (("Job", f"{release}-train-start") in objects) == bool(guard)
    job = objects[("RayJob", f"{release}-train")]
    if values.get("train", {}).get("runner") == "reference":  # the upstream recipe; see tests/test_reference.py
        assert " python3 -m recipe.dapo.src.main_dapo " in job["spec"]["entrypoint"]
        return
    assert f"/{values['preset']}.yaml" in job["spec"]["entrypoint"]


@pytest.mark.parametrize("path", CI_VALUES, ids=[p.stem for p in CI_VALUES])
def test_ci_values_lint_strict(path):
    _, problems = _lint(yaml.safe_load(path.read_text()) or {})
    assert problems == [], problems


@pytest.mark.parametrize(
    "values, where",
    [
        ({"nodez": 4}, "nodez"),
        ({"train": {"backoffLimit": "three"}}, "/train/backoffLimit"),
        ({"train": {"submissionMode": "InteractiveMode"}}, "/train/submissionMode"),
        ({"worker": {"shmsize": "1Gi"}}, "/worker"),
        ({"nodes": 0}, "/nodes"),
        ({"preset": "_dapo_qwen32b"}, "/preset"),
        ({"overrides": ["recipe.trainer.total_training_steps=$(reboot)"]}, "/overrides/0"),
        ({"overrides": ["recipe.x=a b"]}, "/overrides/0"),
        ({"nccl": {"NCCL_DEBUG": 3}}, "/nccl/NCCL_DEBUG"),
        ({"eval": {"step": "newest"}}, "/eval/step"),
        ({"queue": {"scheduler": "slurm"}}, "/queue/scheduler"),
        ({"head": {"rayStartParams": {"num-cpus": 0}}}, "/head/rayStartParams/num-cpus"),
    ],
)
def test_schema_rejects_bad_values_naming_the_key(values, where):
    with pytest.raises(helm().HelmValuesError, match=re.escape(where)):
        chart().render(values, name="dapo", namespace="ml")
    # dapo doctor and dapo plan read the values through Helm's schema check too
    with pytest.raises(ValuesError, match=re.escape(where)):
        load_values(CHART_DIR, [], [], values)


DELETE_OK = [{"policy": "DeleteCluster", "condition": {"jobStatus": "FAILED", "ttlSeconds": 60}}]

FAIL_CASES = [
    ({"train": {"enabled": False}}, "train.enabled:"),
    ({"fullnameOverride": "a" * 42}, "fullnameOverride:"),
    ({"preset": "nope"}, f'preset: unknown preset "nope"; available: {", ".join(runnable_presets())}'),
    ({"preset": "tiny", "gpusPerNode": 1}, "gpusPerNode:"),
    ({"head": {"rayStartParams": {"num-cpus": "2"}}}, "head.rayStartParams.num-cpus:"),
    ({"overrides": ["placement.nodes=4"]}, "overrides:"),
    ({"storage": {"size": "1Ti"}}, "storage.size: 1Ti is smaller than what preset full needs: "),
    ({"overrides": ["trainer.n_gpus_per_node=4"]}, "overrides:"),
    ({"train": {"shutdownAfterJobFinishes": False}}, "train.ttlSecondsAfterFinished:"),
    ({"train": {"deletionRules": DELETE_OK}}, "train.deletionRules:"),
    (
        {"train": {"shutdownAfterJobFinishes": False, "ttlSecondsAfterFinished": 0, "deletionRules": [
            {"policy": "DeleteCluster", "condition": {"jobStatus": "FAILED", "ttlSeconds": 60}},
            {"policy": "DeleteWorkers", "condition": {"jobStatus": "FAILED", "ttlSeconds": 600}},
        ]}},
        "train.deletionRules[0]:",
    ),
    (
        {"train": {"shutdownAfterJobFinishes": False, "ttlSecondsAfterFinished": 0,
                   "deletionRules": DELETE_OK + DELETE_OK}},
        "train.deletionRules[1]: duplicate",
    ),
    (
        {"train": {"shutdownAfterJobFinishes": False, "ttlSecondsAfterFinished": 0, "deletionRules": [
            {"policy": "DeleteCluster", "condition": {"ttlSeconds": 60}}]}},
        "train.deletionRules[0].condition:",
    ),
    (
        {"queue": {"scheduler": "kueue", "name": "q"},
         "train": {"shutdownAfterJobFinishes": False, "ttlSecondsAfterFinished": 0}},
        "queue.scheduler: kueue",
    ),
    ({"queue": {"scheduler": "kai", "name": "q"}, "train": {"submissionMode": "K8sJobMode"}}, "queue.scheduler: kai"),
    ({"queue": {"scheduler": "volcano"}}, "queue.name:"),
    ({"train": {"submissionMode": "SidecarMode"}, "head": {"restartPolicy": "Always"}}, "head.restartPolicy:"),
    ({"head": {"resources": {"limits": {"nvidia.com/gpu": 1}}}}, "head.resources.limits:"),
    ({"head": {"rayStartParams": {"num-gpus": "8"}}}, "head.rayStartParams.num-gpus:"),
    ({"worker": {"resources": {"requests": {"nvidia.com/gpu": 8}}}}, "worker.resources.requests:"),
    ({"worker": {"extraResources": {"memory": "1Ti"}}}, "worker.extraResources.memory:"),
    ({"env": {"HF_TOKEN": "hf_not_a_real_token"}}, "env.HF_TOKEN:"),
    ({"train": {"runtimeEnv": {"WANDB_API_KEY": "x"}}}, "train.runtimeEnv.WANDB_API_KEY:"),
    ({"nccl": {"HF_HOME": "/tmp"}}, "nccl.HF_HOME:"),
    ({"env": {"NCCL_DEBUG": "INFO"}}, "env.NCCL_DEBUG:"),
    ({"worker": {"labels": {"app.kubernetes.io/component": "x"}}}, "worker.labels.app.kubernetes.io/component:"),
    ({"hostNetwork": True, "worker": {"onePerHost": False}}, "worker.onePerHost:"),
    ({"dataPrep": {"outDir": "/data"}}, "dataPrep.outDir:"),
    ({"preset": "tiny", "eval": {"enabled": True}}, "eval.gpusPerNode:"),
    ({"preset": "tiny", "eval": {"enabled": True, "gpusPerNode": 8}}, "eval.testFile:"),
]


@pytest.mark.parametrize("values, key", FAIL_CASES, ids=[k for _, k in FAIL_CASES])
def test_cross_field_rule_fails_naming_the_key(values, key):
    with pytest.raises(helm().HelmRenderError, match=re.escape(key)):
        chart().render(values, name="dapo", namespace="ml")


def test_rayjob_name_limit_counts_the_suffix():
    # 41 characters of fullname + "-train" = 47: accepted; one more is refused (checked above)
    objects = by_key(helm_objects({"fullnameOverride": "a" * 41, **RWX}))
    assert ("RayJob", "a" * 41 + "-train") in objects


def test_helm_package_carries_the_presets_and_renders_the_same(tmp_path):
    archive = helm().package(str(CHART_DIR), destination=str(tmp_path))
    with tarfile.open(archive) as tar:
        packaged = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if "/presets/" in m.name}
    source = {f"dapo/presets/{p.name}": p.read_text() for p in (ROOT / "dapo" / "presets").glob("*.yaml")}
    assert packaged == source
    from_archive = helm().Chart.load(archive)
    values = user_values([VALUES_DIR / "full.yaml"])
    assert from_archive.render(values, name="dapo", namespace="ml") == chart().render(values, name="dapo",
                                                                                     namespace="ml")


def test_chart_presets_link_is_the_package_presets():
    link = CHART_DIR / "presets"
    assert link.is_symlink() and link.resolve() == (ROOT / "dapo" / "presets").resolve()


def test_no_values_file_repeats_the_charts_image_and_ray_pins():
    # values.yaml pins them (tests/test_docker.py holds them to the Makefile's tags and the locks); the EKS file names
    # the EFA variant of the same image, whose tag `make images EFA=1` derives from the pin
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    for f in VALUES_DIR.glob("*.yaml"):
        v = yaml.safe_load(f.read_text()) or {}
        if f.name == "eks-p5.yaml":
            assert v.pop("image") == {"tag": f"{values['image']['tag']}-efa"}, f
        assert "image" not in v and "rayVersion" not in v, f


def test_every_value_is_documented_with_a_helm_docs_comment():
    """KubeRay's chart style: every value (or the block it belongs to) has a `# --` comment above it."""
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    parsed = yaml.safe_load("\n".join(lines))
    undocumented, stack = [], []  # stack of (indent, key, documented)
    for i, line in enumerate(lines):
        m = re.match(r"^( *)([A-Za-z0-9_.-]+):(.*)$", line)
        if not m or line.lstrip().startswith("#"):
            continue
        indent, key = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#") and not lines[j].strip().startswith("# --"):
            j -= 1
        documented = j >= 0 and lines[j].strip().startswith("# --")
        if not documented and not any(d for _, _, d in stack):
            node = parsed
            for _, k, _ in stack:
                node = node[k]
            is_section = isinstance(node[key], dict) and bool(node[key])
            if not is_section:
                undocumented.append(".".join([k for _, k, _ in stack] + [key]))
        stack.append((indent, key, documented))
    assert undocumented == []


def test_schema_forbids_unknown_keys_at_every_level_of_our_own_sections():
    schema = chart().schema
    assert schema["additionalProperties"] is False

    def walk(node, path):
        if node.get("type") == "object" and "properties" in node:
            yield path, node.get("additionalProperties")
            for k, sub in node["properties"].items():
                yield from walk(sub, f"{path}.{k}")

    open_objects = [p for p, extra in walk(schema, "") if extra is not False]
    assert open_objects == []


def test_notes_give_the_next_commands():
    notes = helm_notes(user_values([VALUES_DIR / "full.yaml"]), release="dapo", namespace="ml")
    commands = [line.strip() for line in notes.splitlines() if line.startswith("  kubectl")]
    assert commands[0] == "kubectl logs -n ml -f job/dapo-train-logs"  # the log follower leads
    for expected in (
        "kubectl get rayjob dapo-train -n ml",
        # HTTPMode: no submitter Job; the driver log of every attempt is on the shared volume
        "tail -f /shared/checkpoints/DAPO-verl/DAPO-Qwen2.5-32B/logs/attempt-1.log",
        "ray job logs --address http://localhost:8265 --follow",
        "-c ray-head",
        "Ray head container (GCS, dashboard: not the driver)",
        "helm upgrade` is refused while dapo-train exists",
        "kubectl -n ml delete rayjob/dapo-train job/dapo-train-logs",
        "helm test dapo -n ml",
        "Each attempt may run 2592000 s (activeDeadlineSeconds is per attempt).",
        "stops the run after more than 6 failed attempts in 24 h, 3 of one cause in a row, or a final verdict",
        "kubectl port-forward -n ml svc/dapo-train-head-svc 8265:8265",
        "https://wandb.ai/",
        "kubectl delete pvc dapo-shared -n ml",
    ):
        assert expected in notes, expected
    assert not re.search(r"(?<!ray)job/dapo-train\b(?!-)", notes)  # HTTPMode has no submitter Job
    k8s_job = helm_notes(user_values([VALUES_DIR / "full.yaml"], {"train": {"submissionMode": "K8sJobMode"}}))
    assert "kubectl logs -n ml -f job/dapo-train\n" in k8s_job
    eval_notes = helm_notes(user_values(set_files("eval")[0]), release="dapo-aime", namespace="ml")
    assert "kubectl get rayjob dapo-aime-eval -n ml" in eval_notes and "dapo-train" not in eval_notes
    assert [line.strip() for line in eval_notes.splitlines() if line.startswith("  kubectl")][0] == \
        "kubectl logs -n ml -f job/dapo-aime-eval-logs"
    off = helm_notes(user_values([VALUES_DIR / "full.yaml"], {"logs": {"enabled": False}}), namespace="ml")
    assert "-logs" not in off and "kubectl -n ml delete rayjob dapo-train," in off


def test_standard_labels_on_every_object():
    for obj in helm_objects(user_values([VALUES_DIR / "full.yaml"]), strip=False):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "dapo"
        assert labels["app.kubernetes.io/instance"] == "dapo"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "dapo-0.1.0"
        assert labels["app.kubernetes.io/version"] == chart().metadata["appVersion"]


def test_queue_labels_for_each_batch_scheduler():
    expected = {"kueue": "kueue.x-k8s.io/queue-name", "volcano": "volcano.sh/queue-name", "kai": "kai.scheduler/queue"}
    for scheduler, label in expected.items():
        values = {"queue": {"scheduler": scheduler, "name": "gpu-q"}, "train": {"submissionMode": "HTTPMode"}, **RWX}
        job = by_key(helm_objects(values))[("RayJob", "dapo-train")]
        assert job["metadata"]["labels"][label] == "gpu-q"


def test_operator_values_pin_kuberay_1_7_0_with_the_gates_the_chart_uses():
    ops = yaml.safe_load((ROOT / "k8s" / "kuberay-operator-values.yaml").read_text())
    assert ops["image"]["tag"] == f"v{versions.KUBERAY_VERSION}"
    gates = {g["name"]: g["enabled"] for g in ops["featureGates"]}
    assert gates["RayJobDeletionPolicy"] is True  # train/eval.deletionRules
    text = (ROOT / "k8s" / "kuberay-operator-values.yaml").read_text()
    assert f"--version {versions.KUBERAY_VERSION}" in text


@pytest.mark.parametrize("name", ["tiny", "smoke", "one-gpu", "full"])
def test_training_driver_is_placed_on_a_worker_never_the_head(name):
    """The DAPO loop is the job driver: entrypointNumCpus 1 with a head of num-cpus "0" leaves Ray a worker as the
    only place to start it (cluster-facts: without entrypoint resources the driver runs on the head)."""
    files, release = set_files(name)
    values = user_values(files)
    job = by_key(helm_objects(values, release=release))[("RayJob", f"{release}-train")]["spec"]
    assert job["entrypointNumCpus"] == 1
    cluster = job["rayClusterSpec"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    (group,) = cluster["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] >= 1
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    # the worker that hosts the driver has a CPU for it (KubeRay derives num-cpus from the CPU limit)
    assert float(limits["cpu"]) >= 1


def test_the_one_gpu_values_render_one_worker_with_one_gpu_training_the_one_gpu_preset():
    """values/one-gpu.yaml: one GPU worker pod requesting (and limited to) 1 GPU, Ray told of 1 GPU through the
    placement the entrypoint passes, the preset one-gpu."""
    files, release = set_files("one-gpu")
    job = by_key(helm_objects(user_values(files), release=release))[("RayJob", f"{release}-train")]["spec"]
    (group,) = job["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 1
    resources = group["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == "1", resources
    assert "/one-gpu.yaml placement.nodes=1 placement.gpus_per_node=1" in job["entrypoint"], job["entrypoint"]


def test_local_backend_preset_gets_a_cpu_worker_group_of_its_placement_nodes():
    files, release = set_files("tiny")
    values = user_values(files)
    for extra, replicas in (({}, 2), ({"nodes": 3}, 3)):
        job = by_key(helm_objects({**values, **extra}, release=release))[("RayJob", f"{release}-train")]["spec"]
        (group,) = job["rayClusterSpec"]["workerGroupSpecs"]
        assert group["groupName"] == "cpu" and group["replicas"] == replicas
        resources = group["template"]["spec"]["containers"][0]["resources"]
        assert "nvidia.com/gpu" not in resources["limits"] and "nvidia.com/gpu" not in resources["requests"]
        assert "placement.nodes" not in job["entrypoint"]  # the local backend has no placement to pass

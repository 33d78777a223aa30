"""scripts/render.py (teams without a helm binary: the chart through Helm's engine in-process) on its command line, the
chart's objects for non-default values that reach every branch of the templates, and the committed k8s/rendered/ files
up to date. (render.py's value flags against Helm's own: tests/test_helm_inputs.py.)"""

from __future__ import annotations

import copy

import pytest
import yaml

from conftest import ROOT
from dapo.util.gofmt import go_quote
from k8s_support import by_key, helm_objects, render_script

# Non-default values reaching every optional branch of the templates (and characters Go and Python quote alike).
EVERY_BRANCH = {
    "preset": "7b",
    "nodes": 3,
    "gpusPerNode": 4,
    "overrides": ["recipe.trainer.total_training_steps=7", "+trainer.log_val_generations=2"],
    "fullnameOverride": "dapo-exp",
    "imagePullSecrets": [{"name": "regcred"}],
    "serviceAccountName": "runner",
    "secret": {"name": "tokens", "hfTokenKey": "hf", "hfTokenOptional": False, "wandbApiKeyOptional": True},
    "wandb": {"entity": "team-rl"},
    "storage": {"existingClaim": "lustre-rwx", "mountPath": "/mnt/shared/", "hfHome": "/mnt/shared/hf"},
    "dataPrep": {"outDir": "/mnt/shared/data", "dedup": True, "extraArgs": ["--revision", "abc123"]},
    "nccl": {"NCCL_SOCKET_IFNAME": "bond0", "NCCL_IB_HCA": "mlx5_0,mlx5_1"},
    "env": {"OMP_NUM_THREADS": "8", "on": "yes"},
    "hostNetwork": True,
    "ipcLock": True,
    "priorityClassName": "high",
    "schedulerName": "custom",
    "queue": {"scheduler": "volcano", "name": "rl"},
    "head": {"nodeSelector": {"pool": "cpu"}, "tolerations": [{"key": "cpu", "operator": "Exists"}],
             "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                 {"weight": 1, "preference": {"matchExpressions": [{"key": "z", "operator": "In", "values": ["a"]}]}}]}},
             "labels": {"team": "rl"}, "annotations": {"note": "x"}, "restartPolicy": "Never",
             "rayStartParams": {"num-gpus": "0", "metrics-export-port": "8080"}},
    "worker": {"groupName": "h100", "extraResources": {"rdma/ib": "1", "vpc.amazonaws.com/efa": 32},
               "rayStartParams": {"object-store-memory": "100000000000"},
               "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                   {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}}},
               "labels": {"team": "rl"}, "annotations": {"note": "y"}, "nodeSelector": {"gpu": "h100"}},
    "train": {"submissionMode": "SidecarMode", "backoffLimit": 5, "activeDeadlineSeconds": 12345678,
              "shutdownAfterJobFinishes": False, "ttlSecondsAfterFinished": 0, "presetDir": "/etc/presets/",
              "deletionRules": [{"policy": "DeleteWorkers", "condition": {"jobStatus": "FAILED", "ttlSeconds": 0}},
                                {"policy": "DeleteCluster", "condition": {"jobStatus": "FAILED", "ttlSeconds": 60}},
                                {"policy": "DeleteSelf", "condition": {"jobDeploymentStatus": "Failed"}}],
              "runtimeEnv": {"WANDB_TAGS": 'a "quoted", back\\slash\ttab and üñí ✓', "Y": "n"}},
    "eval": {"enabled": True, "image": {"repository": "", "tag": ""}, "step": "all", "stride": 40, "nodes": 2,
             "gpusPerNode": 8, "benchmarks": ["aime25", "math500"],
             "submissionMode": "HTTPMode", "extraArgs": ["--n-samples", "32"], "activeDeadlineSeconds": None,
             "runtimeEnv": {"VLLM_LOGGING_LEVEL": "DEBUG"}},
    "logs": {"image": {"repository": "registry.local/dapo-logs", "tag": ""}, "rbac": {"create": False},
             "serviceAccountName": "log-reader", "ttlSecondsAfterFinished": 86400},
    "securityContext": {"runAsUser": 0, "runAsNonRoot": False},
    "rayAuth": {"secretName": "ray-token"},
    "networkPolicy": {"operator": {"namespace": "ray-system", "podLabels": {"app": "kuberay"}},
                      "extraIngress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "obs"}}}],
                                        "ports": [{"protocol": "TCP", "port": 8080}]}],
                      "restrictEgress": True,
                      "extraEgress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 3128}]}]},
}


def test_every_template_branch_renders():
    python = by_key(helm_objects(copy.deepcopy(EVERY_BRANCH), release="r1", namespace="team-a"))
    assert sorted(python) == [("ConfigMap", "dapo-exp-preset"), ("Job", "dapo-exp-eval-logs"),
                                              ("Job", "dapo-exp-preflight"),
                                              ("Job", "dapo-exp-train-logs"), ("NetworkPolicy", "dapo-exp-ray"),
                                              ("RayJob", "dapo-exp-eval"), ("RayJob", "dapo-exp-train"),
                                              # the preflight reads storage.existingClaim's access modes
                                              ("Role", "dapo-exp-preflight"), ("RoleBinding", "dapo-exp-preflight"),
                                              ("ServiceAccount", "dapo-exp-preflight")]
    for obj in python.values():
        assert obj["metadata"]["namespace"] == "team-a"
    train = python[("RayJob", "dapo-exp-train")]["spec"]
    # the branches were really taken
    assert train["submissionMode"] == "SidecarMode" and "submitterPodTemplate" not in train
    assert train["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 3
    assert train["rayClusterSpec"]["authOptions"] == {"mode": "token", "secretName": "ray-token"}
    assert python[("NetworkPolicy", "dapo-exp-ray")]["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "WANDB_TAGS" in yaml.safe_load(train["runtimeEnvYAML"])["env_vars"]
    assert yaml.safe_load(train["runtimeEnvYAML"])["env_vars"]["WANDB_TAGS"] == EVERY_BRANCH["train"]["runtimeEnv"][
        "WANDB_TAGS"]
    follower = python[("Job", "dapo-exp-eval-logs")]["spec"]
    assert follower["ttlSecondsAfterFinished"] == 86400 and follower["template"]["spec"]["serviceAccountName"] == \
        "log-reader"
    assert follower["template"]["spec"]["initContainers"][0]["image"] == "registry.local/dapo-logs:0.1.0-verl0.9.1"


@pytest.mark.parametrize("text", ["plain", 'q"uote', "back\\slash", "tab\there", "nl\nx", "bell\a", "\x7f",
                                  "üñí", "✓", "\u00a0nbsp", "\u2028", "😀"])
def test_go_quote_reads_back_unchanged_in_yaml(text):
    assert yaml.safe_load(f"k: {go_quote(text)}")["k"] == text


def test_committed_rendered_manifests_are_up_to_date(tmp_path):
    """`make render` output equals k8s/rendered/ byte for byte; every object is in the README's namespace."""
    assert render_script().main(["--all", "--out", str(tmp_path)]) == 0
    committed = ROOT / "k8s" / "rendered"
    assert sorted(p.name for p in committed.glob("*.yaml")) == sorted(f"{n}.yaml" for n in render_script().RENDER_SETS)
    for name in render_script().RENDER_SETS:
        text = (tmp_path / f"{name}.yaml").read_text()
        assert (committed / f"{name}.yaml").read_text() == text, f"k8s/rendered/{name}.yaml is stale: run make render"
        objects = [o for o in yaml.safe_load_all(text) if o]
        assert objects and all(o["metadata"]["namespace"] == render_script().RENDER_NAMESPACE for o in objects)


def test_render_check_flag_reports_a_stale_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(render_script(), "RENDER_SETS", {"full": render_script().RENDER_SETS["full"]})
    assert render_script().main(["--all", "--out", str(tmp_path)]) == 0
    assert render_script().main(["--all", "--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "full.yaml").write_text("# edited by hand\n")
    assert render_script().main(["--all", "--out", str(tmp_path), "--check"]) == 1
    assert "full.yaml" in capsys.readouterr().err


def test_render_cli_preset_set_and_override(capsys):
    rc = render_script().main(["--preset", "smoke", "--namespace", "ml", "--set", "worker.shmSize=32Gi",
                               "--override", "recipe.trainer.total_training_steps=3", *CLUSTER])
    out = capsys.readouterr().out
    assert rc == 0
    job = by_key([o for o in yaml.safe_load_all(out) if o])[("RayJob", "dapo-smoke-train")]
    assert job["metadata"]["namespace"] == "ml"
    assert job["spec"]["entrypoint"].endswith("placement.gpus_per_node=8 recipe.trainer.total_training_steps=3")
    worker = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}} in worker["volumes"]


# the stand-in cluster of k8s_support.STAND_IN, on render.py's command line (full's 16 nodes declare its fabric)
CLUSTER = ["--set", "image.published=true", "--set", "storage.storageClassName=rwx-class", "--set", "fabric.expect=ib"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--preset", "full", "--set", "nodes=0"], "/nodes"),
        (["--preset", "tiny", "--set", "gpusPerNode=1"], "gpusPerNode: preset"),
        (["--preset", "tiny", "--set", "head.rayStartParams.num-cpus=\"1\""], "head.rayStartParams.num-cpus:"),
        (["--preset", "nope"], "unknown preset"),
        (["--preset", "full", "--set", "fullnameOverride=" + "x" * 45], "fullnameOverride:"),
    ],
)
def test_render_cli_errors_name_the_key_and_exit_2(capsys, argv, message):
    assert render_script().main(argv) == 2
    assert message in capsys.readouterr().err

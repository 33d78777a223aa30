"""The preflight Job (dapo.k8s.preflight, the chart's preflight.yaml): Helm and render.py emit the same object, first
(a pre-install hook: Helm creates it before the release's objects and goes on only when it succeeded), on the GPU
pool, in the run's image, with the storage floor of `dapo plan` and a volume like the run's claim; each check can be
switched off by a value; no preflight for a CPU run. The checks themselves run as processes in
tests/test_preflight.py."""

from __future__ import annotations

import copy

import pytest
import yaml

from dapo.cluster.preflight import build_parser
from k8s_support import CHART_DIR, VALUES_DIR, by_key, helm_objects, python_objects, set_files, user_values

FULL = [VALUES_DIR / "full.yaml"]
REQUIREMENTS = yaml.safe_load((CHART_DIR / "files" / "requirements.yaml").read_text())["presets"]
BRANCHES = [
    None,
    {"storage": {"fixOwnership": {"enabled": True}}, "worker": {"tolerations": [{"key": "gpu", "operator": "Exists"}],
                                                                "nodeSelector": {"pool": "h100"}},
     "imagePullSecrets": [{"name": "regcred"}], "podSecurityContext": {"fsGroup": 100}},
    {"storage": {"existingClaim": "team-shared"}, "preflight": {"storage": {"throughput": False}}},
    {"preflight": {"driver": False, "storage": {"enabled": False}}},
    {"train": {"runner": "reference", "reference": {"image": {"repository": "registry.example.com/ml/dapo"}}},
     "rayAuth": {"enabled": False}},  # Ray 2.43 of the reproduction image has no token auth
]


def both(extra):
    h = helm_objects(user_values(FULL, copy.deepcopy(extra)))
    p = python_objects(FULL, extra=copy.deepcopy(extra))
    return h, p


@pytest.mark.parametrize("extra", BRANCHES, ids=["default", "fix-ownership", "existing-claim", "no-checks",
                                                 "reference"])
def test_helm_and_render_py_emit_the_same_preflight_job_first(extra):
    h, p = both(extra)
    assert h[0] == p[0] and h[0]["metadata"]["name"] == "dapo-preflight", (h[0], p[0])
    assert p[0]["metadata"]["annotations"]["helm.sh/hook"] == "pre-install"
    assert [o["metadata"]["name"] for o in h] == [o["metadata"]["name"] for o in p]


def containers(job):
    spec = job["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}, spec


def test_the_default_preflight_checks_driver_and_storage_on_the_gpu_pool_with_the_plans_floor():
    _, p = both({"worker": {"nodeSelector": {"pool": "h100"}}})
    objs = by_key(p)
    job = objs[("Job", "dapo-preflight")]
    cs, spec = containers(job)
    assert list(cs) == ["driver", "storage", "image"]
    assert spec["nodeSelector"] == {"pool": "h100"}
    assert not any("nvidia.com/gpu" in str(c["resources"]) for c in cs.values())  # no GPU is held
    image = objs[("RayJob", "dapo-train")]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"][
        "containers"][0]["image"]
    assert all(c["image"] == image for c in cs.values())
    assert cs["driver"]["command"][-1] == "580"
    args = build_parser().parse_args(cs["storage"]["command"][3:])
    need = REQUIREMENTS["full"]
    assert (args.min_bytes_per_second, args.checkpoint_bytes, args.seconds_between_saves) == (
        need["minWriteBytesPerSecond"], need["checkpointBytes"], need["secondsBetweenSaves"])
    assert args.write_bytes == 4 << 30 and (args.uid, args.gid) == (1000, 100) and str(args.dir) == "/shared"
    # a volume like the run's claim, created for the pod (the release's own claim comes after the hook)
    claim = objs[("PersistentVolumeClaim", "dapo-shared")]["spec"]
    assert spec["volumes"][0]["ephemeral"]["volumeClaimTemplate"]["spec"] == claim
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 1800


def test_each_check_is_switched_off_by_its_value():
    _, p = both({"preflight": {"storage": {"throughput": False}}})
    cs, _ = containers(p[0])
    args = build_parser().parse_args(cs["storage"]["command"][3:])
    assert args.write_bytes == 0 and args.min_bytes_per_second == 0  # writability still checked
    _, p = both({"preflight": {"driver": False, "storage": {"enabled": False}}})
    cs, spec = containers(p[0])
    assert list(cs) == ["image"] and "volumes" not in spec  # the image still has to pull onto the GPU pool
    _, p = both({"preflight": {"enabled": False}})
    assert ("Job", "dapo-preflight") not in by_key(p)
    _, p = both({"storage": {"fixOwnership": {"enabled": True}}})
    assert list(containers(p[0])[0]) == ["fix-ownership", "driver", "storage", "image"]


def test_a_cpu_run_has_no_preflight():
    files, release = set_files("tiny")
    assert not [o for o in python_objects(files, release=release) if o["metadata"]["name"].endswith("-preflight")]
    assert not [o for o in helm_objects(user_values(files), release=release)
                if o["metadata"]["name"].endswith("-preflight")]

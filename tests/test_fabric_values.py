"""The per-cloud fabric values (values/eks-p5.yaml, gke-a3-high.yaml, gke-a3-mega.yaml, gke-a3-ultra.yaml) and the
two-node check (values/smoke-2node.yaml): what can be verified without the cloud -- the same objects through Helm and
render.py, on the two-node smoke and on the 16-node full run; the NCCL / libfabric variables on every Ray container;
devices, sidecars and volumes on every worker; the training entrypoint starting with the fabric check of the declared
fabric. (The rendered two-node sets are also validated against Kubernetes 1.30 and the KubeRay CRD by
tests/test_manifests_schema.py, through scripts/render.py's RENDER_SETS.)"""

from __future__ import annotations

import pytest
import yaml

from k8s_support import VALUES_DIR, helm_objects, python_objects, ray_pod_templates, user_values

CLOUDS = {"eks-p5": "efa", "gke-a3-high": "tcpx", "gke-a3-mega": "tcpxo", "gke-a3-ultra": "gib"}


def _files(base: list[str], cloud: str):
    return [VALUES_DIR / f for f in base] + [VALUES_DIR / f"{cloud}.yaml"]


@pytest.mark.parametrize("base", [["smoke.yaml", "smoke-2node.yaml"], ["full.yaml"]], ids=["smoke-2node", "full"])
@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_cloud_fabric_values_render_the_same_and_reach_every_ray_pod(cloud, base):
    files = _files(base, cloud)
    release = "dapo-smoke" if base[0] == "smoke.yaml" else "dapo"
    objects = python_objects(files, release=release, namespace="ml")
    assert helm_objects(user_values(files), release=release, namespace="ml") == objects
    cloud_values = yaml.safe_load((VALUES_DIR / f"{cloud}.yaml").read_text())
    rayjob = next(o for o in objects if o["kind"] == "RayJob")
    entry = rayjob["spec"]["entrypoint"]
    assert f"--fabric-check={CLOUDS[cloud]}" in entry.split(" ")[:7], entry
    if base[0] == "smoke.yaml":
        assert rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 2
    templates = [(role.split(":")[0], tpl) for role, tpl in ray_pod_templates(rayjob)]
    assert {role for role, _ in templates} == {"head", "worker"}
    for role, tpl in templates:
        ray = next(c for c in tpl["spec"]["containers"] if c["name"] in ("ray-head", "ray-worker"))
        env = {e["name"]: e.get("value") for e in ray.get("env", [])}
        for key, value in cloud_values["nccl"].items():
            assert env.get(key) == str(value), (role, key)
        if role != "worker":
            continue
        worker = cloud_values["worker"]
        limits = ray["resources"]["limits"]
        for name, count in (worker.get("extraResources") or {}).items():
            assert limits[name] == count and ray["resources"]["requests"][name] == count
        names = {c["name"] for c in tpl["spec"]["containers"]}
        assert {c["name"] for c in worker.get("sidecarContainers", [])} <= names
        volumes = {v["name"] for v in tpl["spec"].get("volumes", [])}
        assert {v["name"] for v in worker.get("extraVolumes", [])} <= volumes
        assert worker.get("annotations", {}).items() <= tpl["metadata"].get("annotations", {}).items()


def test_the_two_node_file_without_a_cloud_file_names_the_missing_fabric():
    from dapo.k8s.presets import ValuesError

    with pytest.raises(ValuesError, match=r"^fabric\.expect: fabric\.check needs the fabric"):
        python_objects([VALUES_DIR / "smoke.yaml", VALUES_DIR / "smoke-2node.yaml"], release="dapo-smoke")

"""The per-cloud fabric values (values/eks-p5.yaml, gke-a3-high.yaml, gke-a3-mega.yaml, gke-a3-ultra.yaml) and the
two-node check (values/smoke-2node.yaml): what can be verified without the cloud -- the same objects through Helm and
render.py, on the two-node smoke and on the 16-node full run; the NCCL / libfabric variables on every Ray container;
devices, sidecars and volumes on every worker; the training entrypoint starting with the fabric check of the declared
fabric. (The rendered two-node sets are also validated against Kubernetes 1.30 and the KubeRay CRD by
tests/test_manifests_schema.py, through scripts/render.py's RENDER_SETS.)"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from k8s_support import VALUES_DIR, chart_objects, helm_objects, ray_pod_templates, user_values

CLOUDS = {"eks-p5": "efa", "gke-a3-high": "tcpx", "gke-a3-mega": "tcpxo", "gke-a3-ultra": "gib"}


def _files(base: list[str], cloud: str):
    return [VALUES_DIR / f for f in base] + [VALUES_DIR / f"{cloud}.yaml"]


@pytest.mark.parametrize("base", [["smoke.yaml", "smoke-2node.yaml"], ["full.yaml"]], ids=["smoke-2node", "full"])
@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_cloud_fabric_values_reach_every_ray_pod(cloud, base):
    files = _files(base, cloud)
    release = "dapo-smoke" if base[0] == "smoke.yaml" else "dapo"
    objects = helm_objects(user_values(files), release=release, namespace="ml")
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
        native = {c["name"] for c in tpl["spec"].get("initContainers", []) if c.get("restartPolicy") == "Always"}
        for sidecar in worker.get("sidecarContainers", []):  # restartPolicy Always: a native sidecar (init container)
            assert sidecar["name"] in (native if sidecar.get("restartPolicy") == "Always" else names), sidecar["name"]
        volumes = {v["name"] for v in tpl["spec"].get("volumes", [])}
        assert {v["name"] for v in worker.get("extraVolumes", [])} <= volumes
        assert worker.get("annotations", {}).items() <= tpl["metadata"].get("annotations", {}).items()


def test_the_two_node_file_without_a_cloud_file_names_the_missing_fabric():
    from dapo.k8s.presets import ValuesError

    with pytest.raises(ValuesError,
                       match=r'^1 value still needed before this installs:\n- fabric\.expect: 2 nodes x 8 GPUs, no fabric'):
        chart_objects([VALUES_DIR / "smoke.yaml", VALUES_DIR / "smoke-2node.yaml"], release="dapo-smoke",
                       stand_in=False, extra={"image": {"published": True}, "storage": {"storageClassName": "rwx"}})


# --- GKE: the fabric daemons as Google runs them, the Ray container as the chart runs it --------------------------

def _worker_pod(cloud: str, extra: dict | None = None) -> dict:
    files = _files(["smoke.yaml", "smoke-2node.yaml"], cloud)
    objects = chart_objects(files, release="dapo-smoke", namespace="ml", extra=extra)
    rayjob = next(o for o in objects if o["kind"] == "RayJob")
    return rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]


@pytest.mark.parametrize("cloud, daemon", [("gke-a3-mega", "tcpxo-daemon"), ("gke-a3-high", "tcpx-daemon")])
def test_the_gke_daemon_runs_as_root_in_its_own_context_while_the_ray_container_stays_non_root(cloud, daemon):
    pod = _worker_pod(cloud)["spec"]
    (sidecar,) = [c for c in pod["initContainers"] if c["name"] == daemon]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: up before the Ray container starts
    assert sidecar["securityContext"]["runAsUser"] == 0 and sidecar["securityContext"]["runAsNonRoot"] is False
    assert "NET_ADMIN" in sidecar["securityContext"]["capabilities"]["add"]
    ray = next(c for c in pod["containers"] if c["name"] == "ray-worker")
    ray_sc = ray.get("securityContext") or {}
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
    assert "runAsUser" not in ray_sc and ray_sc.get("runAsNonRoot") is not False
    assert ray_sc["allowPrivilegeEscalation"] is False and ray_sc["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("cloud", ["gke-a3-mega", "gke-a3-high", "gke-a3-ultra"])
def test_the_host_library_directories_are_read_only_in_the_ray_container(cloud):
    pod = _worker_pod(cloud)["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    ray = next(c for c in pod["containers"] if c["name"] == "ray-worker")
    libraries = [m for m in ray["volumeMounts"] if host.get(m["name"], "").startswith("/home/kubernetes/bin")]
    assert libraries, "the plugin directory reaches the Ray container"
    assert all(m.get("readOnly") is True for m in libraries), libraries


PROFILE = "export NCCL_FASTRAK_IFNAME=eth1,eth2\nexport NCCL_DEBUG=WARN\n"


@pytest.mark.parametrize("cloud", ["gke-a3-mega", "gke-a3-ultra"])
def test_the_installers_env_profile_reaches_ray_start_as_kuberay_composes_the_container_command(cloud, tmp_path):
    """The Ray worker container's args, composed with `ray start` as KubeRay v1.7's BuildPod does (kuberay_loopback
    .ray_container_command), run in bash with a `ray` that records its environment: the profile's variables reach
    `ray start` (every Ray process of the pod inherits them) and win over the pod's; a missing profile ends the
    container before `ray start` with a message naming it."""
    from kuberay_loopback import ray_container_command

    own = yaml.safe_load((VALUES_DIR / f"{cloud}.yaml").read_text())["fabric"]["ncclEnvProfile"]
    assert _worker_pod(cloud)["spec"]["containers"][0]["args"][0].startswith(f'if [ -r "{own}" ]; then . "{own}";')
    profile = tmp_path / "profile" / "nccl-env.sh"
    pod = _worker_pod(cloud, extra={"fabric": {"ncclEnvProfile": str(profile)}})
    ray = next(c for c in pod["spec"]["containers"] if c["name"] == "ray-worker")
    command, args = ray_container_command(ray, "ray start --address=head:6379 --block")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text(f'#!/bin/sh\nenv > {tmp_path}/ray-env\n')
    (bin_dir / "ray").chmod(0o755)
    env = {e["name"]: e["value"] for e in ray["env"] if "value" in e}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    missing = subprocess.run(command + args, env=env, capture_output=True, text=True)
    assert missing.returncode == 1 and not (tmp_path / "ray-env").exists()
    assert f"fabric.ncclEnvProfile {profile} does not exist on this node" in missing.stderr
    profile.parent.mkdir()
    profile.write_text(PROFILE)
    ran = subprocess.run(command + args, env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    seen = dict(line.split("=", 1) for line in (tmp_path / "ray-env").read_text().splitlines() if "=" in line)
    assert seen["NCCL_FASTRAK_IFNAME"] == "eth1,eth2" and seen["NCCL_DEBUG"] == "WARN"  # the profile wins
    assert seen["LD_LIBRARY_PATH"] == env["LD_LIBRARY_PATH"]  # the pod's own variables stay
    assert f"dapo: sourced {profile}" in ran.stdout

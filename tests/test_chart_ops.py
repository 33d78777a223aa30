"""What a multi-week run on a real cluster needs from the chart, checked on what Helm renders (helm_python, the engine
scripts/render.py renders with): writable shared volume, submission mode, deadlines, the upgrade guard (Helm's own `lookup`
against a stand-in API server), evaluation that follows the run's overrides, a hard-to-kill head, the escape hatches
of KubeRay's own chart, the model fetched once, and the GPU start-up check."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import stat
import subprocess
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from conftest import ROOT
from dapo.config import load_preset, resolve_trainer_refs, split_overrides
from dapo.k8s import ValuesError, load_values
from dapo.k8s.upgrade import SPEC_HASH_ANNOTATION, follower_refusal, upgrade_refusal
from k8s_support import (
    CHART_DIR,
    VALUES_DIR,
    JsonHandler,
    by_key,
    chart,
    chart_objects,
    helm,
    helm_notes,
    helm_objects,
    ray_pod_templates,
    render_script,
    set_files,
    spec_sha256,
    go_json,
    user_values,
)

RWX = {"storage": {"storageClassName": "rwx-class"}}
# the container half of the "restricted" Pod Security profile (the pod half is on the pod)
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
GPU_SETS = ["full", "early", "7b", "smoke", "one-gpu"]


def rendered(values, *, release="dapo"):
    """Helm's objects by (kind, name), for chart values on top of the defaults."""
    return by_key(helm_objects(copy.deepcopy(values), release=release))


def refused(values, key):
    with pytest.raises(helm().HelmRenderError, match=re.escape(key)):
        chart().render(copy.deepcopy(values), name="dapo", namespace="ml")


# ---------------------------------------------------------------------------------------------------------------
# storage: a GPU preset names its ReadWriteMany class


@pytest.mark.parametrize("preset", GPU_SETS)
def test_gpu_preset_without_storage_class_or_claim_is_refused(preset):
    refused({"preset": preset}, "- storage.storageClassName: unset, and the default class is ReadWriteOnce on EKS")


def test_storage_rule_accepts_a_class_an_existing_claim_or_the_cpu_preset():
    for values in ({"storage": {"storageClassName": "rwx"}}, {"storage": {"existingClaim": "mine"}},
                   {"preset": "tiny"}):
        assert ("RayJob", "dapo-train") in rendered(values)


def test_every_gpu_values_file_names_a_marked_storage_class():
    """The values files carry a placeholder class on a marked line; the chart refuses it until the user names theirs
    (the chart's dapo.missingValues; the refusal is tested in tests/test_install_rules.py)."""
    for name in GPU_SETS:
        text = (VALUES_DIR / f"{name}.yaml").read_text()
        assert yaml.safe_load(text)["storage"]["storageClassName"] == "shared-rwx"
        assert "# cluster: REQUIRED" in text


# ---------------------------------------------------------------------------------------------------------------
# a Guaranteed head


@pytest.mark.parametrize("name", sorted(render_script().RENDER_SETS))
def test_every_container_of_every_head_has_requests_equal_to_limits(name):
    files, release = set_files(name)
    for job in (o for o in chart_objects(files, release=release) if o["kind"] == "RayJob"):
        head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        for c in head.get("initContainers", []) + head["containers"]:
            r = c["resources"]
            for res in ("cpu", "memory"):
                assert str(r["requests"][res]) == str(r["limits"][res]), (name, c["name"], res)


@pytest.mark.parametrize("values, key", [
    ({**RWX, "dataPrep": {"resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": None, "memory": "8Gi"}}}},
     "dataPrep.resources: requests.cpu and limits.cpu must both be set and equal (got 2 and unset)"),
    ({**RWX, "head": {"resources": {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": {"cpu": "8",
                                                                                         "memory": "32Gi"}}}},
     "head.resources: requests.cpu and limits.cpu must both be set and equal (got 4 and 8)"),
    ({**RWX, "head": {"sidecarContainers": [{"name": "s", "image": "busybox:1.37", "resources": {
        "requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "128Mi"}}}]}},
     "head.sidecarContainers[0].resources: requests.memory and limits.memory"),
])
def test_a_burstable_head_is_refused(values, key):
    refused(values, key)


# ---------------------------------------------------------------------------------------------------------------
# submission mode and deadlines


@pytest.mark.parametrize("name", ["full", "early"])
def test_long_runs_submit_over_http_with_per_attempt_deadlines(name):
    files, release = set_files(name)
    values = user_values(files)
    spec = by_key(chart_objects(files, release=release))[("RayJob", f"{release}-train")]["spec"]
    # HTTPMode: no submitter whose backoffLimit counts `ray job logs --follow` failures over weeks
    assert spec["submissionMode"] == "HTTPMode"
    assert "submitterPodTemplate" not in spec and "submitterConfig" not in spec
    assert spec["preRunningDeadlineSeconds"] == 1800  # after the preflight: scale-up, pulls, the model download
    per_attempt = spec["activeDeadlineSeconds"]
    notes = helm_notes(values, release=release)
    # the follower's failure budget decides: no lifetime product of KubeRay's backstop count and the deadline
    assert f"Each attempt may run {per_attempt} s (activeDeadlineSeconds is per attempt)." in notes
    assert "retried while its failure budget allows" in notes
    total = (spec["backoffLimit"] + 1) * per_attempt
    without = helm_notes(user_values(files, {"train": {"retries": {"failureBudget": {"enabled": False}}}}),
                         release=release)
    assert f"all attempts together at most {total} s" in without
    assert "An attempt that is not Running 1800 s after it started" in notes
    assert f"the start guard (job/{release}-train-start) deletes a run whose pods never started" in notes
    queued = helm_notes(user_values(files + [VALUES_DIR / "kueue.yaml"]), release=release)
    assert "Not Running 3600 s".lower() in queued.lower() and "Kueue admits the run whole" in queued
    assert "counts against submitterConfig.backoffLimit" not in notes
    k8s_job = helm_notes(user_values(files, {"train": {"submissionMode": "K8sJobMode"}}), release=release)
    assert "K8sJobMode: every broken `ray job logs --follow` of the submitter counts" in k8s_job


def test_operator_tolerates_a_dashboard_outage_longer_than_kuberays_default():
    """HTTPMode fails a RayJob (without retry) only after status checks failed for this long."""
    ops = yaml.safe_load((ROOT / "k8s" / "kuberay-operator-values.yaml").read_text())
    env = {e["name"]: e["value"] for e in ops["env"]}
    assert int(env["RAYJOB_STATUS_CHECK_TIMEOUT_SECONDS"]) > 300


def test_notes_warn_that_ipc_lock_needs_root():
    notes = helm_notes({**RWX, "ipcLock": True})
    assert "IPC_LOCK takes effect only for root" in notes
    assert "IPC_LOCK takes effect" not in helm_notes(
        {**RWX, "ipcLock": True, "securityContext": {"runAsUser": 0, "runAsNonRoot": False}})
    assert "IPC_LOCK" not in helm_notes(RWX)


def test_values_describe_deadlines_per_attempt_not_retries_included():
    values_text = (CHART_DIR / "values.yaml").read_text()
    docs = (ROOT / "docs" / "deadlines.md").read_text()
    assert "retries included" not in values_text + docs
    assert "Wall-clock limit of ONE attempt" in values_text and "(backoffLimit + 1) x this" in values_text
    assert "per attempt" in docs


def test_k8s_job_mode_submitter_gets_the_account_priority_and_pod_security_context():
    values = {**RWX, "train": {"submissionMode": "K8sJobMode"}, "serviceAccountName": "runner",
              "priorityClassName": "high", "podSecurityContext": {"fsGroup": 100}}
    p = rendered(values)
    pod = p[("RayJob", "dapo-train")]["spec"]["submitterPodTemplate"]["spec"]
    assert pod["serviceAccountName"] == "runner" and pod["priorityClassName"] == "high"
    # the chart's restricted defaults, with the value's fsGroup merged in (Helm merges maps)
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["podSecurityContext"]
    assert pod["securityContext"] == {**defaults, "fsGroup": 100} and defaults["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"] == {**RESTRICTED_CONTAINER, "readOnlyRootFilesystem": True}


# ---------------------------------------------------------------------------------------------------------------
# evaluation and NOTES follow the run's overrides (deploy.md's own example)


def deploy_md_overrides() -> list[str]:
    text = (ROOT / "docs" / "deploy.md").read_text()
    m = re.search(r"--set 'overrides=\{([^}]*)\}'", text)
    assert m, "docs/deploy.md no longer shows the overrides example"
    return m.group(1).split(",")


def test_eval_release_evaluates_the_checkpoints_of_deploy_md_example_run():
    overrides = deploy_md_overrides()
    assert any(o.startswith("recipe.trainer.experiment_name=") for o in overrides)
    # the reference: the preset as `dapo train` loads it with these overrides
    trainer = load_preset("full", split_overrides(overrides)[0]).recipe.trainer
    expected = resolve_trainer_refs(trainer.default_local_dir, {"project_name": trainer.project_name,
                                                                "experiment_name": trainer.experiment_name})
    assert expected.endswith(f"/{trainer.experiment_name}") and trainer.experiment_name != "DAPO-Qwen2.5-32B"
    files, release = set_files("eval")
    values = user_values(files, {"overrides": overrides})
    objects = by_key(helm_objects(values, release=release))
    argv = objects[("RayJob", "dapo-aime-eval")]["spec"]["entrypoint"].split()
    assert argv[argv.index("--checkpoint-dir") + 1] == expected
    assert argv[argv.index("--output") + 1] == f"{expected}/eval"
    # the training release's NOTES name the same run and directory
    notes = helm_notes(user_values([VALUES_DIR / "full.yaml"], {"overrides": overrides}))
    assert f"run {trainer.experiment_name}" in notes and f"# checkpoints: {expected} on claim" in notes


def test_an_override_through_a_scalar_is_refused():
    refused({**RWX, "overrides": ["recipe.trainer.project_name.x=1"]},
            'overrides: "recipe.trainer.project_name.x=1": "project_name" is not a mapping in the preset')


# ---------------------------------------------------------------------------------------------------------------
# model fetched once, Ray pods offline; evaluation without wandb


def test_model_is_fetched_once_and_every_ray_pod_runs_offline():
    values = {**RWX, "overrides": ["recipe.model.path=Qwen/Qwen2.5-Math-7B"]}
    p = rendered(values)
    job = p[("RayJob", "dapo-train")]
    init = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["data-prepare", "model-fetch"]
    assert init[1]["command"] == ["hf", "download", "Qwen/Qwen2.5-Math-7B"]
    assert not any(e["name"] == "HF_HUB_OFFLINE" for e in init[1]["env"])
    for role, template in ray_pod_templates(job):
        env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
        assert env["HF_HUB_OFFLINE"] == "1", role
    # no download, no offline switch: fetchModel off, or a model built into the preset
    for values in ({**RWX, "dataPrep": {"fetchModel": False}}, {"preset": "tiny"}):
        p = rendered(values)
        job = p[("RayJob", "dapo-train")]
        for role, template in ray_pod_templates(job):
            assert "HF_HUB_OFFLINE" not in {e["name"] for e in template["spec"]["containers"][0]["env"]}, role
            names = [c["name"] for c in template["spec"].get("initContainers", [])]
            assert "model-fetch" not in names
    refused({**RWX, "env": {"HF_HUB_OFFLINE": "0"}}, "env.HF_HUB_OFFLINE: set by the chart")


def test_evaluation_pods_hold_no_wandb_key_unless_the_evaluation_logs_to_wandb():
    files, release = set_files("eval")
    job = by_key(chart_objects(files, release=release))[("RayJob", "dapo-aime-eval")]
    assert user_values([VALUES_DIR / "full.yaml"]).get("secret", {}).get("wandbApiKeyOptional") is not True
    for role, template in ray_pod_templates(job):
        assert not [e for e in template["spec"]["containers"][0]["env"] if e["name"] == "WANDB_API_KEY"], role
    # --wandb-project (dapo.eval.scoring.log_wandb): the driver, on the head, gets it, as required as training's
    extra = {"eval": {"extraArgs": ["--wandb-project=dapo-eval"]}}
    job = by_key(chart_objects(files, release=release, extra=extra))[("RayJob", "dapo-aime-eval")]
    head, worker = [t["spec"]["containers"][0]["env"] for _, t in ray_pod_templates(job)]
    (key,) = [e for e in head if e["name"] == "WANDB_API_KEY"]
    assert key["valueFrom"]["secretKeyRef"]["optional"] is False and "WANDB_API_KEY" not in {e["name"] for e in worker}


# ---------------------------------------------------------------------------------------------------------------
# a head that is hard to kill; escape hatches (KubeRay's ray-cluster chart is the model)

ESCAPES = yaml.safe_load((CHART_DIR / "ci" / "escape-hatches-values.yaml").read_text())


def test_escape_hatches_reach_head_worker_and_eval_pods():
    values = {**copy.deepcopy(ESCAPES), "eval": {"enabled": True}}
    p = rendered(values)
    for kind in ("train", "eval"):
        job = p[("RayJob", f"dapo-{kind}")]
        head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        worker = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
        assert head["runtimeClassName"] == "runc-hardened" and worker["runtimeClassName"] == "nvidia"
        assert [c["name"] for c in head["containers"]] == ["ray-head", "log-shipper"]
        assert [c["name"] for c in worker["containers"]] == ["ray-worker", "dcgm-sidecar"]
        assert {"name": "ca-bundle", "configMap": {"name": "corp-ca"}} in head["volumes"]
        assert {"name": "local-nvme", "mountPath": "/scratch"} in worker["containers"][0]["volumeMounts"]
        for spec in (head, worker):
            assert spec["securityContext"] == {**ESCAPES["podSecurityContext"],
                                               "seccompProfile": {"type": "RuntimeDefault"}}
            sc = spec["containers"][0]["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
            assert sc["capabilities"]["add"] == ["SYS_PTRACE", "IPC_LOCK"]  # ipcLock merged, not replaced
        # the root ownership fix runs first, only in the head, and only it runs as root
        fix = head["initContainers"][0]
        assert fix["name"] == "fix-ownership" and fix["securityContext"]["runAsUser"] == 0
        assert all(c["securityContext"] == RESTRICTED_CONTAINER for c in head["initContainers"][1:])
        ann = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["metadata"]["annotations"]
        assert ann["karpenter.sh/do-not-disrupt"] == "true"
        assert ann["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"


def test_pod_disruption_budget_selects_exactly_the_training_head_and_workers():
    p = rendered({**RWX, "disruption": {"podDisruptionBudget": True}})
    pdb = p[("PodDisruptionBudget", "dapo-train")]
    kubernetes_validate.validate(pdb, "1.30", strict=True)
    assert pdb["spec"]["maxUnavailable"] == 0
    sel = pdb["spec"]["selector"]

    def selected(labels):
        return sel["matchLabels"].items() <= labels.items() and all(
            labels.get(e["key"]) in e["values"] for e in sel["matchExpressions"])

    job = p[("RayJob", "dapo-train")]
    for role, template in ray_pod_templates(job):
        assert selected(template["metadata"]["labels"]), role
    assert not selected(job["spec"].get("submitterPodTemplate", {}).get("metadata", {}).get("labels", {}))
    assert ("PodDisruptionBudget", "dapo-train") not in rendered(RWX)


# ---------------------------------------------------------------------------------------------------------------
# writable shared volume: the ownership fix and the helm test pod, run for real on a temporary directory


def _script(container) -> str:
    assert container["command"][:2] == ["/bin/sh", "-c"]
    return container["command"][2]


def _values_on(tmp: Path, **more):
    return {**RWX, "storage": {"storageClassName": "rwx", "mountPath": str(tmp), "hfHome": f"{tmp}/hf",
                               "fixOwnership": {"enabled": True, "uid": os.getuid(), "gid": os.getgid()}},
            "dataPrep": {"outDir": f"{tmp}/data"}, **more}


def test_fix_ownership_script_creates_the_directories_owned_by_the_image_user(tmp_path):
    values = _values_on(tmp_path)
    p = rendered(values)
    fix = p[("RayJob", "dapo-train")]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"][
        "initContainers"][0]
    out = subprocess.run(["/bin/sh", "-c", _script(fix)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for d in (tmp_path, tmp_path / "data", tmp_path / "hf"):
        st = d.stat()
        assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
        assert stat.S_IMODE(st.st_mode) == 0o2775


def test_helm_test_pods_validate():
    for values in (RWX, {**copy.deepcopy(ESCAPES)}, {"preset": "tiny"}, {**RWX, "test": {"gpu": False}}):
        helm_pods = helm_objects(copy.deepcopy(values), hooks=True)
        for pod in helm_pods:
            kubernetes_validate.validate(pod, "1.30", strict=True)
            assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    names = lambda v: [o["metadata"]["name"] for o in helm_objects(v, hooks=True)]  # noqa: E731
    assert names(RWX) == ["dapo-test-gpu", "dapo-test-shared"]
    assert names({"preset": "tiny"}) == ["dapo-test-shared"]  # no GPU to check
    assert names({**RWX, "test": {"gpu": False}}) == ["dapo-test-shared"]
    gpu = by_key(helm_objects(copy.deepcopy(RWX), hooks=True))[("Pod", "dapo-test-gpu")]["spec"]
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert gpu["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_shared_volume_test_script_writes_reads_back_and_names_the_fix(tmp_path):
    values = _values_on(tmp_path)
    (pod,) = [p for p in helm_objects(values, hooks=True) if p["metadata"]["name"] == "dapo-test-shared"]
    script = _script(pod["spec"]["containers"][0])
    ok = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True)
    assert ok.returncode == 0 and "write and read back OK" in ok.stdout, ok.stderr
    assert list(tmp_path.iterdir()) == []  # the probe file is removed
    # a volume the pod's user cannot write: a read-only directory, or (as root here) a root-owned one seen by
    # another uid, like a root-owned NFS export seen by the image's uid 1000
    argv = ["/bin/sh", "-c", script]
    if os.getuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: cannot act as a non-root user")
        argv = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"] + argv
    tmp_path.chmod(0o555)
    try:
        bad = subprocess.run(argv, capture_output=True, text=True)
    finally:
        tmp_path.chmod(0o755)
    assert bad.returncode == 1
    assert "set podSecurityContext.fsGroup or storage.fixOwnership.enabled" in bad.stderr


# ---------------------------------------------------------------------------------------------------------------
# helm upgrade of a live run: Helm's own `lookup` against a stand-in API server


class FakeApiServer:
    """Just enough of the Kubernetes API for Helm's `lookup`: discovery of ray.io/v1 and batch/v1, GET of RayJobs
    and Jobs (``objects``: name -> object, its kind says which)."""

    def __init__(self, objects: dict[str, dict]):
        self.objects = objects
        self.requests: list[str] = []
        outer = self

        class Handler(JsonHandler):
            def do_GET(self):
                path = self.path.split("?")[0]
                outer.requests.append(path)
                for group, name, kind in (("ray.io", "rayjobs", "RayJob"), ("batch", "jobs", "Job")):
                    if path == f"/apis/{group}/v1":
                        return self.send_json(200, {
                            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/v1",
                            "resources": [{"name": name, "singularName": name[:-1], "namespaced": True, "kind": kind,
                                           "verbs": ["get", "list"]}]})
                m = re.fullmatch(r"/apis/(ray.io|batch)/v1/namespaces/([^/]+)/(rayjobs|jobs)/([^/]+)", path)
                obj = outer.objects.get(m.group(4)) if m else None
                if obj is not None and obj["kind"] == {"rayjobs": "RayJob", "jobs": "Job"}[m.group(3)]:
                    return self.send_json(200, obj)
                return self.send_json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                            "reason": "NotFound", "code": 404})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kubeconfig(self) -> str:
        port = self.server.server_address[1]
        return yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "t",
            "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
            "users": [{"name": "t", "user": {"token": "t"}}],
            "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t", "namespace": "ml"}}],
        })

    def close(self):
        self.server.shutdown()


def helm_upgrade_render(values, live: dict[str, dict]):
    """`helm upgrade --dry-run=server`'s template pass: lookup sees `live`."""
    api = FakeApiServer(live)
    try:
        with helm().Config(kubeconfig_content=api.kubeconfig(), namespace="ml", storage_driver="memory") as cfg:
            return cfg.render(chart(), copy.deepcopy(values), name="dapo", namespace="ml", is_upgrade=True), api
    finally:
        api.close()


def _live(job, status="Running"):
    out = copy.deepcopy(job)
    out["status"] = {"jobDeploymentStatus": status, "jobStatus": "RUNNING"}
    return out


def test_upgrade_guard_uses_helms_lookup_and_refuses_a_spec_change_of_a_live_rayjob():
    values = user_values([VALUES_DIR / "full.yaml"])
    job = by_key(helm_objects(values))[("RayJob", "dapo-train")]
    # no RayJob in the cluster: a fresh install / after `kubectl delete rayjob` renders
    rendered, api = helm_upgrade_render(values, {})
    assert "/apis/ray.io/v1/namespaces/ml/rayjobs/dapo-train" in api.requests
    assert SPEC_HASH_ANNOTATION in rendered["dapo/templates/rayjob-train.yaml"]
    # the same release again (e.g. `helm upgrade` with unchanged values on a running job): allowed
    helm_upgrade_render(values, {"dapo-train": _live(job)})
    # `nodes: 8` mid-run: refused, naming the way out; render.py --apply refuses with the same words
    changed = user_values([VALUES_DIR / "full.yaml"], {"nodes": 8})
    with pytest.raises(helm().HelmRenderError) as exc:
        helm_upgrade_render(changed, {"dapo-train": _live(job)})
    msg = str(exc.value).split("): ", 1)[-1]
    assert msg.startswith("train: the RayJob dapo-train already exists in namespace ml (deployment status Running)")
    # the way out deletes its log follower too (its next run needs a new one)
    assert "kubectl -n ml delete rayjob/dapo-train job/dapo-train-logs" in msg and "new release" in msg
    new = by_key(chart_objects([VALUES_DIR / "full.yaml"], extra={"nodes": 8}))[("RayJob", "dapo-train")]
    assert upgrade_refusal("train", new, _live(job), "ml", "dapo-train-logs") == msg
    no_follower = user_values([VALUES_DIR / "full.yaml"], {"nodes": 8, "logs": {"enabled": False}})
    with pytest.raises(helm().HelmRenderError, match="kubectl -n ml delete rayjob dapo-train;"):
        helm_upgrade_render(no_follower, {"dapo-train": _live(job)})
    # a finished run is guarded too (its retry budget may be spent, but a re-created RayJob would use the change)
    with pytest.raises(helm().HelmRenderError, match="deployment status Complete"):
        helm_upgrade_render(changed, {"dapo-train": _live(job, "Complete")})
    # a RayJob without the annotation (another chart version, edited by hand) is never silently replaced
    bare = _live(job)
    del bare["metadata"]["annotations"]
    with pytest.raises(helm().HelmRenderError, match="would change its spec"):
        helm_upgrade_render(values, {"dapo-train": bare})


def test_follower_guard_refuses_to_change_a_live_follower_job_or_keep_one_whose_rayjob_is_gone():
    values = user_values([VALUES_DIR / "full.yaml"])
    objects = by_key(helm_objects(values))
    job, follower = objects[("RayJob", "dapo-train")], objects[("Job", "dapo-train-logs")]
    assert follower["metadata"]["annotations"][SPEC_HASH_ANNOTATION] == spec_sha256(follower["spec"])
    live = {"dapo-train": _live(job), "dapo-train-logs": follower}
    rendered, api = helm_upgrade_render(values, live)  # unchanged, its RayJob live: allowed
    assert "/apis/batch/v1/namespaces/ml/jobs/dapo-train-logs" in api.requests
    # the RayJob was deleted (to change or restart the run): the upgrade would create a new run under the old Job
    with pytest.raises(helm().HelmRenderError) as exc:
        helm_upgrade_render(values, {"dapo-train-logs": follower})
    msg = str(exc.value).split("): ", 1)[-1]
    assert msg.startswith("logs: the log follower Job dapo-train-logs already exists in namespace ml and follows "
                          "the RayJob dapo-train, which no longer exists")
    assert "kubectl -n ml delete job dapo-train-logs;" in msg
    assert follower_refusal(follower, follower, "dapo-train", False, "ml") == msg
    # its pod template would change (the API server would refuse it as immutable): refused with the way out
    changed = user_values([VALUES_DIR / "full.yaml"], {"logs": {"resources": {"limits": {"memory": "256Mi"}}}})
    with pytest.raises(helm().HelmRenderError, match="would change, and a Job's pod template cannot"):
        helm_upgrade_render(changed, live)
    new = by_key(chart_objects([VALUES_DIR / "full.yaml"], extra={"logs": {"resources": {
        "limits": {"memory": "256Mi"}}}}))[("Job", "dapo-train-logs")]
    assert "would change" in follower_refusal(new, follower, "dapo-train", True, "ml")
    assert follower_refusal(follower, follower, "dapo-train", True, "ml") is None


def test_spec_hash_follows_the_spec_and_the_preset_files_only():
    a = by_key(chart_objects([VALUES_DIR / "full.yaml"]))[("RayJob", "dapo-train")]
    b = by_key(chart_objects([VALUES_DIR / "full.yaml"], release="dapo", extra={"head": {"labels": {"x": "y"}}}))[
        ("RayJob", "dapo-train")]
    assert a["metadata"]["annotations"][SPEC_HASH_ANNOTATION] != b["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
    # the hash is that of the spec and the preset files the ConfigMap carries
    preset_files = by_key(chart_objects([VALUES_DIR / "full.yaml"]))[("ConfigMap", "dapo-preset")]["data"]
    assert a["metadata"]["annotations"][SPEC_HASH_ANNOTATION] == spec_sha256(a["spec"], preset_files)
    files = {"full.yaml": "x"}
    assert spec_sha256(a["spec"], files) != spec_sha256(a["spec"], {"full.yaml": "y"})
    # Go's encoding/json escapes HTML characters and line separators (go_json computes the hash the chart writes)
    assert go_json({"b": "<a&b>\u2028", "a": [1, 2.5, True, None]}) == \
        '{"a":[1,2.5,true,null],"b":"\\u003ca\\u0026b\\u003e\\u2028"}'


# ---------------------------------------------------------------------------------------------------------------
# the GPU start-up check in the pods (worker postStart, helm test pod); the check itself: tests/test_gpu_check.py


def test_gpu_workers_check_the_driver_at_start_and_the_head_does_not():
    p = rendered(RWX)
    job = p[("RayJob", "dapo-train")]
    worker = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert worker["lifecycle"]["postStart"]["exec"]["command"] == ["python", "-m", "dapo.cluster.gpu_check",
                                                                   "--min-driver", "580"]
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert "postStart" not in head["lifecycle"]
    assert worker["lifecycle"]["preStop"]["exec"]["command"][:2] == ["/bin/sh", "-c"]
    assert worker["lifecycle"]["preStop"]["exec"]["command"][2].endswith("; ray stop")
    # another image (e.g. the CUDA 12.6 reproduction stack): its own minimum, or no check
    p = rendered({**RWX, "worker": {"minDriver": 0}})
    worker = p[("RayJob", "dapo-train")]["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert "postStart" not in worker["containers"][0]["lifecycle"]
    p = rendered({**RWX, "worker": {"minDriver": 560}})
    worker = p[("RayJob", "dapo-train")]["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["containers"][0]["lifecycle"]["postStart"]["exec"]["command"][-1] == "560"


class _FakeDynamic:
    """kubernetes.dynamic.DynamicClient stand-in: RayJobs that exist (name -> object), applied objects recorded."""

    def __init__(self, live: dict[str, dict]):
        self.live = live
        self.applied: list[str] = []
        outer = self

        class Resource:
            def __init__(self, kind):
                self.kind = kind

            def get(self, name, namespace):
                from types import SimpleNamespace

                from kubernetes.dynamic.exceptions import NotFoundError

                if self.kind == "RayJob" and name in outer.live:
                    return SimpleNamespace(to_dict=lambda: copy.deepcopy(outer.live[name]))
                raise NotFoundError(SimpleNamespace(status=404, reason="Not Found", body="", headers={}))

        class Resources:
            def get(self, api_version, kind):
                return Resource(kind)

        self.resources = Resources()

    def server_side_apply(self, res, body, namespace, field_manager, force_conflicts):
        self.applied.append(f"{body['kind']}/{body['metadata']['name']}")


@pytest.mark.parametrize("nodes, refused_", [(None, False), (8, True)])
def test_render_py_apply_applies_the_upgrade_guard_before_applying_anything(monkeypatch, capsys, nodes, refused_):
    from kubernetes import config as kconfig
    from kubernetes import dynamic

    job = by_key(chart_objects([VALUES_DIR / "full.yaml"], namespace="ml"))[("RayJob", "dapo-train")]
    fake = _FakeDynamic({"dapo-train": _live(job)})
    monkeypatch.setattr(kconfig, "load_kube_config", lambda *a, **k: None)
    monkeypatch.setattr(dynamic, "DynamicClient", lambda *a, **k: fake)
    argv = ["--preset", "full", "--namespace", "ml", "--apply", "--set", "image.published=true", "--set",
            "storage.storageClassName=rwx-class", "--set", "fabric.expect=ib"] + (["--set", f"nodes={nodes}"] if nodes
                                                                                 else [])
    rc = render_script().main(argv)
    err = capsys.readouterr().err
    if refused_:
        assert rc == 2 and fake.applied == []
        assert "train: the RayJob dapo-train already exists in namespace ml" in err
    else:
        assert rc == 0 and "RayJob/dapo-train" in fake.applied and "ConfigMap/dapo-preset" in fake.applied


@pytest.mark.parametrize("values, where", [
    ({"train": {"preRunningDeadlineSeconds": 0}}, "/train/preRunningDeadlineSeconds"),
    ({"eval": {"preRunningDeadlineSeconds": "1h"}}, "/eval/preRunningDeadlineSeconds"),
    ({"storage": {"fixOwnership": {"uid": -1}}}, "/storage/fixOwnership/uid"),
    ({"storage": {"fixOwnership": {"owner": "ray"}}}, "/storage/fixOwnership"),
    ({"disruption": {"pdb": True}}, "/disruption"),
    ({"worker": {"runtimeClassName": "Not_A_Name"}}, "/worker/runtimeClassName"),
    ({"head": {"sidecarContainers": {"name": "x"}}}, "/head/sidecarContainers"),
    ({"worker": {"extraVolumes": ["tmp"]}}, "/worker/extraVolumes/0"),
    ({"podSecurityContext": "root"}, "/podSecurityContext"),
    ({"worker": {"minDriver": "580"}}, "/worker/minDriver"),
    ({"test": {"gpu": "yes"}}, "/test/gpu"),
    ({"dataPrep": {"fetchModel": "true"}}, "/dataPrep/fetchModel"),
])
def test_schema_rejects_bad_new_values_naming_the_key(values, where):
    with pytest.raises(helm().HelmValuesError, match=re.escape(where)):
        chart().render({**RWX, **values}, name="dapo", namespace="ml")
    with pytest.raises(ValuesError, match=re.escape(where)):  # dapo doctor and dapo plan: the same schema
        load_values(CHART_DIR, [], [], {**RWX, **values})


# ---------------------------------------------------------------------------------------------------------------
# verl on CPU (placement.accelerator: cpu): logical GPUs, no devices, an image with vLLM's CPU build

CPU_IMAGE = {"image": {"repository": "registry.local/dapo-vllm-cpu", "tag": "dev"}}


def test_verl_on_cpu_workers_declare_logical_gpus_and_request_no_device():
    from dapo.backends.verl.settings import CPU_RAY_CPUS_PER_GPU

    p = rendered({"preset": "verl-tiny", **CPU_IMAGE})
    spec = p[("RayJob", "dapo-train")]["spec"]
    (group,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == 2  # the preset's two nodes: two worker pods (two raylets)
    # KubeRay passes rayStartParams to `ray start`: verl places an FSDP rank and a vLLM replica per logical GPU
    assert group["rayStartParams"] == {"num-gpus": "1", "num-cpus": str(CPU_RAY_CPUS_PER_GPU)}
    container = group["template"]["spec"]["containers"][0]
    assert not any("nvidia.com/gpu" in (container["resources"].get(s) or {}) for s in ("requests", "limits"))
    assert "postStart" not in container.get("lifecycle", {})  # no GPU driver check
    assert "placement.nodes=2 placement.gpus_per_node=1" in spec["entrypoint"] and spec["entrypointNumCpus"] == 1
    assert spec["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # the driver on the worker


def test_verl_on_cpu_refuses_the_cuda_image_and_hand_set_logical_resources():
    refused({"preset": "verl-tiny"}, '- image.repository: preset "verl-tiny" runs verl on CPU')
    refused({"preset": "verl-tiny", **CPU_IMAGE, "worker": {"rayStartParams": {"num-gpus": "4"}}},
            'worker.rayStartParams.num-gpus: preset "verl-tiny" runs verl on CPU')

"""Helpers shared by the chart / render / manifest / submission tests: the chart rendered by Helm's own engine
(helm_python, the Helm SDK that scripts/render.py and dapo doctor render with), and the pods KubeRay builds from it."""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import yaml

from conftest import ROOT
from dapo.k8s import ValuesError

CHART_DIR = ROOT / "charts" / "dapo"
VALUES_DIR = ROOT / "values"
# Labels only Helm writes (the chart's dapo.labels): left out of the objects the tests compare unless strip=False.
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
# The cluster the tests render for, layered after the values files and before a test's own values: its images exist
# under the chart's default names, its ReadWriteMany class is rwx-class (what `scripts/render.py --all` renders for:
# RENDER_CLUSTER there). Without it the chart refuses the unpublished default images and the values files'
# placeholder class (the chart's dapo.missingValues); stand_in=False renders without it. Its network is InfiniBand: a
# run on more than one GPU node whose values declare no fabric gets fabric.expect ib (the chart refuses such a run
# otherwise), as scripts/render.py's RENDER_FABRIC renders those sets.
STAND_IN = {"image": {"published": True}, "storage": {"storageClassName": "rwx-class"}}
STAND_IN_FABRIC = {"fabric": {"expect": "ib"}}


def _drop_nulls(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _drop_nulls(v) for k, v in data.items() if v is not None}
    return copy.deepcopy(data)


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """A copy of base with over merged into it: maps merge, anything else is replaced, a null removes the key."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = _drop_nulls(value)
    return out


def stand_in_fabric(values: dict[str, Any]) -> dict[str, Any]:
    """STAND_IN_FABRIC when the chart refuses these values for want of a declared fabric -- a run of our trainer on
    more than one GPU node (its dapo.missingValues) -- else {}. Helm decides, not a copy of its rule: the values are
    rendered once to see."""
    if (values.get("fabric") or {}).get("expect"):
        return {}
    return copy.deepcopy(STAND_IN_FABRIC) if _wants_fabric(json.dumps(values, sort_keys=True)) else {}


@functools.lru_cache(maxsize=None)
def _wants_fabric(values_json: str) -> bool:
    try:
        chart().render(json.loads(values_json), name="dapo", namespace="ml")
    except helm().HelmError as exc:
        return "\n- fabric.expect: " in str(exc)
    return False


def go_json(data: Any) -> str:
    """Go's encoding/json (Helm's ``toJson``): keys sorted, no spaces, <, >, &, U+2028, U+2029 escaped."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def spec_sha256(spec: dict[str, Any], preset_files: dict[str, str] | None = None) -> str:
    """What the chart's dapo.rayJobWithHash writes into dapo-k8s.github.io/spec-sha256: SHA-256 of the Go JSON of the
    spec (and of the preset files the training job reads)."""
    content: dict[str, Any] = {"spec": spec}
    if preset_files is not None:
        content["presetFiles"] = preset_files
    return hashlib.sha256(go_json(content).encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def render_script():
    """scripts/render.py as a module (its RENDER_SETS, main, to_yaml)."""
    spec = importlib.util.spec_from_file_location("dapo_render_script", ROOT / "scripts" / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def helm():
    import helm_python

    helm_python.disable_logging()
    return helm_python


@functools.lru_cache(maxsize=None)
def chart():
    return helm().Chart.load(str(CHART_DIR))


def on_stand_in(values: dict[str, Any]) -> dict[str, Any]:
    """STAND_IN with these values over it (a copy), and its fabric where the run needs one."""
    out = merge(copy.deepcopy(STAND_IN), copy.deepcopy(values))
    return merge(out, stand_in_fabric(values=out))


def user_values(files: list[Path] | tuple[Path, ...], extra: dict[str, Any] | None = None, *,
                stand_in: bool = True) -> dict[str, Any]:
    """What `helm -f a.yaml -f b.yaml` hands the chart: user files merged, later wins, maps merge; then STAND_IN
    (unless stand_in is False), then extra."""
    out: dict[str, Any] = {}
    for f in files:
        out = merge(out, yaml.safe_load(Path(f).read_text()) or {})
    if stand_in:
        out = merge(out, copy.deepcopy(STAND_IN))
    if extra:
        out = merge(out, extra)
    if stand_in:
        out = merge(out, stand_in_fabric(values=out))
    return out


def helm_render(values: dict[str, Any], *, release: str = "dapo", namespace: str = "ml",
                stand_in: bool = True) -> dict[str, str]:
    """`helm template` of these user values; STAND_IN beneath them unless stand_in is False."""
    if stand_in:
        values = merge(copy.deepcopy(STAND_IN), values)
        values = merge(values, stand_in_fabric(values=values))
    return chart().render(copy.deepcopy(values), name=release, namespace=namespace)


def helm_objects(values: dict[str, Any], *, release: str = "dapo", namespace: str = "ml",
                 strip: bool = True, hooks: bool = False, stand_in: bool = True) -> list[dict[str, Any]]:
    """Objects of `helm template`, NOTES left out; Helm-only labels removed when strip; the `helm test` hook pods
    only when hooks (then nothing else); the pre-install preflight Job with the other objects."""
    out, pre_install = [], []
    for path, text in sorted(helm_render(values, release=release, namespace=namespace, stand_in=stand_in).items()):
        if path.endswith("NOTES.txt"):
            continue
        for obj in yaml.safe_load_all(text):
            # `helm test` pods are hooks=True; the preflight's pre-install hook is among the release's objects
            is_hook = bool(obj) and (obj["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"
            if obj and is_hook == hooks:
                if strip:
                    for label in HELM_ONLY_LABELS:
                        obj["metadata"].get("labels", {}).pop(label, None)
                hook = (obj["metadata"].get("annotations") or {}).get("helm.sh/hook") or ""
                pre = "pre-install" in hook.split(",")
                (pre_install if pre else out).append(obj)
    return pre_install + out  # Helm's install order: the pre-install hooks first


def helm_notes(values: dict[str, Any], *, release: str = "dapo", namespace: str = "ml") -> str:
    return helm_render(values, release=release, namespace=namespace)["dapo/templates/NOTES.txt"]


def set_files(name: str) -> tuple[list[Path], str]:
    files, release = render_script().RENDER_SETS[name]
    return [VALUES_DIR / f for f in files], release


def chart_objects(files=(), *, release: str = "dapo", namespace: str = "ml", extra: dict[str, Any] | None = None,
                  stand_in: bool = True, hooks: bool = False) -> list[dict[str, Any]]:
    """helm_objects of these values files with extra over them (user_values); a refusal of the chart raises
    ValuesError with Helm's message, the template position left out (what scripts/render.py prints)."""
    from dapo.k8s.helm import _message

    values = user_values(list(files), copy.deepcopy(extra) if extra else None, stand_in=stand_in)
    try:
        return helm_objects(values, release=release, namespace=namespace, stand_in=False, hooks=hooks)
    except helm().HelmError as exc:
        raise ValuesError(_message(exc)) from exc


def refusal(files=(), extra: dict[str, Any] | None = None, *, stand_in: bool = True, release: str = "dapo") -> str:
    """The chart's message refusing these values."""
    try:
        chart_objects(files, extra=extra, stand_in=stand_in, release=release)
    except ValuesError as exc:
        return str(exc)
    raise AssertionError(f"the chart renders {extra}")


def doctor_release(files=(), sets=(), *, extra: dict[str, Any] | None = None, release: str = "dapo",
                   namespace: str = "ml"):
    """The release (values, objects, NOTES) as `dapo doctor -f <files> --set <sets>` reads it
    (dapo.k8s.doctor_cli.read_release), extra merged over the files and sets."""
    from dapo.k8s import helm
    from dapo.k8s.doctor_cli import read_release

    user = helm.user_values(helm.ValueOptions(files=[str(f) for f in files], set=list(sets)))
    if extra:
        user = helm.merge_maps(user, copy.deepcopy(extra))
    return read_release(CHART_DIR, user, release=release, namespace=namespace)


def by_key(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def parse_sets(sets: dict[str, str]) -> dict[str, Any]:
    """`--set a.b=x --set c=y` as the nested values Helm builds from them (strings)."""
    out: dict[str, Any] = {}
    for key, value in sets.items():
        node = out
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def objects_by_key(values: dict[str, Any], *, release: str = "dapo") -> dict[tuple[str, str], dict[str, Any]]:
    """Helm's objects by (kind, name), for chart values on top of the defaults (and STAND_IN)."""
    return by_key(helm_objects(copy.deepcopy(values), release=release))


def pod_templates(rayjob: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(role, pod template) of a RayJob: head, each worker group, the submitter."""
    spec = rayjob["spec"]
    out = [("head", spec["rayClusterSpec"]["headGroupSpec"]["template"])]
    out += [(f"worker:{g['groupName']}", g["template"]) for g in spec["rayClusterSpec"].get("workerGroupSpecs", [])]
    if "submitterPodTemplate" in spec:
        out.append(("submitter", spec["submitterPodTemplate"]))
    return out


def ray_pod_templates(rayjob: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(role, t) for role, t in pod_templates(rayjob) if role != "submitter"]


class JsonHandler(BaseHTTPRequestHandler):
    """The request handler of this suite's stand-in Kubernetes API servers: quiet, and ``send_json`` answers with a
    status code and a JSON body as the API server does."""

    def log_message(self, *args):
        pass

    def send_json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


# -- every value set, and the pods KubeRay builds from the rendered objects ----------------------------------------

RWX = {"storage": {"storageClassName": "rwx-class"}}


def value_sets() -> list[tuple[str, dict, str]]:
    """(id, user values, release): every preset on its own, every values/ combination, every ci values file."""
    cpu_image = {"image": {"repository": "registry.local/dapo-cpu"}}  # verl on CPU refuses the CUDA image
    presets = sorted(p.stem for p in (CHART_DIR / "presets").glob("*.yaml") if not p.stem.startswith("_"))
    out = [(f"preset-{p}", {**RWX, "preset": p, **(cpu_image if p.startswith("verl-") else {})}, "dapo")
           for p in presets]
    for name in sorted(render_script().RENDER_SETS):
        files, release = set_files(name)
        out.append((f"values-{name}", user_values(files), release))
    out += [(f"ci-{f.stem}", yaml.safe_load(f.read_text()) or {}, "dapo")
            for f in sorted((CHART_DIR / "ci").glob("*.yaml"))]
    return out


# KubeRay v1.7.0's label keys (ray-operator/controllers/ray/utils/constant.go)
RAY_CLUSTER, RAY_NODE_TYPE, RAY_GROUP = "ray.io/cluster", "ray.io/node-type", "ray.io/group"
ORIGIN_NAME, ORIGIN_CRD = "ray.io/originated-from-cr-name", "ray.io/originated-from-crd"


def ray_pod_labels(template_labels: dict[str, str], cluster: str, node_type: str, group: str) -> dict[str, str]:
    """KubeRay v1.7.0's labelPod (common/pod.go): its labels, the template's over them, except ray.io/node-type,
    ray.io/group and ray.io/cluster, which the template cannot override."""
    labels = {"ray.io/is-ray-node": "yes", RAY_CLUSTER: cluster, RAY_NODE_TYPE: node_type, RAY_GROUP: group,
              "ray.io/identifier": f"{cluster}-{node_type}", "app.kubernetes.io/name": "kuberay",
              "app.kubernetes.io/created-by": "kuberay-operator"}
    for k, v in (template_labels or {}).items():
        if k not in (RAY_NODE_TYPE, RAY_GROUP, RAY_CLUSTER):
            labels[k] = v
    return labels


def kuberay_pods(rayjob, suffix: str = "x7k2q") -> list[tuple[str, dict]]:
    """The pods KubeRay v1.7.0 creates from a RayJob, with their labels: the head (SidecarMode: plus its submitter
    container, GetDefaultSubmitterContainer, no securityContext), each worker group (plus the `wait-gcs-ready` init
    container with the Ray container's securityContext, common/pod.go), the K8sJobMode submitter Job's pod. The
    RayCluster is named <RayJob>-<5 random characters> (utils.GenerateRayClusterName); the submitter template gets
    ray.io/originated-from-cr-name / -crd and app.kubernetes.io/created-by (rayjob_controller.go
    getSubmitterTemplate), its pod the Job controller's job-name labels (the Job is named after the RayJob)."""
    spec, name = rayjob["spec"], rayjob["metadata"]["name"]
    cluster_name = f"{name}-{suffix}"
    cluster = spec["rayClusterSpec"]
    head = copy.deepcopy(cluster["headGroupSpec"]["template"])
    head.setdefault("metadata", {})["labels"] = ray_pod_labels(head["metadata"].get("labels"), cluster_name, "head",
                                                               "headgroup")
    if spec.get("submissionMode") == "SidecarMode":
        head["spec"]["containers"].append({"name": "ray-job-submitter", "image": "x"})
    out = [("head", head)]
    for group in cluster.get("workerGroupSpecs", []):
        worker = copy.deepcopy(group["template"])
        worker.setdefault("metadata", {})["labels"] = ray_pod_labels(worker["metadata"].get("labels"), cluster_name,
                                                                     "worker", group["groupName"])
        ray = worker["spec"]["containers"][0]
        wait = {"name": "wait-gcs-ready", "image": ray["image"]}
        if "securityContext" in ray:
            wait["securityContext"] = copy.deepcopy(ray["securityContext"])
        worker["spec"]["initContainers"] = [wait] + worker["spec"].get("initContainers", [])
        out.append((f"worker {group['groupName']}", worker))
    if "submitterPodTemplate" in spec:
        sub = copy.deepcopy(spec["submitterPodTemplate"])
        sub.setdefault("metadata", {}).setdefault("labels", {}).update({
            ORIGIN_NAME: name, ORIGIN_CRD: "RayJob", "app.kubernetes.io/created-by": "kuberay-operator",
            "batch.kubernetes.io/job-name": name, "job-name": name})
        out.append(("submitter", sub))
    return out


def rendered_pods(values, release, namespace: str = "ml") -> list[tuple[str, dict]]:
    """(what, pod) of every pod the chart's objects lead to, as KubeRay and the Job controller create them, helm test
    pods included."""
    pods = []
    for obj in helm_objects(values, release=release, namespace=namespace) + \
            helm_objects(values, release=release, namespace=namespace, hooks=True):
        name = f"{obj['kind']} {obj['metadata']['name']}"
        if obj["kind"] == "RayJob":
            pods += [(f"{name} {role}", t) for role, t in kuberay_pods(obj)]
        elif obj["kind"] == "Job":
            t = copy.deepcopy(obj["spec"]["template"])
            t.setdefault("metadata", {}).setdefault("labels", {}).update(
                {"batch.kubernetes.io/job-name": obj["metadata"]["name"], "job-name": obj["metadata"]["name"]})
            pods.append((name, t))
        elif obj["kind"] == "Pod":
            pods.append((name, {"metadata": obj["metadata"], "spec": obj["spec"]}))
    return pods

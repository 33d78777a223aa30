"""checkov, a standard Kubernetes scanner, over everything the chart renders for every values/ combination and every
ci values file: its objects, its helm test pods, and the Ray pod templates of its RayJobs exported as Pods (checkov
does not look inside a CRD such as RayJob). No finding, every skip is on its object with its reason, and every skip
answers a finding: the same objects without their skip annotations fail exactly the checks the annotations skip.

tests/test_security.py checks the Ray pods against the Pod Security Standard as well. checkov's dependencies clash with
the main venv's pins, so it lives in its own venv, ``.venv-checkov`` (``make setup-checkov``, part of ``make test``);
``DAPO_CHECKOV`` names another checkov binary.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from k8s_support import CHART_DIR, helm_objects, pod_templates, render_script, set_files, user_values

CHECKOV = Path(os.environ.get("DAPO_CHECKOV") or ROOT / ".venv-checkov" / "bin" / "checkov")
SKIP = "checkov.io/skip"


def chart_reasons() -> dict[str, str]:
    """The chart's reasons (dapo.checkovSkips in _security.tpl): check (or check:variant) -> reason."""
    text = (CHART_DIR / "templates" / "_security.tpl").read_text()
    block = text[text.index('{{- define "dapo.checkovSkips" -}}'):]
    block = block[:block.index("-}}", block.index("$reasons := dict"))]
    return dict(re.findall(r'^\s*"(CKV_K8S_\d+(?::\w+)?)" "((?:[^"\\]|\\.)*)"\s*$', block, re.M))


CHECKOV_REASONS = chart_reasons()


def ray_pods(rayjob: dict) -> list[dict]:
    """A RayJob's pod templates -- head, worker groups, K8sJobMode submitter -- as Pods named <RayJob>-<role>: the
    template's labels and annotations (the skips with their reasons) and its spec, as KubeRay creates the pods from
    them."""
    meta = rayjob["metadata"]
    return [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"{meta['name']}-{role.split(':')[0]}", "namespace": meta["namespace"],
                          **{k: copy.deepcopy(t["metadata"][k]) for k in ("labels", "annotations")
                             if t.get("metadata", {}).get(k)}},
             "spec": copy.deepcopy(t["spec"])} for role, t in pod_templates(rayjob)]


def scanned_objects(values: dict, release: str) -> list[dict]:
    """What the chart renders for these values (hooks and helm test pods included) and its RayJobs' pods."""
    objects = helm_objects(values, release=release, strip=False) + \
        helm_objects(values, release=release, strip=False, hooks=True)
    return objects + [p for o in objects if o["kind"] == "RayJob" for p in ray_pods(o)]


def without_skips(obj: dict) -> dict:
    obj = copy.deepcopy(obj)
    annotations = obj["metadata"].get("annotations") or {}
    for k in [k for k in annotations if k.startswith(SKIP)]:
        del annotations[k]
    return obj


def _rendered(out: Path) -> dict[str, int]:
    """Every value set's objects, one file each, as Helm renders them, and the same without any skip annotation
    (out/bare/); counts of objects and Ray pods."""
    sets = [(f"values-{n}", user_values(set_files(n)[0]), set_files(n)[1]) for n in sorted(render_script().RENDER_SETS)]
    sets += [(f"ci-{f.stem}", yaml.safe_load(f.read_text()) or {}, "dapo") for f in sorted((CHART_DIR / "ci").glob("*.yaml"))]
    (out / "bare").mkdir()
    count = {"objects": 0, "ray pods": 0}
    for name, values, release in sets:
        objects = scanned_objects(values, release)
        (out / f"{name}.yaml").write_text(yaml.safe_dump_all(objects, sort_keys=False))
        (out / "bare" / f"{name}.yaml").write_text(yaml.safe_dump_all([without_skips(o) for o in objects],
                                                                      sort_keys=False))
        count["objects"] += len(objects)
        count["ray pods"] += sum(len(pod_templates(o)) for o in objects if o["kind"] == "RayJob")
    return count


def test_checkov_finds_nothing_unexplained_in_what_the_chart_renders_ray_pods_included(tmp_path):
    if not CHECKOV.exists():
        # make test names it in DAPO_CHECKOV: a missing scanner there is a failure, not a skip
        assert not os.environ.get("DAPO_CHECKOV"), f"DAPO_CHECKOV={CHECKOV} does not exist"
        pytest.skip(f"{CHECKOV} not present: make setup-checkov builds it (make test does)")
    count = _rendered(tmp_path)
    r = subprocess.run([str(CHECKOV), "-d", str(tmp_path), "--framework", "kubernetes", "-o", "json",
                        "--skip-download"], capture_output=True, text=True, timeout=900)
    assert r.returncode in (0, 1), r.stderr[-3000:]  # 1: failed checks, reported below
    reports = json.loads(r.stdout)
    (report,) = reports if isinstance(reports, list) else [reports]
    summary, results = report["summary"], report["results"]
    assert summary["parsing_errors"] == 0 and summary["resource_count"] > 0 and summary["passed"] > 0, summary

    def key(finding):  # (file, resource): bare/x.yaml and x.yaml hold the same objects
        return Path(finding["file_path"]).name, finding["resource"]

    def ours(finding):
        return "/bare/" not in finding["file_path"]

    failed = [(f["check_id"], f["check_name"], f["file_path"], f["resource"])
              for f in results.get("failed_checks", []) if ours(f)]
    assert not failed, f"{len(failed)} checkov findings without a fix or a reason: {failed[:20]}"
    skipped, found = defaultdict(set), defaultdict(set)
    for s in results.get("skipped_checks", []):
        assert ours(s), s["file_path"]
        reason = s["check_result"].get("suppress_comment")
        variants = {r for k, r in CHECKOV_REASONS.items() if k.split(":")[0] == s["check_id"]}
        assert reason in variants, (s["resource"], s["check_id"], reason)
        skipped[key(s)].add(s["check_id"])
    for f in results.get("failed_checks", []):
        if not ours(f):
            found[key(f)].add(f["check_id"])
    # every skip answers a finding the object has without it, and nothing else is found there
    assert dict(skipped) == dict(found), {k: (skipped[k], found[k]) for k in set(skipped) | set(found)
                                          if skipped[k] != found[k]}
    kinds = {f["resource"].split(".")[0] for f in results.get("passed_checks", [])}
    assert {"Job", "Pod", "Role"} <= kinds, kinds
    ray = {k for k in skipped if k[1].startswith("Pod.") and k[1].rsplit("-", 1)[-1] in ("head", "worker")}
    assert len(ray) >= 30 and count["ray pods"] >= len(ray), (len(ray), count)
    assert any(k[1].endswith("-submitter") for k in skipped), "no K8sJobMode submitter was scanned"
    print(f"\ncheckov: {count['objects']} objects, {len(ray)} Ray head/worker pods with skips, "
          f"{sum(len(v) for v in skipped.values())} skips over {len({c for v in skipped.values() for c in v})} checks, "
          f"0 failed")


def test_every_reason_survives_checkovs_annotation_parser():
    """checkov reads `checkov.io/skipN: <check>=<reason>` with one split on "=" (kubernetes_utils.get_skipped_checks):
    a reason holding "=" breaks the whole scan."""
    assert len(CHECKOV_REASONS) >= 25 and "CKV_K8S_25:ray" in CHECKOV_REASONS
    assert not [k for k, reason in CHECKOV_REASONS.items() if "=" in reason]


def _worker_skips(values: dict) -> set[str]:
    """The checks skipped on the training worker's pod template as the chart renders it for these values."""
    (job,) = [o for o in helm_objects(values) if o["kind"] == "RayJob"]
    annotations = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["metadata"]["annotations"]
    return {v.split("=", 1)[0] for k, v in annotations.items() if k.startswith(SKIP)}


def test_a_ray_pod_skips_container_checks_only_for_the_values_sidecars():
    """The chart's own containers get no skip for what the chart must set itself (allowPrivilegeEscalation, a CPU
    request, dropped capabilities): such a finding fails the scan; a sidecar of the values without them is skipped
    with its reason. Capabilities the values add (ipcLock) and wandb's key (the worker's) stay explained."""
    rwx = {"storage": {"storageClassName": "rwx-class"}}
    sidecar_checks = {"CKV_K8S_10", "CKV_K8S_20", "CKV_K8S_37"}
    own = _worker_skips({**rwx, "ipcLock": True})
    assert {"CKV_K8S_8", "CKV_K8S_9", "CKV_K8S_15", "CKV_K8S_22", "CKV_K8S_40", "CKV_K8S_25", "CKV_K8S_35",
            "CKV_K8S_43"} <= own
    assert not own & sidecar_checks
    bare = {"name": "fabric-daemon", "image": "registry.example.com/daemon:1"}
    assert sidecar_checks <= _worker_skips({**rwx, "worker": {"sidecarContainers": [bare]}})

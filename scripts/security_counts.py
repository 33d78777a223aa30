"""What reaches the run, counted over every value set the chart is tested with (scripts/render.py's RENDER_SETS and
charts/dapo/ci/*.yaml, rendered by real Helm as tests/test_checkov.py renders them): the pod templates that get a
service-account token, the containers that receive each of the Secret's keys, and checkov's findings on the Ray pod
templates (head, workers, K8sJobMode submitter) exported as Pods -- with their skip annotations honoured and without.

    python scripts/security_counts.py [--checkov .venv-checkov/bin/checkov]

What docs/security.md says reaches which pod is counted here.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from k8s_support import CHART_DIR, helm_objects, pod_templates, render_script, set_files, user_values  # noqa: E402

SKIP = "checkov.io/skip"


def value_sets() -> list[tuple[str, dict, str]]:
    sets = [(f"values-{n}", user_values(set_files(n)[0]), set_files(n)[1]) for n in sorted(render_script().RENDER_SETS)]
    sets += [(f"ci-{f.stem}", yaml.safe_load(f.read_text()) or {}, "dapo") for f in sorted((CHART_DIR / "ci").glob("*.yaml"))]
    return sets


def pod_specs(obj: dict) -> list[tuple[str, dict]]:
    """(role, pod template or pod) of an object: a RayJob's head, workers and submitter; a Job's pod; a Pod."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    if kind == "RayJob":
        return [(f"RayJob {name} {role}", t) for role, t in pod_templates(obj)]
    if kind == "Job":
        return [(f"Job {name}", obj["spec"]["template"])]
    if kind == "Pod":
        return [(f"Pod {name}", obj)]
    return []


def category(role: str) -> str:
    """"RayJob dapo-train head" -> "RayJob train head", "Job dapo-train-logs" -> "Job train-logs": the role, without
    the release's name."""
    kind, name, *rest = role.split()
    return " ".join([kind, name.partition("-")[2], *rest])


def has_token(spec: dict) -> bool:
    """Whether a pod gets a service-account token: the kubelet's automount (unless the pod turns it off) or a
    projected serviceAccountToken volume of its own."""
    projected = [s for v in spec.get("volumes") or [] for s in (v.get("projected") or {}).get("sources", [])]
    return spec.get("automountServiceAccountToken") is not False or any("serviceAccountToken" in s for s in projected)


def secret_keys(spec: dict, container: dict, secret: str, all_keys: tuple[str, ...]) -> set[str]:
    """The keys of Secret ``secret`` a container receives: as variables (env, envFrom) or as mounted files."""
    keys = set()
    for e in container.get("env") or []:
        ref = (e.get("valueFrom") or {}).get("secretKeyRef") or {}
        if ref.get("name") == secret:
            keys.add(ref["key"])
    for e in container.get("envFrom") or []:
        if (e.get("secretRef") or {}).get("name") == secret:
            keys.update(all_keys)
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    for m in container.get("volumeMounts") or []:
        vol = volumes.get(m["name"]) or {}
        sources = [vol["secret"]] if "secret" in vol else [s["secret"] for s in (vol.get("projected") or {}).get(
            "sources", []) if "secret" in s]
        for s in sources:
            if s.get("secretName", s.get("name")) == secret:
                keys.update([i["key"] for i in s["items"]] if s.get("items") else all_keys)
    return keys


def counts(sets: list[tuple[str, dict, str]]) -> tuple[dict, dict[str, list[dict]]]:
    """Token mounts and secret holders over the sets, and per set what to scan: the Ray pods (head, workers,
    submitter) and the set's NetworkPolicy objects (checkov's CKV2_K8S_6 looks for a policy that selects a pod)."""
    chart_values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    secret = chart_values["secret"]
    names = {"HF token": secret["hfTokenKey"], "wandb key": secret["wandbApiKeyKey"]}
    out: Counter = Counter()
    who: dict[str, Counter] = {"with a token": Counter(), **{f"with the {label}": Counter() for label in names}}
    scan: dict[str, list[dict]] = {}
    for set_name, values, release in sets:
        objects = helm_objects(values, release=release, strip=False) + \
            helm_objects(values, release=release, strip=False, hooks=True)
        ray_pods = scan.setdefault(set_name, [o for o in objects if o["kind"] == "NetworkPolicy"])
        for obj in objects:
            for role, template in pod_specs(obj):
                spec = template["spec"]
                out["pod templates"] += 1
                what = category(role)
                if has_token(spec):
                    out["pod templates with a token"] += 1
                    who["with a token"][what] += 1
                for c in (spec.get("initContainers") or []) + spec["containers"]:
                    out["containers"] += 1
                    got = secret_keys(spec, c, secret["name"], tuple(names.values()))
                    for label, key in names.items():
                        out[f"containers with the {label}"] += key in got
                        who[f"with the {label}"][f"{what}: {c['name']}"] += key in got
                if obj["kind"] == "RayJob":
                    meta = template.get("metadata") or {}
                    name = f"{role.split()[1]}-{role.split()[2]}".replace(":", "-")
                    ray_pods.append({"apiVersion": "v1", "kind": "Pod",
                                     "metadata": {"name": name, "namespace": obj["metadata"]["namespace"],
                                                  "labels": dict(meta.get("labels") or {}),
                                                  "annotations": dict(meta.get("annotations") or {})},
                                     "spec": copy.deepcopy(spec)})
    out["value sets"] = len(sets)
    return {**out, **{k: dict(sorted((w, n) for w, n in c.items() if n)) for k, c in who.items()}}, scan


def checkov(checkov_bin: str, scan: dict[str, list[dict]]) -> dict:
    """checkov over the Ray pods as rendered (skips honoured) and with their skip annotations removed; the findings
    on the pods."""
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for label, strip in (("as rendered", False), ("without skips", True)):
            path = Path(d) / label.replace(" ", "-")
            path.mkdir()
            pods = 0
            for set_name, objects in scan.items():
                docs = copy.deepcopy(objects)
                for p in docs:
                    if p["kind"] == "Pod":
                        pods += 1
                        if strip:
                            p["metadata"]["annotations"] = {k: v for k, v in p["metadata"]["annotations"].items()
                                                            if not k.startswith(SKIP)}
                (path / f"{set_name}.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
            r = subprocess.run([checkov_bin, "-d", str(path), "--framework", "kubernetes", "-o", "json",
                                "--skip-download"], capture_output=True, text=True, timeout=1800)
            assert r.returncode in (0, 1), r.stderr[-2000:]
            report = json.loads(r.stdout)
            report = report[0] if isinstance(report, list) else report
            res = report["results"]
            failed, skipped = ([f for f in res.get(k, []) if f["resource"].startswith("Pod.")]
                               for k in ("failed_checks", "skipped_checks"))
            out[label] = {"pods": pods, "failed": len(failed), "skipped": len(skipped),
                          "failed by check": dict(sorted(Counter(f["check_id"] for f in failed).items())),
                          "pods with a finding": len({(f["file_path"], f["resource"]) for f in failed})}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkov", default=str(ROOT / ".venv-checkov" / "bin" / "checkov"),
                        help="checkov binary ('' skips the scan)")
    args = parser.parse_args(argv)
    found, scan = counts(value_sets())
    print(json.dumps(found, indent=1))
    if args.checkov:
        print(json.dumps({"checkov on the Ray pod templates": checkov(args.checkov, scan)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Render the dapo chart's objects without Helm: the same ConfigMap, PVC and RayJobs as
``helm install <release> charts/dapo -f values/<preset>.yaml``, from the pure functions in ``dapo.k8s``.

    python scripts/render.py --preset full                         # YAML on stdout
    python scripts/render.py --preset full --namespace ml | kubectl apply --server-side -f -
    python scripts/render.py --preset smoke --set worker.shmSize=64Gi --override recipe.trainer.total_training_steps=5
    python scripts/render.py --values values/full.yaml --values values/eval.yaml --release dapo-aime
    python scripts/render.py --preset full --namespace ml --apply  # server-side apply with the kubernetes client
    python scripts/render.py --all --out k8s/rendered              # every preset (`make render`)
    python scripts/render.py --all --out k8s/rendered --check      # exit 1 if a rendered file is stale

``--preset NAME`` takes ``values/NAME.yaml`` when it exists (cluster specifics of that preset) and otherwise just
selects the preset. Values are checked against the chart's values.schema.json and its cross-field rules, and the
preset with its overrides is loaded strictly -- errors name the offending key and exit with status 2.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dapo.config import ConfigError  # noqa: E402
from dapo.k8s import ValuesError, render_objects  # noqa: E402
from dapo.k8s.rules import problems  # noqa: E402

CHART_DIR = ROOT / "charts" / "dapo"
VALUES_DIR = ROOT / "values"

# What `--all` renders into k8s/rendered/<name>.yaml: (values files, release name), matching the commands in the
# header of each values file.
RENDER_SETS: dict[str, tuple[tuple[str, ...], str]] = {
    "early": (("early.yaml",), "dapo"),
    "full": (("full.yaml",), "dapo"),
    "7b": (("7b.yaml",), "dapo"),
    "smoke": (("smoke.yaml",), "dapo-smoke"),
    "tiny": (("tiny.yaml",), "dapo-tiny"),
    "eval": (("full.yaml", "eval.yaml"), "dapo-aime"),
    # the upstream DAPO recipe (verl 4f80e46) beside ours: train.runner reference
    "reference-full": (("full.yaml", "reference.yaml"), "dapo-ref"),
    "reference-early": (("early.yaml", "reference.yaml"), "dapo-ref"),
    # the two-node fabric check per cloud (values/smoke-2node.yaml + the cloud's fabric file)
    "smoke-2node-eks-p5": (("smoke.yaml", "smoke-2node.yaml", "eks-p5.yaml"), "dapo-smoke"),
    "smoke-2node-gke-a3-high": (("smoke.yaml", "smoke-2node.yaml", "gke-a3-high.yaml"), "dapo-smoke"),
    "smoke-2node-gke-a3-mega": (("smoke.yaml", "smoke-2node.yaml", "gke-a3-mega.yaml"), "dapo-smoke"),
    "smoke-2node-gke-a3-ultra": (("smoke.yaml", "smoke-2node.yaml", "gke-a3-ultra.yaml"), "dapo-smoke"),
}


# The cluster `--all` renders for: images from the registry registry.invalid, which cannot resolve (RFC 6761 reserves
# .invalid), so an applied example pulls nothing anyone could have published; ReadWriteMany class rwx-class (the chart
# refuses its own unpublished default images and the values files' placeholder class: dapo.k8s.install_rules). Each
# file's header says so.
PLACEHOLDER_REGISTRY = "registry.invalid"
RENDER_CLUSTER = (f"image.repository={PLACEHOLDER_REGISTRY}/dapo",
                  f"eval.image.repository={PLACEHOLDER_REGISTRY}/dapo-eval",
                  f"train.reference.image.repository={PLACEHOLDER_REGISTRY}/dapo",
                  "storage.storageClassName=rwx-class")
# ... and its network is InfiniBand: the sets that run on several GPU nodes and declare no fabric of their own (the
# chart refuses them otherwise: dapo.k8s.fabric) are rendered with this fabric declared.
RENDER_FABRIC = {"early": ("fabric.expect=ib",), "full": ("fabric.expect=ib",), "7b": ("fabric.expect=ib",)}


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings; quotes for strings another YAML parser could read as numbers."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    if re.match(r"^[-+.]?[0-9]", data):
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style='"')
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str)


def to_yaml(objects: list[dict[str, Any]], header: str = "") -> str:
    docs = [yaml.dump(o, Dumper=_Dumper, sort_keys=False, width=1_000_000, default_flow_style=False)
            for o in objects]
    return header + "---\n" + "---\n".join(docs)


def render_set(name: str, *, namespace: str | None = None) -> list[dict[str, Any]]:
    files, release = RENDER_SETS[name]
    return render_objects(CHART_DIR, [VALUES_DIR / f for f in files], RENDER_CLUSTER + RENDER_FABRIC.get(name, ()),
                          release=release, namespace=namespace)


def header_for(name: str) -> str:
    files, release = RENDER_SETS[name]
    args = " ".join(f"--values values/{f}" for f in files) if len(files) > 1 else f"--preset {name}"
    cluster = RENDER_CLUSTER + RENDER_FABRIC.get(name, ())
    args += "".join(f" --set {s}" for s in cluster)
    helm = " ".join(f"-f values/{f}" for f in files) + "".join(f" --set {s}" for s in cluster)
    return (
        f"# Generated by: python scripts/render.py {args} --release {release}  (regenerate all: make render)\n"
        f"# Same objects as: helm template {release} charts/dapo {helm}\n"
        f"# An example, not a deployment: its images come from {PLACEHOLDER_REGISTRY}, a registry name that never\n"
        "# resolves (RFC 6761); its ReadWriteMany StorageClass is rwx-class"
        + (", its fabric InfiniBand" if name in RENDER_FABRIC else "") + ". Render your own with your\n"
        "# registry and digests (make images REGISTRY=... writes them) and your class"
        + (" and fabric (-f values/<cloud>.yaml)" if name in RENDER_FABRIC else "") + " before applying.\n"
        "# Do not edit: change dapo/presets, values/ or charts/dapo and re-render. No namespace is set: a rendering like\n"
        "# this one is applied with\n"
        "#   kubectl apply --server-side -n <namespace> -f <file>\n"
        "# Without a namespace the log follower's ServiceAccount, Role and RoleBinding are left out (a RoleBinding\n"
        "# names its ServiceAccount's namespace): it then ends the run on its attempt logs alone; so is the start\n"
        "# guard (dapo/k8s/start_guard.py). For them, render with --namespace <namespace>.\n"
    )


def apply(objects: list[dict[str, Any]], namespace: str | None) -> None:
    from kubernetes import config as kconfig
    from kubernetes import dynamic
    from kubernetes.client import api_client

    try:
        kconfig.load_kube_config()
    except kconfig.ConfigException:
        kconfig.load_incluster_config()
    from kubernetes.dynamic.exceptions import NotFoundError

    from dapo.k8s.upgrade import follower_refusal, upgrade_refusal

    client = dynamic.DynamicClient(api_client.ApiClient())

    def live_object(api_version: str, kind: str, name: str, ns: str):
        try:
            return client.resources.get(api_version=api_version, kind=kind).get(name=name, namespace=ns).to_dict()
        except NotFoundError:
            return None

    # the chart's upgrade guards: never change the spec of an existing RayJob (its next retry would run the change),
    # nor the pod template of a log follower Job (immutable), nor keep a follower whose RayJob is gone
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for obj in objects:
        ns = obj["metadata"].get("namespace") or namespace or "default"
        name = obj["metadata"]["name"]
        if obj["kind"] == "RayJob":
            kind = obj["metadata"]["labels"]["app.kubernetes.io/component"]
            follower = f"{name}-logs" if ("Job", f"{name}-logs") in names else None
            refusal = upgrade_refusal(kind, obj, live_object(obj["apiVersion"], "RayJob", name, ns), ns, follower)
        elif obj["kind"] == "Job" and name.endswith("-logs"):
            rayjob = name[: -len("-logs")]
            live = live_object("batch/v1", "Job", name, ns)
            refusal = live and follower_refusal(obj, live, rayjob, live_object("ray.io/v1", "RayJob", rayjob, ns)
                                                is not None, ns)
        else:
            continue
        if refusal:
            raise ValuesError(refusal)
    for obj in objects:
        res = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        ns = obj["metadata"].get("namespace") or namespace or "default"
        client.server_side_apply(res, body=obj, namespace=ns, field_manager="dapo-render", force_conflicts=False)
        print(f"{obj['kind']}/{obj['metadata']['name']} applied (server-side) in namespace {ns}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        return _render_all(ap, args) if args.all else _render_one(ap, args)
    except (ValuesError, ConfigError) as exc:
        print(f"render.py: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="scripts/render.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", help="preset to render (uses values/<preset>.yaml when present)")
    ap.add_argument("-f", "--values", action="append", default=[], type=Path, help="values file (repeatable)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="chart value, e.g. worker.shmSize=64Gi (repeatable; VALUE is parsed as YAML)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="training override appended to `overrides`, e.g. recipe.trainer.total_training_steps=5")
    ap.add_argument("--release", default=None, help="release name (default: dapo, or the preset's usual one)")
    ap.add_argument("--namespace", "-n", default=None, help="metadata.namespace (default: none, kubectl's current)")
    ap.add_argument("--out", type=Path, default=None, help="write <out>/<preset>.yaml instead of stdout")
    ap.add_argument("--all", action="store_true", help="render every preset of values/ into --out")
    ap.add_argument("--check", action="store_true", help="with --all: fail if a file under --out is not up to date")
    ap.add_argument("--apply", action="store_true", help="server-side apply with the kubernetes client")
    return ap


def _render_all(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--all``: every set of values/ into ``--out`` (``--check``: 1 when a file there is not up to date)."""
    if not args.out:
        ap.error("--all needs --out DIR")
    if args.preset or args.values or args.set or args.override or args.apply:
        ap.error("--all renders the fixed sets of values/; it takes no other inputs")
    stale = []
    args.out.mkdir(parents=True, exist_ok=True)
    for name in RENDER_SETS:
        text = to_yaml(render_set(name), header_for(name))
        path = args.out / f"{name}.yaml"
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
            print(f"wrote {path}", file=sys.stderr)
    if stale:
        print("stale rendered manifests (run `make render`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


def _render_one(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """One preset (or values files) to stdout, ``--out`` or the cluster (``--apply``); 2 when KubeRay would reject
    an object."""
    if args.check:
        ap.error("--check works with --all")
    files: list[Path] = []
    release = args.release
    name = args.preset or "manifests"
    if args.preset in RENDER_SETS:
        set_files, set_release = RENDER_SETS[args.preset]
        files += [VALUES_DIR / f for f in set_files]
        release = release or set_release
    elif args.preset and (VALUES_DIR / f"{args.preset}.yaml").exists():
        files.append(VALUES_DIR / f"{args.preset}.yaml")
    files += args.values
    extra: dict[str, Any] = {}
    if args.preset and args.preset not in RENDER_SETS and not (VALUES_DIR / f"{args.preset}.yaml").exists():
        extra["preset"] = args.preset
    sets = list(args.set)
    objects_values_extra = extra or None
    if args.override:
        # appended after every other source of `overrides`
        from dapo.k8s import load_values

        base = load_values(CHART_DIR, files, sets, objects_values_extra)
        objects_values_extra = {**(objects_values_extra or {}), "overrides": list(base["overrides"]) + args.override}
    objects = render_objects(CHART_DIR, files, sets, release=release or "dapo", namespace=args.namespace,
                             extra=objects_values_extra)
    found = [f"{o['kind']}/{o['metadata']['name']}: {p}" for o in objects for p in problems(o)]
    if found:
        print("render.py: KubeRay would reject:\n  " + "\n  ".join(found), file=sys.stderr)
        return 2
    if args.apply:
        apply(objects, args.namespace)
        return 0
    text = to_yaml(objects)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{name}.yaml").write_text(text)
        print(f"wrote {args.out / f'{name}.yaml'}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

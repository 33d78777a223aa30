#!/usr/bin/env python3
"""Render the dapo chart without a ``helm`` binary: ``helm template <release> charts/dapo -n <namespace> -f ...
--set ...`` through Helm's own engine, in-process (the Helm SDK, :mod:`dapo.k8s.helm`), for ``kubectl apply``.

    python scripts/render.py --preset full -n dapo                 # YAML on stdout
    python scripts/render.py --preset full -n dapo | kubectl apply --server-side -f -
    python scripts/render.py --preset smoke --set worker.shmSize=64Gi --override recipe.trainer.total_training_steps=5
    python scripts/render.py -f values/full.yaml -f values/eval.yaml --release dapo-aime
    python scripts/render.py --preset full -n dapo --apply         # server-side apply with the kubernetes client
    python scripts/render.py --all --out k8s/rendered              # every set of values/ (`make render`)
    python scripts/render.py --all --out k8s/rendered --check      # exit 1 if a rendered file is stale

``-f``/``--values``, ``--set``, ``--set-string``, ``--set-json`` and ``--set-file`` mean what they mean to Helm (the
same parser, the same order: files, then --set-json, --set, --set-string, --set-file). ``--preset NAME`` adds
``-f values/NAME.yaml`` when that file exists and otherwise ``--set-json preset="NAME"`` before every other --set.
The output is what ``helm template --skip-tests`` prints: the pre-install preflight first, the post-install start
guard last. Helm's refusals (the schema, the chart's rules) exit with status 2 and Helm's message; the values the
install still needs come in one message, a line each with its fix.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dapo.k8s import ValuesError  # noqa: E402
from dapo.k8s import helm  # noqa: E402
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
    "one-gpu": (("one-gpu.yaml",), "dapo-one-gpu"),
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
# refuses its own unpublished default images and the values files' placeholder class). Each
# file's header says so.
PLACEHOLDER_REGISTRY = "registry.invalid"
RENDER_CLUSTER = (f"image.repository={PLACEHOLDER_REGISTRY}/dapo",
                  f"eval.image.repository={PLACEHOLDER_REGISTRY}/dapo-eval",
                  f"train.reference.image.repository={PLACEHOLDER_REGISTRY}/dapo",
                  "storage.storageClassName=rwx-class")
# ... and its network is InfiniBand: the sets that run on several GPU nodes and declare no fabric of their own (the
# chart refuses them otherwise) are rendered with this fabric declared.
RENDER_FABRIC = {"early": ("fabric.expect=ib",), "full": ("fabric.expect=ib",), "7b": ("fabric.expect=ib",)}


# ... in this namespace (the README's).
RENDER_NAMESPACE = "dapo"


def ordered(manifests: list[helm.Manifest]) -> list[helm.Manifest]:
    """What ``helm template --skip-tests`` prints, for kubectl: no `helm test` pods; the pre-install hooks (the
    preflight) first, then the release's objects in template order, then the post-install hooks (the start guard)."""
    kept = [m for m in manifests if "test" not in m.hooks]
    pre = [m for m in kept if any(h.startswith("pre-") for h in m.hooks)]
    post = [m for m in kept if m.hooks and m not in pre]
    return pre + [m for m in kept if not m.hooks] + post


def to_yaml(manifests: list[helm.Manifest], header: str = "") -> str:
    return header + "".join(f"---\n# Source: {m.source}\n{m.text}" + ("" if m.text.endswith("\n") else "\n")
                            for m in manifests)


def render(opts: helm.ValueOptions, *, release: str, namespace: str, overrides: tuple[str, ...] = ()
           ) -> list[helm.Manifest]:
    """The objects of ``helm template <release> charts/dapo -n <namespace> <opts> --skip-tests``; ``overrides``
    appended to the values' ``overrides``."""
    values = helm.user_values(opts)
    if overrides:
        values["overrides"] = list(helm.coalesced(CHART_DIR, values)["overrides"]) + list(overrides)
    return ordered(helm.render(CHART_DIR, values, release=release, namespace=namespace))


def set_options(name: str) -> helm.ValueOptions:
    files, _ = RENDER_SETS[name]
    return helm.ValueOptions(files=[str(VALUES_DIR / f) for f in files],
                             set=list(RENDER_CLUSTER + RENDER_FABRIC.get(name, ())))


def render_set(name: str, *, namespace: str = RENDER_NAMESPACE) -> list[helm.Manifest]:
    return render(set_options(name), release=RENDER_SETS[name][1], namespace=namespace)


def header_for(name: str) -> str:
    files, release = RENDER_SETS[name]
    args = " ".join(f"-f values/{f}" for f in files) if len(files) > 1 else f"--preset {name}"
    cluster = RENDER_CLUSTER + RENDER_FABRIC.get(name, ())
    sets = "".join(f" --set {s}" for s in cluster)
    helm_args = " ".join(f"-f values/{f}" for f in files) + sets
    return (
        f"# Generated by: python scripts/render.py {args}{sets} --release {release} -n {RENDER_NAMESPACE}"
        "  (regenerate all: make render)\n"
        f"# Same objects as: helm template {release} charts/dapo -n {RENDER_NAMESPACE} {helm_args} --skip-tests\n"
        f"# An example, not a deployment: its images come from {PLACEHOLDER_REGISTRY}, a registry name that never\n"
        "# resolves (RFC 6761); its ReadWriteMany StorageClass is rwx-class"
        + (", its fabric InfiniBand" if name in RENDER_FABRIC else "") + ". Render your own with your\n"
        "# registry and digests (make images REGISTRY=... writes them) and your class"
        + (" and fabric (-f values/<cloud>.yaml)" if name in RENDER_FABRIC else "") + " before applying.\n"
        "# Do not edit: change dapo/presets, values/ or charts/dapo and re-render.\n"
    )


def apply(objects: list[dict[str, Any]], namespace: str) -> None:
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
        ns = obj["metadata"].get("namespace") or namespace
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
        ns = obj["metadata"].get("namespace") or namespace
        client.server_side_apply(res, body=obj, namespace=ns, field_manager="dapo-render", force_conflicts=False)
        print(f"{obj['kind']}/{obj['metadata']['name']} applied (server-side) in namespace {ns}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        return _render_all(ap, args) if args.all else _render_one(ap, args)
    except ValuesError as exc:
        print(f"render.py: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="scripts/render.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", help="preset to render (adds -f values/<preset>.yaml when present)")
    helm.add_value_flags(ap)
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="training override appended to `overrides`, e.g. recipe.trainer.total_training_steps=5")
    ap.add_argument("--release", default=None, help="release name (default: dapo, or the preset's usual one)")
    ap.add_argument("--namespace", "-n", default="default", help="the release's namespace (default: default, as "
                    "helm template without a kubeconfig)")
    ap.add_argument("--out", type=Path, default=None, help="write <out>/<preset>.yaml instead of stdout")
    ap.add_argument("--all", action="store_true", help="render every set of values/ into --out")
    ap.add_argument("--check", action="store_true", help="with --all: fail if a file under --out is not up to date")
    ap.add_argument("--apply", action="store_true", help="server-side apply with the kubernetes client")
    return ap


def _render_all(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--all``: every set of values/ into ``--out`` (``--check``: 1 when a file there is not up to date)."""
    if not args.out:
        ap.error("--all needs --out DIR")
    if args.preset or helm.options_from(args).args() or args.override or args.apply:
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


def preset_options(args: argparse.Namespace) -> tuple[helm.ValueOptions, str | None]:
    """The value flags with ``--preset`` resolved, and the preset's usual release name."""
    opts = helm.options_from(args)
    release = None
    if args.preset in RENDER_SETS:
        set_files, release = RENDER_SETS[args.preset]
        opts.files[:0] = [str(VALUES_DIR / f) for f in set_files]
    elif args.preset and (VALUES_DIR / f"{args.preset}.yaml").exists():
        opts.files.insert(0, str(VALUES_DIR / f"{args.preset}.yaml"))
    elif args.preset:
        opts.set_json.insert(0, f"preset={json.dumps(args.preset)}")
    return opts, release


def _render_one(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """One release to stdout, ``--out`` or the cluster (``--apply``); 2 when Helm refuses the values or KubeRay
    would reject an object."""
    if args.check:
        ap.error("--check works with --all")
    opts, release = preset_options(args)
    manifests = render(opts, release=args.release or release or "dapo", namespace=args.namespace,
                       overrides=tuple(args.override))
    found = [f"{m.obj['kind']}/{m.obj['metadata']['name']}: {p}" for m in manifests for p in problems(m.obj)]
    if found:
        print("render.py: KubeRay would reject:\n  " + "\n  ".join(found), file=sys.stderr)
        return 2
    if args.apply:
        apply([m.obj for m in manifests], args.namespace)
        return 0
    text = to_yaml(manifests)
    if args.out:
        name = args.preset or "manifests"
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{name}.yaml").write_text(text)
        print(f"wrote {args.out / f'{name}.yaml'}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``dapo doctor``: the command line of :mod:`dapo.k8s.doctor` -- whether this cluster can run the release these
values describe, before anything is installed.

    dapo doctor -n dapo -f values/full.yaml --set storage.storageClassName=fsx-lustre --set image.repository=...

``-f`` / ``--set`` / ``--set-string`` / ``--set-json`` / ``--set-file`` are those of ``helm upgrade --install`` and
``scripts/render.py``: the values are read and the objects rendered by Helm's own code (:mod:`dapo.k8s.helm`), and the
preset is loaded strictly with its overrides (which Helm cannot do); the cluster is the kubeconfig's (``--kubeconfig``, ``--context``). Prints one table and
exits 1 when a check failed (the run cannot start as installed), 2 when the values are refused or the API server
cannot be reached, 0 otherwise.
"""

from __future__ import annotations

import argparse
import posixpath
import shlex
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from dapo.k8s.doctor import Release

CHART = Path(__file__).resolve().parents[2] / "charts" / "dapo"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dapo doctor", description="Whether this cluster can run the release these "
                                 "values describe, checked before anything is installed (docs/chart.md#dapo-doctor): one table; "
                                 "exit 1 when the run cannot start, 2 when the values are refused or the API server "
                                 "cannot be reached.")
    from dapo.k8s.helm import add_value_flags

    add_value_flags(ap)
    ap.add_argument("-n", "--namespace", default=None, help="the release's namespace (default: the kubeconfig's)")
    ap.add_argument("--release", default="dapo", help="the release name (default: dapo)")
    ap.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    ap.add_argument("--context", default=None, help="kubeconfig context (default: the current one)")
    ap.add_argument("--chart", type=Path, default=CHART, help="the chart directory (default: this checkout's)")
    return ap


def read_release(chart: Path, user: dict[str, Any], *, release: str, namespace: str) -> Release:
    """The release these user values make, by Helm's own code, its preset loaded strictly as the entrypoint will.
    Raises ValuesError / ConfigError for values refused."""
    from dapo.k8s import helm

    values = helm.coalesced(chart, user)
    manifests, notes = helm.render_release(chart, user, release=release, namespace=namespace)
    objects = [m.obj for m in manifests if "test" not in m.hooks]
    validate_preset(objects)
    return Release(values, objects, notes)


def validate_preset(objects: list[dict[str, Any]]) -> None:
    """Load the preset as the training RayJob's entrypoint will, before anything is installed (Helm cannot): the
    entrypoint's arguments read by ``dapo train``'s own parser, the preset files from the ConfigMap the workers mount
    where ``--preset`` points (the driver runs on a worker). Nothing to load when no RayJob runs ``dapo.train`` (the
    evaluation alone, or the reference recipe, whose overrides are verl 4f80e46's). Raises ConfigError naming the
    offending key, ValuesError when the preset the entrypoint names is not mounted."""
    from dapo.config import ConfigError, load_preset, split_overrides
    from dapo.k8s import ValuesError
    from dapo.train.cli import build_parser

    for job in (o for o in objects if o["kind"] == "RayJob"):
        argv = shlex.split(job["spec"].get("entrypoint") or "")
        if "dapo.train" not in argv:
            continue
        args, unknown = build_parser().parse_known_args(argv[argv.index("dapo.train") + 1:])
        if unknown:
            raise ValuesError(f"overrides: the training entrypoint would stop at once: `dapo train` does not take "
                              f"{' '.join(unknown)} (an override is key=value)")
        ours, _verl = split_overrides(args.overrides)
        folder, name = posixpath.split(args.preset)
        files = _mounted_config_map(job, objects, folder)
        if name not in files:
            raise ValuesError(f"train.presetDir: the entrypoint's --preset {args.preset} is not in the ConfigMap the "
                              f"workers mount at {folder or '(no folder)'}")
        with tempfile.TemporaryDirectory(prefix="dapo-preset-") as tmp:
            for key, text in files.items():
                Path(tmp, key).write_text(text)
            try:
                load_preset(str(Path(tmp, name)), ours)
            except ConfigError as exc:  # named as the pod would name it: the mounted path
                raise ConfigError(str(exc).replace(tmp, folder)) from None


def _mounted_config_map(job: dict[str, Any], objects: list[dict[str, Any]], folder: str) -> dict[str, str]:
    """The data of the rendered ConfigMap that the RayJob's workers mount at ``folder`` ({} when none is)."""
    groups = job["spec"]["rayClusterSpec"].get("workerGroupSpecs") or []
    pod = groups[0]["template"]["spec"] if groups else {}
    mounts = {m["name"] for c in pod.get("containers") or [] for m in c.get("volumeMounts") or []
              if m["mountPath"].rstrip("/") == folder.rstrip("/")}
    names = {v["configMap"]["name"] for v in pod.get("volumes") or [] if v["name"] in mounts and "configMap" in v}
    for o in objects:
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] in names:
            return dict(o.get("data") or {})
    return {}


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    from dapo.config import ConfigError
    from dapo.k8s import ValuesError, helm
    from dapo.k8s.doctor import CannotRead, Cluster, Doctor, exit_code, table
    from dapo.k8s.doctor_checks import run

    try:
        cluster = Cluster(args.kubeconfig, args.context)
        cluster.get("/version")
    except CannotRead as exc:
        print(f"dapo doctor: {exc}", file=sys.stderr)
        return 2
    namespace = args.namespace or cluster.namespace
    try:
        found = read_release(args.chart, helm.user_values(helm.options_from(args)), release=args.release,
                             namespace=namespace)
    except (ValuesError, ConfigError) as exc:
        print(f"dapo doctor: {exc}", file=sys.stderr)
        return 2
    rows = run(Doctor(found, namespace, cluster))
    print(f"dapo doctor: release {args.release} in namespace {namespace}, {cluster.client.configuration.host}")
    print(table(rows))
    counts = Counter(r.verdict for r in rows)
    code = exit_code(rows)
    verdict = "the run cannot start as these values install it" if code else "nothing found that stops the run"
    print(f"\n{counts['ok']} ok, {counts['warn']} warn, {counts['FAIL']} FAIL: {verdict}")
    return code


if __name__ == "__main__":
    sys.exit(main())

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
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Optional

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


def read_release(chart: Path, user: dict[str, Any], *, release: str, namespace: str
                 ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(``.Values``, the objects ``helm upgrade --install`` would create but the ``helm test`` pods) of these user
    values, by Helm's own code; the preset loaded strictly. Raises ValuesError / ConfigError for values refused."""
    from dapo.k8s import helm, validate_preset

    values = helm.coalesced(chart, user)
    objects = [m.obj for m in helm.render(chart, user, release=release, namespace=namespace) if "test" not in m.hooks]
    validate_preset(values)
    return values, objects


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
        values, objects = read_release(args.chart, helm.user_values(helm.options_from(args)), release=args.release,
                                       namespace=namespace)
    except (ValuesError, ConfigError) as exc:
        print(f"dapo doctor: {exc}", file=sys.stderr)
        return 2
    rows = run(Doctor(values, objects, namespace, cluster))
    print(f"dapo doctor: release {args.release} in namespace {namespace}, {cluster.client.configuration.host}")
    print(table(rows))
    counts = Counter(r.verdict for r in rows)
    code = exit_code(rows)
    verdict = "the run cannot start as these values install it" if code else "nothing found that stops the run"
    print(f"\n{counts['ok']} ok, {counts['warn']} warn, {counts['FAIL']} FAIL: {verdict}")
    return code


if __name__ == "__main__":
    sys.exit(main())

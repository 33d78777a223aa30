"""The Helm chart ``charts/dapo`` from Python, and what is checked against the cluster before it is installed.

- :mod:`dapo.k8s.helm`: the chart through Helm's own code in-process (the Helm SDK): ``-f``/``--set``/``--set-string``/
  ``--set-json``/``--set-file`` read as Helm reads them, the objects rendered by Helm's engine. ``scripts/render.py``
  and ``dapo doctor`` render with it; the modules below that build objects are a Python twin the tests still compare
  with Helm.
- :mod:`dapo.k8s.versions`: the pinned image / Ray / KubeRay versions.
- :mod:`dapo.k8s.presets`: the preset files the chart mounts, and what the chart reads from them.
- :mod:`dapo.k8s.values`: Helm-style value merging, the values schema, the chart's cross-field rules.
- :mod:`dapo.k8s.install_rules`: what the cluster must already have: published images, a real StorageClass.
- :mod:`dapo.k8s.fabric`: which runs must declare their network fabric, and the fabric check their entrypoint starts with.
- :mod:`dapo.k8s.context`: what every object knows: the checked values, names, labels, metadata.
- :mod:`dapo.k8s.pods`: the Ray head and worker pod templates (containers, volumes, init containers).
- :mod:`dapo.k8s.rayjobs`: the training and evaluation RayJobs.
- :mod:`dapo.k8s.followers`: a log follower Job per RayJob (``kubectl logs -f job/<release>-train-logs``), its RBAC.
- :mod:`dapo.k8s.upgrade`: the RayJob spec hash and the upgrade guard built on it.
- :mod:`dapo.k8s.helm_tests`: the `helm test` hook pods.
- :mod:`dapo.k8s.preflight`: the preflight Job, a pre-install hook that checks image, driver and storage first.
- :mod:`dapo.k8s.manifests`: every object (ConfigMap, followers, PDB, PVC, the RayJobs): :class:`Chart`, :func:`build`.
- :mod:`dapo.k8s.rules`: KubeRay controller rules that the CRD schemas do not encode.
- :mod:`dapo.k8s.security`: Ray token auth (``authOptions``), the NetworkPolicy, the restricted securityContexts,
  the Pod Security profile the values need.
- :mod:`dapo.k8s.start_guard`: the start guard Job (post-install hook, no gang scheduler): a run whose pods never
  started is stopped instead of retried blindly.
- :mod:`dapo.k8s.capacity`: where a pod of the chart fits on the cluster's nodes (selectors, affinity, taints,
  allocatable minus the requests of running pods) and what an autoscaler says it can add: for ``dapo doctor``.
- :mod:`dapo.k8s.doctor`, :mod:`dapo.k8s.doctor_checks`, ``dapo.k8s.doctor_cli`` (``dapo doctor``): whether the
  cluster can run the release, read through the ``kubernetes`` client with the user's kubeconfig before anything is
  installed. They live here, not in :mod:`dapo.cluster`: they need this package's values loading and renderer (the
  same ``-f`` / ``--set`` as Helm and ``scripts/render.py``) and the client, and ``dapo.cluster`` -- the programs
  inside the pods, in every image -- is held to the standard library (tests/test_layout.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import yaml

from dapo.k8s.manifests import HELM_ONLY_LABELS, Chart, build
from dapo.k8s.presets import ValuesError


def load_values(chart_dir: Path, value_files: Iterable[Path] = (), sets: Iterable[str] = (),
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """``.Values`` as the templates see it for ``helm template -f <value_files> --set <sets>`` with ``extra`` merged
    over them: read, coalesced with the chart's defaults and checked against values.schema.json by Helm's own code
    (:mod:`dapo.k8s.helm`)."""
    from dapo.k8s import helm

    user = helm.user_values(helm.ValueOptions(files=[str(f) for f in value_files], set=list(sets)))
    if extra:
        user = helm.merge_maps(user, extra)
    return helm.coalesced(chart_dir, user)


def validate_preset(values: dict[str, Any]) -> None:
    """Load the preset strictly with the overrides the entrypoint will pass (Helm cannot do this)."""
    from dapo.config import load_preset
    from dapo.k8s.presets import merged_preset
    from dapo.k8s.values import placement
    from dapo.config import split_overrides

    pl = placement(values, merged_preset(values["preset"]))
    ours, _verl = split_overrides(list(values["overrides"]))
    if pl["backend"] != "local":
        ours += [f"placement.nodes={pl['nodes']}", f"placement.gpus_per_node={pl['gpus']}"]
    load_preset(values["preset"], ours)


def render_objects(chart_dir: Path, value_files: Iterable[Path] = (), sets: Iterable[str] = (), *,
                   release: str = "dapo", namespace: str | None = None,
                   extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """What ``helm template <release> charts/dapo -n <namespace> -f ... --set ...`` renders, without Helm.
    ``namespace=None`` leaves metadata.namespace out (kubectl's current namespace applies)."""
    meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    values = load_values(chart_dir, value_files, sets, extra)
    objects = build(values, release=release, namespace=namespace, chart_name=meta["name"],
                    app_version=str(meta["appVersion"]))
    validate_preset(values)
    return objects


__all__ = ["HELM_ONLY_LABELS", "Chart", "ValuesError", "build", "load_values", "render_objects", "validate_preset"]

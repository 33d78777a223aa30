"""The Helm chart ``charts/dapo`` from Python, and what is checked against the cluster before it is installed.

The chart is the only description of the release's objects: whatever renders them here renders them through Helm's
own engine (:mod:`dapo.k8s.helm`), so there is no second renderer to keep equal to it.

- :mod:`dapo.k8s.helm`: the chart through Helm's own code in-process (the Helm SDK): ``-f``/``--set``/``--set-string``/
  ``--set-json``/``--set-file`` read as Helm reads them, the objects rendered by Helm's engine. ``scripts/render.py``
  and ``dapo doctor`` render with it.
- :mod:`dapo.k8s.versions`: the KubeRay version and name limits (the images are pinned in values.yaml).
- :mod:`dapo.k8s.presets`: the preset chain with the chart's error type (:class:`ValuesError`), for ``dapo plan``.
- :mod:`dapo.k8s.rules`: KubeRay controller rules that the CRD schemas do not encode, checked on what
  ``scripts/render.py`` renders.
- :mod:`dapo.k8s.upgrade`: the upgrade guards of ``scripts/render.py --apply`` (the chart's ``dapo.upgradeGuard`` and
  ``dapo.followerGuard``, which need a live cluster).
- :mod:`dapo.k8s.security`: the Pod Security level a namespace needs, as the chart's NOTES name it (``dapo doctor``).
- :mod:`dapo.k8s.capacity`: where a pod of the chart fits on the cluster's nodes (selectors, affinity, taints,
  allocatable minus the requests of running pods) and what an autoscaler says it can add: for ``dapo doctor``.
- :mod:`dapo.k8s.doctor`, :mod:`dapo.k8s.doctor_checks`, ``dapo.k8s.doctor_cli`` (``dapo doctor``): whether the
  cluster can run the release, read through the ``kubernetes`` client with the user's kubeconfig before anything is
  installed. They live here, not in :mod:`dapo.cluster`: they need this package's values loading and Helm rendering
  (the same ``-f`` / ``--set`` as Helm and ``scripts/render.py``) and the client, and ``dapo.cluster`` -- the programs
  inside the pods, in every image -- is held to the standard library (tests/test_layout.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

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


__all__ = ["ValuesError", "load_values"]

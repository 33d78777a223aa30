"""The README's first screen is the job: what this is, the two local commands, the cluster path (operator, Secret,
``helm install``, ``kubectl logs -f``), ``render.py``, evaluation, then the contents; everything else lives in the
docs it links, and every doc is linked."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
FIRST_SCREEN = 40


def test_the_first_screen_holds_the_local_and_the_cluster_commands():
    head = "\n".join(README.splitlines()[:FIRST_SCREEN])
    for needle in ("make train", "make test", "helm upgrade --install kuberay-operator", "create secret generic",
                   "helm install dapo charts/dapo", "kubectl logs -n dapo -f job/dapo-train-logs",
                   "python scripts/render.py --preset", "values/eval.yaml", "## Contents"):
        assert needle in head, f"the README's first {FIRST_SCREEN} lines lack {needle!r}"


def test_the_cluster_path_gets_the_images_first_and_points_the_chart_at_them():
    head = "\n".join(README.splitlines()[:FIRST_SCREEN])
    steps = ["make images REGISTRY=", "helm upgrade --install kuberay-operator", "create secret generic",
             "helm install dapo charts/dapo", "kubectl logs -n dapo -f job/dapo-train-logs"]
    at = [head.index(step) for step in steps]
    assert at == sorted(at), "the cluster path: images, operator, Secret, helm install, kubectl logs -f"
    install = head[at[3]:at[4]]
    # the values file `make images` writes: both repositories and their digests (tests/test_docker.py)
    assert "-f build/images/values.yaml" in install


def test_the_readme_links_every_doc_and_every_link_resolves():
    links = {m.group(1) for m in re.finditer(r"\]\(([^)#\s]+)", README) if "://" not in m.group(1)}
    missing = sorted(link for link in links if not (ROOT / link).exists())
    assert not missing, f"README links to files that do not exist: {missing}"
    unlinked = sorted({p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")} - links)
    assert not unlinked, f"docs the README does not link: {unlinked}"

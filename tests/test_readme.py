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
                   "helm upgrade --install dapo charts/dapo", "kubectl logs -n dapo -f job/dapo-train-logs",
                   "python scripts/render.py --preset", "values/eval.yaml", "## Contents"):
        assert needle in head, f"the README's first {FIRST_SCREEN} lines lack {needle!r}"


def test_the_cluster_path_gets_the_images_first_and_points_the_chart_at_them():
    head = "\n".join(README.splitlines()[:FIRST_SCREEN])
    steps = ["make images REGISTRY=", "helm upgrade --install kuberay-operator", "create secret generic",
             "dapo doctor -n dapo", "helm upgrade --install dapo charts/dapo", "kubectl logs -n dapo -f job/dapo-train-logs"]
    at = [head.index(step) for step in steps]
    assert at == sorted(at), "the cluster path: images, operator, Secret, dapo doctor, helm install, kubectl logs -f"
    install = head[at[4]:at[5]]
    # the values file `make images` writes: both repositories and their digests (tests/test_docker.py)
    assert "-f build/images/values.yaml" in install


def test_the_readme_links_every_doc_and_every_link_resolves():
    links = {m.group(1) for m in re.finditer(r"\]\(([^)#\s]+)", README) if "://" not in m.group(1)}
    missing = sorted(link for link in links if not (ROOT / link).exists())
    assert not missing, f"README links to files that do not exist: {missing}"
    unlinked = sorted({p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")} - links)
    assert not unlinked, f"docs the README does not link: {unlinked}"


def test_the_install_line_can_be_run_again_after_a_failed_preflight():
    # `helm install` refuses a name in use after a failed install; `helm upgrade --install` installs again, and the
    # preflight is a pre-upgrade hook too while the RayJob does not exist (tests/test_preflight_chart.py)
    head = " ".join("\n".join(README.splitlines()[:FIRST_SCREEN]).split())
    assert "helm install dapo " not in head
    assert "kubectl -n dapo logs job/dapo-preflight --all-containers" in head


def test_the_render_line_renders_what_the_install_line_installs_and_names_early_for_what_it_is():
    import yaml

    head = " ".join("\n".join(README.splitlines()[:FIRST_SCREEN]).split())
    install = re.search(r"helm upgrade --install dapo charts/dapo -n (\S+) -f values/(\w+)\.yaml((?: -f \"?values/[\w$]+\.yaml\"?)*)"
                        r"(.*?)#", head)
    render = re.search(r"`python scripts/render.py --preset (\w+)((?: -f \"?values/[\w$]+\.yaml\"?)*) -n (\S+)` with the same "
                       r"(?:(\w+) )?`--set` items?( and `-f build/images/values\.yaml`)?", head)
    assert install and render, head
    assert (render.group(1), render.group(2), render.group(3)) == (install.group(2), install.group(3), install.group(1))
    sets = re.findall(r"--set ", install.group(4))
    assert (render.group(4) or "one") == {1: "one", 2: "two", 3: "three", 4: "four"}[len(sets)]
    # the images' values file make images writes (their digests): named by both lines or neither
    assert bool(render.group(5)) == ("-f build/images/values.yaml" in install.group(4))
    plan = yaml.safe_load((ROOT / "charts" / "dapo" / "files" / "requirements.yaml").read_text())["presets"]["early"]
    assert (f"`--preset early` is the AIME-44 recipe, {plan['plan']['rolloutSteps']:,} rollout steps "
            f"(~{round(plan['plan']['gpuHours'], -3):,} GPU-hours in `dapo plan`)") in head


def test_dapo_doctor_checks_the_values_the_install_line_installs_before_it():
    head = " ".join("\n".join(README.splitlines()[:FIRST_SCREEN]).split())
    doctor = re.search(r"dapo doctor -n (\S+)((?: -f values/\w+\.yaml)+)(.*?)#", head)
    install = re.search(r"helm upgrade --install dapo charts/dapo -n (\S+)((?: -f values/\w+\.yaml)+)(.*?)#", head)
    assert doctor and install and doctor.start() < install.start()
    assert doctor.groups()[:2] == install.groups()[:2]
    assert "values/kueue.yaml" in install.group(2)  # gang admission on the README's path
    # the install's --set items that the release's objects depend on (eval.image is the later eval release's)
    sets = set(re.findall(r"--set (\S+)", install.group(3))) - {'eval.image.repository="$REGISTRY/dapo-eval"'}
    assert set(re.findall(r"--set (\S+)", doctor.group(3))) == sets

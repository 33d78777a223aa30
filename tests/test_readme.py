"""The README is the job: what this is and what has run where on its first screen, the two local commands, then the
cluster path in the order a platform engineer runs it -- images, operator, namespace and Secret, Kueue, the CLI,
`dapo doctor`, the one-node smoke, the two-node smoke with the cloud file, `full` -- each step with what it prints;
the same commands, in the same order, as docs/deploy.md's runbook; everything else lives in the docs it links, and
every doc is linked."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
FIRST_SCREEN = 15


def _cluster_block(text: str = README) -> str:
    """The fenced block of the README's "On a cluster" section, continuation lines joined."""
    section = text.split("## On a cluster", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```bash\n(.*?)^```", section, flags=re.S | re.M)
    assert block, "the README's cluster section has no command block"
    return block.group(1).replace("\\\n", " ")


def _commands(block: str) -> list[str]:
    return [" ".join(ln.split("#", 1)[0].split()) for ln in block.splitlines() if ln.strip() and
            not ln.lstrip().startswith("#")]


def _steps(block: str) -> list[tuple[str, list[str]]]:
    """(the step's comment, its lines) for each `# N. ...` comment of the block."""
    out: list[tuple[str, list[str]]] = []
    for ln in block.splitlines():
        if re.match(r"# \d+\. ", ln):
            out.append((ln, []))
        elif out:
            out[-1][1].append(ln)
    return out


def test_the_first_screen_says_what_has_run_where():
    head = " ".join("\n".join(README.splitlines()[:FIRST_SCREEN]).split())
    for needle in ("everything here ran on CPU", "No image has been built", "nothing has run on a GPU",
                   "no AIME score has been reproduced by this bundle"):
        assert needle in head, f"the README's first {FIRST_SCREEN} lines lack {needle!r}"


def test_the_readme_holds_the_local_and_the_cluster_commands_and_a_place_for_one_gpu():
    local = README.split("## On this machine", 1)[1].split("\n## ", 1)[0]
    assert "make train" in local and "make test" in local
    assert re.search(r"^One GPU: ", local, re.M), "the local section's one-GPU line"
    for needle in ("helm upgrade --install kuberay-operator", "create secret generic",
                   "helm upgrade --install dapo charts/dapo", "kubectl logs -n dapo -f job/dapo-train-logs",
                   "python scripts/render.py --preset", "values/eval.yaml", "## Contents"):
        assert needle in README, f"the README lacks {needle!r}"


# the cluster path, in order: each (what, a pattern of its command line)
PATH_STEPS = [
    ("the images", r"^make images REGISTRY="),
    ("the operator", r"^helm upgrade --install kuberay-operator "),
    ("the namespace", r"^kubectl create namespace dapo "),
    ("the Secret", r"create secret generic dapo-secrets"),
    ("Kueue", r"^helm upgrade --install kueue "),
    ("Kueue's queues", r"^kubectl apply --server-side -f k8s/kueue\.yaml"),
    ("the CLI", r"^(uv tool install|pip install) "),
    ("dapo doctor for the smoke", r"^dapo doctor -n dapo -f values/smoke\.yaml"),
    ("the one-node smoke", r"^helm upgrade --install dapo-smoke charts/dapo -n dapo -f values/smoke\.yaml --"),
    ("its log", r"^kubectl logs -n dapo -f job/dapo-smoke-train-logs"),
    ("the two-node smoke", r"^helm upgrade --install dapo-smoke charts/dapo .*-f values/smoke-2node\.yaml -f \"values/\$CLOUD\.yaml\""),
    ("dapo doctor for full", r"^dapo doctor -n dapo -f values/full\.yaml"),
    ("full", r"^helm upgrade --install dapo charts/dapo -n dapo -f values/full\.yaml"),
    ("its log", r"^kubectl logs -n dapo -f job/dapo-train-logs"),
]


def _first(commands: list[str], pattern: str) -> int:
    return next((i for i, c in enumerate(commands) if re.search(pattern, c)), -1)


def test_the_cluster_path_runs_in_order_one_node_smoke_before_any_multi_node_run():
    commands = _commands(_cluster_block())
    at = [_first(commands, pattern) for _, pattern in PATH_STEPS]
    missing = [what for (what, _), i in zip(PATH_STEPS, at) if i < 0]
    assert not missing, f"the README's cluster block lacks {missing}"
    assert at == sorted(at), "the cluster path's order: " + ", ".join(what for what, _ in PATH_STEPS)
    # the first chart install is one node: no multi-node file, no cloud file
    installs = [c for c in commands if re.match(r"helm upgrade --install \S+ charts/dapo", c)]
    assert "smoke-2node" not in installs[0] and "$CLOUD" not in installs[0], installs[0]
    # every chart install takes the images make images pushed (their digests: tests/test_docker.py)
    assert all("-f build/images/values.yaml" in c for c in installs), installs


def test_the_cli_is_installed_before_it_is_used():
    commands = _commands(_cluster_block())
    install = _first(commands, r"^(uv tool install|pip install) ")
    first_use = min(i for i, c in enumerate(commands) if re.search(r"(^|&& )dapo ", c))
    assert install >= 0 and install <= first_use, (install, first_use)


def test_every_step_shows_what_it_prints():
    steps = _steps(_cluster_block())
    assert len(steps) >= 9, [s for s, _ in steps]
    silent = [comment for comment, lines in steps if not any("# ->" in ln for ln in lines)]
    assert not silent, f"steps without the line they print (`# -> ...`): {silent}"


def test_the_readme_and_the_runbook_give_the_same_commands_in_the_same_order():
    """One path, two views: the README's commands are the runbook's (docs/deploy.md), in its order."""
    runbook = (ROOT / "docs" / "deploy.md").read_text()
    blocks = re.findall(r"^```bash\n(.*?)^```", runbook, flags=re.S | re.M)
    book = _commands("\n".join(b.replace("\\\n", " ") for b in blocks))
    pos = 0
    for command in _commands(_cluster_block()):
        for part in command.split(" && "):
            found = next((i for i in range(pos, len(book)) if part in book[i]), None)
            assert found is not None, f"the README's {part!r} is not in docs/deploy.md after step {pos}"
            pos = found


def test_the_readme_links_every_doc_and_every_link_resolves():
    links = {m.group(1) for m in re.finditer(r"\]\(([^)#\s]+)", README) if "://" not in m.group(1)}
    missing = sorted(link for link in links if not (ROOT / link).exists())
    assert not missing, f"README links to files that do not exist: {missing}"
    unlinked = sorted({p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")} - links)
    assert not unlinked, f"docs the README does not link: {unlinked}"


def test_the_install_line_can_be_run_again_after_a_failed_preflight():
    # `helm install` refuses a name in use after a failed install; `helm upgrade --install` installs again, and the
    # preflight is a pre-upgrade hook too while the RayJob does not exist (tests/test_preflight_chart.py)
    text = " ".join(README.split())
    assert "helm install " not in text
    assert "kubectl -n dapo logs job/dapo-preflight --all-containers" in text


def test_the_render_line_renders_what_the_install_line_installs_and_names_early_for_what_it_is():
    text = " ".join(README.replace("\\\n", " ").split())
    install = re.search(r"helm upgrade --install dapo charts/dapo -n (\S+) -f values/(\w+)\.yaml((?: -f \"?values/[\w$]+\.yaml\"?)*)"
                        r"(.*?)#", text)
    render = re.search(r"`python scripts/render.py --preset (\w+)((?: -f \"?values/[\w$]+\.yaml\"?)*) -n (\S+)` with the same "
                       r"(?:(\w+) )?`--set` items?( and `-f build/images/values\.yaml`)?", text)
    assert install and render, text
    assert (render.group(1), render.group(2), render.group(3)) == (install.group(2), install.group(3), install.group(1))
    sets = re.findall(r"--set ", install.group(4))
    assert (render.group(4) or "one") == {1: "one", 2: "two", 3: "three", 4: "four"}[len(sets)]
    # the images' values file make images writes (their digests): named by both lines or neither
    assert bool(render.group(5)) == ("-f build/images/values.yaml" in install.group(4))
    plan = yaml.safe_load((ROOT / "charts" / "dapo" / "files" / "requirements.yaml").read_text())["presets"]["early"]
    assert (f"`--preset early` is the AIME-44 recipe, {plan['plan']['rolloutSteps']:,} rollout steps "
            f"(~{round(plan['plan']['gpuHours'], -3):,} GPU-hours in `dapo plan`)") in text


def test_dapo_doctor_checks_the_values_each_install_after_it_installs():
    commands = _commands(_cluster_block())
    doctors = [i for i, c in enumerate(commands) if c.startswith("dapo doctor ")]
    assert len(doctors) >= 2, "dapo doctor before the smoke and before full"
    for i in doctors:
        doctor = re.match(r"dapo doctor -n (\S+)((?: -f \"?values/[\w$]+\.yaml\"?)+)(.*)", commands[i])
        install = next(c for c in commands[i + 1:] if re.match(r"helm upgrade --install \S+ charts/dapo", c))
        helm = re.match(r"helm upgrade --install \S+ charts/dapo -n (\S+)((?: -f \"?values/[\w$]+\.yaml\"?)+)(.*)", install)
        assert doctor and helm, (commands[i], install)
        assert doctor.groups()[:2] == helm.groups()[:2], (commands[i], install)
        want = set(re.findall(r"(?:--set|-f) (\S+)", helm.group(3)))
        assert set(re.findall(r"(?:--set|-f) (\S+)", doctor.group(3))) == want, (commands[i], install)
    full = next(c for c in commands if c.startswith("helm upgrade --install dapo charts/dapo"))
    assert "values/kueue.yaml" in full  # gang admission on the README's path


def test_the_readmes_make_train_time_is_the_measured_one():
    """One measurement (docs/tiny.md, Measured), quoted once: the README rounds it; the Makefile and the preset
    point to it."""
    tiny = (ROOT / "docs" / "tiny.md").read_text()
    m, s = map(int, re.search(r"\| wall time, whole run \(.*?\) \| (\d+) min (\d+) s \|", tiny).groups())
    quoted = float(re.search(r"make train .*?~([\d.]+) min on 2 cores once \.venv exists", README).group(1))
    before, after = re.search(r"before RL ([\d.]+) -> after RL ([\d.]+)", README).groups()
    assert f"before RL {before} -> after RL {after}" in tiny, "the README quotes another run than docs/tiny.md's"
    assert abs(quoted * 60 - (60 * m + s)) <= 15, (quoted, m, s)
    for path in ("Makefile", "dapo/presets/tiny.yaml"):
        text = (ROOT / path).read_text()
        assert "docs/tiny.md#measured" in text, path
        assert not re.search(r"\b\d+(\.\d+)? min(utes)?\b", text.split("\n\n", 1)[0] if path.endswith(".yaml") else
                             next(ln for ln in text.splitlines() if "tiny.md#measured" in ln)), path

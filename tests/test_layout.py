"""The layout of the ``dapo`` package, read from the source with ``ast`` (nothing is imported).

The direction rule. Packages are stacked in ``ORDER``; a module may import only from its own package and the
packages below it:

    core (dapo.loss, .advantage, .reward, .sampler)   the algorithm; imports nothing of the project
    dapo.util            file and language-model helpers with no DAPO knowledge
    dapo.config          the preset schema, its rules, its loader
    dapo.data            dataset schema, files, preparation, the evaluation benchmarks
    dapo.tiny            the tiny preset's locally built model, tokenizer, task and warm start
    dapo.eval            checkpoint export, serving, the evaluation client and results
    dapo.backends.base   the interface the loop drives
    dapo.train           the loop, checkpoints, health, metrics, run logs, reports
    dapo.backends.local, dapo.backends.verl   the two backends (neither imports the other)
    dapo.plan            steps, time, memory and storage of a run
    dapo.reference       the upstream recipe run through the same chart
    dapo.cluster         the programs of the small pods around a run: log follower, driver check, preflight
    dapo.k8s             the chart through Helm's engine, dapo doctor
    dapo.bench           benchmarks

Command-line modules (``dapo.cli``, every ``*.cli``, ``*_cli`` and ``__main__``) sit on top: they may import
anything, and only command-line modules import them. Function-level (lazy) imports count: an import inside a
function is still a dependency. On top of the rule, no two modules import each other, directly or through others.

Size: no module over ``MAX_LINES`` lines unless ``LONG_MODULES`` names it and its docstring says why.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import dapo_modules

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "dapo"
CORE = {"dapo.loss", "dapo.advantage", "dapo.reward", "dapo.sampler"}
ORDER = ["core", "dapo.util", "dapo.config", "dapo.data", "dapo.tiny", "dapo.eval", "dapo.backends.base", "dapo.train",
         "dapo.backends.local", "dapo.backends.verl", "dapo.plan", "dapo.reference", "dapo.cluster", "dapo.k8s",
         "dapo.bench"]
# backends at the same height that must not import each other
SIBLINGS = [("dapo.backends.local", "dapo.backends.verl")]
MAX_LINES = 400
# module -> why it is longer (its docstring must say so too: the phrase "over 400 lines")
LONG_MODULES = {
    "dapo.sampler": "one state machine (DynamicSampler) whose docstrings state eq. 11, Algorithm 1 and the carry mode",
}


MODULES = dapo_modules()


def _resolve(name: str) -> str:
    """The module that ``import name`` / ``from name import ...`` runs: the longest existing prefix."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str) -> list[tuple[str, int, bool]]:
    """``(imported module, line, lazy)`` for every ``dapo`` import of ``module``; lazy = inside a function."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    lazy_nodes = {id(n) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for n in ast.walk(fn)}
    out = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for t in targets:
            if t == "dapo" or t.startswith("dapo."):
                out.append((_resolve(t), node.lineno, id(node) in lazy_nodes))
    return out


IMPORTS = {m: _imports(m) for m in MODULES}


def _graph(*, lazy: bool) -> dict[str, set[str]]:
    return {m: {t for t, _, is_lazy in deps if t != m and (lazy or not is_lazy)} for m, deps in IMPORTS.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _edges_in(cycles: list[list[str]], graph: dict[str, set[str]]) -> list[str]:
    lines = []
    for comp in cycles:
        for m in comp:
            for t, line, is_lazy in IMPORTS[m]:
                if t in comp and t != m and t in graph[m]:
                    lines.append(f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}{' (lazy)' if is_lazy else ''}")
    return sorted(set(lines))


def _is_cli(module: str) -> bool:
    leaf = module.rsplit(".", 1)[-1]
    return module == "dapo.cli" or leaf in ("cli", "__main__") or leaf.endswith("_cli")


def _package(module: str) -> str:
    """The entry of ``ORDER`` a module belongs to."""
    if module in CORE or module == "dapo":
        return "core"
    if module == "dapo.backends":  # the package's docstring
        return "dapo.backends.base"
    parts = module.split(".")
    return ".".join(parts[:3]) if parts[1] == "backends" and len(parts) > 2 else ".".join(parts[:2])


def test_the_import_reader_sees_lazy_and_relative_imports():
    # the reader itself: dapo.train.cli picks a backend inside a function; the k8s package imports its presets
    assert ("dapo.backends.local.run", True) in {(t, lazy) for t, _, lazy in IMPORTS["dapo.train.cli"]}
    assert "dapo.k8s.presets" in _graph(lazy=False)["dapo.k8s"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _package("dapo.backends.verl.loss") == "dapo.backends.verl" and _package("dapo.sampler") == "core"
    assert _is_cli("dapo.eval.cli") and _is_cli("dapo.eval.serve_cli") and _is_cli("dapo.train.__main__")
    assert not _is_cli("dapo.eval.client")


def test_every_package_has_a_place_in_the_order():
    unplaced = sorted({_package(m) for m in MODULES if not _is_cli(m)} - set(ORDER))
    assert not unplaced, f"place these packages in ORDER (and the docstring): {unplaced}"


@pytest.mark.parametrize("module", sorted(CORE | {"dapo"}))
def test_the_core_imports_nothing_of_the_project_outside_the_core(module):
    # "dapo" (the package __init__) runs before any core module, so it is held to the same rule
    outside = [f"{MODULES[module].relative_to(ROOT)}:{line} imports {t}"
               for t, line, _ in IMPORTS[module] if t not in CORE]
    assert not outside, "the DAPO core must stay framework- and project-free:\n" + "\n".join(outside)


def _against_the_direction(imports: dict[str, list[tuple[str, int, bool]]]) -> list[str]:
    """``importer file:line (package) imports target (package)`` for each library import of a package above the
    importer's, or of a sibling backend (command-line modules on either side are the next test's)."""
    rank = {p: i for i, p in enumerate(ORDER)}
    upward = []
    for m, deps in sorted(imports.items()):
        if _is_cli(m):
            continue
        for t, line, _ in deps:
            if _is_cli(t):
                continue
            a, b = _package(m), _package(t)
            if rank[b] > rank[a] or (a, b) in SIBLINGS or (b, a) in SIBLINGS:
                upward.append(f"{MODULES[m].relative_to(ROOT)}:{line} ({a}) imports {t} ({b})")
    return upward


def test_the_direction_check_flags_upward_and_sibling_imports():
    fake = {"dapo.data.files": [("dapo.train.loop", 3, True), ("dapo.util.fsutil", 4, False)],
            "dapo.backends.verl.run": [("dapo.backends.local.run", 7, False), ("dapo.train.loop", 8, True)],
            "dapo.train.cli": [("dapo.k8s.presets", 9, True)]}
    assert _against_the_direction(fake) == [
        "dapo/backends/verl/run.py:7 (dapo.backends.verl) imports dapo.backends.local.run (dapo.backends.local)",
        "dapo/data/files.py:3 (dapo.data) imports dapo.train.loop (dapo.train)",
    ]


def test_modules_import_only_their_own_package_and_the_packages_below_it():
    upward = _against_the_direction(IMPORTS)
    assert not upward, "imports against the direction (see this file's docstring):\n" + "\n".join(upward)


def test_only_command_line_modules_import_command_line_modules():
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}"
           for m, deps in sorted(IMPORTS.items()) if not _is_cli(m)
           for t, line, _ in deps if _is_cli(t)]
    assert not bad, "a library module imports a command line:\n" + "\n".join(bad)


def test_import_time_imports_form_no_circle():
    graph = _graph(lazy=False)
    cycles = _cycles(graph)
    assert not cycles, "import circles:\n" + "\n".join(_edges_in(cycles, graph))


def test_function_level_imports_form_no_circle():
    graph = _graph(lazy=True)
    cycles = _cycles(graph)
    assert not cycles, "import circles (function-level imports included):\n" + "\n".join(_edges_in(cycles, graph))


def test_the_warm_start_imports_no_backend_and_the_planner_no_data_preparation():
    # the two circles issue 16 named: tiny/warmstart -> backends/local -> tiny/assets -> tiny/warmstart, and
    # data -> plan -> data; what both sides need lives in dapo.util.lm_forward and dapo.data.parquet
    graph = _graph(lazy=True)
    assert not [(m, t) for m in graph if m.startswith("dapo.tiny") for t in graph[m] if t.startswith("dapo.backends")]
    assert not [(m, t) for m in graph if m.startswith("dapo.plan") for t in graph[m] if t == "dapo.data.prepare"]
    assert "dapo.util.lm_forward" in graph["dapo.tiny.warmstart"]


def test_the_loop_sees_backends_only_through_their_interface():
    graph = _graph(lazy=True)
    assert {t for t in graph["dapo.train.loop"] if t.startswith("dapo.backends")} == {"dapo.backends.base"}
    assert graph["dapo.backends.base"] <= CORE


def _third_party_imports(module: str) -> list[str]:
    """``file:line imports name`` for each module-level import of ``module`` that is neither the standard library
    nor the project."""
    import sys

    tree = ast.parse(MODULES[module].read_text())
    lazy = {id(n) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(fn)}
    out = []
    for node in ast.walk(tree):
        if id(node) in lazy or not isinstance(node, (ast.Import, ast.ImportFrom)) or getattr(node, "level", 0):
            continue
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        for name in names:
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top not in ("dapo", "__future__"):
                out.append(f"{MODULES[module].relative_to(ROOT)}:{node.lineno} imports {name}")
    return out


def test_the_pods_around_the_run_need_only_the_standard_library():
    # dapo.cluster runs in every image (the reproduction image has our package without extras): module-level
    # imports are the standard library and the project's own stdlib-only modules; dapo.k8s only names its programs
    cluster = sorted(m for m in MODULES if m.startswith("dapo.cluster"))
    assert {"dapo.cluster.follow", "dapo.cluster.gpu_check", "dapo.cluster.rayjob_api"} <= set(cluster)
    found = [line for m in cluster for line in _third_party_imports(m)]
    assert not found, "\n".join(found)
    graph = _graph(lazy=True)
    project = {t for m in cluster for t in graph[m] if not t.startswith("dapo.cluster")}
    assert project <= {"dapo.train.runlog", "dapo.train.attempts"}, project
    assert not any(t.startswith("dapo.cluster") for m in MODULES if m.startswith("dapo.k8s") for t in graph[m])
    assert _third_party_imports("dapo.k8s.rules"), "the reader must see a third-party import (yaml)"


def _docstring(module: str) -> str:
    return ast.get_docstring(ast.parse(MODULES[module].read_text())) or ""


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_over_the_limit_without_a_stated_reason(module):
    lines = len(MODULES[module].read_text().splitlines())
    if module in LONG_MODULES:
        assert lines > MAX_LINES, f"{module} has {lines} lines now: drop it from LONG_MODULES"
        assert "over 400 lines" in _docstring(module), f"{module}: say in its docstring why it is over 400 lines"
    else:
        assert lines <= MAX_LINES, (f"{MODULES[module].relative_to(ROOT)} has {lines} lines (> {MAX_LINES}): split it "
                                    "by responsibility")


def test_every_package_names_its_modules():
    # two hops from the README's table: the package -> its __init__ docstring (:mod:`dapo.pkg.module`) -> the module
    missing = []
    for init in sorted(PKG.rglob("__init__.py")):
        if init.parent == PKG:
            continue  # dapo/__init__ names the packages and the core
        doc = _docstring(".".join(init.relative_to(ROOT).parent.parts))
        missing += [str(f.relative_to(ROOT)) for f in sorted(init.parent.glob("*.py"))
                    if f.stem not in ("__init__", "__main__") and not re.search(rf"[.~`]{f.stem}[`.]", doc)]
    assert not missing, f"modules their package's docstring does not name (as :mod:`dapo.x.name`): {missing}"


def test_every_package_says_what_it_holds():
    empty = [str(f.relative_to(ROOT)) for f in PKG.rglob("__init__.py") if not _docstring(
        ".".join(f.relative_to(ROOT).parent.parts))]
    assert not empty, f"packages without a docstring: {empty}"

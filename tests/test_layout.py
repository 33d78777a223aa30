"""The import direction of the ``dapo`` package, read from the source with ``ast`` (nothing is imported).

The rule: the DAPO core (``dapo.loss``, ``dapo.advantage``, ``dapo.reward``, ``dapo.sampler``) imports nothing of the
project outside the core; the loop sits on the core, the backends on the loop's interface, the CLIs on top; and no
two modules import each other, directly or through others. Function-level (lazy) imports count: an import inside a
function is still a dependency, and a circle of lazy imports is a circle (it never fails at import time, yet the
modules in it can no longer be read, tested or moved apart one at a time).

Import-time imports (outside functions) form no circle at all. With function-level imports included, the only
circles left close through the edges in ``PENDING_SPLIT``: a module that is both a library and a CLI, whose CLI part
calls upward. Each goes when that module splits into library + CLI (issue 16, items 1-2); the test fails when an
edge listed there is gone, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "dapo"
CORE = {"dapo.loss", "dapo.advantage", "dapo.reward", "dapo.sampler"}

# (importer, imported): the CLI part of a library module reaching up; see the module docstring.
PENDING_SPLIT = {
    ("dapo.plan.estimate", "dapo.plan.memory"): "`dapo plan` reports sizing's memory/storage model, which reads plan's model table",
    ("dapo.plan.estimate", "dapo.k8s"): "`dapo plan` reads the chart's values, whose check uses sizing (-> plan)",
    ("dapo.data.prepare", "dapo.data.benchmarks"): "`dapo data prepare` builds the benchmarks, which write rows with data's schema",
}


def _modules() -> dict[str, Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


MODULES = _modules()


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


def test_the_import_reader_sees_lazy_and_relative_imports():
    # the reader itself: dapo.train.cli picks a backend inside a function; the k8s package imports its modules
    assert ("dapo.backends.local.backend", True) in {(t, lazy) for t, _, lazy in IMPORTS["dapo.train.cli"]}
    assert "dapo.k8s.manifests" in _graph(lazy=False)["dapo.k8s"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("module", sorted(CORE | {"dapo"}))
def test_the_core_imports_nothing_of_the_project_outside_the_core(module):
    # "dapo" (the package __init__) runs before any core module, so it is held to the same rule
    outside = [f"{MODULES[module].relative_to(ROOT)}:{line} imports {t}"
               for t, line, _ in IMPORTS[module] if t not in CORE]
    assert not outside, "the DAPO core must stay framework- and project-free:\n" + "\n".join(outside)


def test_import_time_imports_form_no_circle():
    graph = _graph(lazy=False)
    cycles = _cycles(graph)
    assert not cycles, "import circles:\n" + "\n".join(_edges_in(cycles, graph))


def test_function_level_imports_form_no_circle_but_the_pending_splits():
    graph = _graph(lazy=True)
    for importer, imported in PENDING_SPLIT:
        assert imported in graph[importer], f"{importer} no longer imports {imported}: drop it from PENDING_SPLIT"
        graph[importer].discard(imported)
    cycles = _cycles(graph)
    assert not cycles, "import circles (function-level imports included):\n" + "\n".join(_edges_in(cycles, graph))


def test_the_warm_start_imports_no_backend_and_the_planner_no_data_preparation():
    # the two circles issue 16 names: tiny/warmstart -> backends/local -> tiny/assets -> tiny/warmstart, and
    # data -> plan -> data; what both sides need lives in dapo.util.lm_forward and dapo.data.parquet
    graph = _graph(lazy=True)
    tiny_to_backends = [(m, t) for m in graph if m.startswith("dapo.tiny") for t in graph[m]
                        if t.startswith("dapo.backends")]
    assert not tiny_to_backends
    assert "dapo.data.prepare" not in graph["dapo.plan.estimate"]
    assert {"dapo.util.lm_forward"} <= graph["dapo.tiny.warmstart"] and "dapo.data.parquet" in graph["dapo.plan.estimate"]


def test_the_loop_sees_backends_only_through_their_interface_and_nothing_imports_the_cli():
    graph = _graph(lazy=True)
    assert {t for t in graph["dapo.train.loop"] if t.startswith("dapo.backends")} == {"dapo.backends.base"}
    assert graph["dapo.backends.base"] <= CORE
    assert [m for m in graph if "dapo.cli" in graph[m]] == []

"""Function length in ``dapo/`` and ``scripts/``, read from the source with ``ast`` (nothing is imported).

No function is over ``MAX_LINES`` lines unless it is one table: a key-by-key mapping whose rows are data (the verl
keys the bundle sets, one row per key). A table is listed in ``TABLES`` with what its rows are, and its docstring
says "one table". Any other long function is split by the steps it already names (docs/development.md); the training
step itself reads as Algorithm 1 in at most ``MAX_STEP_LINES`` lines.

A function's length runs from its ``def`` line (decorators excluded) to its last line: docstring, nested functions
and classes included. Methods and nested functions are measured too (``path:Class.method``). The tests are not held
to it: an end-to-end test is one scenario, read top to bottom.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("dapo", "scripts")
MAX_LINES = 80
MAX_STEP_LINES = 60
# path:function -> what its rows are (its docstring must say "one table" too)
TABLES = {
    "dapo/backends/verl/settings.py:settings": "every verl key the bundle sets: one row (key, value, preset key) per key",
}


def _functions(path: str, source: str) -> list[tuple[str, int, ast.AST]]:
    """``(path:qualified name, lines, node)`` of every function and method in ``source``, nested ones included."""
    out: list[tuple[str, int, ast.AST]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                out.append((f"{path}:{name}", child.end_lineno - child.lineno + 1, child))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source, filename=path), "")
    return out


def _long(sources: dict[str, str], tables: dict[str, str] = TABLES) -> list[str]:
    """``path:name has N lines`` for each function over ``MAX_LINES`` that ``tables`` does not list."""
    return [f"{where} has {n} lines" for path, text in sorted(sources.items()) for where, n, _ in _functions(path, text)
            if n > MAX_LINES and where not in tables]


SOURCE_FILES = {p.relative_to(ROOT).as_posix(): p.read_text() for d in SOURCES for p in sorted((ROOT / d).rglob("*.py"))}
FUNCTIONS = {where: (n, node) for path, text in SOURCE_FILES.items() for where, n, node in _functions(path, text)}


def _fabricated(body_lines: int, indent: str = "    ") -> str:
    return "\n".join(f"{indent}x{i} = {i}" for i in range(body_lines))


def test_the_reader_measures_functions_methods_and_nested_functions():
    source = "\n".join([
        "import functools", "", "",
        "@functools.cache", "def short():", _fabricated(79), "", "",  # 80 lines with its def: allowed
        "def long():", _fabricated(80), "", "",  # 81 lines
        "class Loop:",
        "    async def step(self):", _fabricated(85, " " * 8), "",
        "    def outer(self):", "        def inner():", _fabricated(81, " " * 12), "        return inner", "",
        "if True:", "    def hidden():", _fabricated(90, " " * 8),
    ])  # fmt: skip
    lengths = {where: n for where, n, _ in _functions("x.py", source)}
    assert lengths["x.py:short"] == 80 and lengths["x.py:long"] == 81 and lengths["x.py:Loop.step"] == 86
    assert lengths["x.py:Loop.outer.inner"] == 82 and lengths["x.py:Loop.outer"] == 84
    assert _long({"x.py": source}) == ["x.py:long has 81 lines", "x.py:Loop.step has 86 lines",
                                       "x.py:Loop.outer has 84 lines", "x.py:Loop.outer.inner has 82 lines",
                                       "x.py:hidden has 91 lines"]  # fmt: skip
    # a table is let through by name, and only by name
    assert _long({"x.py": source}, {"x.py:long": "rows"}) == _long({"x.py": source})[1:]


def test_no_function_is_over_the_limit_unless_it_is_a_table():
    long = _long(SOURCE_FILES)
    assert not long, (f"functions over {MAX_LINES} lines:\n" + "\n".join(long) + "\nsplit each by the steps it already "
                      "names (docs/development.md); a key-by-key mapping whose rows are data goes into TABLES instead")


@pytest.mark.parametrize("where", sorted(TABLES))
def test_every_table_is_still_long_and_says_it_is_one_table(where):
    assert where in FUNCTIONS, f"{where} does not exist any more: drop it from TABLES"
    n, node = FUNCTIONS[where]
    assert n > MAX_LINES, f"{where} has {n} lines now: drop it from TABLES"
    assert "one table" in (ast.get_docstring(node) or ""), f"{where}: say in its docstring that it is one table"


def test_the_training_step_reads_as_algorithm_1():
    n, node = FUNCTIONS["dapo/train/loop.py:DAPOLoop.train_step"]
    assert n <= MAX_STEP_LINES, f"DAPOLoop.train_step has {n} lines (> {MAX_STEP_LINES})"
    calls = sorted((c.lineno, c.col_offset, ast.unparse(c.func)) for c in ast.walk(node) if isinstance(c, ast.Call))
    phases = ["self.generate", "self.score", "self.filter_groups", "self.kept_batch", "self.advantages",
              "self.backend.compute_old_log_probs", "self.backend.update", "self.step_metrics"]
    named = [name for _, _, name in calls if name in phases]
    assert named == phases, f"the step's phases, in order: {named}"

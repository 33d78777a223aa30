"""Template length in the chart: no ``define`` of ``charts/dapo/templates`` is over ``MAX_DEFINE_LINES`` lines (a
screen), as no function of ``dapo/`` is over 80 (tests/test_function_length.py). A long define is split by the parts
it already names (the RayJob: its submitter, head group, worker group, Ray containers; dapo.validate: its rule
groups), in files by concern (``_presets.tpl``, ``_pods.tpl``, ``_rayjob.tpl``, ...).

A define's length runs from its ``{{- define`` line to the ``{{- end`` that closes it, counted by the actions that
open a block (``define``, ``if``, ``range``, ``with``, ``block``) and the ``end`` actions, so an inner ``end`` does not
end it.
"""

from __future__ import annotations

import re

import pytest

from conftest import ROOT

TEMPLATES = ROOT / "charts" / "dapo" / "templates"
MAX_DEFINE_LINES = 60
OPENS = re.compile(r"{{-?\s*(?:define|if|range|with|block)\s")
ENDS = re.compile(r"{{-?\s*end\s*-?}}")
DEFINE = re.compile(r'{{-?\s*define\s+"([^"]+)"')


def defines(text: str) -> list[tuple[str, int]]:
    """(name, lines) of every define in a template's text."""
    lines, out = text.split("\n"), []
    for i, line in enumerate(lines):
        m = DEFINE.search(line)
        if not m:
            continue
        depth, k = 0, i
        while True:
            depth += len(OPENS.findall(lines[k])) - len(ENDS.findall(lines[k]))
            if depth <= 0:
                break
            k += 1
            if k == len(lines):
                raise ValueError(f"define {m[1]!r} is never closed")
        out.append((m[1], k - i + 1))
    return out


def _long(texts: dict[str, str]) -> list[str]:
    return [f"{path}: {name} has {n} lines" for path, text in sorted(texts.items()) for name, n in defines(text)
            if n > MAX_DEFINE_LINES]


TEXTS = {p.relative_to(ROOT).as_posix(): p.read_text() for p in sorted(TEMPLATES.rglob("*"))
         if p.suffix in (".tpl", ".yaml", ".txt")}


def test_no_define_of_the_chart_is_longer_than_a_screen():
    names = [name for text in TEXTS.values() for name, _ in defines(text)]
    assert len(names) > 60 and "dapo.rayJob" in names and "dapo.validate" in names, names
    assert not _long(TEXTS), _long(TEXTS)


def _fabricated(body_lines: int, nested: bool = False) -> str:
    inner = ["{{- if .x -}}", "{{- end -}}"] if nested else []
    body = [f"line {i}" for i in range(body_lines - len(inner))]
    return "\n".join(['{{- define "t" -}}', *inner[:1], *body, *inner[1:], "{{- end -}}", "after"])


@pytest.mark.parametrize("nested", [False, True])
def test_the_rule_counts_a_define_to_its_own_end(nested):
    """A define one line over the limit is named, one at the limit is not, an inner `end` does not close it."""
    assert defines(_fabricated(MAX_DEFINE_LINES - 2, nested)) == [("t", MAX_DEFINE_LINES)]
    assert _long({"x.tpl": _fabricated(MAX_DEFINE_LINES - 2, nested)}) == []
    assert _long({"x.tpl": _fabricated(MAX_DEFINE_LINES - 1, nested)}) == [f"x.tpl: t has {MAX_DEFINE_LINES + 1} lines"]


def test_an_unclosed_define_is_an_error():
    with pytest.raises(ValueError, match="never closed"):
        defines('{{- define "t" -}}\n{{- if .x }}\n{{- end -}}')

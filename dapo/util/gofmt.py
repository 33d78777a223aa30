"""Values printed the way Go (and so Helm's templates) print them, so the chart and its Python twins
(:mod:`dapo.k8s`, :mod:`dapo.reference`) say the same thing byte for byte: ``strconv.Quote``, ``printf "%q"``, and
the template function ``toString``.
"""

from __future__ import annotations

from typing import Any


def go_quote(s: str) -> str:
    """Go's ``quote`` (strconv.Quote): a double-quoted string that YAML reads back unchanged."""
    named = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
             '"': '\\"', "\\": "\\\\"}
    out = []
    for ch in s:
        if ch in named:
            out.append(named[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def q(value: Any) -> str:
    """Quote a value in a message the way the chart's `printf "%q"` does, so both say the same."""
    return go_quote(str(value))


def go_string(value: Any) -> str:
    """Go template ``toString`` of a scalar read from YAML (numbers arrive as float64 there)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return str(value)

"""Values printed the way Go (and so Helm's templates) print them, so Python messages and commands that the chart
also writes (:mod:`dapo.k8s`, :mod:`dapo.reference`, :mod:`dapo.config`) say the same thing byte for byte:
``strconv.Quote``, ``printf "%q"``, and the template function ``toString``.
"""

from __future__ import annotations

import math
from decimal import Decimal
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
    """A scalar read from YAML as the chart prints it (numbers arrive as float64 there): a whole number as an integer
    below 1e21 (as ``toJson`` prints it), another float as Go's ``%v`` (``toString``: the shortest digits, in
    exponent form when the exponent is below -4 or at least 6), a boolean as ``true``/``false``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    if isinstance(value, float) and math.isfinite(value):
        return _go_float(value)
    return str(value)


def _go_float(value: float) -> str:
    """Go's ``%v`` of a finite float64 (strconv's ``'g'`` with the shortest digits, which Python's repr also finds)."""
    exact = Decimal(repr(value)).normalize()
    sign, digits, exponent = exact.as_tuple()
    first = len(digits) - 1 + int(exponent)  # the decimal exponent of the leading digit
    if first < -4 or first >= 6:
        text = "".join(map(str, digits))
        mantissa = text[0] + (f".{text[1:]}" if len(text) > 1 else "")
        return f"{'-' if sign else ''}{mantissa}e{'-' if first < 0 else '+'}{abs(first):02d}"
    return format(exact, "f")

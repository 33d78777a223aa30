"""Reading back what ``dapo eval run`` writes, independently of the code that writes it."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any


def read_results(path: Path) -> list[dict[str, Any]]:
    """``results.csv`` back as typed rows (numbers as float/int, empty as None)."""
    out = []
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            row: dict[str, Any] = {}
            for k, v in rec.items():
                if v == "":
                    row[k] = None
                elif k in ("step", "rows", "answered", "problems", "k"):
                    row[k] = int(v)
                elif k == "complete":
                    row[k] = v == "True"
                elif k in ("benchmark", "comparable_scorer", "model", "time"):
                    row[k] = v
                else:
                    row[k] = float(v)
            out.append(row)
    return out

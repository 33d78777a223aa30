"""Tables of an evaluation directory (``dapo eval run --output OUT``): one per checkpoint, one across checkpoints.

Layout: ``OUT/global_step_N/<benchmark>/summary.json`` (``--benchmarks``) or ``OUT/global_step_N/summary.json``
(the single ``--test-file``). From them:

- ``OUT/global_step_N/benchmarks.json``: one row per benchmark of that checkpoint;
- ``OUT/results.csv``: one row per (step, benchmark) over all checkpoints, rebuilt atomically from the summaries
  after every benchmark (a rerun or a resumed evaluation cannot duplicate or drop a row).

Row fields: ``step, benchmark, complete, rows, answered, problems, k`` and, for the scorer behind ``acc`` (the DAPO
verifier), ``avg`` (avg@k = acc/mean@k), ``pass`` (pass@k), ``cons`` (cons@k); ``avg_math_verify``,
``pass_math_verify``, ``cons_math_verify`` where the benchmark is scored by math-verify too; ``score`` (100 x avg@k of
the scorer comparable with published figures, named in ``comparable_scorer``); ``response_length_mean`` (completion
tokens) and ``truncation_rate`` (share of answers cut at max_tokens).
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any, Optional

from dapo.util.fsutil import atomic_write_text

STEP_TABLE = "benchmarks.json"
RESULTS_CSV = "results.csv"
STEP_DIR = re.compile(r"^global_step_(\d+)$")

COLUMNS = (
    "step", "benchmark", "complete", "rows", "answered", "problems", "k", "avg", "pass", "cons",
    "avg_math_verify", "pass_math_verify", "cons_math_verify", "score", "comparable_scorer",
    "response_length_mean", "truncation_rate", "model", "time",
)  # fmt: skip


def row_from_summary(summary: dict[str, Any], step: Optional[int], name: str) -> dict[str, Any]:
    m = summary["metrics"]
    k = m["k"]
    out: dict[str, Any] = {
        "step": step,
        "benchmark": summary.get("benchmark") or name,
        "complete": bool(summary["complete"]),
        "rows": summary["rows"],
        "answered": summary["answered"],
        "problems": m["problems"],
        "k": k,
        "avg": m.get(f"acc/mean@{k}"),
        "pass": m.get(f"pass@{k}"),
        "cons": m.get(f"cons@{k}"),
        "score": summary.get("score", summary.get("aime_score")),
        "comparable_scorer": summary.get("comparable_scorer", "dapo"),
        "response_length_mean": summary["response_length"]["all"]["mean"],
        "truncation_rate": summary["response_length"]["clip_ratio"],
        "model": (summary.get("config") or {}).get("model"),
        "time": summary.get("time"),
    }
    mv = (summary.get("metrics_by_scorer") or {}).get("math_verify")
    if mv:
        out.update(avg_math_verify=mv.get(f"acc/mean@{k}"), pass_math_verify=mv.get(f"pass@{k}"),
                   cons_math_verify=mv.get(f"cons@{k}"))
    return {c: out.get(c) for c in COLUMNS}


def _read(path: Path) -> Optional[dict[str, Any]]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _step_of(step_dir: Path) -> Optional[int]:
    m = STEP_DIR.match(step_dir.name)
    return int(m.group(1)) if m else None


def step_rows(step_dir: Path, subs: list[str]) -> list[dict[str, Any]]:
    """One row per benchmark subdirectory of ``step_dir`` that has a summary, in the given order."""
    rows = []
    for sub in subs:
        s = _read(step_dir / sub / "summary.json")
        if s is not None:
            rows.append(row_from_summary(s, _step_of(step_dir), sub or "test_file"))
    return rows


def write_step_table(step_dir: Path, rows: list[dict[str, Any]]) -> Path:
    return atomic_write_text(step_dir / STEP_TABLE, json.dumps(rows, indent=2) + "\n")


def collect(base: Path) -> list[dict[str, Any]]:
    """Every (step, benchmark) with a summary under ``base``, ordered by step then benchmark directory name."""
    base = Path(base)
    rows = []
    if not base.is_dir():
        return rows
    for step_dir in sorted((p for p in base.iterdir() if p.is_dir() and _step_of(p) is not None), key=_step_of):
        if (step_dir / "summary.json").exists():
            rows += step_rows(step_dir, [""])
        subs = sorted(p.name for p in step_dir.iterdir() if p.is_dir() and (p / "summary.json").exists())
        rows += step_rows(step_dir, subs)
    return rows


def write_results(base: Path) -> Path:
    """Rebuild ``base/results.csv`` (atomically) from every summary under ``base``."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    for r in collect(base):
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return atomic_write_text(Path(base) / RESULTS_CSV, buf.getvalue())


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * float(v):.1f}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """The per-checkpoint summary table (percentages; lengths in tokens)."""
    header = ("benchmark", "problems x k", "avg@k", "pass@k", "cons@k", "avg@k math-verify", "mean length",
              "truncated", "complete")  # fmt: skip
    body = []
    for r in rows:
        length = "-" if r["response_length_mean"] is None else f"{r['response_length_mean']:.0f}"
        body.append((
            r["benchmark"], f"{r['problems']} x {r['k']}", _pct(r["avg"]), _pct(r["pass"]), _pct(r["cons"]),
            _pct(r["avg_math_verify"]), length, _pct(r["truncation_rate"]),
            "yes" if r["complete"] else f"no ({r['answered']}/{r['rows']})",
        ))  # fmt: skip
    widths = [max(len(str(x[i])) for x in [header, *body]) for i in range(len(header))]
    step = rows[0]["step"] if rows else None
    lines = [f"step {step}: accuracy in % (avg@k = mean over all answers; scorer: DAPO verifier, MATH-500 also "
             "math-verify)"]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in [header, *body]]
    return "\n".join(lines)

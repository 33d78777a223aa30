"""The evaluation benchmarks as data: AIME-2024 (the DAPO release's file), AIME-2025 and MATH-500, all in the DAPO row
schema with the DAPO prompt template, and how each is scored.

=========  ======================  ========  =======  ==============  =================================================
name       file                    problems  copies   data_source     scored by
=========  ======================  ========  =======  ==============  =================================================
aime24     aime-2024.parquet       30        32       math_dapo       the DAPO verifier (the release's file, as is)
aime25     aime-2025.parquet       30        32       aime25          the DAPO verifier (integer answers 0-999)
math500    math-500.parquet        500       4        math            the DAPO verifier and math-verify, side by side
=========  ======================  ========  =======  ==============  =================================================

Every problem is one user message in the AIME-2024 file's template (:data:`PROMPT_TEMPLATE`), repeated ``copies``
times (one sampled answer per row: avg@k from one request per row, like the DAPO script). ``data_source`` names are
the ones verl 0.9.1's ``default_compute_score`` routes to its ``math_dapo`` verifier (``aime*``, ``math``), so verl's
own reward loop scores the files the way ours does, and training validation logs one
``val-core/<data_source>/acc/mean@k`` per file.

Raw sources (``dapo data prepare``): a hub dataset (``math-ai/aime25`` ``test.jsonl``: ``problem, answer, id``;
``opencompass/AIME2025`` ``aime2025-I.jsonl`` + ``aime2025-II.jsonl``: ``question, answer``;
``HuggingFaceH4/MATH-500`` ``test.jsonl``: ``problem, solution, answer, subject, level, unique_id``), a local mirror
(``--source DIR``: ``DIR/<owner>/<name>/<file>`` or ``DIR/<file>``) or a file (jsonl, json or parquet).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

# The AIME-2024 file's prompt (BytedTsinghua-SIA/AIME-2024, identical on all 960 rows around the problem text).
PROMPT_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)
REWARD_STYLE = "rule-lighteval/MATH_v2"
ABILITY = "MATH"

PROBLEM_COLUMNS = ("problem", "question", "Problem", "Question")
ANSWER_COLUMNS = ("answer", "Answer")
ID_COLUMNS = ("unique_id", "id", "ID", "problem_idx")


class BenchmarkError(ValueError):
    """A bad benchmark name, source or row; the message names it."""


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    file: str
    problems: int
    copies: int
    data_source: str
    # "integer": AIME answers 0-999; "latex": MATH answers (expressions)
    answer_kind: str
    # scorers reported; the first is the one behind ``acc``
    scorers: tuple[str, ...]
    # the scorer whose avg@k is comparable with published figures
    comparable: str
    # default hub dataset and the files of it that hold the problems; None = the DAPO release's ready-made file
    repo: Optional[str]
    paths: tuple[str, ...] = ()
    # extra_info fields copied from the raw rows (beside index, raw_problem, split, source_id)
    keep: tuple[str, ...] = ()

    @property
    def rows(self) -> int:
        return self.problems * self.copies


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("aime24", "AIME-2024", "aime-2024.parquet", 30, 32, "math_dapo", "integer", ("dapo",), "dapo",
                  None),
        Benchmark("aime25", "AIME-2025", "aime-2025.parquet", 30, 32, "aime25", "integer", ("dapo",), "dapo",
                  "math-ai/aime25", ("test.jsonl",)),
        Benchmark("math500", "MATH-500", "math-500.parquet", 500, 4, "math", "latex", ("dapo", "math_verify"),
                  "math_verify", "HuggingFaceH4/MATH-500", ("test.jsonl",), ("subject", "level")),
    )
}  # fmt: skip

# Hub datasets known to hold each benchmark, and their files.
KNOWN_SOURCES: dict[str, dict[str, tuple[str, ...]]] = {
    "aime25": {"math-ai/aime25": ("test.jsonl",),
               "opencompass/AIME2025": ("aime2025-I.jsonl", "aime2025-II.jsonl")},
    "math500": {"HuggingFaceH4/MATH-500": ("test.jsonl",)},
}  # fmt: skip

# Published DAPO numbers for Qwen2.5-32B (base), AIME-2024 avg@32 at the END of training. The paper (arXiv 2503.14476)
# gives 50 (Table 1, Figure 1: the curve itself is a figure, no per-step values are printed); the repository's
# README gives 44 for the early recipe (no token-level loss, no dynamic sampling). No MATH-500 or AIME-2025 numbers.
PUBLISHED: dict[str, list[dict[str, Any]]] = {
    "aime24": [
        {"label": "DAPO (paper): 50, end of training", "preset": "full", "avg": 0.50},
        {"label": "DAPO early recipe (repository): 44, end of training", "preset": "early", "avg": 0.44},
    ],
}


def get(name: str) -> Benchmark:
    try:
        return BENCHMARKS[name]
    except KeyError:
        raise BenchmarkError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}") from None


def parse_list(spec: str | list[str]) -> list[tuple[Benchmark, Optional[str]]]:
    """``"aime24,aime25,math500"`` or ``["aime24=/path/file.parquet", ...]`` -> (benchmark, explicit file or None),
    in the given order, each once."""
    items = spec if isinstance(spec, list) else [s for s in re.split(r"[,\s]+", spec) if s]
    out: list[tuple[Benchmark, Optional[str]]] = []
    for item in items:
        name, _, path = str(item).partition("=")
        b = get(name.strip())
        if any(b.name == o.name for o, _ in out):
            raise BenchmarkError(f"benchmark {b.name!r} is listed twice")
        out.append((b, path.strip() or None))
    if not out:
        raise BenchmarkError("no benchmark given")
    return out


# --------------------------------------------------------------------------------------------------------------------
# Raw rows -> DAPO rows
# --------------------------------------------------------------------------------------------------------------------


def read_raw(paths: list[Path]) -> list[dict[str, Any]]:
    """Records of jsonl / json / parquet files, concatenated in order."""
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for p in paths:
        p = Path(p)
        suffix = p.suffix.lower()
        try:
            if suffix == ".parquet":
                recs = pd.read_parquet(p).to_dict("records")
            elif suffix == ".jsonl":
                recs = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
            elif suffix == ".json":
                loaded = json.loads(p.read_text())
                recs = loaded if isinstance(loaded, list) else loaded.get("data", loaded.get("rows"))
                if not isinstance(recs, list):
                    raise ValueError("expected a list of records (or {'data': [...]})")
            else:
                raise ValueError("expected .jsonl, .json or .parquet")
        except (OSError, ValueError) as exc:
            raise BenchmarkError(f"{p}: cannot read the problems ({exc})") from exc
        rows.extend(recs)
    return rows


def _pick(rec: dict[str, Any], names: tuple[str, ...]) -> Optional[str]:
    for n in names:
        if n in rec and rec[n] is not None:
            return n
    return None


def _integer_answer(value: Any, where: str) -> str:
    text = str(value).strip()
    if isinstance(value, float) and value.is_integer():
        text = str(int(value))
    if not re.fullmatch(r"\d{1,3}", text):
        raise BenchmarkError(f"{where}: AIME answers are integers 0-999, got {value!r}")
    return str(int(text))  # "033" -> "33", as the DAPO verifier compares normalised strings


def build_rows(bench: Benchmark, raw: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """DAPO-schema rows: each raw problem in the AIME-2024 prompt template, ``bench.copies`` times (problem-major).

    Errors name the source, the raw row and the column."""
    if len(raw) != bench.problems:
        raise BenchmarkError(f"{source}: {len(raw)} problems, {bench.title} has {bench.problems}")
    problems = []
    seen: dict[str, int] = {}
    for i, rec in enumerate(raw):
        where = f"{source} row {i}"
        pcol, acol = _pick(rec, PROBLEM_COLUMNS), _pick(rec, ANSWER_COLUMNS)
        if pcol is None or acol is None:
            missing = "problem (or question)" if pcol is None else "answer"
            raise BenchmarkError(f"{where}: no {missing} column (columns: {sorted(rec)})")
        text = str(rec[pcol]).strip()
        if not text:
            raise BenchmarkError(f"{where}: column {pcol!r} is empty")
        if text in seen:
            raise BenchmarkError(f"{where}: the same problem as row {seen[text]}")
        seen[text] = i
        if bench.answer_kind == "integer":
            answer = _integer_answer(rec[acol], f"{where} column {acol!r}")
        else:
            answer = str(rec[acol]).strip()
            if not answer:
                raise BenchmarkError(f"{where}: column {acol!r} is empty")
        icol = _pick(rec, ID_COLUMNS)
        extra: dict[str, Any] = {
            "index": i,
            "raw_problem": text,
            "split": "test",
            "source_id": str(rec[icol]) if icol else str(i),
        }
        for k in bench.keep:
            if k not in rec:
                raise BenchmarkError(f"{where}: no {k!r} column (columns: {sorted(rec)})")
            extra[k] = str(rec[k])
        problems.append(
            {
                "data_source": bench.data_source,
                "prompt": [{"role": "user", "content": PROMPT_TEMPLATE.format(problem=text)}],
                "ability": ABILITY,
                "reward_model": {"ground_truth": answer, "style": REWARD_STYLE},
                "extra_info": extra,
            }
        )
    return [p for p in problems for _ in range(bench.copies)]


def write_benchmark(bench: Benchmark, raw_paths: list[Path], dest: Path, source: str) -> Path:
    """Raw problem file(s) -> ``dest`` (DAPO schema, validated, atomic)."""
    from dapo.data.files import write_rows

    return write_rows(build_rows(bench, read_raw(raw_paths), source), dest)

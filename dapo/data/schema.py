"""The DAPO row schema and its checks: what a valid row is, the defects of a table, the statistics of a file, and the
"N problems x k copies" layout of an evaluation file. Tables in, problems out: no file is read or written here.

The DAPO row schema (what verl's RLHFDataset and the DAPO reward manager read)::

    data_source   str                         e.g. "math_dapo"
    prompt        list[{role: str, content: str}]   a chat; at least one "user" message
    ability       str                         e.g. "MATH"
    reward_model  {ground_truth: str, style: str}   the verifier's answer, e.g. {"ground_truth": "34", "style": "rule"}
    extra_info    struct                      free-form (index, raw_problem, ...)
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Optional

import pyarrow as pa
import pyarrow.compute as pc

from dapo.data.parquet import DataError

# AIME-2024 as DAPO evaluates it: 30 problems, each repeated 32 times, so one sample per row gives avg@32.
AIME_PROBLEMS = 30
AIME_REPEATS = 32

REQUIRED_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")
CHAT_ROLES = ("system", "user", "assistant")


# --------------------------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Problem:
    """One kind of defect: the first offending row, the column (dotted for nested fields) and how many rows have it."""

    column: str
    message: str
    row: Optional[int] = None
    count: int = 1
    value: Any = None

    def __str__(self) -> str:
        where = f"row {self.row}: " if self.row is not None else ""
        more = f" ({self.count - 1} more row(s) like it)" if self.count > 1 else ""
        shown = "" if self.value is None else f" -- value: {_short(self.value)}"
        return f"{where}column '{self.column}' {self.message}{shown}{more}"


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _first_bad(mask: pa.Array | pa.ChunkedArray) -> tuple[Optional[int], int]:
    """(first index where ``mask`` is true, number of true entries); nulls in the mask count as false."""
    mask = pc.fill_null(mask, False)
    count = pc.sum(mask).as_py() or 0
    if not count:
        return None, 0
    idx = pc.indices_nonzero(mask.combine_chunks() if isinstance(mask, pa.ChunkedArray) else mask)
    return int(idx[0].as_py()), int(count)


def _rows_with(mask: pa.Array, parents: pa.Array, nrows: int) -> pa.Array:
    """Row-level mask from a mask over list elements (``parents`` = the row of each element)."""
    bad_parents = pc.filter(parents, pc.fill_null(mask, False))
    return pc.is_in(pa.array(range(nrows), pa.int64()), value_set=pc.unique(bad_parents).cast(pa.int64()))


def validate_table(table: pa.Table, row_offset: int = 0) -> list[Problem]:
    """Every schema defect of ``table`` in the DAPO row schema (empty list = valid); vectorised.

    Rows are reported as ``row_offset`` + their index in ``table`` (for record batches of a larger file).
    """
    problems = _validate(table)
    for prob in problems:
        if prob.row is not None:
            prob.row += row_offset
    return problems


class _Table:
    """One table under validation: its columns and the problems found so far."""

    def __init__(self, table: pa.Table):
        self.table, self.n = table, table.num_rows
        self.names = set(table.column_names)
        self.problems: list[Problem] = []

    def col(self, name: str) -> pa.Array:
        return self.table.column(name).combine_chunks()

    def value_at(self, name: str, row: int) -> Any:
        return self.table.column(name)[row].as_py()

    def check(self, mask: pa.Array, column: str, message: str, top: str) -> None:
        """A problem at the rows where ``mask`` is true (shown: the first, and the value of its column ``top``)."""
        row, count = _first_bad(mask)
        if row is not None:
            self.problems.append(Problem(column, message, row, count, self.value_at(top, row)))

    def every_row(self, column: str, message: str, top: str) -> None:
        """A problem of the column's type: every row has it (shown: the first)."""
        n = self.n
        self.problems.append(Problem(column, message, 0 if n else None, n, self.value_at(top, 0) if n else None))


def _validate(table: pa.Table) -> list[Problem]:
    """The problems of ``table``, column by column (the schema in the module docstring)."""
    t = _Table(table)
    missing = [c for c in REQUIRED_COLUMNS if c not in t.names]
    for col in missing:
        t.problems.append(Problem(col, f"is missing (columns present: {', '.join(table.column_names)})"))
    _check_plain_strings(t)
    if "prompt" in t.names:
        _check_prompt(t)
    if "reward_model" in t.names:
        _check_reward_model(t)
    if "extra_info" in t.names:
        _check_extra_info(t)
    return t.problems


def _check_plain_strings(t: _Table) -> None:
    """data_source and ability: strings, not null; data_source not empty."""
    for name in ("data_source", "ability"):
        if name not in t.names:
            continue
        arr = t.col(name)
        if not _is_string(arr.type):
            t.every_row(name, f"has type {arr.type}, expected string", name)
            continue
        t.check(arr.is_null(), name, "is null", name)
        if name == "data_source":
            t.check(pc.equal(pc.utf8_length(arr), 0), name, "is empty", name)


def _check_prompt(t: _Table) -> None:
    """prompt: list<struct<role: string, content: string>>, a non-empty chat with a user message."""
    n, check = t.n, t.check
    arr = t.col("prompt")
    expected = "a chat: list of {role, content} (e.g. [{'role': 'user', 'content': '...'}])"
    if not _is_list(arr.type) or not pa.types.is_struct(arr.type.value_type):
        t.every_row("prompt", f"has type {arr.type}, expected {expected}", "prompt")
        return
    fields = {arr.type.value_type.field(i).name: arr.type.value_type.field(i).type
              for i in range(arr.type.value_type.num_fields)}
    bad_fields = [f for f in ("role", "content") if f not in fields or not _is_string(fields[f])]
    if bad_fields:
        t.every_row(f"prompt[].{bad_fields[0]}", f"is missing or not a string (message type: {arr.type.value_type}); "
                    f"expected {expected}", "prompt")
        return
    check(arr.is_null(), "prompt", "is null", "prompt")
    check(pc.equal(pc.list_value_length(arr), 0), "prompt", "is an empty chat", "prompt")
    flat = pc.list_flatten(arr)
    parents = pc.list_parent_indices(arr)
    role = pc.struct_field(flat, "role")
    content = pc.struct_field(flat, "content")
    check(_rows_with(flat.is_null(), parents, n), "prompt[]", "holds a null message", "prompt")
    bad_role = pc.invert(pc.fill_null(pc.is_in(role, value_set=pa.array(CHAT_ROLES)), False))
    check(_rows_with(bad_role, parents, n), "prompt[].role", f"is not one of {list(CHAT_ROLES)}", "prompt")
    bad_content = pc.or_(content.is_null(), pc.equal(pc.utf8_length(pc.fill_null(content, "")), 0))
    check(_rows_with(bad_content, parents, n), "prompt[].content", "is null or empty", "prompt")
    has_user = _rows_with(pc.equal(role, "user"), parents, n)
    nonempty = pc.greater(pc.fill_null(pc.list_value_length(arr), 0), 0)
    check(pc.and_(nonempty, pc.invert(has_user)), "prompt", "has no 'user' message", "prompt")


def _check_reward_model(t: _Table) -> None:
    """reward_model: struct<ground_truth: string, style: string>, a non-empty ground truth."""
    arr = t.col("reward_model")
    if not pa.types.is_struct(arr.type):
        t.every_row("reward_model", f"has type {arr.type}, expected {{ground_truth: str, style: str}}", "reward_model")
        return
    fields = {arr.type.field(i).name: arr.type.field(i).type for i in range(arr.type.num_fields)}
    t.check(arr.is_null(), "reward_model", "is null", "reward_model")
    for sub in ("ground_truth", "style"):
        if sub not in fields:
            t.every_row(f"reward_model.{sub}", f"is missing (reward_model has: {', '.join(fields) or 'no fields'})",
                        "reward_model")
            continue
        if not _is_string(fields[sub]):
            t.every_row(f"reward_model.{sub}", f"has type {fields[sub]}, expected string", "reward_model")
            continue
        sub_arr = pc.struct_field(arr, sub)
        if sub == "ground_truth":
            empty = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(pc.fill_null(sub_arr, ""))), 0)
            t.check(pc.or_(sub_arr.is_null(), empty), "reward_model.ground_truth", "is missing or empty",
                    "reward_model")
        else:
            t.check(sub_arr.is_null(), "reward_model.style", "is null", "reward_model")


def _check_extra_info(t: _Table) -> None:
    """extra_info: a struct (or map) of free-form fields."""
    arr = t.col("extra_info")
    if not (pa.types.is_struct(arr.type) or pa.types.is_map(arr.type)):
        t.every_row("extra_info", f"has type {arr.type}, expected a struct (e.g. {{index: int}})", "extra_info")
    else:
        t.check(arr.is_null(), "extra_info", "is null", "extra_info")


# --------------------------------------------------------------------------------------------------------------------
# Statistics: unique prompts, repeats, de-duplication
# --------------------------------------------------------------------------------------------------------------------


def prompt_keys(table: pa.Table) -> pa.Array:
    """One string per row identifying its chat (roles + contents); equal keys = the same prompt."""
    arr = table.column("prompt").combine_chunks()
    flat = pc.list_flatten(arr)
    msg = pc.binary_join_element_wise(pc.struct_field(flat, "role"), pc.struct_field(flat, "content"), "\x1f")
    offsets = pc.subtract(arr.offsets, arr.offsets[0])
    per_row = pa.ListArray.from_arrays(offsets, msg)
    return pc.binary_join(per_row, "\x1e")


@dataclass
class FileReport:
    """What a parquet file holds; ``problems`` empty means it passed validation."""

    path: str
    rows: int
    unique_prompts: Optional[int] = None
    min_repeats: Optional[int] = None
    max_repeats: Optional[int] = None
    data_sources: dict[str, int] = field(default_factory=dict)
    conflicting_ground_truths: int = 0
    sha256: Optional[str] = None
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["problems"] = [str(p) for p in self.problems]
        return d

    def summary(self) -> str:
        lines = [f"{self.path}: {self.rows:,} rows"]
        if self.unique_prompts is not None:
            rep = (f"each repeated {self.min_repeats}x" if self.min_repeats == self.max_repeats
                   else f"repeated {self.min_repeats}-{self.max_repeats}x")
            lines.append(f"  unique prompts: {self.unique_prompts:,} ({rep})")
        if self.data_sources:
            lines.append("  data_source: " + ", ".join(f"{k} ({v:,})" for k, v in self.data_sources.items()))
        if self.sha256:
            lines.append(f"  sha256: {self.sha256}")
        lines += [f"  warning: {w}" for w in self.warnings]
        lines += [f"  ERROR {p}" for p in self.problems]
        return "\n".join(lines)


def check_layout(report: FileReport, problems: int, copies: int, title: str = "the benchmark") -> list[Problem]:
    """An evaluation file's layout: ``problems`` distinct prompts, each exactly ``copies`` times (avg@copies from one
    sample per row), ``problems x copies`` rows."""
    out = []
    want_rows = problems * copies
    if report.rows != want_rows:
        out.append(Problem("*", f"file has {report.rows} rows; {title} for avg@{copies} has {want_rows} "
                                f"({problems} problems x {copies})"))
    if report.unique_prompts is not None and report.unique_prompts != problems:
        out.append(Problem("prompt", f"has {report.unique_prompts} unique prompts; {title} has {problems}"))
    if report.min_repeats is not None and not (report.min_repeats == report.max_repeats == copies):
        out.append(Problem("prompt", f"prompts are repeated {report.min_repeats}-{report.max_repeats}x; "
                                     f"expected each exactly {copies}x"))
    return out


def check_aime(report: FileReport) -> list[Problem]:
    """AIME-2024 as DAPO evaluates it: 30 problems x 32 repeats = 960 rows (avg@32 from one sample per row)."""
    return check_layout(report, AIME_PROBLEMS, AIME_REPEATS, "AIME-2024")


def parse_layout(spec: str) -> tuple[int, int]:
    """``"30x32"`` -> (30, 32)."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX*]\s*(\d+)\s*", spec)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise DataError(f"layout must be PROBLEMSxCOPIES (e.g. 30x32), got {spec!r}")
    return int(m.group(1)), int(m.group(2))

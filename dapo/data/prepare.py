"""Training / evaluation data in the DAPO-Math-17k schema: download, validate, de-duplicate, load.

``dapo data prepare [--out DIR] [--dedup]`` fetches the two parquet files the presets read
(``recipe.data.train_files`` / ``val_files``)::

    BytedTsinghua-SIA/DAPO-Math-17k  data/dapo-math-17k.parquet  ->  OUT/dapo-math-17k.parquet
    BytedTsinghua-SIA/AIME-2024      data/aime-2024.parquet      ->  OUT/aime-2024.parquet

then builds the evaluation benchmarks AIME-2025 (``aime-2025.parquet``, 30 x 32) and MATH-500 (``math-500.parquet``,
500 x 4) from their hub datasets in the same schema and prompt template (:mod:`dapo.data.benchmarks`; ``--benchmarks``),
validates every row, reports unique vs total prompts (the hub training file is ~17.9k problems, each repeated ~100
times: 1,791,700 rows), optionally writes a de-duplicated training file (``dapo-math-17k-dedup.parquet``) and prints
what one epoch over each file means in rollout and gradient steps for the presets (see ``dapo.plan.steps``).

The DAPO row schema (what verl's RLHFDataset and the DAPO reward manager read)::

    data_source   str                         e.g. "math_dapo"
    prompt        list[{role: str, content: str}]   a chat; at least one "user" message
    ability       str                         e.g. "MATH"
    reward_model  {ground_truth: str, style: str}   the verifier's answer, e.g. {"ground_truth": "34", "style": "rule"}
    extra_info    struct                      free-form (index, raw_problem, ...)

Idempotent and crash-safe: each output is written to a temporary file in the output directory, validated, then
renamed into place (``os.replace``), so a reader never sees a half-written parquet; ``manifest.json`` beside the files
records their sha256, and files whose checksum matches are not fetched again.

Sources: the Hugging Face hub by default (``huggingface_hub``; ``HF_TOKEN`` / ``HF_ENDPOINT`` from the environment),
or a local copy: ``--source DIR`` (a mirror laid out as ``DIR/<owner>/<name>/<path>`` or holding the files directly)
or ``--train-repo file:///path/to/repo-root`` / a path to the parquet file itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dapo.util.fsutil import atomic_write, atomic_write_text, temp_beside
from dapo.data.parquet import DataError, parquet_rows  # noqa: F401 (both also imported from here)

# --------------------------------------------------------------------------------------------------------------------
# Where the data lives
# --------------------------------------------------------------------------------------------------------------------

TRAIN_REPO = "BytedTsinghua-SIA/DAPO-Math-17k"
TRAIN_PATH_IN_REPO = "data/dapo-math-17k.parquet"
VAL_REPO = "BytedTsinghua-SIA/AIME-2024"
VAL_PATH_IN_REPO = "data/aime-2024.parquet"

# file names the presets use (dapo/presets/_dapo_qwen32b.yaml: /shared/data/<name>)
TRAIN_FILE = "dapo-math-17k.parquet"
VAL_FILE = "aime-2024.parquet"
DEDUP_FILE = "dapo-math-17k-dedup.parquet"
MANIFEST = "manifest.json"

# AIME-2024 as DAPO evaluates it: 30 problems, each repeated 32 times, so one sample per row gives avg@32.
AIME_PROBLEMS = 30
AIME_REPEATS = 32
# evaluation benchmarks `prepare` builds beside the two release files (dapo.data.benchmarks)
EXTRA_BENCHMARKS = ("aime25", "math500")

REQUIRED_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")
CHAT_ROLES = ("system", "user", "assistant")
# pandas writes its index as an extra column; it carries no meaning for training
PANDAS_INDEX = "__index_level_0__"


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


def _validate(table: pa.Table) -> list[Problem]:
    problems: list[Problem] = []
    names = set(table.column_names)
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    for col in missing:
        problems.append(Problem(col, f"is missing (columns present: {', '.join(table.column_names)})"))
    n = table.num_rows

    def col(name: str) -> pa.Array:
        return table.column(name).combine_chunks()

    def value_at(name: str, row: int) -> Any:
        return table.column(name)[row].as_py()

    def check(mask: pa.Array, column: str, message: str, top: str) -> None:
        row, count = _first_bad(mask)
        if row is not None:
            problems.append(Problem(column, message, row, count, value_at(top, row)))

    # plain string columns
    for name in ("data_source", "ability"):
        if name not in names:
            continue
        arr = col(name)
        if not _is_string(arr.type):
            problems.append(Problem(name, f"has type {arr.type}, expected string", 0 if n else None,
                                    n, value_at(name, 0) if n else None))
            continue
        check(arr.is_null(), name, "is null", name)
        if name == "data_source":
            check(pc.equal(pc.utf8_length(arr), 0), name, "is empty", name)

    # prompt: list<struct<role: string, content: string>>
    if "prompt" in names:
        arr = col("prompt")
        expected = "a chat: list of {role, content} (e.g. [{'role': 'user', 'content': '...'}])"
        if not _is_list(arr.type) or not pa.types.is_struct(arr.type.value_type):
            problems.append(Problem("prompt", f"has type {arr.type}, expected {expected}",
                                    0 if n else None, n, value_at("prompt", 0) if n else None))
        else:
            fields = {arr.type.value_type.field(i).name: arr.type.value_type.field(i).type
                      for i in range(arr.type.value_type.num_fields)}
            bad_fields = [f for f in ("role", "content") if f not in fields or not _is_string(fields[f])]
            if bad_fields:
                problems.append(Problem(f"prompt[].{bad_fields[0]}",
                                        f"is missing or not a string (message type: {arr.type.value_type}); "
                                        f"expected {expected}", 0 if n else None, n,
                                        value_at("prompt", 0) if n else None))
            else:
                check(arr.is_null(), "prompt", "is null", "prompt")
                check(pc.equal(pc.list_value_length(arr), 0), "prompt", "is an empty chat", "prompt")
                flat = pc.list_flatten(arr)
                parents = pc.list_parent_indices(arr)
                role = pc.struct_field(flat, "role")
                content = pc.struct_field(flat, "content")
                check(_rows_with(flat.is_null(), parents, n), "prompt[]", "holds a null message", "prompt")
                bad_role = pc.invert(pc.fill_null(pc.is_in(role, value_set=pa.array(CHAT_ROLES)), False))
                check(_rows_with(bad_role, parents, n), "prompt[].role",
                      f"is not one of {list(CHAT_ROLES)}", "prompt")
                bad_content = pc.or_(content.is_null(), pc.equal(pc.utf8_length(pc.fill_null(content, "")), 0))
                check(_rows_with(bad_content, parents, n), "prompt[].content", "is null or empty", "prompt")
                has_user = _rows_with(pc.equal(role, "user"), parents, n)
                nonempty = pc.greater(pc.fill_null(pc.list_value_length(arr), 0), 0)
                check(pc.and_(nonempty, pc.invert(has_user)), "prompt", "has no 'user' message", "prompt")

    # reward_model: struct<ground_truth: string, style: string>
    if "reward_model" in names:
        arr = col("reward_model")
        if not pa.types.is_struct(arr.type):
            problems.append(Problem("reward_model", f"has type {arr.type}, expected {{ground_truth: str, style: str}}",
                                    0 if n else None, n, value_at("reward_model", 0) if n else None))
        else:
            fields = {arr.type.field(i).name: arr.type.field(i).type for i in range(arr.type.num_fields)}
            check(arr.is_null(), "reward_model", "is null", "reward_model")
            for sub in ("ground_truth", "style"):
                if sub not in fields:
                    problems.append(Problem(f"reward_model.{sub}", f"is missing (reward_model has: "
                                            f"{', '.join(fields) or 'no fields'})", 0 if n else None, n,
                                            value_at("reward_model", 0) if n else None))
                    continue
                if not _is_string(fields[sub]):
                    problems.append(Problem(f"reward_model.{sub}", f"has type {fields[sub]}, expected string",
                                            0 if n else None, n, value_at("reward_model", 0) if n else None))
                    continue
                sub_arr = pc.struct_field(arr, sub)
                if sub == "ground_truth":
                    empty = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(pc.fill_null(sub_arr, ""))), 0)
                    check(pc.or_(sub_arr.is_null(), empty), "reward_model.ground_truth", "is missing or empty",
                          "reward_model")
                else:
                    check(sub_arr.is_null(), "reward_model.style", "is null", "reward_model")

    # extra_info: a struct (or map) of free-form fields
    if "extra_info" in names:
        arr = col("extra_info")
        if not (pa.types.is_struct(arr.type) or pa.types.is_map(arr.type)):
            problems.append(Problem("extra_info", f"has type {arr.type}, expected a struct (e.g. {{index: int}})",
                                    0 if n else None, n, value_at("extra_info", 0) if n else None))
        else:
            check(arr.is_null(), "extra_info", "is null", "extra_info")
    return problems


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


class _Scanner:
    """Validation + prompt statistics accumulated over record batches (bounded memory on the 1.8M-row file).

    Prompts get global ids through a dict of the *unique* keys only: each batch is dictionary-encoded by arrow and
    just its distinct keys are looked up.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.rows = 0
        self.problems: dict[tuple[str, str], Problem] = {}
        self.ids: dict[str, int] = {}
        self.first_row: list[int] = []
        self.counts = np.zeros(0, dtype=np.int64)
        self.gt_pairs: set[tuple[int, str]] = set()
        self.sources: dict[str, int] = {}

    def add(self, table: pa.Table) -> None:
        offset, n = self.rows, table.num_rows
        self.rows += n
        for prob in validate_table(table, offset):
            key = (prob.column, prob.message)
            if key in self.problems:
                self.problems[key].count += prob.count
            else:
                self.problems[key] = prob
        if self.problems or n == 0:
            return  # statistics only for valid data
        enc = prompt_keys(table).dictionary_encode()
        local = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        gids = np.empty(len(enc.dictionary), dtype=np.int64)
        for i, key in enumerate(enc.dictionary.to_pylist()):
            gid = self.ids.get(key)
            if gid is None:
                gid = self.ids[key] = len(self.ids)
                self.first_row.append(-1)
            gids[i] = gid
        row_gid = gids[local]
        if len(self.ids) > len(self.counts):
            self.counts = np.concatenate([self.counts, np.zeros(len(self.ids) - len(self.counts), np.int64)])
        self.counts += np.bincount(row_gid, minlength=len(self.counts))
        uniq, pos = np.unique(row_gid, return_index=True)
        for gid, at in zip(uniq.tolist(), pos.tolist()):
            if self.first_row[gid] < 0:
                self.first_row[gid] = offset + at
        gt = pc.struct_field(table.column("reward_model").combine_chunks(), "ground_truth").dictionary_encode()
        gt_local = gt.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        gt_names = gt.dictionary.to_pylist()
        pairs = np.unique(row_gid * len(gt_names) + gt_local)
        self.gt_pairs.update((int(q // len(gt_names)), gt_names[int(q % len(gt_names))]) for q in pairs)
        for v in pc.value_counts(table.column("data_source").combine_chunks()).to_pylist():
            self.sources[str(v["values"])] = self.sources.get(str(v["values"]), 0) + int(v["counts"])

    def report(self) -> FileReport:
        rep = FileReport(path=self.path, rows=self.rows, problems=list(self.problems.values()))
        if rep.problems or not self.rows:
            return rep
        rep.unique_prompts = len(self.ids)
        rep.min_repeats = int(self.counts.min())
        rep.max_repeats = int(self.counts.max())
        per_prompt = np.bincount(np.fromiter((g for g, _ in self.gt_pairs), np.int64, len(self.gt_pairs)),
                                 minlength=len(self.ids))
        rep.conflicting_ground_truths = int((per_prompt > 1).sum())
        if rep.conflicting_ground_truths:
            rep.warnings.append(f"{rep.conflicting_ground_truths} prompt(s) appear with different "
                                "reward_model.ground_truth values")
        rep.data_sources = self.sources
        return rep

    def first_rows(self) -> np.ndarray:
        """Row index of the first occurrence of every prompt, ascending."""
        return np.sort(np.asarray(self.first_row, dtype=np.int64))


def _scan_table(table: pa.Table, path: str) -> _Scanner:
    sc = _Scanner(path)
    sc.add(table)
    return sc


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


def _drop_index(table: pa.Table) -> pa.Table:
    return table.drop_columns([PANDAS_INDEX]) if PANDAS_INDEX in table.column_names else table


def dedup_table(table: pa.Table) -> pa.Table:
    """First occurrence of every prompt, in file order (the pandas index column is dropped)."""
    sc = _scan_table(table, "<table>")
    if sc.problems:
        raise DataError("cannot de-duplicate invalid rows:\n  " + "\n  ".join(map(str, sc.problems.values())))
    return _drop_index(table.take(pa.array(sc.first_rows())))


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_table(path: str | os.PathLike) -> pa.Table:
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file")
    try:
        return pq.read_table(p)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"{p}: not a readable parquet file ({exc})") from exc


def _batches(path: str | os.PathLike, batch_rows: int) -> Iterable[pa.Table]:
    try:
        pf = pq.ParquetFile(path)
        for batch in pf.iter_batches(batch_size=batch_rows):
            yield pa.Table.from_batches([batch])
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"{path}: not a readable parquet file ({exc})") from exc


def _scan_file(path: str | os.PathLike, batch_rows: int) -> _Scanner:
    if not Path(path).exists():
        raise DataError(f"{path}: no such file")
    sc = _Scanner(str(path))
    for table in _batches(path, batch_rows):
        sc.add(table)
    return sc


def check_file(path: str | os.PathLike, *, aime: bool = False, checksum: bool = True,
               batch_rows: int = 65536, layout: Optional[tuple[int, int]] = None,
               title: str = "the benchmark") -> FileReport:
    """Validate a parquet file in the DAPO schema, streaming ``batch_rows`` rows at a time.

    ``aime`` adds the 30 x 32 AIME-2024 checks, ``layout=(problems, copies)`` those of any "N problems x k" file.
    Problems name the first bad row (0-based) and the column.
    """
    report = _scan_file(path, batch_rows).report()
    if aime and report.ok:
        report.problems += check_aime(report)
    if layout is not None and report.ok:
        report.problems += check_layout(report, *layout, title)
    if checksum:
        report.sha256 = sha256_file(Path(path))
    return report


def dedup_file(src: str | os.PathLike, dst: str | os.PathLike, *, batch_rows: int = 65536) -> int:
    """Write the first occurrence of every prompt of ``src`` to ``dst`` (atomically, streaming); returns rows."""
    sc = _scan_file(src, batch_rows)
    if sc.problems:
        raise DataError(f"{src}: cannot de-duplicate invalid rows:\n  " +
                        "\n  ".join(map(str, sc.problems.values())))
    keep = sc.first_rows()
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_beside(dst, ".tmp")
    writer = None
    offset = 0
    try:
        for table in _batches(src, batch_rows):
            n = table.num_rows
            lo, hi = np.searchsorted(keep, [offset, offset + n])
            offset += n
            if hi == lo:
                continue
            part = _drop_index(table.take(pa.array(keep[lo:hi] - (offset - n))))
            if writer is None:
                writer = pq.ParquetWriter(tmp, part.schema)
            writer.write_table(part)
        if writer is None:
            raise DataError(f"{src}: no rows to write")
        writer.close()
        writer = None
        os.replace(tmp, dst)
    except BaseException:
        if writer is not None:
            writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return len(keep)


def load_rows(path: str | os.PathLike, *, limit: Optional[int] = None) -> list[dict[str, Any]]:
    """Rows of a DAPO-schema parquet file as dicts (``data_source, prompt, ability, reward_model, extra_info``).

    Validates first: raises :class:`DataError` naming the file, the first bad row and the column.
    """
    table = read_table(path)
    problems = validate_table(table)
    if problems:
        raise DataError(f"{path}: not in the DAPO schema:\n  " + "\n  ".join(str(p) for p in problems))
    table = table.select(list(REQUIRED_COLUMNS))
    if limit is not None:
        table = table.slice(0, limit)
    return table.to_pylist()


def _atomic_write_table(table: pa.Table, path: Path) -> None:
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def write_rows(rows: Iterable[dict[str, Any]], path: str | os.PathLike) -> Path:
    """Validate ``rows`` (DAPO schema) and write them to ``path`` atomically (temp file + rename)."""
    rows = list(rows)
    if not rows:
        raise DataError(f"{path}: refusing to write an empty file")
    try:
        table = pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DataError(f"{path}: rows do not form a table ({exc})") from exc
    problems = validate_table(table)
    if problems:
        raise DataError(f"{path}: rows are not in the DAPO schema:\n  " + "\n  ".join(str(p) for p in problems))
    p = Path(path)
    _atomic_write_table(table, p)
    return p


# --------------------------------------------------------------------------------------------------------------------
# Fetching: the hub, or a local copy
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Source:
    """Where one file comes from; ``fetch(dest)`` copies it to ``dest``."""

    description: str
    fetch: Callable[[Path], None]


def _local_candidates(root: Path, repo: str, path_in_repo: str) -> list[Path]:
    name = Path(path_in_repo).name
    return [root / repo / path_in_repo, root / path_in_repo, root / name]


def resolve_source(spec: str, path_in_repo: str, *, source_dir: Optional[str] = None,
                   revision: Optional[str] = None) -> Source:
    """``spec``: a hub dataset id (``owner/name``), ``file:///dir`` (a repo root or the file), or a local path.

    With ``source_dir`` a hub id is looked up in the local mirror instead of the hub.
    """

    def local(path: Path) -> Source:
        def fetch(dest: Path) -> None:
            shutil.copyfile(path, dest)

        return Source(str(path), fetch)

    def from_root(root: Path, repo: str) -> Source:
        if root.is_file():
            return local(root)
        candidates = _local_candidates(root, repo, path_in_repo) if repo else [root / path_in_repo,
                                                                            root / Path(path_in_repo).name]
        for c in candidates:
            if c.is_file():
                return local(c)
        raise DataError(f"{path_in_repo} not found under {root} (looked for: {', '.join(map(str, candidates))})")

    if spec.startswith("file://"):
        return from_root(Path(spec[len("file://"):]), "")
    if Path(spec).exists():
        return from_root(Path(spec), "")
    if source_dir:
        return from_root(Path(source_dir), spec)
    if spec.count("/") != 1:
        raise DataError(f"{spec!r} is neither a hub dataset id (owner/name) nor an existing local path")
    return _hub_source(spec, path_in_repo, revision)


def _hub_source(repo: str, path_in_repo: str, revision: Optional[str]) -> Source:
    url = f"hf://datasets/{repo}/{path_in_repo}" + (f"@{revision}" if revision else "")

    def fetch(dest: Path) -> None:
        try:
            from huggingface_hub import hf_hub_download
        except ImportError as exc:  # pragma: no cover - a core dependency
            raise DataError("huggingface_hub is not installed: pip install huggingface_hub") from exc
        staging = dest.parent / f".{dest.name}.hub"
        try:
            got = hf_hub_download(
                repo_id=repo,
                filename=path_in_repo,
                repo_type="dataset",
                revision=revision,
                token=os.environ.get("HF_TOKEN") or None,
                local_dir=str(staging),
            )
            shutil.move(got, dest)
        except DataError:
            raise
        except Exception as exc:  # network, auth, missing file: say what to do about it
            raise DataError(
                f"could not download {url}: {type(exc).__name__}: {exc}\n"
                "  (set HF_TOKEN for gated/private repos, HF_ENDPOINT for a mirror, or pass --source DIR / "
                "--train-repo file:///path with a local copy)"
            ) from exc
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    return Source(url, fetch)


# --------------------------------------------------------------------------------------------------------------------
# prepare
# --------------------------------------------------------------------------------------------------------------------


def _load_manifest(out: Path) -> dict[str, Any]:
    p = out / MANIFEST
    if not p.exists():
        return {"format": 1, "files": {}}
    try:
        data = json.loads(p.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
            raise ValueError("no 'files' mapping")
        return data
    except (ValueError, OSError) as exc:
        print(f"warning: {p} is unreadable ({exc}); checksums will be recomputed", file=sys.stderr)
        return {"format": 1, "files": {}}


def _save_manifest(out: Path, manifest: dict[str, Any]) -> None:
    atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _entry(report: FileReport, source: str, **extra: Any) -> dict[str, Any]:
    return {
        "sha256": report.sha256,
        "bytes": Path(report.path).stat().st_size,
        "rows": report.rows,
        "unique_prompts": report.unique_prompts,
        "min_repeats": report.min_repeats,
        "max_repeats": report.max_repeats,
        "source": source,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **extra,
    }


def _report_from_entry(path: Path, entry: dict[str, Any]) -> FileReport:
    return FileReport(path=str(path), rows=entry["rows"], unique_prompts=entry.get("unique_prompts"),
                      min_repeats=entry.get("min_repeats"), max_repeats=entry.get("max_repeats"),
                      sha256=entry["sha256"])


def _up_to_date(path: Path, entry: Optional[dict[str, Any]], log: Callable[[str], None]) -> bool:
    if not path.exists() or not entry:
        return False
    digest = sha256_file(path)
    if digest == entry.get("sha256"):
        return True
    log(f"{path.name}: checksum {digest[:12]} differs from the manifest ({str(entry.get('sha256'))[:12]}); "
        "fetching again")
    return False


def _fetch_one(out: Path, name: str, source: Source, manifest: dict[str, Any], *, aime: bool, force: bool,
               log: Callable[[str], None]) -> FileReport:
    target = out / name
    entry = manifest["files"].get(name)
    if not force and _up_to_date(target, entry, log):
        log(f"{name}: present, checksum matches the manifest -- skipped")
        return _report_from_entry(target, entry)
    tmp = temp_beside(target, ".download")
    log(f"{name}: fetching {source.description}")
    try:
        source.fetch(tmp)
        report = check_file(tmp, aime=aime)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if not report.ok:
        kept = out / f".{name}.rejected"
        os.replace(tmp, kept)
        raise DataError(
            f"{source.description} failed validation; nothing in {out} was replaced "
            f"(the download is kept at {kept} for inspection):\n  " + "\n  ".join(str(p) for p in report.problems)
        )
    os.replace(tmp, target)
    report.path = str(target)
    manifest["files"][name] = _entry(report, source.description)
    _save_manifest(out, manifest)
    return report


def _write_dedup(out: Path, train: FileReport, manifest: dict[str, Any], *, force: bool,
                 log: Callable[[str], None]) -> FileReport:
    target = out / DEDUP_FILE
    entry = manifest["files"].get(DEDUP_FILE)
    if (not force and entry and entry.get("derived_from_sha256") == train.sha256
            and _up_to_date(target, entry, log)):
        log(f"{DEDUP_FILE}: present and derived from the current {TRAIN_FILE} -- skipped")
        return _report_from_entry(target, entry)
    dedup_file(out / TRAIN_FILE, target)
    report = check_file(target)
    if not report.ok or report.max_repeats != 1:  # pragma: no cover - our own output; guards a regression
        target.unlink(missing_ok=True)
        raise DataError(f"{target}: de-duplicated file failed its own check: {report.summary()}")
    manifest["files"][DEDUP_FILE] = _entry(report, f"dedup of {TRAIN_FILE}", derived_from_sha256=train.sha256)
    _save_manifest(out, manifest)
    log(f"{DEDUP_FILE}: wrote {report.rows:,} rows (one per unique prompt)")
    return report


def _benchmark_sources(bench, spec: str, source_dir: Optional[str],
                       revision: Optional[str]) -> list[tuple[Source, str]]:
    """The raw problem file(s) of ``bench`` as (source, file name): a local file, a local copy of a dataset
    repository, or a known hub dataset's files (from the ``--source`` mirror or the hub)."""
    from dapo.data.benchmarks import KNOWN_SOURCES

    if spec.startswith("file://"):
        spec = spec[len("file://"):]
    if Path(spec).is_file():
        return [(resolve_source(spec, Path(spec).name), Path(spec).name)]
    known = KNOWN_SOURCES.get(bench.name, {})
    if Path(spec).is_dir():
        paths = bench.paths if (Path(spec) / bench.paths[0]).exists() else next(
            (ps for ps in known.values() if (Path(spec) / ps[0]).exists()), bench.paths)
        return [(resolve_source(spec, p), Path(p).name) for p in paths]
    if spec not in known:
        raise DataError(f"--{bench.name}-repo {spec!r}: not a local file and not a known {bench.title} dataset "
                        f"({', '.join(known)}); pass a jsonl/json/parquet file with problem and answer columns")
    return [(resolve_source(spec, p, source_dir=source_dir, revision=revision), Path(p).name) for p in known[spec]]


def _fetch_benchmark(out: Path, bench, spec: str, manifest: dict[str, Any], *, source_dir: Optional[str],
                     revision: Optional[str], force: bool, log: Callable[[str], None]) -> FileReport:
    """Raw problems -> ``out/<bench.file>`` in the DAPO schema and prompt template, checked as N problems x k."""
    from dapo.data.benchmarks import BenchmarkError, write_benchmark

    target = out / bench.file
    entry = manifest["files"].get(bench.file)
    sources = _benchmark_sources(bench, spec, source_dir, revision)
    described = " + ".join(s.description for s, _ in sources)
    if not force and entry and entry.get("source") != described:
        log(f"{bench.file}: built from {entry.get('source')}, now asked for {described}; building again")
    elif not force and _up_to_date(target, entry, log):
        log(f"{bench.file}: present, checksum matches the manifest -- skipped")
        return _report_from_entry(target, entry)
    log(f"{bench.file}: building {bench.title} from {described}")
    raws = [temp_beside(out / f"{bench.name}-raw", f"-{name}") for _, name in sources]
    tmp = temp_beside(target, ".build")
    try:
        for (src, _), raw in zip(sources, raws):
            src.fetch(raw)
        raw_sha = [sha256_file(r) for r in raws]
        try:
            write_benchmark(bench, raws, tmp, described)
        except BenchmarkError as exc:
            raise DataError(f"{bench.title}: {exc}; nothing in {out} was replaced") from None
        report = check_file(tmp, layout=(bench.problems, bench.copies), title=bench.title)
        if not report.ok:  # pragma: no cover - our own output; guards a regression
            raise DataError(f"{bench.title}: the built file failed its check:\n  " +
                            "\n  ".join(str(p) for p in report.problems))
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
        for r in raws:
            r.unlink(missing_ok=True)
    report.path = str(target)
    manifest["files"][bench.file] = _entry(report, described, raw_sha256=raw_sha, benchmark=bench.name,
                                           layout=f"{bench.problems}x{bench.copies}")
    _save_manifest(out, manifest)
    return report


@dataclass
class PrepareResult:
    out: Path
    train: FileReport
    val: FileReport
    dedup: Optional[FileReport] = None
    benchmarks: dict[str, FileReport] = field(default_factory=dict)


def prepare(out: str | os.PathLike, *, dedup: bool = False, train_repo: str = TRAIN_REPO,
            val_repo: str = VAL_REPO, source_dir: Optional[str] = None, revision: Optional[str] = None,
            force: bool = False, log: Callable[[str], None] = print,
            benchmarks: Iterable[str] = EXTRA_BENCHMARKS,
            benchmark_repos: Optional[dict[str, str]] = None) -> PrepareResult:
    """Fetch + validate the training and AIME files into ``out``, then build the extra evaluation ``benchmarks``
    (AIME-2025, MATH-500; :mod:`dapo.data.benchmarks`) from ``benchmark_repos`` (name -> hub id or file; default the
    benchmark's hub dataset). Idempotent; see the module docstring."""
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = _load_manifest(out_dir)
    train_src = resolve_source(train_repo, TRAIN_PATH_IN_REPO, source_dir=source_dir, revision=revision)
    val_src = resolve_source(val_repo, VAL_PATH_IN_REPO, source_dir=source_dir, revision=revision)
    train = _fetch_one(out_dir, TRAIN_FILE, train_src, manifest, aime=False, force=force, log=log)
    val = _fetch_one(out_dir, VAL_FILE, val_src, manifest, aime=True, force=force, log=log)
    result = PrepareResult(out_dir, train, val)
    if dedup:
        result.dedup = _write_dedup(out_dir, train, manifest, force=force, log=log)
    from dapo.data.benchmarks import get as get_benchmark

    for name in benchmarks:
        bench = get_benchmark(name)
        if bench.repo is None:
            continue  # aime24: the release's ready-made file, fetched above
        spec = (benchmark_repos or {}).get(name) or bench.repo
        result.benchmarks[name] = _fetch_benchmark(out_dir, bench, spec, manifest, source_dir=source_dir,
                                                   revision=revision if spec == bench.repo else None, force=force,
                                                   log=log)
    return result


# --------------------------------------------------------------------------------------------------------------------
# Step semantics for the presets (numbers from dapo.plan.steps, the single place that computes them)
# --------------------------------------------------------------------------------------------------------------------


def epochs_table(files: dict[str, int], presets: Iterable[str]) -> str:
    """What one epoch over each file means for each preset: generation rounds, rollout and gradient steps."""
    from dapo.config import load_preset
    from dapo.plan.steps import PAPER_ROLLOUT_STEPS, step_semantics

    header = ("preset", "file", "rows", "gen rounds/epoch", "rollout steps/epoch", "gradient steps/epoch",
              f"epochs for {PAPER_ROLLOUT_STEPS} rollout steps (paper)")
    rows = []
    for name in presets:
        preset = load_preset(name)
        for fname, nrows in files.items():
            s = step_semantics(preset, nrows)
            epochs = "-" if s.epochs_for_paper is None else (
                f"{s.epochs_for_paper:.2f}" if s.epochs_for_paper < 10 else f"{s.epochs_for_paper:.1f}")
            rows.append((name, fname, f"{nrows:,}", f"{s.gen_rounds_per_epoch:,}", f"{s.rollout_steps_per_epoch:,}",
                         f"{s.gradient_steps_per_epoch:,}", epochs))
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(line.rstrip() for line in [fmt.format(*header), *(fmt.format(*r) for r in rows)])


# --------------------------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dapo data", description="prepare and validate DAPO parquet files")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="download DAPO-Math-17k + AIME-2024, validate, optionally de-duplicate")
    p.add_argument("--out", default="data", help="output directory (the Helm data Job uses /shared/data)")
    p.add_argument("--dedup", action="store_true", help=f"also write {DEDUP_FILE} (one row per unique prompt)")
    p.add_argument("--train-repo", default=TRAIN_REPO,
                   help=f"hub dataset id, file:///repo-root, or a local parquet path (default {TRAIN_REPO})")
    p.add_argument("--val-repo", default=VAL_REPO, help=f"same for the AIME file (default {VAL_REPO})")
    p.add_argument("--source", metavar="DIR",
                   help="local mirror instead of the hub: DIR/<owner>/<name>/<path> or the files directly in DIR")
    p.add_argument("--revision", help="hub revision (branch, tag or commit) to pin")
    p.add_argument("--force", action="store_true", help="fetch again even when the checksum matches")
    p.add_argument("--preset", action="append", default=None,
                   help="preset(s) to print epochs/steps for (default: early, full)")
    p.add_argument("--benchmarks", default=",".join(EXTRA_BENCHMARKS),
                   help="evaluation benchmarks to build beside the two release files (comma list; '' for none)")
    p.add_argument("--aime25-repo", default=None,
                   help="AIME-2025 source: math-ai/aime25 (default), opencompass/AIME2025, or a jsonl/json/parquet "
                   "file with problem (or question) and answer columns")
    p.add_argument("--math500-repo", default=None,
                   help="MATH-500 source: HuggingFaceH4/MATH-500 (default) or a file with its columns")
    c = sub.add_parser("check", help="validate a parquet file in the DAPO schema")
    c.add_argument("file")
    c.add_argument("--aime", action="store_true", help="also check the AIME-2024 layout (30 problems x 32)")
    c.add_argument("--benchmark", default=None, help="also check this benchmark's layout (aime24, aime25, math500)")
    c.add_argument("--layout", default=None, metavar="NxK", help="also check N problems x K copies (e.g. 30x32)")
    c.add_argument("--json", action="store_true", help="machine-readable report")
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "check":
            layout, title = (parse_layout(args.layout), "the file") if args.layout else (None, "the benchmark")
            if args.benchmark:
                from dapo.data.benchmarks import BenchmarkError, get as get_benchmark

                try:
                    b = get_benchmark(args.benchmark)
                except BenchmarkError as exc:
                    raise DataError(str(exc)) from None
                layout, title = (b.problems, b.copies), b.title
            report = check_file(args.file, aime=args.aime, layout=layout, title=title)
            print(json.dumps(report.to_dict(), indent=2) if args.json else report.summary())
            return 0 if report.ok else 1
        from dapo.data.benchmarks import BenchmarkError, parse_list

        try:
            benches = [b.name for b, _ in parse_list(args.benchmarks)] if args.benchmarks.strip() else []
        except BenchmarkError as exc:
            raise DataError(f"--benchmarks: {exc}") from None
        repos = {k: v for k, v in (("aime25", args.aime25_repo), ("math500", args.math500_repo)) if v}
        result = prepare(args.out, dedup=args.dedup, train_repo=args.train_repo, val_repo=args.val_repo,
                         source_dir=args.source, revision=args.revision, force=args.force, benchmarks=benches,
                         benchmark_repos=repos)
    except DataError as exc:
        print(f"dapo data: {exc}", file=sys.stderr)
        return 1
    print()
    for rep in (result.train, result.val, result.dedup, *result.benchmarks.values()):
        if rep is not None:
            print(rep.summary())
    files = {TRAIN_FILE: result.train.rows}
    if result.dedup is not None:
        files[DEDUP_FILE] = result.dedup.rows
    elif result.train.unique_prompts:
        files[f"(dedup: {DEDUP_FILE})"] = result.train.unique_prompts
    from dapo.config import ConfigError

    try:
        print("\nWhat one epoch means (rollout step = one batch of train_batch_size prompts; gradient step = one "
              "optimizer update of ppo_mini_batch_size prompts):")
        print(epochs_table(files, args.preset or ["early", "full"]))
    except ConfigError as exc:
        print(f"dapo data: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

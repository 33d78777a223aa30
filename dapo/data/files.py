"""DAPO-schema parquet files: check (streaming, bounded memory), de-duplicate, write, and read the rows a run trains on.

The check, the de-duplication and every writer validate against :mod:`dapo.data.schema` and raise
:class:`dapo.data.parquet.DataError` naming the file, the first bad row and the column; every writer writes a
temporary file beside the target and renames it into place (``os.replace``), so a reader never sees a half-written
parquet. :func:`read_rows` is what both backends read a run's files with (the columns the loop needs checked;
``dapo data check`` validates a whole file).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dapo.util.fsutil import atomic_write, temp_beside
from dapo.data.parquet import DataError
from dapo.data.schema import FileReport, Problem, check_aime, check_layout, prompt_keys, validate_table

# pandas writes its index as an extra column; it carries no meaning for training
PANDAS_INDEX = "__index_level_0__"


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


def _drop_index(table: pa.Table) -> pa.Table:
    return table.drop_columns([PANDAS_INDEX]) if PANDAS_INDEX in table.column_names else table


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


def read_rows(files: list[str], what: str) -> list[dict[str, Any]]:
    """The rows of the training / validation parquet files both backends read, as plain Python objects; ``what``
    (the preset key that named the files) prefixes every error."""
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for f in files:
        if not Path(f).exists():
            raise FileNotFoundError(f"{what}: {f} does not exist")
        df = pd.read_parquet(f)
        for col in ("prompt", "reward_model"):
            if col not in df.columns:
                raise ValueError(
                    f"{what}: {f} has no '{col}' column (DAPO-Math-17k schema; columns: {list(df.columns)})"
                )
        rows.extend(to_plain(r) for r in df.to_dict("records"))
    return rows


def to_plain(obj: Any) -> Any:
    """numpy arrays / scalars from parquet -> plain lists / Python scalars (chat lists come back as arrays)."""
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj

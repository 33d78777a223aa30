"""Parquet facts that need no schema: a file's row count, and the error every data module raises.

It sits below every other module of :mod:`dapo.data` and below :mod:`dapo.plan.cli` (which counts a training
file's rows), so the planner does not import data preparation.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["DataError", "parquet_rows"]


class DataError(ValueError):
    """Bad data or a failed fetch; the message names the file and, where it applies, the row and column."""


def parquet_rows(path: str | os.PathLike) -> int:
    """Row count from the parquet footer (no data read)."""
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"{path}: not a readable parquet file ({exc})") from exc

"""The evaluation's files and its resumable answer log: the output file names, the test file's rows, the durable
``responses.jsonl`` and the ``run.json`` that pins the sampling of a run.

Nothing is lost: every answer is appended to ``<output>/responses.jsonl`` as soon as it arrives (one JSON line,
flushed and fsync'd), keyed by the row index. A rerun with the same ``--output`` reads that file and sends only the
rows that have no answer yet. A torn last line (the client killed mid-write) is dropped and its row redone; any other
malformed line is an error naming the file and line. ``<output>/run.json`` records the sampling parameters and the
test file; resuming with different ones is refused rather than mixing answers.

The bottom of the client's modules (:mod:`dapo.eval.endpoint`, :mod:`dapo.eval.scoring`, :mod:`dapo.eval.client`
sit on it): imports only ``dapo.util`` and :func:`dapo.data.files.to_plain`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from dapo.data.files import to_plain
from dapo.util.fsutil import fsync_dir

log = logging.getLogger("dapo.eval")

RESPONSES = "responses.jsonl"
RUN_META = "run.json"
ERRORS = "errors.jsonl"
RESULTS = "results.parquet"
SUMMARY = "summary.json"

# Sampling fields that must not change between a run and its resume.
_PINNED = ("model", "temperature", "top_p", "max_tokens", "seed", "rows", "test_file_sha256")


class EvalError(RuntimeError):
    """A problem the user must fix (bad file, endpoint down, refused request); the message says what and where."""


# --------------------------------------------------------------------------------------------------------------------
# Test file
# --------------------------------------------------------------------------------------------------------------------


def prompt_sha(messages: list[dict]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


@dataclass
class TestRow:
    row: int
    messages: list[dict]
    ground_truth: str
    problem: str
    sha: str


def load_test_file(path: str | Path, limit: Optional[int] = None) -> tuple[Any, list[TestRow]]:
    """Read a DAPO-schema parquet (``prompt`` chat list, ``reward_model.ground_truth``; problem id from
    ``extra_info.index`` when present, else the prompt). Errors name the file, row and column."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise EvalError(f"test file {path} does not exist")
    df = pd.read_parquet(path)
    for col in ("prompt", "reward_model"):
        if col not in df.columns:
            raise EvalError(f"test file {path} has no column {col!r} (columns: {list(df.columns)})")
    if limit is not None:
        df = df.iloc[:limit].copy()
    rows = []
    for i, rec in enumerate(df.to_dict("records")):
        messages = to_plain(rec["prompt"])
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages)
        ):
            raise EvalError(f"test file {path} row {i}: 'prompt' must be a non-empty chat list of {{role, content}}")
        rm = to_plain(rec["reward_model"])
        if not isinstance(rm, dict) or rm.get("ground_truth") in (None, ""):
            raise EvalError(f"test file {path} row {i}: 'reward_model.ground_truth' is missing")
        extra = to_plain(rec.get("extra_info")) if "extra_info" in df.columns else None
        if isinstance(extra, dict) and extra.get("index") is not None:
            problem = str(extra["index"])
        else:
            problem = prompt_sha(messages)
        rows.append(TestRow(i, messages, str(rm["ground_truth"]), problem, prompt_sha(messages)))
    return df, rows


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------------------------------
# Durable answer log
# --------------------------------------------------------------------------------------------------------------------


class ResponseLog:
    """Append-only JSONL of answers, one line per row, durable on return of :meth:`append`.

    Invariants: each row appears at most once; a line is only ever appended whole (``write`` + ``flush`` +
    ``fsync``); on open, a last line without its newline (torn by a kill) is cut off so the row is redone.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.records: dict[int, dict] = {}
        self.dropped_torn_line = False
        self._load()
        self._f = open(self.path, "ab")
        fsync_dir(self.path.parent)

    def _load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1  # bytes up to and including the last newline are whole lines
        if end < len(data):
            self.dropped_torn_line = True
            log.warning(
                "%s: dropping a torn last line (%d bytes, the client was killed mid-write); that row is redone",
                self.path,
                len(data) - end,
            )
            with open(self.path, "r+b") as f:
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())
        for lineno, line in enumerate(data[:end].split(b"\n")[:-1], start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                row = rec["row"]
                if not isinstance(row, int) or isinstance(row, bool):
                    raise TypeError("row is not an integer")
            except (ValueError, KeyError, TypeError) as exc:
                raise EvalError(
                    f"{self.path} line {lineno} is not a valid answer record ({exc}); it is not the last line, so it "
                    "was not torn by a kill: inspect or move the file"
                ) from None
            if row in self.records:
                log.warning("%s line %d: row %d appears again; keeping its first answer", self.path, lineno, row)
                continue
            self.records[row] = rec

    def append(self, rec: dict) -> None:
        row = rec["row"]
        if row in self.records:
            raise EvalError(f"row {row} already has an answer in {self.path}")
        self._f.write((json.dumps(rec, ensure_ascii=False) + "\n").encode())
        self._f.flush()
        os.fsync(self._f.fileno())
        self.records[row] = rec

    def close(self) -> None:
        self._f.close()


def check_resume(log_: ResponseLog, rows: list[TestRow]) -> None:
    """Every stored answer must belong to a row of this test file with the same prompt."""
    by_row = {r.row: r for r in rows}
    for row, rec in log_.records.items():
        if row not in by_row:
            raise EvalError(
                f"{log_.path}: row {row} is not in the test file ({len(rows)} rows): the output directory belongs to "
                "another test file; use a new --output"
            )
        if rec.get("prompt_sha") != by_row[row].sha:
            raise EvalError(
                f"{log_.path}: the answer stored for row {row} was generated for a different prompt; the output "
                "directory belongs to another test file; use a new --output"
            )


def write_run_meta(out_dir: Path, meta: dict) -> None:
    """Create ``run.json`` or check that an existing one pins the same sampling parameters."""
    path = out_dir / RUN_META
    if path.exists():
        old = json.loads(path.read_text())
        diff = {k: (old.get(k), meta.get(k)) for k in _PINNED if old.get(k) != meta.get(k)}
        if diff:
            detail = ", ".join(f"{k}: stored {a!r} vs now {b!r}" for k, (a, b) in diff.items())
            raise EvalError(
                f"{out_dir} holds answers generated with other settings ({detail}); resuming would mix them. "
                "Use a new --output, or the stored settings."
            )
        return
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, path)
    fsync_dir(out_dir)

"""Metrics of a verl trainer read back from its console log: the reference runner's ``<ckpt>/logs/attempt-N.log``.

verl's console logger (at 4f80e46: ``verl/utils/logger/aggregate_logger.py``, ``concat_dict_to_str``) prints one
line per ``logger.log(data, step)``: ``step:N - key:value - key:value ...``, every numeric value formatted with
``{:.3f}``. Ray prefixes what an actor prints with its name (``(TaskRunner pid=123) ``, in colour on a terminal),
so the line is searched, not matched from its start. Records of one step are merged; a later attempt's record of a
step replaces the earlier attempt's (a retried job resumes from its last checkpoint and redoes the steps after it).
The records have the shape of our ``metrics.jsonl`` (``{"step": N, key: value}``), so ``dapo report`` plots both.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Optional

from dapo.train.runlog import ATTEMPT_RE

_VALUE = r"-?(?:\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|nan|inf)"
LINE_RE = re.compile(rf"(?:^|[\s)])step:(\d+)((?: - [^\s:]+:{_VALUE})+)\s*$")
PAIR_RE = re.compile(rf" - ([^\s:]+):({_VALUE})")


def parse_line(line: str) -> Optional[tuple[int, dict[str, float]]]:
    """``(step, metrics)`` of one console line, or None for any other line."""
    m = LINE_RE.search(line.rstrip("\n"))
    if not m:
        return None
    return int(m.group(1)), {k: float(v) for k, v in PAIR_RE.findall(m.group(2))}


def attempt_logs(path: Path | str) -> list[Path]:
    """The attempt logs of a log directory in attempt order, or ``[path]`` for one file."""
    p = Path(path)
    if p.is_file():
        return [p]
    logs = [(int(m.group(1)), q) for q in p.glob("attempt-*.log") if (m := ATTEMPT_RE.match(q.name))]
    return [q for _, q in sorted(logs)]


def read_console_logs(paths: Iterable[Path | str]) -> list[dict[str, Any]]:
    """Records ``{"step": N, ...}`` sorted by step, from attempt logs given in attempt order."""
    by_step: dict[int, dict[str, Any]] = {}
    for path in paths:
        attempt: dict[int, dict[str, Any]] = {}
        with open(path, errors="replace") as f:
            for line in f:
                parsed = parse_line(line)
                if parsed:
                    step, metrics = parsed
                    attempt.setdefault(step, {"step": step}).update(metrics)
        by_step.update(attempt)
    return [by_step[s] for s in sorted(by_step)]

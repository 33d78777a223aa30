"""The work of ``dapo eval run``: which checkpoint steps to evaluate (``--step N|latest|all``, ``--stride``), the
benchmarks of each (:class:`Task`: ``--benchmarks`` or the single ``--test-file``), which of them already have a
complete result (a rerun skips them), the served model's default name, and the tables written per checkpoint and
across checkpoints.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


def default_model_id(ckpt: Path, step: Optional[int]) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", ckpt.resolve().name).strip("-") or "model"
    return f"{base}-step{step}" if step is not None else base


@dataclass
class Task:
    """One benchmark of a checkpoint: its test file, its output subdirectory ('' = the step directory itself, the
    single ``--test-file`` layout) and the benchmark (scorers), None for a plain test file."""

    name: str
    test_file: Path
    sub: str
    benchmark: Any = None


def tasks(args: argparse.Namespace) -> list[Task]:
    """``--benchmarks`` (files under ``--data-dir``, or ``name=path``) or the single ``--test-file``."""
    from dapo.data.benchmarks import parse_list

    if not args.benchmarks:
        return [Task("test_file", Path(args.test_file), "", None)]
    data_dir = Path(args.data_dir) if args.data_dir else (Path(args.test_file).parent if args.test_file else None)
    out = []
    for bench, path in parse_list(args.benchmarks):
        if path is None and data_dir is None:
            raise ValueError(f"{bench.name}: give --data-dir (where `dapo data prepare` wrote {bench.file}) or "
                             f"{bench.name}=PATH")
        out.append(Task(bench.name, Path(path) if path else data_dir / bench.file, bench.name, bench))
    return out


def done(out_dir: Path) -> bool:
    """A benchmark of a step is done when its summary says every row is answered."""
    import json

    try:
        return bool(json.loads((out_dir / "summary.json").read_text()).get("complete"))
    except (OSError, ValueError):
        return False


def steps(args: argparse.Namespace) -> list[Any]:
    """The steps to evaluate: ``all`` = every complete checkpoint (``--stride S``: steps divisible by S), else one."""
    from dapo.eval.export import complete_steps

    if str(args.step) != "all":
        return [args.step]
    steps = complete_steps(args.checkpoint_dir)
    if args.stride is not None:
        steps = [s for s in steps if s % args.stride == 0]
    return steps



def write_tables(step_dir: Path, tasks: list[Task], base: Optional[Path]) -> str:
    """Per checkpoint: ``STEP_DIR/benchmarks.json`` (one row per benchmark); across steps: ``OUTPUT/results.csv``
    rebuilt from every step's summaries (so a rerun never duplicates a row). Returns the checkpoint's text table."""
    from dapo.eval import results as eval_results

    if not any(t.sub for t in tasks):
        if base is not None:
            eval_results.write_results(base)
        return ""
    rows = eval_results.step_rows(step_dir, [t.sub for t in tasks])
    eval_results.write_step_table(step_dir, rows)
    if base is not None:
        eval_results.write_results(base)
    return eval_results.format_table(rows)


"""``dapo data``: the command line of :mod:`dapo.data.prepare` (``prepare``) and of the file checks (``check``),
and what one epoch over each prepared file means for the presets.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Iterable, Optional

from dapo.data.parquet import DataError
from dapo.data.schema import parse_layout
from dapo.data.files import check_file
from dapo.data.prepare import DEDUP_FILE, EXTRA_BENCHMARKS, TRAIN_FILE, TRAIN_REPO, VAL_REPO, prepare


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

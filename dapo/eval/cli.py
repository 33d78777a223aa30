"""``dapo eval``: AIME-2024 avg@32 evaluation with DAPO's exact semantics on Ray Serve LLM + vLLM.

Subcommands:

- ``dapo eval aime``   the client against a running endpoint; flags of the DAPO repository's ``eval_aime24.py``
  (``--temperature 1.0 --top_p 0.7 --max_tokens 20480 --model ... --test_file ...``) plus ``--base-url``,
  ``--concurrency``, ``--output`` (resumable: rerun with the same ``--output``).
- ``dapo eval serve``  serve an HF directory with Ray Serve LLM (blocks until SIGTERM / Ctrl-C).
- ``dapo eval export`` turn a training checkpoint (verl FSDP shards) into an HF directory.
- ``dapo eval run``    all three: export the step, serve it, run the client, remove the app. The chart's eval job:
  ``dapo eval run --checkpoint-dir <dir> --step latest --test-file <parquet> --output <dir>
  [--tensor-parallel-size N ...]``. With ``--output``, each run (each attempt of the RayJob) tees its stdout and
  stderr into ``<output>/logs/attempt-<N>.log`` (:mod:`dapo.train.runlog`), which the chart's log follower prints.

Metric semantics: :mod:`dapo.eval.metrics`; client: :mod:`dapo.eval.client` (output files and the answer log:
:mod:`dapo.eval.records`; requests: :mod:`dapo.eval.endpoint`; scoring: :mod:`dapo.eval.scoring`); serving:
:mod:`dapo.eval.serve` (flags: :mod:`dapo.eval.serve_cli`); export: :mod:`dapo.eval.export`; ``run`` itself:
:mod:`dapo.eval.run_cli` (what it evaluates: :mod:`dapo.eval.tasks`). Exit status: 0 complete, 1 incomplete or
failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

# --------------------------------------------------------------------------------------------------------------------
# Parsers
# --------------------------------------------------------------------------------------------------------------------


def _run_parser(sub) -> None:
    from dapo.eval.serve_cli import add_serve_args
    from dapo.eval.fsdp_merge import DTYPES

    p = sub.add_parser(
        "run",
        help="export a checkpoint step, serve it with Ray Serve LLM, run the AIME client, tear down",
        description="Export -> serve -> evaluate -> tear down (the chart's eval job). Explicit flags win over "
        "--preset, which wins over the DAPO defaults (T=1.0, top_p=0.7, 20480 tokens).",
    )
    p.add_argument("--checkpoint-dir", default=None, help="trainer.default_local_dir of the run (or an HF dir)")
    p.add_argument("--step", default="latest",
                   help="'latest', a step number, or 'all': every complete checkpoint without a result yet (one "
                   "serving per checkpoint; rerun to continue)")
    p.add_argument("--stride", type=int, default=None, help="with --step all: only steps divisible by STRIDE")
    p.add_argument("--benchmarks", default=None,
                   help="comma list of aime24, aime25, math500 (or NAME=PATH): every one scored against one serving "
                   "of the checkpoint, results in OUTPUT/global_step_N/NAME/ (default: the single --test-file)")
    p.add_argument("--data-dir", default=None,
                   help="where `dapo data prepare` wrote the benchmark files (default: the --test-file's directory)")
    p.add_argument("--hf-dir", default=None, help="export target (default CKPT/global_step_N/hf)")
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="dtype of the exported weights")
    p.add_argument("--model-id", default=None, help="served model name (default <run dir name>-step<N>)")
    p.add_argument("--preset", default=None, help="take sampling / TP / paths defaults from this preset")
    p.add_argument("--test-file", "--test_file", dest="test_file", default=None)
    p.add_argument("--output", default=None,
                   help="results go to OUTPUT/global_step_N (one directory per step; rerun to resume); "
                   "default eval_aime24_<model id>")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-p", "--top_p", dest="top_p", type=float, default=None)
    p.add_argument("--max-tokens", "--max_tokens", dest="max_tokens", type=int, default=None)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-retries", type=int, default=8)
    p.add_argument("--request-timeout", type=float, default=36000.0)
    p.add_argument("--wait-timeout", type=float, default=3600.0, help="seconds for the engine to come up")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--wandb-project", default=None)
    p.add_argument("--wandb-run-name", default=None)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-attempt-log", action="store_true",
                   help="do not write OUTPUT/logs/attempt-N.log (stdout + stderr of this attempt)")
    add_serve_args(p, model_required=False)
    # preset-overridable serve flags: None = not given
    p.set_defaults(tensor_parallel_size=None, max_model_len=None)


def build_parser() -> argparse.ArgumentParser:
    from dapo.eval.client import add_client_args
    from dapo.eval.serve_cli import add_serve_args
    from dapo.eval.export import add_export_args

    parser = argparse.ArgumentParser(prog="dapo eval", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_client_args(sub.add_parser("aime", help="the AIME-2024 client against a running endpoint"))
    add_serve_args(sub.add_parser("serve", help="serve an HF model directory with Ray Serve LLM (blocking)"))
    add_export_args(sub.add_parser("export", help="checkpoint (verl FSDP shards) -> HF model directory"))
    _run_parser(sub)
    sc = sub.add_parser("score", help="score the stored answers again (no endpoint): a verifier fix, math-verify")
    sc.add_argument("output", help="an output directory (run.json + responses.jsonl), or a `run --output` directory "
                    "(every global_step_N/<benchmark> below it; results.csv rebuilt)")
    return parser


def score_main(args: argparse.Namespace) -> int:
    """Rescore every output directory at or below ``args.output``; rebuild ``results.csv`` of a run output."""
    from dapo.eval import client as eval_client
    from dapo.eval import records as eval_records
    from dapo.eval import results as eval_results
    from dapo.eval import scoring as eval_scoring
    from dapo.data.benchmarks import BENCHMARKS

    base = Path(args.output)
    dirs = sorted({p.parent for p in base.rglob(eval_records.RUN_META)})
    if not dirs:
        print(f"dapo eval score: no {eval_records.RUN_META} at or below {base}", file=sys.stderr)
        return 2
    rc = 0
    for d in dirs:
        try:
            s = eval_client.rescore(d, BENCHMARKS.get(d.name))
        except eval_records.EvalError as exc:
            print(f"dapo eval score: {exc}", file=sys.stderr)
            rc = 1
            continue
        print(f"== {d} ==\n{eval_scoring.format_summary(s)}")
        rc = rc or (0 if s["complete"] else 1)
    if any(eval_results.STEP_DIR.match(p.name) for p in base.iterdir() if p.is_dir()):
        print(f"wrote {eval_results.write_results(base)}")
    return rc


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "aime":
        from dapo.eval.client import client_main

        return client_main(args)
    if args.command == "serve":
        from dapo.eval.serve_cli import serve_main

        return serve_main(args)
    if args.command == "export":
        from dapo.eval.export import main_args

        return main_args(args)
    if args.command == "score":
        return score_main(args)
    from dapo.eval.run_cli import run_main

    if args.output and not args.no_attempt_log:  # the driver log of each RayJob attempt, beside the results
        from dapo.train.runlog import run_logged

        return run_logged(Path(args.output) / "logs", lambda: run_main(args), prog="dapo eval run",
                          header="dapo eval run " + " ".join((argv if argv is not None else sys.argv[1:])[1:]))
    return run_main(args)


if __name__ == "__main__":
    sys.exit(main())

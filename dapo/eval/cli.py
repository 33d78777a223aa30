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
:mod:`dapo.eval.serve` (flags: :mod:`dapo.eval.serve_cli`); export: :mod:`dapo.eval.export`; what ``run`` evaluates:
:mod:`dapo.eval.tasks`. Exit status: 0 complete, 1 incomplete or failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Optional

# The DAPO repository's evaluation defaults (eval/eval_aime24.py) and the engine context they need.
DAPO_TEMPERATURE = 1.0
DAPO_TOP_P = 0.7
DAPO_MAX_TOKENS = 20480
DAPO_MAX_PROMPT = 2048


def _resolve_interpolation(value: str, trainer: Any) -> str:
    """``${trainer.project_name}`` style references (verl's Hydra syntax in the presets) -> values."""

    def sub(m: re.Match) -> str:
        section, _, key = m.group(1).partition(".")
        if section != "trainer" or not hasattr(trainer, key):
            raise ValueError(f"cannot resolve ${{{m.group(1)}}} in {value!r}")
        return str(getattr(trainer, key))

    return re.sub(r"\$\{([^}]+)\}", sub, value)


def preset_defaults(name: str) -> dict[str, Any]:
    """Evaluation defaults from a preset (the single source of truth): validation sampling, answer budget, engine
    TP, checkpoint directory and the validation file."""
    from dapo.config import load_preset

    p = load_preset(name)
    r = p.recipe
    out: dict[str, Any] = {
        "temperature": r.rollout.val.temperature,
        "top_p": r.rollout.val.top_p,
        "max_tokens": r.data.max_response_length,
        "max_model_len": r.data.max_prompt_length + r.data.max_response_length,
        "tensor_parallel_size": p.placement.parallel.rollout_tp,
        "checkpoint_dir": _resolve_interpolation(r.trainer.default_local_dir, r.trainer),
    }
    if r.data.val_files:
        out["test_file"] = r.data.val_files[0]
    return out


def _apply_defaults(args: argparse.Namespace, defaults: dict[str, Any]) -> None:
    for k, v in defaults.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)


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


# --------------------------------------------------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------------------------------------------------


def default_max_model_len(model_dir: Path, max_tokens: int) -> Optional[int]:
    """Engine context = DAPO's prompt budget (2048) + the answer budget, capped by the model's
    ``max_position_embeddings`` (a shorter context leaves more KV cache for concurrent answers than vLLM's default of
    the full position range)."""
    import json

    try:
        limit = json.loads((Path(model_dir) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        limit = None
    want = DAPO_MAX_PROMPT + max_tokens
    return min(want, int(limit)) if limit else want


def run_main(args: argparse.Namespace) -> int:
    """Export -> serve -> client (every benchmark) -> tear down, for one step or every complete checkpoint
    (``--step all``). Returns 0 when every row of every benchmark of every step has an answer."""
    from dapo.eval import client as eval_client
    from dapo.eval import serve as eval_serve
    from dapo.eval import records as eval_records
    from dapo.eval import scoring as eval_scoring
    from dapo.eval import serve_cli as eval_serve_cli
    from dapo.eval import tasks as eval_tasks
    from dapo.data.benchmarks import BenchmarkError
    from dapo.eval.export import export_checkpoint
    from dapo.eval.fsdp_merge import ExportError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.preset:
        try:
            _apply_defaults(args, preset_defaults(args.preset))
        except Exception as exc:  # ConfigError and friends
            print(f"dapo eval run: preset {args.preset!r}: {exc}", file=sys.stderr)
            return 2
    _apply_defaults(
        args,
        {
            "temperature": DAPO_TEMPERATURE,
            "top_p": DAPO_TOP_P,
            "max_tokens": DAPO_MAX_TOKENS,
            "tensor_parallel_size": "auto",
        },
    )
    if not args.checkpoint_dir:
        print("dapo eval run: --checkpoint-dir is required (or a --preset naming trainer.default_local_dir)",
              file=sys.stderr)  # fmt: skip
        return 2
    if not args.test_file and not args.benchmarks:
        print("dapo eval run: --test-file or --benchmarks is required (or a --preset with data.val_files)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        tasks = eval_tasks.tasks(args)
    except (BenchmarkError, ValueError) as exc:
        print(f"dapo eval run: --benchmarks: {exc}", file=sys.stderr)
        return 2
    for t in tasks:
        if not t.test_file.is_file():
            hint = " (run `dapo data prepare`)" if t.benchmark is not None else ""
            print(f"dapo eval run: test file {t.test_file} of {t.name} does not exist{hint}", file=sys.stderr)
            return 2
    if args.stride is not None and (str(args.step) != "all" or args.stride < 1):
        print(f"dapo eval run: --stride N (N >= 1) goes with --step all (got --step {args.step} --stride "
              f"{args.stride})", file=sys.stderr)  # fmt: skip
        return 2
    if args.hf_dir and str(args.step) == "all":
        print("dapo eval run: --hf-dir names one export target; with --step all each step exports to "
              "CKPT/global_step_N/hf", file=sys.stderr)  # fmt: skip
        return 2
    try:
        steps = eval_tasks.steps(args)
    except ExportError as exc:
        print(f"dapo eval run: {exc}", file=sys.stderr)
        return 1
    if not steps:
        print(f"dapo eval run: no complete checkpoint in {args.checkpoint_dir} yet", file=sys.stderr)
        return 1
    base = Path(args.output) if args.output else None
    connected = bool(args.address or os.environ.get("RAY_ADDRESS"))
    ray_up = ray_down = False
    rc = 0
    try:
        for i, step in enumerate(steps):
            if base is not None and isinstance(step, int):
                if all(eval_tasks.done(base / f"global_step_{step}" / t.sub) for t in tasks):
                    print(f"[eval] step {step}: every benchmark already has a result -- skipped", flush=True)
                    continue
            try:
                exported = export_checkpoint(args.checkpoint_dir, step, args.hf_dir, dtype=args.dtype)
            except ExportError as exc:
                print(f"dapo eval run: export: {exc}", file=sys.stderr)
                rc = 1
                continue
            model_id = args.model_id or eval_tasks.default_model_id(Path(args.checkpoint_dir), exported.step)
            if len(steps) > 1 and args.model_id:
                model_id = f"{args.model_id}-step{exported.step}"
            # one subdirectory per evaluated step, so evaluating another step never mixes answers
            sub = f"global_step_{exported.step}" if exported.step is not None else model_id
            step_dir = base / sub if base is not None else eval_client.default_output(model_id)
            todo = [t for t in tasks if not eval_tasks.done(step_dir / t.sub)]
            if not todo:
                print(f"[eval] {step_dir}: every benchmark already has a result -- skipped", flush=True)
                eval_tasks.write_tables(step_dir, tasks, base)
                continue
            max_model_len = args.max_model_len or default_max_model_len(exported.path, args.max_tokens)
            try:
                step_args = argparse.Namespace(**vars(args))
                step_args.max_model_len = max_model_len
                serve_cfg = eval_serve_cli.config_from_args(step_args, model=str(exported.path), model_id=model_id)
                serve_cfg.validate()
                client_args = argparse.Namespace(**vars(step_args))
                client_args.model = model_id
                client_args.base_url = f"http://127.0.0.1:{serve_cfg.port}/v1"
                client_cfg = eval_client.config_from_args(client_args)
            except (eval_serve.ServeError, eval_records.EvalError) as exc:
                print(f"dapo eval run: {exc}", file=sys.stderr)
                return 2
            if not ray_up:
                eval_serve.init_ray(args.address, args.num_cpus, args.ray_temp_dir)
                ray_up = True
            try:
                serve_cfg = eval_serve.resolve_auto(serve_cfg, eval_serve.cluster_gpus())
                client_cfg.base_url = eval_serve.start(serve_cfg)
                print(f"[eval] serving {model_id!r} ({exported.action} {exported.path}) at {client_cfg.base_url}; "
                      f"benchmarks: {', '.join(t.name for t in todo)}", flush=True)
                for t in todo:
                    out = step_dir / t.sub
                    summary = eval_client.evaluate(
                        client_cfg,
                        t.test_file,
                        out,
                        wandb_project=args.wandb_project,
                        wandb_run_name=(args.wandb_run_name or model_id) + (f"-{t.name}" if t.sub else ""),
                        progress=not args.no_progress,
                        benchmark=t.benchmark,
                        extra={
                            "checkpoint": {
                                "checkpoint_dir": str(args.checkpoint_dir),
                                "step": exported.step,
                                "hf_dir": str(exported.path),
                                "export": exported.action,
                            },
                            "serve": {
                                "tensor_parallel_size": serve_cfg.tensor_parallel_size,
                                "max_model_len": serve_cfg.max_model_len,
                                "device": serve_cfg.device,
                            },
                        },
                    )
                    print((f"== {t.name} ==\n" if t.sub else "") + eval_scoring.format_summary(summary))
                    print(f"wrote {out / eval_records.SUMMARY} and {out / eval_records.RESULTS}")
                    if not summary["complete"]:
                        rc = 1
            except (eval_records.EvalError, eval_serve.ServeError) as exc:
                print(f"dapo eval run: {exc}", file=sys.stderr)
                print(f"dapo eval run: answers so far are kept in {step_dir}; rerun the same command to resume",
                      file=sys.stderr)  # fmt: skip
                return 1
            finally:  # remove the app (frees the GPUs); after the last step also Ray, when we started it
                ray_down = not connected and i == len(steps) - 1
                eval_serve.stop(shutdown_ray=ray_down)
            table = eval_tasks.write_tables(step_dir, tasks, base)
            if table:
                print(table)
    finally:
        if ray_up and not connected and not ray_down:
            eval_serve.stop(shutdown_ray=True)
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
    if args.output and not args.no_attempt_log:  # the driver log of each RayJob attempt, beside the results
        from dapo.train.runlog import run_logged

        return run_logged(Path(args.output) / "logs", lambda: run_main(args), prog="dapo eval run",
                          header="dapo eval run " + " ".join((argv if argv is not None else sys.argv[1:])[1:]))
    return run_main(args)


if __name__ == "__main__":
    sys.exit(main())

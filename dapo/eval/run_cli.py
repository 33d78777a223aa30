"""``dapo eval run``: export -> serve -> evaluate every benchmark -> tear down, for one checkpoint step or every
complete one (``--step all``); the chart's eval job. Its flags are :mod:`dapo.eval.cli`'s.

:func:`run_main` in phases: the options (explicit flags win over ``--preset``, which wins over the DAPO defaults), the
benchmarks and checkpoint steps to evaluate (:mod:`dapo.eval.tasks`), then per step (:func:`_evaluate_step`) the
export (:mod:`dapo.eval.export`), the serving and client configuration, Ray Serve LLM (:mod:`dapo.eval.serve`), the
client on every benchmark not yet scored (:mod:`dapo.eval.client`) and the tables; Ray is shut down at the end
when this command started it. Exit status: 0 complete, 1 incomplete or failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Optional

# The DAPO repository's evaluation defaults (eval/eval_aime24.py) and the engine context they need.
DAPO_TEMPERATURE = 1.0
DAPO_TOP_P = 0.7
DAPO_MAX_TOKENS = 20480
DAPO_MAX_PROMPT = 2048


def preset_defaults(name: str) -> dict[str, Any]:
    """Evaluation defaults from a preset (the single source of truth): validation sampling, answer budget, engine
    TP, checkpoint directory and the validation file."""
    from dapo.config import load_preset, run_dir

    p = load_preset(name)
    r = p.recipe
    out: dict[str, Any] = {
        "temperature": r.rollout.val.temperature,
        "top_p": r.rollout.val.top_p,
        "max_tokens": r.data.max_response_length,
        "max_model_len": r.data.max_prompt_length + r.data.max_response_length,
        "tensor_parallel_size": p.placement.parallel.rollout_tp,
        "checkpoint_dir": run_dir(p),
    }
    if r.data.val_files:
        out["test_file"] = r.data.val_files[0]
    return out


def _apply_defaults(args: argparse.Namespace, defaults: dict[str, Any]) -> None:
    for k, v in defaults.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)


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


class _Exit(Exception):
    """Ends ``dapo eval run`` with exit code ``rc``; the reason is already on stderr."""

    def __init__(self, rc: int):
        super().__init__(rc)
        self.rc = rc


def _fail(rc: int, *lines: str) -> NoReturn:
    for line in lines:
        print(f"dapo eval run: {line}", file=sys.stderr)
    raise _Exit(rc)


@dataclass
class _Ray:
    connected: bool  # to an existing cluster (--address, RAY_ADDRESS): never shut down here
    up: bool = False  # started (or connected) by this command
    down: bool = False  # shut down after the last step


def run_main(args: argparse.Namespace) -> int:
    """Export -> serve -> client (every benchmark) -> tear down, for one step or every complete checkpoint
    (``--step all``). Returns 0 when every row of every benchmark of every step has an answer."""
    from dapo.eval import serve as eval_serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        _apply_run_defaults(args)
        tasks, steps = _tasks_and_steps(args)
        base = Path(args.output) if args.output else None
        ray = _Ray(connected=bool(args.address or os.environ.get("RAY_ADDRESS")))
        rc = 0
        try:
            for i, step in enumerate(steps):
                rc = max(rc, _evaluate_step(args, tasks, step, base, ray, many=len(steps) > 1,
                                            last=i == len(steps) - 1))
        finally:
            if ray.up and not ray.connected and not ray.down:
                eval_serve.stop(shutdown_ray=True)
        return rc
    except _Exit as exc:
        return exc.rc


def _apply_run_defaults(args: argparse.Namespace) -> None:
    """Explicit flags win over ``--preset``, which wins over the DAPO defaults (T=1.0, top_p=0.7, 20480 tokens)."""
    if args.preset:
        try:
            _apply_defaults(args, preset_defaults(args.preset))
        except Exception as exc:  # ConfigError and friends
            _fail(2, f"preset {args.preset!r}: {exc}")
    _apply_defaults(
        args,
        {
            "temperature": DAPO_TEMPERATURE,
            "top_p": DAPO_TOP_P,
            "max_tokens": DAPO_MAX_TOKENS,
            "tensor_parallel_size": "auto",
        },
    )


def _tasks_and_steps(args: argparse.Namespace) -> tuple[list[Any], list[Any]]:
    """The benchmarks (each with its test file) and the checkpoint steps to evaluate; usage errors exit 2, no
    checkpoint exits 1."""
    from dapo.eval import tasks as eval_tasks
    from dapo.data.benchmarks import BenchmarkError
    from dapo.eval.fsdp_merge import ExportError

    if not args.checkpoint_dir:
        _fail(2, "--checkpoint-dir is required (or a --preset naming trainer.default_local_dir)")
    if not args.test_file and not args.benchmarks:
        _fail(2, "--test-file or --benchmarks is required (or a --preset with data.val_files)")
    try:
        tasks = eval_tasks.tasks(args)
    except (BenchmarkError, ValueError) as exc:
        _fail(2, f"--benchmarks: {exc}")
    for t in tasks:
        if not t.test_file.is_file():
            hint = " (run `dapo data prepare`)" if t.benchmark is not None else ""
            _fail(2, f"test file {t.test_file} of {t.name} does not exist{hint}")
    if args.stride is not None and (str(args.step) != "all" or args.stride < 1):
        _fail(2, f"--stride N (N >= 1) goes with --step all (got --step {args.step} --stride {args.stride})")
    if args.hf_dir and str(args.step) == "all":
        _fail(2, "--hf-dir names one export target; with --step all each step exports to CKPT/global_step_N/hf")
    try:
        steps = eval_tasks.steps(args)
    except ExportError as exc:
        _fail(1, str(exc))
    if not steps:
        _fail(1, f"no complete checkpoint in {args.checkpoint_dir} yet")
    return tasks, steps


def _evaluate_step(args: argparse.Namespace, tasks: list[Any], step: Any, base: Optional[Path], ray: _Ray, *,
                   many: bool, last: bool) -> int:
    """Export one step, serve it, run the client on every benchmark without a result, remove the app (and Ray after
    the ``last`` step, when this command started it), write the tables. Returns 1 when an answer is missing."""
    from dapo.eval import client as eval_client
    from dapo.eval import records as eval_records
    from dapo.eval import serve as eval_serve
    from dapo.eval import tasks as eval_tasks
    from dapo.eval.export import export_checkpoint
    from dapo.eval.fsdp_merge import ExportError

    if base is not None and isinstance(step, int):
        if all(eval_tasks.done(base / f"global_step_{step}" / t.sub) for t in tasks):
            print(f"[eval] step {step}: every benchmark already has a result -- skipped", flush=True)
            return 0
    try:
        exported = export_checkpoint(args.checkpoint_dir, step, args.hf_dir, dtype=args.dtype)
    except ExportError as exc:
        print(f"dapo eval run: export: {exc}", file=sys.stderr)
        return 1
    model_id = args.model_id or eval_tasks.default_model_id(Path(args.checkpoint_dir), exported.step)
    if many and args.model_id:
        model_id = f"{args.model_id}-step{exported.step}"
    # one subdirectory per evaluated step, so evaluating another step never mixes answers
    sub = f"global_step_{exported.step}" if exported.step is not None else model_id
    step_dir = base / sub if base is not None else eval_client.default_output(model_id)
    todo = [t for t in tasks if not eval_tasks.done(step_dir / t.sub)]
    if not todo:
        print(f"[eval] {step_dir}: every benchmark already has a result -- skipped", flush=True)
        eval_tasks.write_tables(step_dir, tasks, base)
        return 0
    serve_cfg, client_cfg = _configs(args, exported, model_id)
    if not ray.up:
        eval_serve.init_ray(args.address, args.num_cpus, args.ray_temp_dir)
        ray.up = True
    try:
        serve_cfg = eval_serve.resolve_auto(serve_cfg, eval_serve.cluster_gpus())
        client_cfg.base_url = eval_serve.start(serve_cfg)
        print(f"[eval] serving {model_id!r} ({exported.action} {exported.path}) at {client_cfg.base_url}; "
              f"benchmarks: {', '.join(t.name for t in todo)}", flush=True)
        rc = _evaluate_benchmarks(args, todo, step_dir, exported, model_id, serve_cfg, client_cfg)
    except (eval_records.EvalError, eval_serve.ServeError) as exc:
        _fail(1, str(exc), f"answers so far are kept in {step_dir}; rerun the same command to resume")
    finally:  # remove the app (frees the GPUs); after the last step also Ray, when we started it
        ray.down = not ray.connected and last
        eval_serve.stop(shutdown_ray=ray.down)
    table = eval_tasks.write_tables(step_dir, tasks, base)
    if table:
        print(table)
    return rc


def _configs(args: argparse.Namespace, exported: Any, model_id: str) -> tuple[Any, Any]:
    """The serving configuration of the exported step and the client's; a bad one exits 2."""
    from dapo.eval import client as eval_client
    from dapo.eval import records as eval_records
    from dapo.eval import serve as eval_serve
    from dapo.eval import serve_cli as eval_serve_cli

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
        _fail(2, str(exc))
    return serve_cfg, client_cfg


def _evaluate_benchmarks(args: argparse.Namespace, todo: list[Any], step_dir: Path, exported: Any, model_id: str,
                         serve_cfg: Any, client_cfg: Any) -> int:
    """The client on each benchmark of ``todo`` against the serving; 1 when one of them is incomplete."""
    from dapo.eval import client as eval_client
    from dapo.eval import records as eval_records
    from dapo.eval import scoring as eval_scoring

    rc = 0
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
    return rc

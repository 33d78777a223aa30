"""``dapo eval``: AIME-2024 avg@32 evaluation with DAPO's exact semantics on Ray Serve LLM + vLLM.

Subcommands:

- ``dapo eval aime``   the client against a running endpoint; flags of the DAPO repository's ``eval_aime24.py``
  (``--temperature 1.0 --top_p 0.7 --max_tokens 20480 --model ... --test_file ...``) plus ``--base-url``,
  ``--concurrency``, ``--output`` (resumable: rerun with the same ``--output``).
- ``dapo eval serve``  serve an HF directory with Ray Serve LLM (blocks until SIGTERM / Ctrl-C).
- ``dapo eval export`` turn a training checkpoint (verl FSDP shards) into an HF directory.
- ``dapo eval run``    all three: export the step, serve it, run the client, remove the app. The chart's eval job:
  ``dapo eval run --checkpoint-dir <dir> --step latest --test-file <parquet> --output <dir>
  [--tensor-parallel-size N ...]``.

Metric semantics: :mod:`dapo.eval_metrics`; client and output files: :mod:`dapo.eval_client`; serving:
:mod:`dapo.eval_serve`; export: :mod:`dapo.export`. Exit status: 0 complete, 1 incomplete or failed, 2 bad usage.
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
    from dapo.eval_serve import add_serve_args
    from dapo.export import DTYPES

    p = sub.add_parser(
        "run",
        help="export a checkpoint step, serve it with Ray Serve LLM, run the AIME client, tear down",
        description="Export -> serve -> evaluate -> tear down (the chart's eval job). Explicit flags win over "
        "--preset, which wins over the DAPO defaults (T=1.0, top_p=0.7, 20480 tokens).",
    )
    p.add_argument("--checkpoint-dir", default=None, help="trainer.default_local_dir of the run (or an HF dir)")
    p.add_argument("--step", default="latest", help="'latest' or a step number")
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
    add_serve_args(p, model_required=False)
    # preset-overridable serve flags: None = not given
    p.set_defaults(tensor_parallel_size=None, max_model_len=None)


def build_parser() -> argparse.ArgumentParser:
    from dapo.eval_client import add_client_args
    from dapo.eval_serve import add_serve_args
    from dapo.export import add_export_args

    parser = argparse.ArgumentParser(prog="dapo eval", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_client_args(sub.add_parser("aime", help="the AIME-2024 client against a running endpoint"))
    add_serve_args(sub.add_parser("serve", help="serve an HF model directory with Ray Serve LLM (blocking)"))
    add_export_args(sub.add_parser("export", help="checkpoint (verl FSDP shards) -> HF model directory"))
    _run_parser(sub)
    return parser


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


def _default_model_id(ckpt: Path, step: Optional[int]) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", ckpt.resolve().name).strip("-") or "model"
    return f"{base}-step{step}" if step is not None else base


def run_main(args: argparse.Namespace) -> int:
    """Export -> serve -> client -> tear down. Returns 0 when every row has an answer."""
    from dapo import eval_client, eval_serve
    from dapo.export import ExportError, export_checkpoint

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
    if not args.test_file:
        print("dapo eval run: --test-file is required (or a --preset with data.val_files)", file=sys.stderr)
        return 2
    if not Path(args.test_file).is_file():
        print(f"dapo eval run: test file {args.test_file} does not exist", file=sys.stderr)
        return 2
    try:
        exported = export_checkpoint(args.checkpoint_dir, args.step, args.hf_dir, dtype=args.dtype)
    except ExportError as exc:
        print(f"dapo eval run: export: {exc}", file=sys.stderr)
        return 1
    model_id = args.model_id or _default_model_id(Path(args.checkpoint_dir), exported.step)
    if args.max_model_len is None:
        args.max_model_len = default_max_model_len(exported.path, args.max_tokens)
    try:
        serve_cfg = eval_serve.config_from_args(args, model=str(exported.path), model_id=model_id)
        serve_cfg.validate()
        client_args = argparse.Namespace(**vars(args))
        client_args.model = model_id
        client_args.base_url = f"http://127.0.0.1:{serve_cfg.port}/v1"
        client_cfg = eval_client.config_from_args(client_args)
    except (eval_serve.ServeError, eval_client.EvalError) as exc:
        print(f"dapo eval run: {exc}", file=sys.stderr)
        return 2
    # one subdirectory per evaluated step, so evaluating another step never mixes answers
    sub = f"global_step_{exported.step}" if exported.step is not None else model_id
    output = Path(args.output) / sub if args.output else eval_client.default_output(model_id)
    connected = bool(args.address or os.environ.get("RAY_ADDRESS"))
    eval_serve.init_ray(args.address, args.num_cpus, args.ray_temp_dir)
    try:
        serve_cfg = eval_serve.resolve_auto(serve_cfg, eval_serve.cluster_gpus())
        client_cfg.base_url = eval_serve.start(serve_cfg)
        print(f"[eval] serving {model_id!r} ({exported.action} {exported.path}) at {client_cfg.base_url}", flush=True)
        summary = eval_client.evaluate(
            client_cfg,
            args.test_file,
            output,
            wandb_project=args.wandb_project,
            wandb_run_name=args.wandb_run_name or model_id,
            progress=not args.no_progress,
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
    except (eval_client.EvalError, eval_serve.ServeError) as exc:
        print(f"dapo eval run: {exc}", file=sys.stderr)
        print(f"dapo eval run: answers so far are kept in {output}; rerun the same command to resume", file=sys.stderr)
        return 1
    finally:
        eval_serve.stop(shutdown_ray=not connected)
    print(eval_client.format_summary(summary))
    print(f"wrote {output / eval_client.SUMMARY} and {output / eval_client.RESULTS}")
    return 0 if summary["complete"] else 1


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "aime":
        from dapo.eval_client import client_main

        return client_main(args)
    if args.command == "serve":
        from dapo.eval_serve import serve_main

        return serve_main(args)
    if args.command == "export":
        from dapo.export import main_args

        return main_args(args)
    return run_main(args)


if __name__ == "__main__":
    sys.exit(main())

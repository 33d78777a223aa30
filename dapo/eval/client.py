"""AIME-2024 evaluation client: one chat request per test-file row against an OpenAI-compatible endpoint (Ray Serve
LLM / vLLM), resumable, then verified and summarised; the ``dapo eval aime`` / ``eval/eval_aime24.py`` flags.

Semantics follow the DAPO repository's ``eval/eval_aime24.py``: every parquet row (960 = 30 problems x 32) is one
``/v1/chat/completions`` request whose ``messages`` are the row's ``prompt`` chat list, sampled with
``temperature=1.0, top_p=0.7, max_completion_tokens=20480``; the answer is verified with
``dapo.reward.compute_score(answer, reward_model.ground_truth)`` and ``acc/mean@32`` is the mean ``acc`` over all
rows (see :mod:`dapo.eval.metrics`).

This module runs (or resumes) an evaluation and rescores one; the pieces it puts together: the output files and the
resumable answer log (:mod:`dapo.eval.records`), the requests with retries (:mod:`dapo.eval.endpoint`), scoring and
reports (:mod:`dapo.eval.scoring`). It imports those three.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Optional

from dapo.eval.endpoint import ClientConfig, RunStats, run_requests
from dapo.eval.records import (
    RESPONSES,
    RESULTS,
    RUN_META,
    SUMMARY,
    EvalError,
    ResponseLog,
    check_resume,
    file_sha256,
    load_test_file,
    write_run_meta,
)
from dapo.eval.scoring import format_summary, log_wandb, summarize

log = logging.getLogger("dapo.eval")


def default_output(model: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model.strip("/").split("/")[-1])
    return Path(f"eval_aime24_{safe}")


def evaluate(
    cfg: ClientConfig,
    test_file: str | Path,
    output: str | Path,
    *,
    wandb_project: Optional[str] = None,
    wandb_run_name: Optional[str] = None,
    transport=None,
    progress: bool = True,
    extra: Optional[dict] = None,
    benchmark: Optional[Any] = None,
) -> dict:
    """Run (or resume) the evaluation and write the reports; returns the summary (``extra`` is recorded in its
    ``config``; ``benchmark`` chooses the scorers, see :func:`summarize`). Raises EvalError."""
    test_file = Path(test_file)
    out_dir = Path(output)
    if wandb_project or os.environ.get("WANDB_PROJECT"):
        try:
            import wandb  # noqa: F401  (fail before spending compute)
        except ImportError:
            raise EvalError("wandb logging is configured (--wandb-project / WANDB_PROJECT) but wandb is not installed")
    if benchmark is not None and "math_verify" in benchmark.scorers:
        try:  # fail before spending compute
            from dapo.reward import _load_math_verify

            _load_math_verify()
        except ImportError as exc:
            raise EvalError(f"{benchmark.title} is scored with math-verify too: {exc}") from None
    df, rows = load_test_file(test_file, cfg.limit)
    if not rows:
        raise EvalError(f"test file {test_file} has no rows")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_run_meta(
        out_dir,
        {
            "model": cfg.model,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "max_tokens": cfg.max_tokens,
            "seed": cfg.seed,
            "rows": len(rows),
            "test_file": str(test_file),
            "test_file_sha256": file_sha256(test_file),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "host": socket.gethostname(),
        },
    )
    responses = ResponseLog(out_dir / RESPONSES)
    try:
        check_resume(responses, rows)
        done = len(responses.records)
        if done:
            todo = len(rows) - done
            log.info("%s: %d of %d rows already answered; sending the other %d", out_dir, done, len(rows), todo)
        reporter = _Progress(len(rows)) if progress else None
        stats = asyncio.run(run_requests(cfg, rows, responses, out_dir, progress=reporter, transport=transport))
        if reporter:
            reporter.close()
        summary = summarize(cfg, test_file, df, rows, responses.records, stats, out_dir, extra, benchmark)
    finally:
        responses.close()
    log_wandb(summary, wandb_project, wandb_run_name)
    return summary


def rescore(out_dir: str | Path, benchmark: Optional[Any] = None) -> dict:
    """Score an output directory's ``responses.jsonl`` again (a verifier fix, a new scorer) without any endpoint:
    the test file and sampling come from its ``run.json``; ``results.parquet`` and ``summary.json`` are rewritten
    (the summary keeps the ``checkpoint`` / ``serve`` records of the run that generated the answers)."""
    out_dir = Path(out_dir)
    try:
        meta = json.loads((out_dir / RUN_META).read_text())
    except (OSError, ValueError) as exc:
        raise EvalError(f"{out_dir}: no readable {RUN_META} ({exc}); is it an evaluation output directory?") from None
    test_file = Path(meta["test_file"])
    if file_sha256(test_file) != meta.get("test_file_sha256"):
        raise EvalError(f"{test_file} changed since {out_dir} was generated (sha256 differs from {RUN_META})")
    cfg = ClientConfig(model=meta["model"], temperature=meta["temperature"], top_p=meta["top_p"],
                       max_tokens=meta["max_tokens"], seed=meta.get("seed"))
    df, rows = load_test_file(test_file)
    if meta.get("rows") is not None and meta["rows"] < len(rows):  # generated with --limit
        cfg.limit = meta["rows"]
        df, rows = df.iloc[: meta["rows"]].copy(), rows[: meta["rows"]]
    try:
        old = json.loads((out_dir / SUMMARY).read_text()).get("config", {})
    except (OSError, ValueError):
        old = {}
    extra = {k: v for k, v in old.items() if k in ("checkpoint", "serve")}
    responses = ResponseLog(out_dir / RESPONSES)
    try:
        check_resume(responses, rows)
        return summarize(cfg, test_file, df, rows, responses.records, RunStats(), out_dir, extra, benchmark)
    finally:
        responses.close()


class _Progress:
    """A log line every 5 % (works in Kubernetes logs, unlike a redrawn bar)."""

    def __init__(self, total: int):
        self.total = total
        self.t0 = time.monotonic()
        self.next = 0.0

    def __call__(self, done: int, total: int) -> None:
        frac = done / max(1, total)
        if frac >= self.next or done == total:
            elapsed = time.monotonic() - self.t0
            print(f"[eval] {done}/{total} answered ({100 * frac:.0f} %, {elapsed:.0f} s)", flush=True)
            self.next = frac + 0.05

    def close(self) -> None:
        pass


def add_client_args(p) -> None:
    """The DAPO script's flags (``--temperature --top_p --max_tokens --model --test_file``) + ours."""
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top_p", "--top-p", dest="top_p", type=float, default=0.7)
    p.add_argument("--max_tokens", "--max-tokens", dest="max_tokens", type=int, default=20480,
                   help="max completion tokens per answer")
    p.add_argument("--model", default="BytedTsinghua-SIA/DAPO-Qwen-32B", help="the served model id")
    p.add_argument("--test_file", "--test-file", dest="test_file", default="aime-2024.parquet")
    p.add_argument("--base-url", "--base_url", dest="base_url", default="http://127.0.0.1:8000/v1",
                   help="OpenAI-compatible endpoint (with or without /v1)")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    p.add_argument("--output", default=None,
                   help="output directory (responses.jsonl, results.parquet, summary.json); rerun with the same "
                   "directory to resume. Default: eval_aime24_<model>")
    p.add_argument("--seed", type=int, default=None, help="per-request seed = seed + row (default: none, like DAPO)")
    p.add_argument("--max-retries", type=int, default=8)
    p.add_argument("--request-timeout", type=float, default=36000.0, help="seconds per request")
    p.add_argument("--wait-timeout", type=float, default=1800.0,
                   help="seconds to wait for /v1/models to list the model")
    p.add_argument("--limit", type=int, default=None, help="only the first N rows (a quick look)")
    p.add_argument("--wandb-project", default=None, help="log to this W&B project (default: $WANDB_PROJECT if set)")
    p.add_argument("--wandb-run-name", default=None)
    p.add_argument("--no-progress", action="store_true")


def config_from_args(args) -> ClientConfig:
    if args.concurrency < 1:
        raise EvalError(f"--concurrency must be >= 1, got {args.concurrency}")
    if args.max_tokens < 1:
        raise EvalError(f"--max_tokens must be >= 1, got {args.max_tokens}")
    if not 0 < args.top_p <= 1:
        raise EvalError(f"--top_p must be in (0, 1], got {args.top_p}")
    if args.temperature < 0:
        raise EvalError(f"--temperature must be >= 0, got {args.temperature}")
    return ClientConfig(
        base_url=args.base_url,
        model=args.model,
        temperature=args.temperature,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        concurrency=args.concurrency,
        seed=args.seed,
        max_retries=args.max_retries,
        request_timeout_s=args.request_timeout,
        wait_timeout_s=args.wait_timeout,
        api_key=os.environ.get("OPENAI_API_KEY"),
        limit=args.limit,
    )


def client_main(args) -> int:
    """Run the client from parsed args; prints the summary; rc 0 complete, 1 incomplete or error."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = config_from_args(args)
        output = Path(args.output) if args.output else default_output(cfg.model)
        summary = evaluate(
            cfg,
            args.test_file,
            output,
            wandb_project=args.wandb_project,
            wandb_run_name=args.wandb_run_name,
            progress=not args.no_progress,
        )
    except EvalError as exc:
        print(f"eval: error: {exc}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    print(f"wrote {output / SUMMARY} and {output / RESULTS}")
    return 0 if summary["complete"] else 1

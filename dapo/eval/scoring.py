"""Scoring and reports of an evaluation: every answer verified (the DAPO verifier, math-verify where the benchmark
asks for it), the metrics (:mod:`dapo.eval.metrics`), ``results.parquet`` and ``summary.json`` written, the summary as
text, and the optional Weights & Biases log.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Optional

from dapo.eval.endpoint import ClientConfig, RunStats
from dapo.eval.records import RESULTS, SUMMARY, EvalError, TestRow


SCORERS = ("dapo", "math_verify")
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*(.+)")


def math_verify_answer(content: str, ground_truth: str) -> bool:
    """math-verify's verdict on an answer to a DAPO-template prompt: the text after the last ``Answer:`` in the last
    300 characters (the DAPO verifier's window) is parsed as LaTeX (``$...$``, then as a plain expression), else the
    tail with math-verify's default extraction (``\\boxed{}``, LaTeX, expressions); gold = ``\\boxed{ground_truth}``;
    ``math_verify.verify`` decides (symbolic equivalence: ``\\frac{6}{4}`` = ``1.5`` = ``3/2``, intervals, sets,
    ``\\text{(C)}`` = ``(C)``). False when either side does not parse."""
    from dapo.reward import _load_math_verify

    mv = _load_math_verify()
    tail = (content or "")[-300:]
    try:
        gold = mv.parse("\\boxed{" + str(ground_truth) + "}")
        lines = _ANSWER_LINE.findall(tail)
        if lines:
            ans = lines[-1].strip().strip("$").strip().rstrip(".").strip()
            cand = mv.parse("$" + ans + "$") or mv.parse(ans)
        else:
            cand = mv.parse(tail)
        return bool(gold) and bool(cand) and bool(mv.verify(gold, cand))
    except Exception:  # math-verify raises on pathological input (and times out via SIGALRM): not verified
        return False


def score_records(
    rows: list[TestRow], records: dict[int, dict], scorers: tuple[str, ...] = ("dapo",)
) -> list[tuple[TestRow, dict, dict]]:
    """(row, answer record, verifier result) for every answered row, in row order. The result is the DAPO verifier's
    ``{score, acc, pred}``; with ``"math_verify"`` in ``scorers`` also ``acc_math_verify`` (math-verify's symbolic
    equivalence with ``\\boxed{ground_truth}``, :func:`math_verify_answer`)."""
    from dapo.reward import compute_score

    unknown = [s for s in scorers if s not in SCORERS]
    if unknown:
        raise EvalError(f"unknown scorer(s) {unknown}; known: {list(SCORERS)}")
    if "math_verify" in scorers:
        try:
            from dapo.reward import _load_math_verify

            _load_math_verify()
        except ImportError as exc:
            raise EvalError(f"{exc} (the MATH-500 score that is comparable with published figures needs it)") from None
    out = []
    for row in rows:
        rec = records.get(row.row)
        if rec is None:
            continue
        content = rec.get("content") or ""
        res = compute_score(content, row.ground_truth)
        scored = {"score": float(res["score"]), "acc": bool(res["acc"]), "pred": res.get("pred")}
        if "math_verify" in scorers:
            scored["acc_math_verify"] = math_verify_answer(content, row.ground_truth)
        out.append((row, rec, scored))
    return out


def _clean(obj: Any) -> Any:
    """NaN -> None so the JSON is standard."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


def summarize(
    cfg: ClientConfig,
    test_file: Path,
    df,
    rows: list[TestRow],
    records: dict[int, dict],
    stats: RunStats,
    out_dir: Path,
    extra: Optional[dict] = None,
    benchmark: Optional[Any] = None,
) -> dict:
    """Verify every answer, write ``results.parquet`` (the test rows + ``output`` + ``res`` like the DAPO script, plus
    per-row columns) and ``summary.json``; return the summary. ``benchmark`` (:class:`dapo.data.benchmarks.Benchmark`)
    chooses the scorers: ``metrics`` is always the DAPO verifier's; ``metrics_by_scorer`` adds math-verify's where the
    benchmark asks for it, and ``score`` is 100 x avg@k of the scorer comparable with published figures."""
    from dapo.eval.metrics import ScoredAnswer, aime_metrics, length_stats, per_problem

    scorers = tuple(benchmark.scorers) if benchmark is not None else ("dapo",)
    scored = score_records(rows, records, scorers)

    def answers_for(acc_key: str) -> list:
        return [
            ScoredAnswer(
                row=row.row,
                problem=row.problem,
                acc=res[acc_key],
                pred=None if res["pred"] is None else str(res["pred"]),
                completion_tokens=rec.get("completion_tokens"),
                finish_reason=rec.get("finish_reason"),
            )
            for row, rec, res in scored
        ]

    answers = answers_for("acc")
    metrics = aime_metrics(answers)
    # math-verify: the same avg/pass over its verdicts; cons@k votes over the DAPO-normalised predictions and asks
    # math-verify whether the winner (the first answer carrying the most frequent prediction) is correct
    by_scorer = {s: (metrics if s == "dapo" else aime_metrics(answers_for(f"acc_{s}"))) for s in scorers}
    comparable = benchmark.comparable if benchmark is not None else "dapo"
    missing = sorted(r.row for r in rows if r.row not in records)
    k = metrics["k"]
    summary = {
        "complete": not missing,
        "rows": len(rows),
        "answered": len(answers),
        "missing_rows": missing,
        "metrics": metrics,
        "metrics_by_scorer": by_scorer,
        "benchmark": None if benchmark is None else benchmark.name,
        "comparable_scorer": comparable,
        # 100 x avg@k of the scorer comparable with published figures (AIME: the DAPO verifier; MATH-500: math-verify)
        "score": None if not answers else round(100.0 * by_scorer[comparable][f"acc/mean@{k}"], 2),
        # The paper's number ("AIME 50" = 50.0): 100 x acc/mean@k over the complete 960-row file.
        "aime_score": None if not answers else round(100.0 * metrics[f"acc/mean@{k}"], 2),
        "per_problem": per_problem(answers),
        "response_length": length_stats(answers),
        "this_run": _run_stats(stats),
        "config": {
            **{k_: v for k_, v in dataclasses.asdict(cfg).items() if k_ != "api_key"},
            "test_file": str(test_file),
            **(extra or {}),
        },
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    _write_results(df, rows, scored, scorers, out_dir)
    summary = _clean(summary)
    tmp = out_dir / (SUMMARY + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, out_dir / SUMMARY)
    return summary


def _run_stats(stats: RunStats) -> dict:
    """What this run of the client did: requests, answers, retries, failures, time and tokens."""
    return {
        "requests_sent": stats.sent,
        "answers": stats.answered,
        "retries": stats.retries,
        "failed": len(stats.failed),
        "wall_time_s": round(stats.wall_s, 2),
        "completion_tokens": stats.completion_tokens,
        "tokens_per_s": round(stats.completion_tokens / stats.wall_s, 2) if stats.wall_s > 0 else None,
    }


def _write_results(df, rows: list[TestRow], scored: list, scorers: tuple[str, ...], out_dir: Path) -> None:
    """``results.parquet``: every row of the test file with its answer (``output`` None when unanswered), ``res``
    like the DAPO script, and per-row columns; written atomically."""
    res_by_row = {row.row: (rec, res) for row, rec, res in scored}
    df = df.copy()
    df["problem_id"] = [r.problem for r in rows]
    df["output"] = [res_by_row[r.row][0].get("content") if r.row in res_by_row else None for r in rows]
    df["res"] = [res_by_row[r.row][1] if r.row in res_by_row else None for r in rows]
    df["acc"] = [res_by_row[r.row][1]["acc"] if r.row in res_by_row else None for r in rows]
    df["pred"] = [res_by_row[r.row][1]["pred"] if r.row in res_by_row else None for r in rows]
    for sc in scorers[1:]:
        df[f"acc_{sc}"] = [res_by_row[r.row][1][f"acc_{sc}"] if r.row in res_by_row else None for r in rows]
    for col in ("finish_reason", "completion_tokens", "prompt_tokens"):
        df[col] = [res_by_row[r.row][0].get(col) if r.row in res_by_row else None for r in rows]
    tmp = out_dir / (RESULTS + ".tmp")
    df.to_parquet(tmp)
    os.replace(tmp, out_dir / RESULTS)


def format_summary(summary: dict) -> str:
    m = summary["metrics"]
    k = m["k"]
    bench = summary.get("benchmark") or "aime24"
    lines = [f"acc/mean@{k}: {m[f'acc/mean@{k}']}"]
    if bench == "aime24":
        lines.append(f"AIME-2024 avg@{k} (the paper's number): {summary['aime_score']}")
    for sc, sm in (summary.get("metrics_by_scorer") or {}).items():
        if sc != "dapo":
            lines.append(f"{sc}: acc/mean@{k} {sm[f'acc/mean@{k}']}   pass@{k} {sm[f'pass@{k}']}   "
                         f"cons@{k} {sm[f'cons@{k}']}")
    if bench != "aime24" and summary.get("score") is not None:
        lines.append(f"{bench} avg@{k} x 100 by {summary.get('comparable_scorer')} (comparable with published "
                     f"figures): {summary['score']}")
    lines.append(
        f"pass@{k}: {m[f'pass@{k}']}   cons@{k}: {m[f'cons@{k}']}   ({m['problems']} problems, {m['answers']} answers)"
    )
    ls = summary["response_length"]["all"]
    lines.append(
        f"response length: mean {ls['mean']} p50 {ls['p50']} max {ls['max']} tokens; "
        f"clipped at max_tokens: {summary['response_length']['clip_ratio']}"
    )
    tr = summary["this_run"]
    lines.append(
        f"this run: {tr['answers']} answers in {tr['wall_time_s']} s ({tr['tokens_per_s']} tokens/s), "
        f"{tr['retries']} retries, {tr['failed']} failed"
    )
    if not summary["complete"]:
        lines.append(
            f"INCOMPLETE: {len(summary['missing_rows'])} of {summary['rows']} rows have no answer yet; rerun with the "
            "same --output to finish them (the metrics above cover the answered rows only)"
        )
    return "\n".join(lines)


def log_wandb(summary: dict, project: Optional[str], run_name: Optional[str]) -> None:
    """Log the summary to Weights & Biases when a project is configured (flag or WANDB_PROJECT)."""
    project = project or os.environ.get("WANDB_PROJECT")
    if not project:
        return
    import wandb

    m = summary["metrics"]
    k = m["k"]
    b = summary.get("benchmark") or "aime24"
    run = wandb.init(project=project, name=run_name, job_type="eval", config=summary["config"])
    try:
        data = {
            f"eval/{b}/acc/mean@{k}": m[f"acc/mean@{k}"],
            f"eval/{b}/pass@{k}": m[f"pass@{k}"],
            f"eval/{b}/cons@{k}": m[f"cons@{k}"],
            f"eval/{b}/response_length/mean": summary["response_length"]["all"]["mean"],
            f"eval/{b}/clip_ratio": summary["response_length"]["clip_ratio"],
            f"eval/{b}/tokens_per_s": summary["this_run"]["tokens_per_s"],
        }
        for sc, sm in (summary.get("metrics_by_scorer") or {}).items():
            if sc != "dapo":
                data[f"eval/{b}/{sc}/acc/mean@{k}"] = sm[f"acc/mean@{k}"]
        table = wandb.Table(columns=["problem", "samples", "correct", "acc", "cons_pred", "cons_correct"])
        for p in summary["per_problem"]:
            table.add_data(p["problem"], p["samples"], p["correct"], p["acc"], p["cons_pred"], p["cons_correct"])
        data[f"eval/{b}/per_problem"] = table
        run.log({k_: v for k_, v in data.items() if v is not None})
        run.summary["complete"] = summary["complete"]
    finally:
        run.finish()

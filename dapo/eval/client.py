"""AIME-2024 evaluation client: one chat request per test-file row against an OpenAI-compatible endpoint (Ray Serve
LLM / vLLM), resumable, then verified and summarised.

Semantics follow the DAPO repository's ``eval/eval_aime24.py``: every parquet row (960 = 30 problems x 32) is one
``/v1/chat/completions`` request whose ``messages`` are the row's ``prompt`` chat list, sampled with
``temperature=1.0, top_p=0.7, max_completion_tokens=20480``; the answer is verified with
``dapo.reward.compute_score(answer, reward_model.ground_truth)`` and ``acc/mean@32`` is the mean ``acc`` over all
rows (see :mod:`dapo.eval.metrics`).

Nothing is lost: every answer is appended to ``<output>/responses.jsonl`` as soon as it arrives (one JSON line,
flushed and fsync'd), keyed by the row index. A rerun with the same ``--output`` reads that file and sends only the
rows that have no answer yet. A torn last line (the client killed mid-write) is dropped and its row redone; any other
malformed line is an error naming the file and line. ``<output>/run.json`` records the sampling parameters and the
test file; resuming with different ones is refused rather than mixing answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import hashlib
import json
import logging
import math
import os
import random
import re
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

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


@dataclass
class ClientConfig:
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "BytedTsinghua-SIA/DAPO-Qwen-32B"
    temperature: float = 1.0
    top_p: float = 0.7
    max_tokens: int = 20480
    # Requests in flight at once.
    concurrency: int = 64
    # Per-request sampling seed = seed + row (None: the server's randomness, like the DAPO script).
    seed: Optional[int] = None
    # Retries per row on transient failures (connection errors, timeouts, 408/429/5xx), exponential backoff.
    max_retries: int = 8
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    # One request may take long: 20k tokens of a 32B model under load (the DAPO script allows 10 h).
    request_timeout_s: float = 36000.0
    # How long to wait for /v1/models to list the model before giving up.
    wait_timeout_s: float = 1800.0
    # Poll interval while waiting for /v1/models.
    wait_poll_s: float = 2.0
    api_key: Optional[str] = None
    # Only the first N rows of the test file (a quick look; metrics are then over those rows).
    limit: Optional[int] = None


def normalize_base_url(url: str) -> str:
    """``http://host:8000``, ``http://host:8000/`` and ``http://host:8000/v1`` all mean ``http://host:8000/v1``."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


# --------------------------------------------------------------------------------------------------------------------
# Test file
# --------------------------------------------------------------------------------------------------------------------


def _to_py(obj: Any) -> Any:
    """numpy arrays / scalars from parquet -> plain Python (for JSON and hashing)."""
    if hasattr(obj, "tolist"):
        obj = obj.tolist()
    if isinstance(obj, dict):
        return {k: _to_py(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_py(v) for v in obj]
    return obj


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
        messages = _to_py(rec["prompt"])
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages)
        ):
            raise EvalError(f"test file {path} row {i}: 'prompt' must be a non-empty chat list of {{role, content}}")
        rm = _to_py(rec["reward_model"])
        if not isinstance(rm, dict) or rm.get("ground_truth") in (None, ""):
            raise EvalError(f"test file {path} row {i}: 'reward_model.ground_truth' is missing")
        extra = _to_py(rec.get("extra_info")) if "extra_info" in df.columns else None
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


# --------------------------------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------------------------------

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class TransientError(Exception):
    def __init__(self, msg: str, retry_after: Optional[float] = None):
        super().__init__(msg)
        self.retry_after = retry_after


class RequestRefused(EvalError):
    """A non-transient HTTP error (a 4xx other than 408/409/425/429): retrying would not help."""


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Full-jitter exponential backoff: uniform in [0.5, 1] x min(cap, base * 2**attempt)."""
    return min(cap, base * (2**attempt)) * (0.5 + 0.5 * rng.random())


def _retry_after(headers) -> Optional[float]:
    value = headers.get("retry-after") if headers is not None else None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


async def wait_for_model(client, base_url: str, model: str, timeout_s: float, poll_s: float = 2.0) -> None:
    """Poll ``GET /v1/models`` until it lists ``model``; a clear error after ``timeout_s``."""
    import httpx

    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while True:
        try:
            r = await client.get(f"{base_url}/models", timeout=min(30.0, max(1.0, timeout_s)))
            if r.status_code == 200:
                ids = [m.get("id") for m in r.json().get("data", [])]
                if model in ids:
                    return
                last = f"it serves {ids}, not {model!r}"
            else:
                last = f"HTTP {r.status_code}: {r.text[:200]}"
        except (httpx.TransportError, ValueError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise EvalError(
                f"the endpoint {base_url} did not list model {model!r} within {timeout_s:.0f} s ({last}). Is the "
                "server up (the Ray Serve LLM app), and is --model its model id?"
            )
        await asyncio.sleep(poll_s)


def build_request(cfg: ClientConfig, row: TestRow) -> dict:
    body: dict[str, Any] = {
        "model": cfg.model,
        "messages": row.messages,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "max_completion_tokens": cfg.max_tokens,
        "n": 1,
        "stream": False,
    }
    if cfg.seed is not None:
        body["seed"] = cfg.seed + row.row
    return body


async def chat_once(client, cfg: ClientConfig, base_url: str, row: TestRow) -> dict:
    """One request; raises TransientError (retry) or RequestRefused (give up)."""
    import httpx

    try:
        r = await client.post(f"{base_url}/chat/completions", json=build_request(cfg, row))
    except httpx.TransportError as exc:  # connect/read/write errors, timeouts, protocol errors
        raise TransientError(f"{type(exc).__name__}: {exc}") from None
    if r.status_code in RETRY_STATUS:
        raise TransientError(f"HTTP {r.status_code}: {r.text[:300]}", _retry_after(r.headers))
    if r.status_code != 200:
        raise RequestRefused(f"row {row.row}: HTTP {r.status_code} from {base_url}/chat/completions: {r.text[:500]}")
    try:
        body = r.json()
        choice = body["choices"][0]
        content = choice["message"].get("content")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise TransientError(f"malformed response body: {r.text[:300]}") from None
    usage = body.get("usage") or {}
    return {
        "content": content if content is not None else "",
        "finish_reason": choice.get("finish_reason"),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "served_model": body.get("model"),
    }


@dataclass
class RunStats:
    sent: int = 0
    answered: int = 0
    retries: int = 0
    failed: list[dict] = field(default_factory=list)
    completion_tokens: int = 0
    wall_s: float = 0.0


async def run_requests(
    cfg: ClientConfig,
    rows: list[TestRow],
    log_: ResponseLog,
    out_dir: Path,
    *,
    progress: Optional[Callable[[int, int], None]] = None,
    transport=None,
    sleep=asyncio.sleep,
) -> RunStats:
    """Send every row without an answer, ``cfg.concurrency`` at a time; append each answer as it arrives."""
    import httpx

    base_url = normalize_base_url(cfg.base_url)
    todo = [r for r in rows if r.row not in log_.records]
    stats = RunStats()
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
    timeout = httpx.Timeout(cfg.request_timeout_s, connect=30.0)
    rng = random.Random(0 if cfg.seed is None else cfg.seed)
    t0 = time.monotonic()
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout, transport=transport) as client:
        await wait_for_model(client, base_url, cfg.model, cfg.wait_timeout_s, cfg.wait_poll_s)
        if not todo:
            return stats
        queue: asyncio.Queue[TestRow] = asyncio.Queue()
        for r in todo:
            queue.put_nowait(r)
        refused: list[RequestRefused] = []

        async def one(row: TestRow) -> None:
            for attempt in range(cfg.max_retries + 1):
                t = time.monotonic()
                stats.sent += 1
                try:
                    ans = await chat_once(client, cfg, base_url, row)
                except TransientError as exc:
                    if attempt == cfg.max_retries:
                        _log_error(out_dir, row.row, str(exc), attempt + 1)
                        stats.failed.append({"row": row.row, "error": str(exc)})
                        return
                    delay = backoff_delay(attempt, cfg.backoff_base_s, cfg.backoff_max_s, rng)
                    if exc.retry_after is not None:
                        delay = max(delay, min(exc.retry_after, cfg.backoff_max_s))
                    stats.retries += 1
                    log.warning("row %d: %s; retry %d/%d in %.1f s", row.row, exc, attempt + 1, cfg.max_retries, delay)
                    await sleep(delay)
                    continue
                rec = {
                    "row": row.row,
                    "problem": row.problem,
                    "prompt_sha": row.sha,
                    **ans,
                    "latency_s": round(time.monotonic() - t, 3),
                    "attempts": attempt + 1,
                    "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                }
                log_.append(rec)  # no await between here and the fsync: one writer, whole lines
                stats.answered += 1
                stats.completion_tokens += int(ans.get("completion_tokens") or 0)
                if progress:
                    progress(len(log_.records), len(rows))
                return

        async def worker() -> None:
            while not refused:
                try:
                    row = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                try:
                    await one(row)
                except RequestRefused as exc:
                    _log_error(out_dir, row.row, str(exc), 1)
                    stats.failed.append({"row": row.row, "error": str(exc)})
                    refused.append(exc)  # the same request shape fails for every row: stop sending

        await asyncio.gather(*(worker() for _ in range(min(cfg.concurrency, len(todo)))))
        stats.wall_s = time.monotonic() - t0
        if refused:
            raise refused[0]
    return stats


def _log_error(out_dir: Path, row: int, error: str, attempts: int) -> None:
    with open(out_dir / ERRORS, "a") as f:
        rec = {"row": row, "error": error, "attempts": attempts, "time": _dt.datetime.now(_dt.timezone.utc).isoformat()}
        f.write(json.dumps(rec) + "\n")


# --------------------------------------------------------------------------------------------------------------------
# Scoring and reports
# --------------------------------------------------------------------------------------------------------------------


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
    k = metrics["k"]
    # math-verify: the same avg/pass over its verdicts; cons@k votes over the DAPO-normalised predictions and asks
    # math-verify whether the winner (the first answer carrying the most frequent prediction) is correct
    by_scorer = {s: (metrics if s == "dapo" else aime_metrics(answers_for(f"acc_{s}"))) for s in scorers}
    comparable = benchmark.comparable if benchmark is not None else "dapo"
    missing = sorted(r.row for r in rows if r.row not in records)
    complete = not missing
    summary = {
        "complete": complete,
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
        "this_run": {
            "requests_sent": stats.sent,
            "answers": stats.answered,
            "retries": stats.retries,
            "failed": len(stats.failed),
            "wall_time_s": round(stats.wall_s, 2),
            "completion_tokens": stats.completion_tokens,
            "tokens_per_s": round(stats.completion_tokens / stats.wall_s, 2) if stats.wall_s > 0 else None,
        },
        "config": {
            **{k_: v for k_, v in dataclasses.asdict(cfg).items() if k_ != "api_key"},
            "test_file": str(test_file),
            **(extra or {}),
        },
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    # results.parquet: all rows of the test file; unanswered rows have output None.
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
    summary = _clean(summary)
    tmp = out_dir / (SUMMARY + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, out_dir / SUMMARY)
    return summary


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


# --------------------------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------------------------


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

"""The HTTP side of the evaluation client: its settings (:class:`ClientConfig`), one ``/v1/chat/completions``
request per test row against an OpenAI-compatible endpoint (Ray Serve LLM / vLLM), retries with full-jitter backoff
on transient failures (connection errors, timeouts, 408/409/425/429/5xx), and the concurrent request loop that
appends each answer to the durable log as it arrives.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from dapo.eval.records import ERRORS, EvalError, ResponseLog, TestRow

log = logging.getLogger("dapo.eval")


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
        requests = _Requests(client, cfg, base_url, log_, out_dir, stats, rng, sleep, progress, len(rows))
        await asyncio.gather(*(requests.worker(queue) for _ in range(min(cfg.concurrency, len(todo)))))
        stats.wall_s = time.monotonic() - t0
        if requests.refused:
            raise requests.refused[0]
    return stats


@dataclass
class _Requests:
    """The request loop of one :func:`run_requests`: workers take rows off a queue, each row is retried on transient
    failures, every answer goes to the log as it arrives."""

    client: Any
    cfg: ClientConfig
    base_url: str
    log_: ResponseLog
    out_dir: Path
    stats: RunStats
    rng: random.Random
    sleep: Callable
    progress: Optional[Callable[[int, int], None]]
    total: int  # rows of the test file
    refused: list[RequestRefused] = field(default_factory=list)

    async def worker(self, queue: asyncio.Queue[TestRow]) -> None:
        while not self.refused:
            try:
                row = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            try:
                await self.one(row)
            except RequestRefused as exc:
                _log_error(self.out_dir, row.row, str(exc), 1)
                self.stats.failed.append({"row": row.row, "error": str(exc)})
                self.refused.append(exc)  # the same request shape fails for every row: stop sending

    async def one(self, row: TestRow) -> None:
        """One row: up to ``max_retries`` retries with full-jitter backoff (``Retry-After`` honoured, capped)."""
        cfg, stats = self.cfg, self.stats
        for attempt in range(cfg.max_retries + 1):
            t = time.monotonic()
            stats.sent += 1
            try:
                ans = await chat_once(self.client, cfg, self.base_url, row)
            except TransientError as exc:
                if attempt == cfg.max_retries:
                    _log_error(self.out_dir, row.row, str(exc), attempt + 1)
                    stats.failed.append({"row": row.row, "error": str(exc)})
                    return
                delay = backoff_delay(attempt, cfg.backoff_base_s, cfg.backoff_max_s, self.rng)
                if exc.retry_after is not None:
                    delay = max(delay, min(exc.retry_after, cfg.backoff_max_s))
                stats.retries += 1
                log.warning("row %d: %s; retry %d/%d in %.1f s", row.row, exc, attempt + 1, cfg.max_retries, delay)
                await self.sleep(delay)
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
            self.log_.append(rec)  # no await between here and the fsync: one writer, whole lines
            stats.answered += 1
            stats.completion_tokens += int(ans.get("completion_tokens") or 0)
            if self.progress:
                self.progress(len(self.log_.records), self.total)
            return


def _log_error(out_dir: Path, row: int, error: str, attempts: int) -> None:
    with open(out_dir / ERRORS, "a") as f:
        rec = {"row": row, "error": error, "attempts": attempts, "time": _dt.datetime.now(_dt.timezone.utc).isoformat()}
        f.write(json.dumps(rec) + "\n")

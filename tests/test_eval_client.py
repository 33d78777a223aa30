"""The evaluation client against a fake OpenAI-compatible HTTP server on loopback: one request per row with the DAPO
sampling, answers appended durably, resume without duplicates or losses, retries on transient errors only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest

from dapo.eval.client import evaluate
from dapo.eval.endpoint import ClientConfig, RequestRefused, backoff_delay, normalize_base_url
from dapo.eval.records import RESPONSES, EvalError, ResponseLog

ROOT = Path(__file__).resolve().parents[1]
MODEL = "dapo-test"


def make_parquet(path: Path, problems: int = 3, k: int = 4) -> list[dict]:
    """A DAPO-schema test file: ``problems`` x ``k`` rows, interleaved like the real one."""
    rows = []
    for j in range(k):
        for p in range(problems):
            q = f"Problem {p}: what is {p} + 100?"
            rows.append(
                {
                    "data_source": "math_dapo",
                    "prompt": [{"role": "user", "content": q}],
                    "ability": "MATH",
                    "reward_model": {"ground_truth": str(p + 100), "style": "rule-lighteval/MATH_v2"},
                    "extra_info": {"index": p, "raw_problem": q, "split": None},
                }
            )
    pd.DataFrame(rows).to_parquet(path)
    return rows


class FakeOpenAI:
    """Loopback server: /v1/models lists ``model``; /v1/chat/completions answers via ``answer(body, n)`` where n
    counts the requests with that prompt so far (1-based), or plays a scripted failure."""

    def __init__(self, answer, model: str = MODEL, latency_s: float = 0.0, ready_after: int = 0):
        self.answer, self.model, self.latency_s = answer, model, latency_s
        self.ready_after = ready_after  # /v1/models calls answered 503 before the model is listed
        self.requests: list[dict] = []
        self.model_polls = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, obj, headers: dict | None = None):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path != "/v1/models":
                    return self._send(404, {"detail": "not found"})
                with outer.lock:
                    outer.model_polls += 1
                    polls = outer.model_polls
                if polls <= outer.ready_after:
                    return self._send(503, {"detail": "starting"})
                self._send(200, {"object": "list", "data": [{"id": outer.model, "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with outer.lock:
                    outer.requests.append(body)
                    n = sum(1 for r in outer.requests if r["messages"] == body["messages"])
                if outer.latency_s:
                    time.sleep(outer.latency_s)
                if body.get("model") != outer.model:
                    return self._send(404, {"detail": f"no model {body.get('model')!r}"})
                result = outer.answer(body, n)
                if result == "drop":  # connection closed without a response
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if isinstance(result, tuple):  # (status, headers)
                    return self._send(result[0], {"error": {"message": "scripted", "code": result[0]}}, result[1])
                self._send(
                    200,
                    {
                        "object": "chat.completion",
                        "model": outer.model,
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": result},
                                     "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 12, "completion_tokens": len(result.split()),
                                  "total_tokens": 12 + len(result.split())},
                    },
                )  # fmt: skip

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def problem_of(body) -> int:
    return int(body["messages"][0]["content"].split()[1].rstrip(":"))


def solver(body, n):
    """Problem 0 always right, problem 1 right on its first request only, problem 2 always wrong."""
    p = problem_of(body)
    right = p == 0 or (p == 1 and n == 1)
    return f"Thinking about it.\nAnswer: {p + 100 if right else 7}"


def cfg(url: str, **kw) -> ClientConfig:
    base = dict(base_url=url, model=MODEL, concurrency=4, backoff_base_s=0.01, backoff_max_s=0.05, wait_timeout_s=5,
                wait_poll_s=0.05)
    return ClientConfig(**{**base, **kw})


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_one_request_per_row_with_dapo_sampling_and_metrics(tmp_path):
    rows = make_parquet(tmp_path / "aime.parquet")
    with FakeOpenAI(solver) as srv:
        summary = evaluate(cfg(srv.url), tmp_path / "aime.parquet", tmp_path / "out", progress=False)
    assert len(srv.requests) == 12
    for body in srv.requests:
        assert body["temperature"] == 1.0 and body["top_p"] == 0.7 and body["max_completion_tokens"] == 20480
        assert body["model"] == MODEL and "seed" not in body
    assert sorted(json.dumps(b["messages"]) for b in srv.requests) == sorted(json.dumps(r["prompt"]) for r in rows)
    recs = read_jsonl(tmp_path / "out" / RESPONSES)
    assert sorted(r["row"] for r in recs) == list(range(12))
    m = summary["metrics"]
    # 12 answers: problem 0 4/4, problem 1 1/4, problem 2 0/4
    assert m["k"] == 4 and m["acc/mean@4"] == pytest.approx(5 / 12) and summary["aime_score"] == pytest.approx(41.67)
    assert m["pass@4"] == pytest.approx(2 / 3)
    assert m["cons@4"] == pytest.approx(1 / 3)  # problem 1's vote goes to the wrong "7"
    assert summary["complete"] and summary["this_run"]["answers"] == 12
    df = pd.read_parquet(tmp_path / "out" / "results.parquet")
    assert len(df) == 12 and {"output", "res", "acc", "pred", "problem_id"} <= set(df.columns)
    assert df["acc"].sum() == 5 and df["res"].iloc[0]["acc"] == df["acc"].iloc[0]
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["metrics"]["acc/mean@4"] == pytest.approx(5 / 12)


def test_rerun_sends_only_rows_without_an_answer(tmp_path):
    make_parquet(tmp_path / "aime.parquet")
    out = tmp_path / "out"
    with FakeOpenAI(solver) as srv:
        evaluate(cfg(srv.url), tmp_path / "aime.parquet", out, progress=False)
    lines = (out / RESPONSES).read_text().splitlines(keepends=True)
    kept = lines[:5]
    (out / RESPONSES).write_text("".join(kept))
    with FakeOpenAI(solver) as srv2:
        summary = evaluate(cfg(srv2.url), tmp_path / "aime.parquet", out, progress=False)
    assert len(srv2.requests) == 7
    text = (out / RESPONSES).read_text()
    assert text.startswith("".join(kept)), "answers already written are never rewritten"
    assert sorted(r["row"] for r in read_jsonl(out / RESPONSES)) == list(range(12))
    assert summary["complete"] and summary["this_run"]["answers"] == 7


def test_torn_last_line_is_dropped_and_its_row_redone(tmp_path):
    make_parquet(tmp_path / "aime.parquet")
    out = tmp_path / "out"
    with FakeOpenAI(solver) as srv:
        evaluate(cfg(srv.url), tmp_path / "aime.parquet", out, progress=False)
    lines = (out / RESPONSES).read_text().splitlines(keepends=True)
    torn_row = json.loads(lines[3])["row"]
    (out / RESPONSES).write_text("".join(lines[:3]) + lines[3][: len(lines[3]) // 2])  # killed mid-write
    with FakeOpenAI(solver) as srv2:
        evaluate(cfg(srv2.url), tmp_path / "aime.parquet", out, progress=False)
    assert len(srv2.requests) == 9
    assert torn_row in {r["row"] for r in read_jsonl(out / RESPONSES)}
    rows = [r["row"] for r in read_jsonl(out / RESPONSES)]
    assert sorted(rows) == list(range(12)) and len(rows) == len(set(rows))


def test_malformed_line_before_the_end_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / RESPONSES
    path.write_text('{"row": 0, "content": "a"}\nnot json\n{"row": 2, "content": "c"}\n')
    with pytest.raises(EvalError, match=rf"{RESPONSES} line 2"):
        ResponseLog(path)


def test_duplicate_rows_in_the_log_keep_the_first_answer(tmp_path):
    path = tmp_path / RESPONSES
    path.write_text('{"row": 0, "content": "first"}\n{"row": 0, "content": "second"}\n')
    log = ResponseLog(path)
    assert log.records[0]["content"] == "first"
    with pytest.raises(EvalError, match="already has an answer"):
        log.append({"row": 0, "content": "third"})
    log.close()


def test_transient_errors_are_retried_and_nothing_is_lost(tmp_path):
    make_parquet(tmp_path / "aime.parquet")

    def flaky(body, n):
        p = problem_of(body)
        if p == 0 and n == 1:
            return (503, {})
        if p == 1 and n <= 2:
            return (429, {"retry-after": "0"})
        if p == 2 and n == 1:
            return "drop"
        return solver(body, 1)

    with FakeOpenAI(flaky, ready_after=2) as srv:
        summary = evaluate(cfg(srv.url), tmp_path / "aime.parquet", tmp_path / "out", progress=False)
    assert summary["complete"]
    assert summary["this_run"]["retries"] == 4  # one 503, two 429s, one dropped connection
    rows = [r["row"] for r in read_jsonl(tmp_path / "out" / RESPONSES)]
    assert sorted(rows) == list(range(12))
    assert srv.model_polls >= 3, "the client waited for /v1/models before sending"


def test_client_errors_are_not_retried_and_stop_the_run(tmp_path):
    make_parquet(tmp_path / "aime.parquet")
    with FakeOpenAI(lambda body, n: (400, {}) if problem_of(body) == 2 else solver(body, n)) as srv:
        with pytest.raises(RequestRefused, match="HTTP 400"):
            evaluate(cfg(srv.url, concurrency=1), tmp_path / "aime.parquet", tmp_path / "out", progress=False)
    bad = [b for b in srv.requests if problem_of(b) == 2]
    assert len(bad) == 1, "a 4xx is not retried, and the run stops at the first one"
    assert read_jsonl(tmp_path / "out" / "errors.jsonl")[0]["row"] == 2
    assert [r["row"] for r in read_jsonl(tmp_path / "out" / RESPONSES)] == [0, 1]


def test_rows_failing_after_all_retries_leave_the_run_incomplete(tmp_path):
    make_parquet(tmp_path / "aime.parquet", problems=2, k=2)
    with FakeOpenAI(lambda body, n: (502, {}) if problem_of(body) == 1 else solver(body, n)) as srv:
        summary = evaluate(cfg(srv.url, max_retries=2), tmp_path / "aime.parquet", tmp_path / "out", progress=False)
    assert not summary["complete"] and summary["missing_rows"] == [1, 3]
    assert summary["this_run"]["failed"] == 2 and len(srv.requests) == 2 + 2 * 3
    assert summary["metrics"]["answers"] == 2


def test_waiting_for_the_model_times_out_with_a_clear_error(tmp_path):
    make_parquet(tmp_path / "aime.parquet")
    with FakeOpenAI(solver, model="another-model") as srv:
        with pytest.raises(EvalError, match=r"did not list model 'dapo-test'.*another-model"):
            evaluate(cfg(srv.url, wait_timeout_s=0.5), tmp_path / "aime.parquet", tmp_path / "out", progress=False)
        assert srv.requests == []


def test_resuming_with_other_sampling_settings_is_refused(tmp_path):
    make_parquet(tmp_path / "aime.parquet")
    with FakeOpenAI(solver) as srv:
        evaluate(cfg(srv.url, limit=2), tmp_path / "aime.parquet", tmp_path / "out", progress=False)
        with pytest.raises(EvalError, match=r"top_p: stored 0.7 vs now 1.0"):
            evaluate(cfg(srv.url, limit=2, top_p=1.0), tmp_path / "aime.parquet", tmp_path / "out", progress=False)


def test_answers_from_another_test_file_are_refused(tmp_path):
    make_parquet(tmp_path / "a.parquet")
    with FakeOpenAI(solver) as srv:
        evaluate(cfg(srv.url), tmp_path / "a.parquet", tmp_path / "out", progress=False)
    path = tmp_path / "out" / RESPONSES
    recs = read_jsonl(path)
    recs[0]["prompt_sha"] = "0" * 16
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(EvalError, match="different prompt"):
        evaluate(cfg("http://127.0.0.1:9"), tmp_path / "a.parquet", tmp_path / "out", progress=False)


def test_bad_test_file_errors_name_the_file_and_row(tmp_path):
    df = pd.DataFrame({"prompt": [[{"role": "user", "content": "q"}]], "reward_model": [{"ground_truth": ""}]})
    df.to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(EvalError, match=r"bad.parquet row 0: 'reward_model.ground_truth'"):
        evaluate(cfg("http://127.0.0.1:9"), tmp_path / "bad.parquet", tmp_path / "out", progress=False)
    with pytest.raises(EvalError, match="does not exist"):
        evaluate(cfg("http://127.0.0.1:9"), tmp_path / "none.parquet", tmp_path / "out", progress=False)


def test_helpers():
    assert normalize_base_url("http://h:8000") == normalize_base_url("http://h:8000/v1/") == "http://h:8000/v1"
    import random

    rng = random.Random(0)
    delays = [backoff_delay(a, 1.0, 60.0, rng) for a in range(10)]
    assert all(0.5 * min(60, 2**a) <= d <= min(60, 2**a) for a, d in enumerate(delays))


def test_sigkill_mid_run_then_rerun_has_every_row_exactly_once(tmp_path):
    """The DAPO-compatible script in a subprocess, killed with SIGKILL while answers stream in, then rerun."""
    make_parquet(tmp_path / "aime.parquet", problems=5, k=8)  # 40 rows
    out = tmp_path / "out"
    cmd = [
        sys.executable, str(ROOT / "eval" / "eval_aime24.py"), "--temperature", "1.0", "--top_p", "0.7",
        "--max_tokens", "64", "--model", MODEL, "--test_file", str(tmp_path / "aime.parquet"),
        "--concurrency", "2", "--output", str(out), "--no-progress",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with FakeOpenAI(solver, latency_s=0.05) as srv:
        proc = subprocess.Popen(
            [*cmd, "--base-url", srv.url], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (out / RESPONSES).exists() and len((out / RESPONSES).read_bytes().splitlines()) >= 6:
                break
            assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        done_at_kill = len(read_jsonl(out / RESPONSES))
        assert 6 <= done_at_kill < 40, "the client must have been killed mid-run"
        first_part = (out / RESPONSES).read_bytes()
        r = subprocess.run([*cmd, "--base-url", srv.url], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "acc/mean@8" in r.stdout
    final = read_jsonl(out / RESPONSES)
    rows = [rec["row"] for rec in final]
    assert sorted(rows) == list(range(40)), "each row exactly once"
    assert (out / RESPONSES).read_bytes().startswith(first_part.rsplit(b"\n", 1)[0])
    assert len(srv.requests) <= 40 + 2, "only the rows in flight at the kill may be asked twice"


def test_eval_run_exports_serves_evaluates_and_tears_down(tmp_path, monkeypatch):
    """`dapo eval run` (the chart's eval job) with the serving layer replaced by the fake endpoint: step selection,
    model id, preset defaults vs explicit flags, and teardown even when the client fails."""
    from dapo.eval import serve as eval_serve
    from dapo.eval import cli as evaluate

    make_parquet(tmp_path / "aime.parquet")
    ckpt = tmp_path / "DAPO-Qwen2.5-32B"
    for step in (5, 10):  # HF weights already in the step dir: served as is
        (ckpt / f"global_step_{step}").mkdir(parents=True)
        (ckpt / f"global_step_{step}" / "config.json").write_text("{}")
        (ckpt / f"global_step_{step}" / "model.safetensors").write_bytes(b"")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("10")
    calls = {}

    def start(cfg):
        calls["serve"] = cfg
        return srv.url + "/v1"

    monkeypatch.setattr(eval_serve, "init_ray", lambda *a, **k: calls.setdefault("init", a))
    monkeypatch.setattr(eval_serve, "cluster_gpus", lambda: 8.0)
    monkeypatch.setattr(eval_serve, "_probe_gpus", lambda: (80 * 10**9, 8))
    monkeypatch.setattr(eval_serve, "start", start)
    monkeypatch.setattr(eval_serve, "stop", lambda shutdown_ray=True: calls.setdefault("stops", []).append(1))

    with FakeOpenAI(solver, model="DAPO-Qwen2.5-32B-step10") as srv:
        rc = evaluate.main(
            ["run", "--checkpoint-dir", str(ckpt), "--step", "latest", "--test-file", str(tmp_path / "aime.parquet"),
             "--output", str(tmp_path / "out"), "--preset", "full", "--top-p", "0.9", "--no-progress"]
        )  # fmt: skip
    assert rc == 0
    served = calls["serve"]
    assert served.model_id == "DAPO-Qwen2.5-32B-step10" and served.model == str(ckpt / "global_step_10")
    assert served.host == "127.0.0.1"  # the chart's evaluation job serves on loopback: its driver is on the head
    # from the preset: TP 4 and a 2048 + 20480 context; the explicit --top-p wins over the preset's 0.7
    assert served.tensor_parallel_size == 4 and served.max_model_len == 22528
    assert {b["top_p"] for b in srv.requests} == {0.9} and {b["max_completion_tokens"] for b in srv.requests} == {20480}
    summary = json.loads((tmp_path / "out" / "global_step_10" / "summary.json").read_text())
    assert summary["config"]["checkpoint"]["step"] == 10 and summary["complete"]
    assert calls["stops"] == [1]

    with FakeOpenAI(solver, model="something-else") as srv:
        rc = evaluate.main(
            ["run", "--checkpoint-dir", str(ckpt), "--step", "5", "--test-file", str(tmp_path / "aime.parquet"),
             "--output", str(tmp_path / "out5"), "--wait-timeout", "0.3", "--no-progress"]
        )  # fmt: skip
    assert rc == 1 and calls["serve"].model_id == "DAPO-Qwen2.5-32B-step5" and calls["stops"] == [1, 1]
    assert calls["serve"].tensor_parallel_size == 1, "without a preset, TP is sized to the (tiny) weights"
    assert calls["serve"].max_model_len == 2048 + 20480  # no max_position_embeddings in this config
    assert evaluate.main(["run", "--checkpoint-dir", str(tmp_path / "none"), "--test-file",
                          str(tmp_path / "aime.parquet")]) == 1  # fmt: skip


def test_summary_is_logged_to_wandb_when_a_project_is_configured(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    make_parquet(tmp_path / "aime.parquet")
    with FakeOpenAI(solver) as srv:
        evaluate(cfg(srv.url), tmp_path / "aime.parquet", tmp_path / "out", progress=False,
                 wandb_project="dapo-eval-test", wandb_run_name="step10")  # fmt: skip
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    tables = list(runs[0].rglob("per_problem*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    assert table["columns"][:4] == ["problem", "samples", "correct", "acc"]
    assert sorted((row[0], row[2]) for row in table["data"]) == [("0", 4), ("1", 1), ("2", 0)]

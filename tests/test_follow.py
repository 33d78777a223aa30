"""The log follower (python -m dapo.cluster.follow) as a process, against a directory where real attempt logs
(dapo.train.runlog's writer, in child processes) are written, appended, cut mid-line, retried: its stdout is every line
of every attempt of the run, in order, once, each attempt under one header, then one line saying how the run ended,
and its exit code says the same. A follower killed and started again on the same state directory prints nothing
twice. With a RayJob (a fake API server: the one GET the chart's Role allows), the run's end and its attempts come
from the RayJob's status."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import ROOT
from k8s_support import JsonHandler
from dapo.train.runlog import started_at

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
FAST = ["--poll", "0.05", "--status-every", "0.1", "--grace", "0.5"]

# One attempt of a "driver": under the real attempt log, lines with pauses, a line written in two pieces, and then
# an exit code -- or SIGKILL in the middle of a line (its pod lost), which leaves no exit line.
WRITER = textwrap.dedent("""
    import os, signal, sys, time
    from dapo.train.runlog import run_logged

    def driver():
        tag, rc = sys.argv[2], sys.argv[3]
        for i in range(3):
            print(f"{tag} step {i}", flush=True)
            time.sleep(0.15)
        os.write(1, f"{tag} a line in two pie".encode())
        time.sleep(0.4)
        if rc == "kill":
            time.sleep(1.0)  # the attempt log's copying thread writes the piece first
            os.kill(os.getpid(), signal.SIGKILL)
        os.write(1, b"ces\\n")
        time.sleep(0.3)  # stdout and stderr reach the log through two pipes: their order needs a pause
        print(f"{tag} done", file=sys.stderr, flush=True)
        return int(rc)

    sys.exit(run_logged(sys.argv[1], driver, header="writer " + sys.argv[2], prog="writer"))
""")


def write_attempt(log_dir: Path, tag: str, rc: int | str) -> int:
    """Run one attempt to its end (or its SIGKILL); returns its exit status."""
    proc = subprocess.run([sys.executable, "-c", WRITER, str(log_dir), tag, str(rc)], env=ENV, capture_output=True,
                          timeout=60)
    return proc.returncode


def follower(log_dir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dapo.cluster.follow", "--log-dir", str(log_dir), *FAST, *args],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def stream_of(log_dir: Path, attempts: list[int]) -> bytes:
    """What the follower must print for these attempts: each under its header, a cut last line completed."""
    out = b""
    for n in attempts:
        path = log_dir / f"attempt-{n}.log"
        data = path.read_bytes()
        stamp = started_at(data.split(b"\n", 1)[0]).strftime("%Y-%m-%d %H:%M:%S UTC")
        out += f"==> attempt {n}, started {stamp}: {path} <==\n".encode() + data
        out += b"" if data.endswith(b"\n") else b"\n"
    return out


def finish(proc: subprocess.Popen, timeout: float = 30) -> tuple[int, bytes, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err.decode()


def test_a_retried_run_that_succeeds_is_printed_once_in_order_and_exits_0(tmp_path):
    log_dir = tmp_path / "run" / "logs"
    proc = follower(log_dir)  # before the directory exists: it waits for it
    time.sleep(0.5)
    assert write_attempt(log_dir, "first", "kill") == -signal.SIGKILL  # its pod lost mid-line
    assert write_attempt(log_dir, "second", 1) == 1
    assert write_attempt(log_dir, "third", 0) == 0
    rc, out, err = finish(proc)
    assert rc == 0, err
    assert out == stream_of(log_dir, [1, 2, 3]) + b"==> the run succeeded: attempt 3 exited with code 0 <==\n"
    text = out.decode()
    assert "first a line in two pie\n==> attempt 2" in text  # the cut line, completed before the next header
    assert text.count("third step 2\n") == 1 and "third done\n" in text  # stdout and stderr of the driver
    assert "waiting for" in err and "attempt 1 ended without an exit code in its log" in err


def test_a_run_that_fails_for_good_ends_after_backoff_limit_plus_one_attempts_with_exit_1(tmp_path):
    log_dir = tmp_path / "logs"
    proc = follower(log_dir, "--backoff-limit", "1")
    assert write_attempt(log_dir, "first", 3) == 3
    time.sleep(0.5)
    assert proc.poll() is None, "one failed attempt of two allowed: the follower waits for the retry"
    assert write_attempt(log_dir, "second", 2) == 2
    rc, out, err = finish(proc)
    assert rc == 1, err
    assert out == stream_of(log_dir, [1, 2]) + b"==> the run failed: 2 attempt(s) failed, backoffLimit 1 <==\n"


def test_a_follower_restarted_mid_run_prints_nothing_twice_and_misses_nothing(tmp_path):
    log_dir, state = tmp_path / "logs", tmp_path / "state"
    first = follower(log_dir, "--state-dir", str(state))
    write_attempt(log_dir, "first", 1)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(log_dir), "second", "0"], env=ENV)
    deadline = time.monotonic() + 30
    while True:  # stop it, look at what it recorded, kill it only between two writes (a kill inside one: next test)
        first.send_signal(signal.SIGSTOP)
        st = json.loads((state / "state.json").read_text()) if (state / "state.json").exists() else {}
        if st.get("attempt") == 2 and st.get("offset", 0) > 0 and not st.get("pending"):
            break
        first.send_signal(signal.SIGCONT)
        assert time.monotonic() < deadline, st
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)  # mid-run, mid-attempt (OOM, a crash): no chance to clean up
    out1, _ = first.communicate(timeout=10)
    second = follower(log_dir, "--state-dir", str(state))
    assert writer.wait(timeout=60) == 0
    rc, out2, err2 = finish(second)
    assert rc == 0, err2
    assert out1 + out2 == stream_of(log_dir, [1, 2]) + b"==> the run succeeded: attempt 2 exited with code 0 <==\n"
    assert out1 and out2 and b"==> attempt 2" in out1, "the restart happened mid-run"
    assert "restarted: resuming attempt 2 at byte" in err2
    # and once more after the end: nothing printed, the same exit code
    rc, out3, err3 = finish(follower(log_dir, "--state-dir", str(state)))
    assert (rc, out3) == (0, b"")


def test_a_write_cut_by_a_kill_is_reported_not_printed_again(tmp_path):
    """Killed between recording a write and finishing it, the follower cannot know how much came out: the restarted
    one names the byte range on stderr and goes on after it (never twice; the file keeps the lines)."""
    log_dir, state = tmp_path / "logs", tmp_path / "state"
    write_attempt(log_dir, "first", 0)
    state.mkdir()
    size = (log_dir / "attempt-1.log").stat().st_size
    (state / "state.json").write_text(json.dumps({
        "attempt": 1, "offset": 0, "last_line": "", "finished": {}, "ended": None, "uid": "",
        "pending": {"what": f"bytes 0-{size} of attempt-1.log", "after": {"offset": size, "last_line": "dapo: exit "
                    f"code 0 | log {log_dir / 'attempt-1.log'}"}}}))
    rc, out, err = finish(follower(log_dir, "--state-dir", str(state)))
    assert rc == 0, err
    assert out == b"==> the run succeeded: attempt 1 exited with code 0 <==\n"
    assert f"stopped while printing bytes 0-{size} of attempt-1.log" in err


def chart_result_script() -> tuple[str, str]:
    """The shell script of the follower Job's main container as the chart renders it, and the state directory it
    reads (mounted from the follower's)."""
    from k8s_support import VALUES_DIR, by_key, helm_objects, user_values

    job = by_key(helm_objects(user_values([VALUES_DIR / "full.yaml"])))[("Job", "dapo-train-logs")]
    (result,) = job["spec"]["template"]["spec"]["containers"]
    assert result["command"][:2] == ["/bin/sh", "-c"]
    (state,) = [m["mountPath"] for m in result["volumeMounts"] if m["name"] == "state"]
    return result["command"][2], state


def test_sidecar_mode_hands_the_exit_code_to_the_pods_main_container_and_waits_for_sigterm(tmp_path):
    script, state_dir = chart_result_script()
    log_dir, state = tmp_path / "logs", tmp_path / "state"
    proc = follower(log_dir, "--state-dir", str(state), "--sidecar", "--backoff-limit", "0")
    write_attempt(log_dir, "only", 5)
    waiter = subprocess.run(["/bin/sh", "-c", script.replace(state_dir, str(state))], timeout=30)
    assert waiter.returncode == 1  # the chart's main container: exits with the follower's code
    assert proc.poll() is None, "a restartable init container must not exit by itself (it would be restarted)"
    proc.send_signal(signal.SIGTERM)
    rc, out, _ = finish(proc)
    assert rc == 0 and out.endswith(b"==> the run failed: 1 attempt(s) failed, backoffLimit 0 <==\n")


# ---------------------------------------------------------------------------------------------------------------
# with the RayJob's status


class FakeRayJobApi:
    """GET /apis/ray.io/v1/namespaces/ml/rayjobs/dapo-train: ``self.obj`` (None: 404), or ``self.code``."""

    def __init__(self):
        self.obj: dict | None = None
        self.code = 200
        self.requests: list[tuple[str, str]] = []
        outer = self

        class Handler(JsonHandler):
            def do_GET(self):
                outer.requests.append((self.path, self.headers.get("Authorization", "")))
                code = outer.code if self.path == "/apis/ray.io/v1/namespaces/ml/rayjobs/dapo-train" else 404
                body = outer.obj if code == 200 else {"kind": "Status", "code": code}
                if body is None:
                    code, body = 404, {"kind": "Status", "code": 404}
                self.send_json(code, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def set(self, deployment: str, job: str = "RUNNING", failed: int = 0, created: datetime | None = None,
            uid: str = "uid-1"):
        created = created or datetime.now(timezone.utc) - timedelta(seconds=2)
        self.obj = {"apiVersion": "ray.io/v1", "kind": "RayJob",
                    "metadata": {"name": "dapo-train", "uid": uid,
                                 "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ")},
                    "spec": {"backoffLimit": 2},
                    "status": {"jobDeploymentStatus": deployment, "jobStatus": job, "failed": failed,
                               **({"reason": "AppFailed"} if deployment == "Failed" else {})}}


@pytest.fixture
def api():
    a = FakeRayJobApi()
    yield a
    a.server.shutdown()


def old_attempt(log_dir: Path) -> None:
    """attempt-1.log of an earlier release with the same run directory: it started (and succeeded) a day ago."""
    log_dir.mkdir(parents=True)
    then = (datetime.now(timezone.utc) - timedelta(days=1)).strftime("%Y-%m-%d %H:%M:%S UTC")
    (log_dir / "attempt-1.log").write_text(f"dapo: this attempt's log (stdout + stderr): {log_dir}/attempt-1.log | "
                                           f"started {then}\nold run\ndapo: exit code 0 | log {log_dir}/attempt-1.log\n")


def with_api(log_dir: Path, api: FakeRayJobApi, *args: str) -> subprocess.Popen:
    return follower(log_dir, "--rayjob", "dapo-train", "--namespace", "ml", "--api-server", api.url, *args)


def test_with_the_rayjob_only_its_attempts_count_and_its_failed_status_ends_the_run(tmp_path, api):
    log_dir = tmp_path / "logs"
    old_attempt(log_dir)  # would end the run at once as a success, were it counted
    proc = with_api(log_dir, api)
    deadline = time.monotonic() + 60  # until it has asked for the RayJob a few times (a loaded machine starts slowly)
    while len(api.requests) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert proc.poll() is None, "the RayJob does not exist yet: nothing can be said of the attempts"
    api.set("Initializing")
    write_attempt(log_dir, "second", 1)
    api.set("Retrying", failed=1)  # KubeRay: a failed attempt with retries left
    time.sleep(1.0)
    assert proc.poll() is None, "a retry is coming"
    api.set("Running", failed=1)
    write_attempt(log_dir, "third", 1)
    api.set("Failed", job="FAILED", failed=2)
    rc, out, err = finish(proc)
    assert rc == 1, err
    assert out == stream_of(log_dir, [2, 3]) + (b"==> the run failed: the RayJob is Failed, job FAILED, 2 failed "
                                                b"attempt(s) (AppFailed: ) <==\n")
    assert "waiting for the RayJob to be created" in err


def test_a_deleted_rayjob_ends_the_run_as_failed(tmp_path, api):
    log_dir = tmp_path / "logs"
    api.set("Running")
    proc = with_api(log_dir, api)
    write_attempt(log_dir, "first", 1)
    api.obj = None  # kubectl delete rayjob (or deletionRules DeleteSelf) before a success
    rc, out, err = finish(proc)
    assert rc == 1, err
    assert out == stream_of(log_dir, [1]) + b"==> the run failed: the RayJob was deleted before the run succeeded <==\n"


def test_a_recreated_rayjob_is_not_followed_by_the_old_follower(tmp_path, api):
    log_dir = tmp_path / "logs"
    api.set("Running", uid="uid-1")
    proc = with_api(log_dir, api)
    write_attempt(log_dir, "first", 1)
    api.set("Running", uid="uid-2")  # deleted and created again between two reads
    rc, out, err = finish(proc)
    assert rc == 1 and out.endswith(b"==> the run failed: the RayJob was deleted before the run succeeded <==\n")


def test_without_permission_to_read_the_rayjob_it_goes_on_with_the_logs(tmp_path, api):
    api.code = 403
    log_dir = tmp_path / "logs"
    proc = with_api(log_dir, api, "--backoff-limit", "0")
    write_attempt(log_dir, "first", 0)
    rc, out, err = finish(proc)
    assert rc == 0, err
    assert out == stream_of(log_dir, [1]) + b"==> the run succeeded: attempt 1 exited with code 0 <==\n"
    assert "HTTP 403" in err and "judged from the attempt logs alone" in err
    assert len(api.requests) == 1, "a refused identity is not asked again"


def test_in_cluster_reads_send_the_current_service_account_token(tmp_path, api, monkeypatch):
    """The token is read again for every request (Kubernetes rotates projected tokens)."""
    from dapo.cluster.rayjob_api import RayJobApi

    token = tmp_path / "token"
    token.write_text("t1\n")
    client = RayJobApi(api.url, "ml", "dapo-train", token_file=token)
    api.set("Complete", job="SUCCEEDED")
    assert client.get().succeeded
    token.write_text("t2\n")
    assert client.get().terminal
    assert [a for _, a in api.requests] == ["Bearer t1", "Bearer t2"]
    api.obj = None
    assert not client.get().exists

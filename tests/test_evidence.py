"""A Ray pod's logs copied to the run's volume by its preStop hook (dapo.cluster.evidence): newest files first
within the pod's byte cap, a file that no longer fits cut to its end, filed under the newest attempt, and nothing
kept for an attempt that completed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from dapo.cluster.evidence import copy_logs, evidence_dir
from dapo.train import attempts
from k8s_support import ROOT


def ray_session(tmp_path):
    """/tmp/ray as Ray lays it out: session_latest a link to the session, its logs with older and newer files."""
    session = tmp_path / "ray" / "session_2026-12-01_10-00-00_000000_1"
    logs = session / "logs"
    (logs / "events").mkdir(parents=True)
    files = {"raylet.out": b"r" * 100, "gcs_server.out": b"g" * 100, "events/event_RAYLET.log": b"e" * 50,
             "worker-abc-01000000-123.err": b"head of the log\n" + b"x" * 200 + b"\nTHE LAST LINE\n"}
    for i, (name, data) in enumerate(files.items()):
        (logs / name).write_bytes(data)
        os.utime(logs / name, (1_000_000 + i, 1_000_000 + i))  # the worker's log is the newest
    (tmp_path / "ray" / "session_latest").symlink_to(session.name)
    return tmp_path / "ray" / "session_latest" / "logs"


def test_newest_files_first_within_the_cap_and_a_file_that_no_longer_fits_keeps_its_end(tmp_path):
    src = ray_session(tmp_path)
    manifest = copy_logs(src.resolve(), tmp_path / "out", max_bytes=300, seconds=10)
    assert manifest["copied"] == ["worker-abc-01000000-123.err", "events/event_RAYLET.log"]
    assert manifest["cut"] == ["gcs_server.out (last 19 of 100 bytes)"] and manifest["left_out"] == ["raylet.out"]
    assert manifest["bytes"] == 300
    assert (tmp_path / "out" / "worker-abc-01000000-123.err").read_bytes().endswith(b"THE LAST LINE\n")


def hook(log_dir, ray_logs, pod):
    return subprocess.run([sys.executable, "-m", "dapo.cluster.evidence", "--log-dir", str(log_dir), "--ray-logs",
                           str(ray_logs), "--max-bytes", "1000", "--seconds", "5"],
                          env={**os.environ, "PYTHONPATH": str(ROOT), "DAPO_POD_NAME": pod, "DAPO_NODE_NAME": "gpu-7"},
                          capture_output=True, text=True, timeout=60)


def test_the_hook_files_the_logs_under_the_newest_attempt_and_pod_and_keeps_nothing_after_success(tmp_path):
    src = ray_session(tmp_path)
    log_dir = tmp_path / "run" / "logs"
    log_dir.mkdir(parents=True)
    for n in (1, 2):
        (log_dir / f"attempt-{n}.log").write_text("x\n")
    r = hook(log_dir, src, "dapo-train-abc-worker-x1")
    assert r.returncode == 0 and "attempt 2: 4 files" in r.stderr, r.stderr
    dest = evidence_dir(tmp_path / "run", 2) / "dapo-train-abc-worker-x1"
    copied = json.loads((dest / "COPIED.json").read_text())
    assert copied["node"] == "gpu-7" and copied["attempt"] == 2 and (dest / "raylet.out").exists()
    attempts.write_end(log_dir, 2, cause="complete", message="done", step=9)
    r = hook(log_dir, src, "dapo-train-abc-worker-x2")
    assert r.returncode == 0 and "attempt 2 completed: no evidence kept" in r.stderr
    assert not (evidence_dir(tmp_path / "run", 2) / "dapo-train-abc-worker-x2").exists()
    r = hook(tmp_path / "missing", src, "p")  # nothing to file under: says so, and the pod goes on to `ray stop`
    assert r.returncode == 0 and "no attempt log" in r.stderr

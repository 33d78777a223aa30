"""The files an attempt leaves for the next one and for the follower (dapo.train.attempts): written whole, read back,
keyed where a change of preset must clear them."""

from __future__ import annotations

import threading
import time

import pytest

from dapo.train import attempts


def test_end_record_round_trip_names_cause_exit_code_and_nodes(tmp_path):
    node = attempts.node_entry("gpu-node-7", why="rank 3 stuck in update_actor", rank=3, ip="10.0.0.7")
    attempts.write_end(tmp_path, 2, cause="stalled", message="update_actor passed its 600 s budget", step=41,
                       phase="update_actor", nodes=[node], evidence="evidence/attempt-2")
    rec = attempts.read_end(tmp_path, 2)
    assert rec["exit_code"] == attempts.EXIT_STALLED and rec["cause"] == "stalled" and rec["final"] is False
    assert rec["nodes"] == [node] and rec["step"] == 41 and rec["phase"] == "update_actor"
    assert [r["attempt"] for r in attempts.end_records(tmp_path)] == [2]
    assert not list(tmp_path.glob(".*.tmp")), "the temporary file is renamed into place"


def test_end_record_refuses_an_unknown_cause(tmp_path):
    with pytest.raises(ValueError, match="unknown cause 'hung'"):
        attempts.write_end(tmp_path, 1, cause="hung", message="", step=0)


def test_end_records_are_ordered_by_attempt_number_not_by_name(tmp_path):
    for n in (10, 2, 1):
        attempts.write_end(tmp_path, n, cause="error", message="x", step=n)
    (tmp_path / "attempt-3.end.json").write_text("{not json")  # a torn or foreign file is skipped
    assert [r["attempt"] for r in attempts.end_records(tmp_path)] == [1, 2, 10]


def test_verdict_applies_only_to_the_preset_it_was_written_for(tmp_path):
    key = attempts.preset_key({"recipe": {"lr": 1e-6}})
    other = attempts.preset_key({"recipe": {"lr": 5e-7}})
    assert key != other
    attempts.write_verdict(tmp_path, key=key, cause="nonfinite", message="actor/grad_norm = nan", step=12, attempt=3)
    assert attempts.read_verdict(tmp_path, key)["cause"] == "nonfinite"
    assert attempts.read_verdict(tmp_path, other) is None
    text = attempts.verdict_refusal(tmp_path, attempts.read_verdict(tmp_path))
    assert "step 12" in text and "exit code 8" in text and "run-verdict.json" in text


def test_wait_for_ack_returns_the_followers_answer_or_gives_up(tmp_path, monkeypatch):
    monkeypatch.delenv(attempts.ACK_TIMEOUT_ENV, raising=False)
    t0 = time.monotonic()
    assert attempts.wait_for_ack(tmp_path, 1) is None  # no follower: no wait
    assert time.monotonic() - t0 < 0.5
    attempts.write_follower_beat(tmp_path)  # a follower is alive: the driver waits for its answer
    threading.Timer(0.3, lambda: attempts.write_ack(tmp_path, 1, ["left out node gpu-7"])).start()
    ack = attempts.wait_for_ack(tmp_path, 1, timeout=5, poll=0.05)
    assert ack["actions"] == ["left out node gpu-7"]
    monkeypatch.setenv(attempts.ACK_TIMEOUT_ENV, "0.2")
    t0 = time.monotonic()
    assert attempts.wait_for_ack(tmp_path, 2, poll=0.05) is None
    assert 0.15 < time.monotonic() - t0 < 2


def test_no_live_follower_means_no_wait_whatever_the_timeout(tmp_path, monkeypatch):
    """The chart sets DAPO_ACK_TIMEOUT_S for the follower it installs; without one beating (none installed, or one
    silent for longer than FOLLOWER_STALE_S) the driver does not sit out the timeout."""
    import os

    monkeypatch.setenv(attempts.ACK_TIMEOUT_ENV, "30")
    t0 = time.monotonic()
    assert attempts.wait_for_ack(tmp_path, 1) is None and time.monotonic() - t0 < 1  # no beat at all
    attempts.write_follower_beat(tmp_path)
    old = time.time() - attempts.FOLLOWER_STALE_S - 5
    os.utime(attempts.follower_path(tmp_path), (old, old))
    t0 = time.monotonic()
    assert attempts.wait_for_ack(tmp_path, 1) is None and time.monotonic() - t0 < 1  # a stale beat

"""The failure budget that replaces KubeRay's lifetime backoffLimit (dapo.cluster.budget): failures counted per
window, the same cause in a row, and the run's record on its volume -- one per RayJob, kept across follower pods."""

from __future__ import annotations

import json

from dapo.cluster.budget import FILE, Budget, RunRecord

H = 3600.0


def failures(*specs):
    """(hours ago, cause) -> failure entries, oldest first."""
    now = 100 * H
    return [{"attempt": i + 1, "time": now - ago * H, "cause": cause, "message": f"m{i + 1}"}
            for i, (ago, cause) in enumerate(specs)], now


def test_the_budget_counts_failures_within_its_window_not_over_the_runs_life():
    budget = Budget(max_failures=3, window_s=24 * H, same_cause=0)
    # six failures over two weeks, never four within a day: the run goes on (backoffLimit 3 would have ended it)
    spread, now = failures((300, "error"), (250, "stalled"), (200, "error"), (100, "nonfinite"), (50, "error"),
                           (1, "stalled"))
    assert budget.spent(spread, now) is None
    dense, now = failures((30, "error"), (20, "stalled"), (10, "error"), (5, "error"), (1, "stalled"))
    why = budget.spent(dense, now)
    assert why.startswith("4 attempts failed within 24 h (train.retries.failureBudget.maxFailures 3 per 24 h)")
    assert budget.spent(dense[:-1], now) is None  # three within the day: allowed


def test_the_same_cause_k_times_in_a_row_stops_the_run_naming_it():
    budget = Budget(max_failures=100, window_s=24 * H, same_cause=3)
    row, now = failures((9, "stalled"), (5, "stalled"), (2, "stalled"))
    why = budget.spent(row, now)
    assert why == ("the same cause, stalled, ended 3 attempts in a row (attempts 1, 2, 3; "
                   "train.retries.failureBudget.sameCauseInARow 3): m3")
    broken, now = failures((9, "stalled"), (5, "error"), (2, "stalled"))
    assert budget.spent(broken, now) is None
    assert Budget(100, 24 * H, 0).spent(row, now) is None  # 0: no such limit
    assert budget.describe(row, now) == "failure budget: 3 of 100 in 24 h, stalled 3 in a row of 3"


def test_a_zero_budget_stops_at_the_first_failure():
    one, now = failures((1, "error"))
    assert Budget(0, 24 * H, 0).spent(one, now).startswith("1 attempts failed within 24 h")


def test_the_record_belongs_to_one_rayjob_and_outlives_the_follower(tmp_path):
    rec = RunRecord(tmp_path, "uid-1")
    rec.add_failure(attempt=2, cause="stalled", message="x", nodes={"gpu-1": "why"}, recorded=True)
    assert rec.leave_out({"gpu-1": "why", "gpu-2": "why"}, 2, limit=3) == (["gpu-1", "gpu-2"], [])
    assert rec.leave_out({"gpu-3": "a", "gpu-4": "b"}, 3, limit=3) == (["gpu-3", "gpu-4"], ["gpu-1"])
    rec.save()
    again = RunRecord(tmp_path, "uid-1")  # a follower in a new pod goes on from it
    assert again.left_out == ["gpu-2", "gpu-3", "gpu-4"] and len(again.failures) == 1
    fresh = RunRecord(tmp_path, "uid-2")  # the RayJob created again: a new run, the old record kept aside
    assert fresh.failures == [] and fresh.left_out == []
    assert json.loads((tmp_path / "failures-uid-1.json").read_text())["uid"] == "uid-1"
    assert not (tmp_path / FILE).exists()  # until the new run's record is first saved

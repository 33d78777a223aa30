"""The progress watchdog's budgets and its thread (dapo.train.watchdog), on a fake clock and on a real blocked call."""

from __future__ import annotations

import os
import threading
import time

import pytest

from dapo.config import WatchdogConfig
from dapo.train import attempts
from dapo.train.watchdog import Watchdog


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _cfg(**kw):
    base = dict(startup_s=300.0, first_s=90.0, floor_s=30.0, multiple=3.0, window=5, save_s=60.0, poll_s=1.0)
    base.update(kw)
    return WatchdogConfig(**base)


def _run_phase(wd, clock, name, seconds):
    wd.enter(name)
    clock.t += seconds
    fired = wd.check()
    wd.leave(name)
    return fired


def test_budgets_follow_start_up_first_time_floor_and_a_multiple_of_recent_times(tmp_path):
    clock = Clock()
    wd = Watchdog(_cfg(), tmp_path, clock=clock)
    assert wd.budget_for("startup") == 300
    assert wd.budget_for("gen") == 90  # first time in this attempt
    _run_phase(wd, clock, "gen", 20.0)
    assert wd.budget_for("gen") == 60  # 3 x 20 s beats the 30 s floor
    for _ in range(5):
        _run_phase(wd, clock, "gen", 2.0)
    assert wd.budget_for("gen") == 30  # the 20 s run left the window of 5: the floor
    assert wd.budget_for("save") == 60  # saves: their own floor even the first time


def test_a_step_at_twice_its_usual_time_does_not_fire_but_a_stall_fires_once(tmp_path):
    clock = Clock()
    wd = Watchdog(_cfg(floor_s=1.0, first_s=1000.0), tmp_path, clock=clock)
    for _ in range(5):
        assert _run_phase(wd, clock, "update_actor", 100.0) is None
    assert _run_phase(wd, clock, "update_actor", 200.0) is None  # 2x: inside 3 x 100 s
    wd.enter("update_actor")  # the 200 s step is in the window now: 3 x 200 s
    clock.t += 601.0
    assert wd.check() == ("update_actor", 601.0, 600.0)
    clock.t += 100.0
    assert wd.check() is None  # fired once for this phase


def test_a_resumed_attempt_starts_with_its_runs_recent_times(tmp_path):
    clock = Clock()
    first = Watchdog(_cfg(), tmp_path, clock=clock)
    _run_phase(first, clock, "gen", 50.0)
    first.write()
    second = Watchdog(_cfg(), tmp_path, clock=clock)
    assert second.budget_for("gen") == 150  # 3 x 50 s from progress.json (above first_s 90)
    assert attempts.read_progress(tmp_path)["recent"] == {"gen": [50.0]}


def test_progress_json_names_phase_deadline_and_heartbeat(tmp_path):
    clock = Clock()
    wd = Watchdog(_cfg(), tmp_path, attempt=3, clock=clock)
    wd.step = 7
    wd.enter("old_log_prob")
    rec = attempts.read_progress(tmp_path)
    assert rec["phase"] == "old_log_prob" and rec["step"] == 7 and rec["attempt"] == 3
    assert rec["deadline"] == pytest.approx(rec["since"] + 90) and rec["pid"] == os.getpid()
    wd.leave("old_log_prob")
    wd.stop()
    assert attempts.read_progress(tmp_path)["phase"] is None


def test_the_thread_fires_while_the_main_thread_is_blocked_in_a_syscall(tmp_path):
    """The stuck call is a read in this (the main) thread that only the watchdog's handler ends."""
    r, w = os.pipe()
    fired = []

    def on_stall(*stalled):
        fired.append((stalled, time.monotonic()))
        os.write(w, b"x")  # what unblocks the read: nothing else would

    wd = Watchdog(_cfg(first_s=0.5, floor_s=0.5, poll_s=0.1), tmp_path, on_stall=on_stall).start()
    t0 = time.monotonic()
    with wd.phase("gen"):
        assert os.read(r, 1) == b"x"
    wd.stop()
    os.close(r)
    os.close(w)
    (phase, elapsed, budget), at = fired[0]
    assert phase == "gen" and budget == 0.5 and elapsed > 0.5 and at - t0 < 2.0


def test_the_first_validation_of_an_attempt_gets_first_s_not_the_floor(tmp_path):
    """The loop's first validation (before RL) is a first time: its budget is first_s (an engine's first pass is
    slow), even though the loop ran other short phases before it."""
    from test_loop import _loop

    from loop_support import ScriptedBackend

    budgets = []

    class Recording(ScriptedBackend):
        def generate(self, prompts, sampling, group_ids=None):
            if sampling.validation:
                budgets.append((loop.watchdog.phase_name, loop.watchdog.budget))
            return super().generate(prompts, sampling, group_ids)

    loop, _ = _loop(tmp_path, ["recipe.trainer.val_before_train=true"], backend=Recording(seed=0))
    loop.watchdog = Watchdog(_cfg(first_s=500.0, floor_s=7.0), tmp_path)
    assert loop.fit() == 0
    assert budgets[0] == ("validate", 500.0)
    assert budgets[-1][0] == "validate" and budgets[-1][1] < 500.0  # later validations: floor or 3 x their time

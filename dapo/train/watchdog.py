"""The progress watchdog: an attempt that stops progressing is ended within its phase's budget, its stacks saved, so
that the next attempt resumes from the newest checkpoint instead of holding every GPU until someone looks.

The loop announces each phase (:meth:`Watchdog.phase`: ``startup``, ``gen`` -- one generation batch --, ``reward``,
``filter``, ``adv``, ``old_log_prob``, ``update_actor``, ``save``, ``validate``); a daemon thread looks every
``poll_s`` seconds and fires when the phase has run past its budget (``recipe.trainer.watchdog``)::

    budget(startup)         = startup_s
    budget(save)            = max(save_s,  multiple * max(last `window` saves))
    budget(phase), 1st time = max(first_s, multiple * max(last `window` times))   (the first time in this attempt)
    budget(phase)           = max(floor_s, multiple * max(last `window` times))

``multiple`` (3 by default) keeps a step at twice its usual time inside its budget; the floors keep phases of a
few seconds from tripping on noise. The last ``window`` times of each phase are kept in ``progress.json``
(:mod:`dapo.train.attempts`), so a resumed attempt starts with its run's history; the first time in an attempt still
gets ``first_s`` (engine warm-up, a first checkpoint). A phase exits cleanly or by an exception alike.

The thread does not share the stuck call's fate: the call blocks the main thread (``ray.get``, a collective, a
syscall on a hung volume), not the thread, which needs only the GIL that such calls release. When it fires it calls
``on_stall(phase, elapsed_s, budget_s)`` -- the loop saves the evidence and ends the attempt (exit code 6). The
thread also refreshes ``progress.json``'s heartbeat every ``poll_s``; the log follower ends an attempt whose heartbeat
stops (a frozen process, a lost head node), the case this thread cannot handle from inside.

Standard library only.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from dapo.train import attempts

StallHandler = Callable[[str, float, float], None]


class Watchdog:
    """Phase budgets and the thread that enforces them (module docstring). ``cfg`` is ``recipe.trainer.watchdog``."""

    def __init__(self, cfg: Any, run_dir: Path | str, *, attempt: Optional[int] = None,
                 on_stall: Optional[StallHandler] = None, clock: Callable[[], float] = time.time):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.attempt = attempt
        self.on_stall = on_stall
        self.clock = clock
        self.step = 0
        self.recent: dict[str, deque] = {}
        self.seen: set[str] = set()  # phases already run in this attempt
        self.phase_name: Optional[str] = None
        self.since = 0.0
        self.budget = 0.0
        self.fired = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        earlier = attempts.read_progress(self.run_dir) or {}
        for name, times in (earlier.get("recent") or {}).items():
            self._history(name).extend(float(t) for t in times if isinstance(t, (int, float)))

    # -- budgets ------------------------------------------------------------------------------------------------------
    def _history(self, name: str) -> deque:
        if name not in self.recent:
            self.recent[name] = deque(maxlen=max(1, int(self.cfg.window)))
        return self.recent[name]

    def budget_for(self, name: str) -> float:
        """The budget of phase ``name`` now (module docstring)."""
        c = self.cfg
        if name == "startup":
            return float(c.startup_s)
        history = self.recent.get(name)
        scaled = c.multiple * max(history) if history else 0.0
        if name == "save":
            floor = c.save_s
        elif name not in self.seen:
            floor = c.first_s
        else:
            floor = c.floor_s
        return float(max(floor, scaled))

    # -- phases -------------------------------------------------------------------------------------------------------
    def enter(self, name: str) -> None:
        with self._lock:
            self.phase_name, self.since = name, self.clock()
            self.budget = self.budget_for(name) if self.cfg.enable else float("inf")
            self.fired = False
        self.write()

    def leave(self, name: str) -> float:
        """The phase ended; its time joins the history. Returns its seconds."""
        with self._lock:
            elapsed = self.clock() - self.since
            if self.phase_name == name:
                if name != "startup":
                    self._history(name).append(elapsed)
                self.seen.add(name)
                self.phase_name = None
        return elapsed

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """``with watchdog.phase("gen"): ...``: the block runs under ``name``'s budget."""
        self.enter(name)
        try:
            yield
        finally:
            self.leave(name)

    # -- the record and the thread ----------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            now = self.clock()
            return {
                "attempt": self.attempt, "pid": os.getpid(), "host": os.uname().nodename, "phase": self.phase_name,
                # the driver's pod and node (the chart's downward API): what the follower ends when this record stops
                "pod": os.environ.get("DAPO_POD_NAME"), "node": os.environ.get("DAPO_NODE_NAME"),
                "step": self.step, "since": self.since if self.phase_name else None,
                "budget_s": self.budget if self.phase_name and self.budget != float("inf") else None,
                "deadline": (self.since + self.budget) if self.phase_name and self.budget != float("inf") else None,
                "heartbeat": now, "heartbeat_every_s": float(self.cfg.poll_s),
                "recent": {k: list(v) for k, v in self.recent.items()},
            }

    def write(self) -> None:
        try:
            attempts.write_json(attempts.progress_path(self.run_dir), self.snapshot())
        except OSError:
            pass  # a volume hiccup must not end the attempt; the next heartbeat writes it again

    def check(self) -> Optional[tuple[str, float, float]]:
        """(phase, elapsed, budget) when the current phase is past its budget and has not fired yet, else None."""
        with self._lock:
            if not self.cfg.enable or self.phase_name is None or self.fired:
                return None
            elapsed = self.clock() - self.since
            if elapsed <= self.budget:
                return None
            self.fired = True
            return self.phase_name, elapsed, self.budget

    def _run(self) -> None:
        while not self._stop.wait(float(self.cfg.poll_s)):
            self.write()
            stalled = self.check()
            if stalled is not None and self.on_stall is not None:
                self.on_stall(*stalled)

    def start(self) -> "Watchdog":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="dapo-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        with self._lock:
            self.phase_name = None
        self.write()

"""The run's failed attempts, the nodes left out, and the failure budget they are held to -- kept by the log
follower on the run's volume, beside the attempts' end records: ``<run dir>/failures.json`` (:class:`RunRecord`).

KubeRay's ``backoffLimit`` counts failures over the RayJob's whole life: the fourth failure of a two-week run ends
it, whatever caused each. What follows the run (the follower, which outlives every attempt) holds it to a rate
instead (:class:`Budget`): at most ``max_failures`` failed attempts in any ``window_s`` (24 h by default), and the
same cause ``same_cause`` times in a row ends the run naming that cause (three watchdog stalls, three non-finite
losses, three lost heads: retrying a fourth time would find the same). The RayJob's own ``backoffLimit`` is set
large enough never to decide while the follower runs (the chart's ``train.backoffLimit``), and stays a backstop for
a follower that is gone.

The record belongs to one RayJob (its uid): a RayJob created again (a new install after a fix) starts a fresh
record, the old one kept as ``failures-<old uid>.json``. Written whole (:func:`dapo.train.attempts.write_json`),
so a follower restarted in another pod goes on where the last one stopped: what it acknowledged, which KubeRay
failures it has counted, which nodes it left out.

Standard library only.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from dapo.train.attempts import FAILURES_FILE as FILE
from dapo.train.attempts import read_json, write_json


@dataclass(frozen=True)
class Budget:
    """How many failed attempts a run may have: ``max_failures`` in any ``window_s``, and not ``same_cause`` in a
    row of one cause (0: no such limit)."""

    max_failures: int = 6
    window_s: float = 86400.0
    same_cause: int = 3

    def spent(self, failures: list[Mapping[str, Any]], now: Optional[float] = None) -> Optional[str]:
        """Why the run must stop after ``failures`` (oldest first), or None.

        Stops when the last ``same_cause`` failures share one cause, or when more than ``max_failures`` of them
        fall within the ``window_s`` before ``now`` (the (max_failures + 1)-th failure in a window stops the run)."""
        now = time.time() if now is None else now
        k = self.same_cause
        if k > 0 and len(failures) >= k and len({f["cause"] for f in failures[-k:]}) == 1:
            last = failures[-1]
            which = ", ".join(str(f.get("attempt") or "?") for f in failures[-k:])
            return (f"the same cause, {last['cause']}, ended {k} attempts in a row (attempts {which}; "
                    f"train.retries.failureBudget.sameCauseInARow {k}): {last.get('message') or ''}".rstrip(": "))
        recent = [f for f in failures if now - float(f["time"]) < self.window_s]
        if len(recent) > self.max_failures:
            hours = self.window_s / 3600
            return (f"{len(recent)} attempts failed within {hours:g} h (train.retries.failureBudget.maxFailures "
                    f"{self.max_failures} per {hours:g} h): " + "; ".join(
                        f"attempt {f.get('attempt') or '?'} {f['cause']}" for f in recent[-6:]))
        return None

    def describe(self, failures: list[Mapping[str, Any]], now: Optional[float] = None) -> str:
        """Where the run stands: failures in the window and the current row of one cause."""
        now = time.time() if now is None else now
        recent = sum(1 for f in failures if now - float(f["time"]) < self.window_s)
        row = 0
        for f in reversed(failures):
            if f["cause"] != failures[-1]["cause"]:
                break
            row += 1
        text = f"failure budget: {recent} of {self.max_failures} in {self.window_s / 3600:g} h"
        if failures and self.same_cause:
            text += f", {failures[-1]['cause']} {row} in a row of {self.same_cause}"
        return text


class RunRecord:
    """``<run dir>/failures.json`` of one RayJob (module doc). Fields: ``uid``; ``failures`` (each: ``attempt``,
    ``time``, ``cause``, ``message``, ``nodes`` {node: why}, ``recorded`` -- by the driver's end record or only by
    what the follower saw); ``left_out`` (each: ``node``, ``why``, ``attempt``, ``time``); ``acked`` (attempts whose
    end record was answered); ``counted`` (KubeRay's ``status.failed`` accounted for); ``pending`` (recorded
    failures KubeRay has not counted yet); ``stopped`` (why and how the run was stopped, or None)."""

    def __init__(self, run_dir: Path | str, uid: str):
        self.path = Path(run_dir) / FILE
        body = read_json(self.path)
        if body is not None and uid and body.get("uid") and body["uid"] != uid:
            os.replace(self.path, self.path.with_name(f"failures-{body['uid']}.json"))
            body = None
        self.body: dict[str, Any] = {"uid": uid, "failures": [], "left_out": [], "acked": [], "counted": 0,
                                     "pending": 0, "stopped": None}
        if body is not None:
            self.body.update(body)
        self.body["uid"] = uid or self.body.get("uid") or ""

    def save(self) -> None:
        write_json(self.path, self.body)

    @property
    def failures(self) -> list[dict[str, Any]]:
        return self.body["failures"]

    @property
    def left_out(self) -> list[str]:
        return [e["node"] for e in self.body["left_out"]]

    def add_failure(self, *, attempt: Optional[int], cause: str, message: str, nodes: Mapping[str, str],
                    recorded: bool, when: Optional[float] = None) -> dict[str, Any]:
        entry = {"attempt": attempt, "time": time.time() if when is None else when, "cause": cause,
                 "message": message[:500], "nodes": dict(nodes), "recorded": recorded}
        self.failures.append(entry)
        return entry

    def leave_out(self, nodes: Mapping[str, str], attempt: Optional[int], limit: int,
                  when: Optional[float] = None) -> tuple[list[str], list[str]]:
        """Add ``nodes`` (node -> why) to the nodes left out; at most ``limit`` stay, the oldest let back first.
        Returns (nodes added, nodes let back)."""
        added, released = [], []
        entries = self.body["left_out"]
        for node, why in nodes.items():
            if node in self.left_out or limit <= 0:
                continue
            entries.append({"node": node, "why": why, "attempt": attempt, "time": time.time() if when is None
                            else when})
            added.append(node)
        while len(entries) > max(0, limit):
            released.append(entries.pop(0)["node"])
        return [n for n in added if n not in released], released

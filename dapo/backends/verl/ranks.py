"""The driver's view of every FSDP rank of a verl run: a compute probe per step, stacks on request, the slow nodes.

Through the shared volume, answered by :mod:`dapo.backends.verl.worker_hooks` in each worker process:

- :meth:`RankWatch.probe` (after each update): every rank times the same matrix-multiply work on its device; the
  step's metrics get the slowest rank's time over the median of the others (``ranks/probe_max_over_median``; with
  two ranks, the one over the other), the slowest rank
  (``ranks/probe_slowest_rank``) and each rank's process-group timeout read back from its process group. A rank above
  ``recipe.trainer.watchdog.slow_ratio`` x the median for ``slow_steps`` steps in a row is named in the log with its
  node, and from then on in every end record of the attempt (:meth:`RankWatch.suspects`), so that the log follower
  can leave its node out of the next attempt.
- :meth:`RankWatch.stacks` (when the watchdog fires): every process writes its stacks into the evidence directory;
  the ranks that wrote none within ``evidence_wait_s`` are returned as the nodes the evidence names.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional

from dapo.backends.verl import worker_hooks
from dapo.train.attempts import node_entry

PROBE_WAIT_S = 60.0  # how long the driver waits for every rank's probe (ranks answer within a poll interval)


class RankWatch:
    """Probe, stacks and slow ranks of one attempt (module docstring). ``cfg`` is ``recipe.trainer.watchdog``."""

    def __init__(self, run_dir: str, attempt: int, world_size: int, cfg: Any,
                 log: Callable[[str], None] = print, poll: float = 0.05, probe_wait_s: float = PROBE_WAIT_S):
        self.run_dir, self.attempt, self.world_size, self.cfg, self.log = run_dir, attempt, world_size, cfg, log
        self.dir = worker_hooks.attempt_dir(run_dir, attempt)
        self.poll, self.probe_wait_s = poll, probe_wait_s
        self.last: dict[int, dict[str, Any]] = {}  # rank -> its latest probe answer
        self.streak: dict[int, int] = {}
        self.slow: dict[int, str] = {}  # rank -> why it is named

    def _read_ranks(self, seq: int) -> dict[int, dict[str, Any]]:
        out = {}
        for p in (self.dir / "ranks").glob("rank-*.json"):
            try:
                rec = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if rec.get("seq") == seq and isinstance(rec.get("rank"), int):
                out[rec["rank"]] = rec
        return out

    def probe(self, step: int) -> dict[str, float]:
        """The step's per-rank metrics (module docstring); {} when no rank answered in time."""
        seq = worker_hooks.post(self.run_dir, self.attempt, "probe", step=step)
        deadline = time.monotonic() + self.probe_wait_s
        got: dict[int, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            got = self._read_ranks(seq)
            if len(got) >= self.world_size:
                break
            time.sleep(self.poll)
        if not got:
            return {}
        self.last.update(got)
        times = {r: float(rec["probe_s"]) for r, rec in got.items()}
        slowest = max(times, key=times.get)
        # over the median of the OTHER ranks: with two ranks the median of all would be their mean
        others = [t for r, t in times.items() if r != slowest] or [times[slowest]]
        median = statistics.median(others)
        ratio = times[slowest] / median if median > 0 else 1.0
        self._track(step, slowest, ratio)
        out = {"ranks/probe_s/max": times[slowest], "ranks/probe_s/median_others": median,
               "ranks/probe_max_over_median": ratio, "ranks/probe_slowest_rank": float(slowest),
               "ranks/answered": float(len(got))}
        timeouts = [rec.get("pg_timeout_s") for rec in got.values() if rec.get("pg_timeout_s") is not None]
        if timeouts:
            out["ranks/pg_timeout_s"] = float(min(timeouts))
        return out

    def _track(self, step: int, slowest: int, ratio: float) -> None:
        for r in list(self.streak):
            if r != slowest:
                self.streak[r] = 0
        if ratio <= self.cfg.slow_ratio:
            self.streak[slowest] = 0
            return
        self.streak[slowest] = self.streak.get(slowest, 0) + 1
        if self.streak[slowest] >= self.cfg.slow_steps and slowest not in self.slow:
            rec = self.last.get(slowest, {})
            where = rec.get("node") or rec.get("host")
            why = (f"slow rank {slowest} on node {where}: its compute probe took {ratio:.1f}x the median for "
                   f"{self.streak[slowest]} steps in a row (step {step}; recipe.trainer.watchdog.slow_ratio "
                   f"{self.cfg.slow_ratio})")
            self.slow[slowest] = why
            self.log(f"SLOW NODE: {why}")

    def entry(self, rank: int, why: str) -> dict[str, Any]:
        rec = self.last.get(rank, {})
        return node_entry(rec.get("node"), why=why, pod=rec.get("pod"), ip=None, rank=rank)

    def node_of(self, pid: Optional[int]) -> Optional[dict[str, Any]]:
        """The node entry of the rank whose process is ``pid`` (from its probe answers), or None."""
        for r, rec in self.last.items():
            if pid is not None and rec.get("pid") == pid:
                return self.entry(r, "")
        return None

    def suspects(self) -> list[dict[str, Any]]:
        return [self.entry(r, why) for r, why in sorted(self.slow.items())]

    def stacks(self, dest: Path, header: str, wait_s: Optional[float] = None) -> list[dict[str, Any]]:
        """Ask every process for its stacks into ``dest``; the ranks that wrote none in time, as node entries."""
        worker_hooks.post(self.run_dir, self.attempt, "stacks", dest=str(dest), header=header)
        wait_s = self.cfg.evidence_wait_s if wait_s is None else wait_s
        deadline = time.monotonic() + wait_s
        answered: set[int] = set()
        while time.monotonic() < deadline:
            answered = {int(p.name.split("-")[1][4:]) for p in Path(dest).glob("stacks-rank*-*.txt")
                        if p.name.split("-")[1][4:].isdigit()}
            if len(answered) >= self.world_size:
                break
            time.sleep(0.2)
        missing = sorted(set(range(self.world_size)) - answered)
        return [self.entry(r, f"rank {r} wrote no stacks within {wait_s:.0f} s: its process is frozen or its node "
                              "is gone") for r in missing]

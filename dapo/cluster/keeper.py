"""What the log follower does between attempts (``python -m dapo.cluster.follow --leave-out-nodes ...``): it answers
each attempt's end record, leaves the nodes a failed attempt names out of the next one, holds the run to its failure
budget, stops KubeRay's retries when the run must end, and ends an attempt whose driver stopped writing at all.

The race it must win is KubeRay v1.7.0's retry (``rayjob_controller.go``): a failed Ray job turns the RayJob
``Retrying`` in the same reconcile that counts it (``checkBackoffLimitAndUpdateStatusIfNeeded`` compares
``status.failed`` with ``spec.backoffLimit`` as they are then), the old RayCluster is deleted (in the background:
its pods still terminate), and a reconcile or two later -- seconds -- the next RayCluster is built from the RayJob's
``spec.rayClusterSpec`` as it is at that moment. So:

- a failure the driver records (:mod:`dapo.train.attempts`: ``<run dir>/logs/attempt-<N>.end.json``; the driver then
  waits up to ``DAPO_ACK_TIMEOUT_S`` for the answer before it exits) is acted on while the attempt still runs: the
  RayJob patched (the nodes left out, :mod:`dapo.cluster.nodes`; ``backoffLimit: 0`` when the run must stop), then
  the answer written (``attempt-<N>.ack.json``, what was done) -- KubeRay sees the failure only after the patch;
- a failure the driver could not record (its head or node lost, the process killed) shows as ``status.failed``
  growing: the follower patches as soon as it reads that (every ``--status-every`` seconds, 5 in the chart), by which time the next
  cluster may already be built from the old spec -- the nodes are then left out of the attempt after it; and when
  the budget is spent the RayJob is deleted (KubeRay's finalizer stops the job and deletes the new cluster), since
  a retry under way cannot be called back (``suspend`` is honoured only from Running or Initializing, and Kueue owns
  it for a queued RayJob).

Why a run stops (:class:`dapo.cluster.budget.Budget`): an end record that says ``final`` (a non-finite value again
at its step, a health stop, dynamic sampling exhausted) or whose attempt wrote the run's verdict
(``run-verdict.json``); more failed attempts than the budget allows in its window; the same cause ``k`` times in a
row. The RayJob then ends ``Failed`` with the Ray job's message (the driver's last lines, the verdict's) and the
follower's last line names the reason.

The backstop for a driver that stops writing (:meth:`Keeper.heartbeat`): while the RayJob is Running and the
current attempt has no end record, an unchanged ``progress.json`` heartbeat for ``--heartbeat-timeout`` seconds
(measured on the follower's clock: no clock skew) means the attempt's own watchdog did not act -- the driver is
frozen or its node is gone. The follower deletes the driver's pod (``progress.json``'s ``pod``, else ``host``: a
pod's hostname is its name), which kills the driver with it: the Ray job fails and KubeRay retries it like any
failure; the pod's preStop hook saves its logs first (:mod:`dapo.cluster.evidence`). It writes the attempt's end
record itself (cause ``stalled``), which the budget counts like the driver's.

RBAC (the chart's Role ``<release>-logs`` when these parts are on): ``patch`` and ``delete`` on the training RayJob
(by name), ``delete`` on pods of the namespace (RBAC cannot restrict it to the release's pods; the follower deletes
only the pod ``progress.json`` names, after checking it carries the release's labels). Standard library only.
"""

from __future__ import annotations

import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Optional

from dapo.cluster import nodes as placement
from dapo.cluster.budget import Budget, RunRecord
from dapo.cluster.rayjob_api import ApiUnavailable, RayJobApi, RayJobStatus
from dapo.train import attempts


def say(text: str) -> None:
    print(f"[attempts] {text}", file=sys.stderr, flush=True)


class Keeper:
    """The follower's actions between attempts (module doc); :meth:`step` once per round of the follower."""

    def __init__(self, api: RayJobApi, log_dir: Path, *, selector: str, leave_out: int = 0,
                 budget: Optional[Budget] = None, heartbeat_s: float = 0.0, say: Callable[[str], None] = say):
        self.api, self.log_dir, self.run_dir = api, Path(log_dir), Path(log_dir).parent
        self.selector, self.leave_out, self.budget, self.heartbeat_s, self.say = selector, leave_out, budget, \
            heartbeat_s, say
        self.record: Optional[RunRecord] = None
        self.seen: dict[str, dict[str, str]] = {}  # RayCluster -> node -> why, what its pods showed
        self.nodes_of: dict[str, dict[str, str]] = {}  # RayCluster -> pod -> node, of every pod seen
        self.cluster = ""  # the RayCluster of the last status read
        self.pods: list[dict] = []
        self.beat: tuple[Any, float] = (None, 0.0)  # the last heartbeat read and when (monotonic) it changed
        self.ended: set[int] = set()  # attempts the heartbeat backstop ended
        self.stop_reason: Optional[str] = None
        self.last_attempt: Optional[int] = None  # the newest attempt the follower printed
        self.disabled: set[str] = set()  # parts whose permission is missing

    # -- the round ---------------------------------------------------------------------------------------------------
    def step(self, status: Optional[RayJobStatus], attempt: Optional[int], owned: Callable[[int], bool],
             observed: Optional[tuple[list, list]] = None, fresh_status: bool = False) -> None:
        """``status``: the RayJob's last read; ``attempt``: the attempt the follower prints (None between
        attempts); ``owned(n)``: whether attempt n belongs to this RayJob; ``observed``: (pods, events) of the
        release from the follower's last look (:mod:`dapo.cluster.waits`); ``fresh_status``: ``status`` was read in
        this round (``api.last_object`` is the RayJob as it is now)."""
        attempts.write_follower_beat(self.log_dir)  # drivers wait for the answers of a follower that beats
        if attempt is not None:
            self.last_attempt = attempt
        if status is None or not status.exists:
            return
        if self.record is None or self.record.body["uid"] != status.uid:
            self.record = RunRecord(self.run_dir, status.uid)
            self.stop_reason = (self.record.body.get("stopped") or {}).get("why")
        if observed is not None and status.cluster:
            self.observe(status.cluster, *observed)
        for n in self._unanswered(owned):
            self.answer(n, status)
        if fresh_status:
            self.count_failures(status, attempt if attempt is not None else self.last_attempt)
            self.keep_placement()
        if status.cluster:
            self.cluster = status.cluster
        self.heartbeat(status, attempt)

    def observe(self, cluster: str, pods: list, events: list) -> None:
        """What the pods of ``cluster`` and their events say of their nodes (:func:`dapo.cluster.nodes.cluster_suspects`),
        added to what was seen of that cluster before."""
        self.pods = list(pods)
        mine = placement.pods_of_cluster(self.pods, cluster)
        known = self.nodes_of.setdefault(cluster, {})
        known.update({(p.get("metadata") or {}).get("name"): (p.get("spec") or {}).get("nodeName") for p in mine
                      if (p.get("spec") or {}).get("nodeName")})
        for node, why in placement.cluster_suspects(mine, events, known).items():
            self.seen.setdefault(cluster, {}).setdefault(node, why)

    def _look_again(self, cluster: str) -> None:
        """A fresh look at the release's pods and the namespace's events, for an attempt that just failed."""
        try:
            pods = self.api.list_json("pods", "labelSelector=" + urllib.parse.quote(self.selector))
            self.observe(cluster, pods, self.api.list_json("events"))
        except (ApiUnavailable, OSError) as exc:
            self.say(f"cannot look at the failed attempt's pods and events ({exc})")

    def _unanswered(self, owned: Callable[[int], bool]) -> list[int]:
        acked = set(self.record.body["acked"])
        out = []
        for p in sorted(self.log_dir.glob("attempt-*.end.json")) if self.log_dir.is_dir() else []:
            try:
                n = int(p.name.split("-", 1)[1].split(".", 1)[0])
            except ValueError:
                continue
            if n not in acked and owned(n):
                out.append(n)
        return sorted(out)

    # -- end records -------------------------------------------------------------------------------------------------
    def answer(self, n: int, status: RayJobStatus) -> None:
        """Act on attempt n's end record, then acknowledge it (module doc)."""
        end = attempts.read_end(self.log_dir, n)
        if end is None:
            return
        rec = self.record
        actions: list[str] = []
        if end.get("cause") == "complete":
            actions.append("nothing to do: the run is complete")
        else:
            try:
                self.pods = self.api.list_json("pods", "labelSelector=" + urllib.parse.quote(self.selector))
            except (ApiUnavailable, OSError) as exc:
                actions.append(f"could not list the run's pods to resolve its nodes ({exc})")
            found, unresolved = placement.suspects(end, self.pods, self.seen.get(status.cluster, {}))
            actions += [f"named, no node: {u}" for u in unresolved]
            earlier = [f for f in rec.failures if f["attempt"] == n and not f["recorded"]]
            failure = {"attempt": n, "cause": str(end.get("cause")), "message": str(end.get("message") or ""),
                       "nodes": found, "recorded": True}
            if earlier:  # counted from KubeRay's status before this record could be read: the same failure
                earlier[0].update(failure)
            else:
                rec.add_failure(**failure)
                rec.body["pending"] += 1
            actions += self.leave_out_nodes(found, n)
            actions.append(f"evidence: {attempts.evidence_dir(self.run_dir, n)}")
            # the budget's decision, a final verdict included (without a budget KubeRay's backoffLimit decides)
            why = (self.final_reason(end, n) or self.budget.spent(rec.failures)) if self.budget else None
            if why:
                actions.append(self.stop_retries(why))
            elif self.budget:
                actions.append(self.budget.describe(rec.failures))
        rec.body["acked"].append(n)
        rec.save()
        attempts.write_ack(self.log_dir, n, actions)
        self.say(f"attempt {n} ended {end.get('cause')} (exit code {end.get('exit_code')}): " + "; ".join(actions))

    def final_reason(self, end: dict, n: int) -> Optional[str]:
        verdict = attempts.read_verdict(self.run_dir)
        if end.get("final") or end.get("cause") == "verdict" or (verdict and verdict.get("attempt") == n):
            v = verdict or {}
            return (f"final verdict of attempt {v.get('attempt', n)} at step {v.get('step', end.get('step'))}: "
                    f"{v.get('cause', end.get('cause'))}: {v.get('message', end.get('message'))}")
        return None

    # -- KubeRay's count -------------------------------------------------------------------------------------------
    def count_failures(self, status: RayJobStatus, attempt: Optional[int]) -> None:
        """Account for every failure KubeRay counted (``status.failed``): those the driver recorded were answered
        already; the others are attributed to what the follower saw of that attempt's cluster."""
        rec = self.record
        new = status.failed - int(rec.body["counted"])
        if new <= 0:
            return
        if attempt in rec.body["acked"]:  # its driver recorded its end: a later attempt failed without a log
            attempt = None
        recorded = min(new, int(rec.body["pending"]))
        rec.body["pending"] -= recorded
        rec.body["counted"] = status.failed
        if new > recorded:
            self._look_again(self.cluster or status.cluster)
        for _ in range(new - recorded):
            failed_cluster = self.cluster or status.cluster
            seen = self.seen.get(failed_cluster, {})
            cause = ("oom_killed" if any("OOMKilled" in w for w in seen.values()) else "node_failure" if seen
                     else "pre_running_deadline" if "PreRunningDeadline" in status.reason else "no_end_record")
            message = f"the RayJob says {status.reason or 'failed'}: {status.message}".rstrip(": ")
            rec.add_failure(attempt=attempt, cause=cause, message=message, nodes=seen, recorded=False)
            acts = self.leave_out_nodes(seen, attempt, late=True)
            why = self.budget.spent(rec.failures) if self.budget else None
            self.say(f"an attempt failed without an end record ({cause}; {message}): " + "; ".join(
                acts or ["no node named"]))
            if why:
                self.say(self.stop_now(why))
        if self.stop_reason and not status.terminal and (rec.body.get("stopped") or {}).get("how") != "deleted":
            self.say(self.stop_now(f"{self.stop_reason} (KubeRay retried it anyway)"))
        rec.save()

    def final_words(self) -> str:
        """What the follower's last line says of a failed run: why the follower stopped it, where the evidence is."""
        parts = [f"stopped by the follower: {self.stop_reason}"] if self.stop_reason else []
        evidence = self.run_dir / "evidence"
        kept = sorted((d.name for d in evidence.iterdir() if d.is_dir()), key=lambda x: (len(x), x)) \
            if evidence.is_dir() else []
        if kept:
            parts.append(f"evidence: {evidence} ({', '.join(kept[-6:])})")
        return "".join(f"{p}; " for p in parts)

    # -- acting on the RayJob ----------------------------------------------------------------------------------------
    def leave_out_nodes(self, found: dict[str, str], attempt: Optional[int], late: bool = False) -> list[str]:
        if not found or self.leave_out <= 0 or "patch" in self.disabled:
            return []
        added, released = self.record.leave_out(found, attempt, self.leave_out)
        out = [f"left out node {n} ({found[n]})" for n in added]
        out += [f"node {n} let back (at most {self.leave_out} left out: train.retries.leaveOutNodes.max)" for n in released]
        if added or released:
            out.append(self.apply_placement()[1] + (" -- the retry may already be built from the spec before this"
                                                  if late else ""))
        return out

    def apply_placement(self, tries: int = 4) -> tuple[bool, str]:
        """Patch the RayJob so that its groups are kept off exactly the nodes left out (a conflict: read, retry).
        Returns (whether it patched, what happened)."""
        want = self.record.left_out
        for _ in range(tries):
            try:
                self.api.get()
                body = placement.placement_patch(self.api.last_object or {}, want)
                if body is None:
                    return False, f"RayJob {self.api.name} already keeps its pods off {', '.join(want) or 'no node'}"
                self.api.patch(body)
                return True, f"RayJob {self.api.name} patched: its next cluster avoids {', '.join(want) or 'no node'}"
            except ApiUnavailable as exc:
                self.disabled.add("patch")
                return False, f"could not patch the RayJob ({exc}): nodes are not left out"
            except OSError as exc:
                last = exc
        return False, f"could not patch the RayJob ({last}): nodes are not left out this time"

    def keep_placement(self) -> None:
        """A ``helm upgrade`` writes the chart's groups back (a merge patch replaces a list whole): put the nodes
        left out back in."""
        live = self.api.last_object
        if live is None or not self.record.left_out or "patch" in self.disabled:
            return
        if placement.live_exclusions(live) != sorted(self.record.left_out):
            patched, what = self.apply_placement()
            if patched or "could not" in what:  # not when the status read predates the follower's own patch
                self.say(f"the RayJob's groups lost the nodes left out (a helm upgrade?): {what}")

    def stop_retries(self, why: str) -> str:
        """KubeRay retries a failure while ``status.failed < backoffLimit`` (before it counts this one): 0 stops it."""
        self.stop_reason = why
        try:
            self.api.patch({"spec": {"backoffLimit": 0}}, "patch this RayJob's backoffLimit")
        except (ApiUnavailable, OSError) as exc:
            self.record.body["stopped"] = {"why": why, "how": f"not stopped: {exc}"}
            return f"the run must stop ({why}) but the RayJob could not be patched ({exc})"
        self.record.body["stopped"] = {"why": why, "how": "backoffLimit 0"}
        return f"stopped KubeRay's retries (backoffLimit 0): {why}"

    def stop_now(self, why: str) -> str:
        self.stop_reason = why
        try:
            self.api.delete(f"/apis/ray.io/v1/namespaces/{self.api.namespace}/rayjobs/{self.api.name}")
        except (ApiUnavailable, OSError) as exc:
            self.record.body["stopped"] = {"why": why, "how": f"not stopped: {exc}"}
            return f"the run must stop ({why}) but the RayJob could not be deleted ({exc})"
        self.record.body["stopped"] = {"why": why, "how": "deleted"}
        self.record.save()
        return f"deleted the RayJob {self.api.name} (its retry was under way): {why}"

    # -- the frozen driver -------------------------------------------------------------------------------------------
    def heartbeat(self, status: RayJobStatus, attempt: Optional[int]) -> None:
        if self.heartbeat_s <= 0 or attempt is None or status.deployment != "Running" or attempt in self.ended:
            return
        progress = attempts.read_progress(self.run_dir)
        if not progress or progress.get("attempt") != attempt or attempts.read_end(self.log_dir, attempt):
            self.beat = (None, time.monotonic())
            return
        now = time.monotonic()
        if progress.get("heartbeat") != self.beat[0]:
            self.beat = (progress.get("heartbeat"), now)
            return
        if now - self.beat[1] >= self.heartbeat_s:
            self.ended.add(attempt)
            self.say(self.end_attempt(progress, attempt, now - self.beat[1]))

    def end_attempt(self, progress: dict, attempt: int, stale: float) -> str:
        pod = str(progress.get("pod") or progress.get("host") or "")
        try:
            mine = {(p.get("metadata") or {}).get("name") for p in
                    self.api.list_json("pods", "labelSelector=" + urllib.parse.quote(self.selector))}
        except (ApiUnavailable, OSError) as exc:
            return f"attempt {attempt}: no heartbeat for {stale:.0f} s, but the run's pods cannot be listed ({exc})"
        if pod not in mine:
            return (f"attempt {attempt}: no heartbeat for {stale:.0f} s, and its driver's pod {pod or '?'} is not one "
                    "of the run's pods: not ended")
        try:
            self.api.delete(f"/api/v1/namespaces/{self.api.namespace}/pods/{pod}")
        except (ApiUnavailable, OSError) as exc:
            return f"attempt {attempt}: no heartbeat for {stale:.0f} s, but its pod {pod} could not be deleted ({exc})"
        evidence = str(attempts.evidence_dir(self.run_dir, attempt))
        message = (f"the driver wrote no heartbeat to {attempts.PROGRESS_FILE} for {stale:.0f} s (phase "
                   f"{progress.get('phase')}, step {progress.get('step')}; its watchdog did not act): the follower "
                   f"deleted its pod {pod}")
        attempts.write_end(self.log_dir, attempt, cause="stalled", message=message, step=int(progress.get("step")
                           or 0), phase=progress.get("phase"), evidence=evidence, extra={"by": "follower"})
        return f"attempt {attempt}: {message}; evidence: {evidence}"


def add_arguments(p) -> None:
    """The follower's options for these actions (all off by default)."""
    p.add_argument("--leave-out-nodes", type=int, default=0, metavar="MAX",
                   help="leave the nodes a failed attempt names out of the next one, at most MAX (0: off)")
    p.add_argument("--max-failures", type=int, default=None,
                   help="failed attempts allowed within --failure-window-hours (omit: no failure budget)")
    p.add_argument("--failure-window-hours", type=float, default=24.0)
    p.add_argument("--same-cause", type=int, default=0, help="the same cause this many times in a row stops the run")
    p.add_argument("--heartbeat-timeout", type=float, default=0.0,
                   help="end an attempt whose progress.json heartbeat stays unchanged this many seconds (0: off)")


def from_args(args, api: Optional[RayJobApi], selector: str) -> Optional[Keeper]:
    budget = None if args.max_failures is None else Budget(args.max_failures, args.failure_window_hours * 3600,
                                                           args.same_cause)
    if api is None or not (args.leave_out_nodes or budget or args.heartbeat_timeout):
        return None
    return Keeper(api, args.log_dir, selector=selector, leave_out=args.leave_out_nodes, budget=budget,
                  heartbeat_s=args.heartbeat_timeout)

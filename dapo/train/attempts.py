"""What an attempt leaves for the next one and for what follows the run: its end record, its progress, the run's
verdict, and the exit codes that say which.

A two-week run is many attempts (KubeRay retries a failed one with a new cluster). Three small JSON files on the run's
volume carry what the next attempt and the log follower (:mod:`dapo.cluster.follow`) need, each written whole to a
temporary name and renamed into place (a reader never sees half of one):

- ``<run dir>/progress.json`` (:mod:`dapo.train.watchdog`): the phase the loop is in (``startup``, ``gen``, ``old_log_prob``,
  ``ref``, ``update_actor``, ``save``, ``validate``), since when, its budget and the deadline that follows
  (:mod:`dapo.train.watchdog` sets them), the step, and a heartbeat the watchdog refreshes every few seconds. The
  driver's watchdog ends an attempt whose phase passes its deadline; the follower ends one whose heartbeat stops
  (a driver that stopped writing at all).
- ``<run dir>/logs/attempt-<N>.end.json`` (:func:`write_end`): how attempt N ended -- exit code, cause
  (:data:`CAUSES`), the step and phase, a message, the nodes the evidence names (a stuck or slow rank's node, a dead
  worker's, a non-finite metric's rank), whether the run must stop for good (``final``), and where the evidence is.
  N is the attempt log's number (:mod:`dapo.train.runlog`).
- ``<run dir>/logs/attempt-<N>.ack.json``: the follower's answer to an end record -- what it did before the attempt
  exited (nodes left out of the next attempt, retries stopped). A driver whose follower is alive (its beat,
  ``logs/follower.json``, refreshed every round) waits up to ``DAPO_ACK_TIMEOUT_S`` (set by the chart) for it before
  it exits (:func:`wait_for_ack`), so that the RayJob's next attempt is built from the patched spec: KubeRay builds
  a retry from the RayJob's spec as it is when the retry starts.
- ``<run dir>/run-verdict.json`` (:func:`write_verdict`): the run ends for good -- a non-finite value at the same
  step twice, a health stop, dynamic sampling exhausted, a failure budget spent. Every attempt reads it first
  (:func:`read_verdict`, as the fabric verdict is read) and exits at once with :data:`EXIT_VERDICT`; the follower
  stops KubeRay from building another cluster for it. The verdict holds the preset's hash (:func:`preset_key`): a
  changed preset (the fix) runs again; so does deleting the file.

Standard library only: the follower's image imports it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

# exit codes of `dapo train` (0 = the run is complete; 1 = a traceback; 2 = a configuration error)
EXIT_HEALTH_STOP = 3  # a guard in recipe.trainer.health.stop_on fired; checkpointed; final
EXIT_SAMPLER_EXHAUSTED = 4  # dynamic sampling hit max_num_gen_batches without filling the batch; checkpointed; final
EXIT_FABRIC = 5  # the fabric check failed (dapo.train.fabric_verdict)
EXIT_STALLED = 6  # the watchdog ended an attempt whose phase passed its budget; the next attempt resumes
EXIT_NONFINITE = 7  # a non-finite loss, gradient norm, entropy, reward or weight; final when it recurs at its step
EXIT_VERDICT = 8  # an earlier attempt's final verdict: this attempt exits at once, training nothing
EXIT_NO_SPACE = 9  # the volume cannot hold the next checkpoint; nothing was written

# what a backend's error says when a worker refused to save non-finite weights (dapo.backends.verl.worker_hooks)
NONFINITE_WEIGHTS_MARK = "DAPO_NONFINITE_WEIGHTS"

# the causes an end record names, and the exit code of each (error: a traceback or a worker that died)
CAUSES = {
    "complete": 0, "error": 1, "health_stop": EXIT_HEALTH_STOP, "sampler_exhausted": EXIT_SAMPLER_EXHAUSTED,
    "fabric": EXIT_FABRIC, "stalled": EXIT_STALLED, "nonfinite": EXIT_NONFINITE, "verdict": EXIT_VERDICT,
    "no_space": EXIT_NO_SPACE, "interrupted": 130,
}
PROGRESS_FILE = "progress.json"
FAILURES_FILE = "failures.json"  # the follower's record of the run's failures (dapo.cluster.budget)
VERDICT_FILE = "run-verdict.json"
ACK_TIMEOUT_ENV = "DAPO_ACK_TIMEOUT_S"
# the follower's beat (<log dir>/follower.json): a driver waits for an ack only from a follower that beat this
# recently -- longer than a shared volume's attribute cache (NFS: up to 60 s) and a follower's slowest round
FOLLOWER_FILE = "follower.json"
FOLLOWER_STALE_S = 300.0


def _utc(when: Optional[float] = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def write_json(path: Path | str, body: Mapping[str, Any]) -> Path:
    """``body`` as ``path``, whole: written to a temporary name beside it, then renamed over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read_json(path: Path | str) -> Optional[dict[str, Any]]:
    """The JSON object at ``path``, or None (absent, unreadable, not an object)."""
    try:
        body = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


# -- progress ---------------------------------------------------------------------------------------------------------
def progress_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / PROGRESS_FILE


def read_progress(run_dir: Path | str) -> Optional[dict[str, Any]]:
    """The progress record (:class:`dapo.train.watchdog.Watchdog` writes it): ``attempt``, ``pid``, ``host``,
    ``pod`` and ``node`` (the driver's, from the downward API), ``phase``, ``step``, ``since``, ``budget_s``,
    ``deadline``, ``heartbeat`` (unix seconds), ``heartbeat_every_s``, ``recent`` (each phase's last times); None
    when absent."""
    return read_json(progress_path(run_dir))


def evidence_dir(run_dir: Path | str, attempt: int) -> Path:
    """``<run dir>/evidence/attempt-<N>``: what attempt N left to diagnose it -- the driver's and workers' stacks, the
    NCCL flight recorder's dumps, and each Ray pod's logs (``<pod>/``, its preStop hook: :mod:`dapo.cluster.evidence`)."""
    return Path(run_dir) / "evidence" / f"attempt-{int(attempt)}"


# -- end records ------------------------------------------------------------------------------------------------------
def end_path(log_dir: Path | str, attempt: int) -> Path:
    return Path(log_dir) / f"attempt-{int(attempt)}.end.json"


def ack_path(log_dir: Path | str, attempt: int) -> Path:
    return Path(log_dir) / f"attempt-{int(attempt)}.ack.json"


def node_entry(node: Optional[str] = None, *, why: str, pod: Optional[str] = None, ip: Optional[str] = None,
               ray_node_id: Optional[str] = None, rank: Optional[int] = None) -> dict[str, Any]:
    """One node an end record names: the Kubernetes node (``DAPO_NODE_NAME``, the downward API's ``spec.nodeName``)
    where known, else what identifies it (pod, IP, Ray node id) for the follower to resolve; ``why`` in words."""
    return {"node": node, "pod": pod, "ip": ip, "ray_node_id": ray_node_id, "rank": rank, "why": why}


def write_end(log_dir: Path | str, attempt: int, *, cause: str, message: str, step: int,
              phase: Optional[str] = None, final: bool = False, nodes: Iterable[Mapping[str, Any]] = (),
              evidence: Optional[str] = None, exit_code: Optional[int] = None,
              extra: Optional[Mapping[str, Any]] = None) -> Path:
    """Record how attempt ``attempt`` ends (module doc); returns the file. ``cause`` is one of :data:`CAUSES`."""
    if cause not in CAUSES:
        raise ValueError(f"unknown cause {cause!r} (known: {sorted(CAUSES)})")
    body = {"attempt": int(attempt), "exit_code": CAUSES[cause] if exit_code is None else int(exit_code),
            "cause": cause, "message": message, "step": int(step), "phase": phase, "final": bool(final),
            "nodes": [dict(n) for n in nodes], "evidence": evidence, "time": _utc(),
            "host": os.uname().nodename, **dict(extra or {})}
    return write_json(end_path(log_dir, attempt), body)


def read_end(log_dir: Path | str, attempt: int) -> Optional[dict[str, Any]]:
    return read_json(end_path(log_dir, attempt))


def end_records(log_dir: Path | str) -> list[dict[str, Any]]:
    """Every attempt's end record in ``log_dir``, by attempt number."""
    d = Path(log_dir)
    records = []
    for p in sorted(d.glob("attempt-*.end.json")) if d.is_dir() else []:
        rec = read_json(p)
        if rec is not None and isinstance(rec.get("attempt"), int):
            records.append(rec)
    return sorted(records, key=lambda r: r["attempt"])


def follower_path(log_dir: Path | str) -> Path:
    return Path(log_dir) / FOLLOWER_FILE


def write_follower_beat(log_dir: Path | str) -> None:
    """The follower is alive and answers end records (it refreshes this every round)."""
    try:
        write_json(follower_path(log_dir), {"pid": os.getpid(), "host": os.uname().nodename, "time": time.time()})
    except OSError:
        pass  # the next round writes it again


def follower_alive(log_dir: Path | str, within: float = FOLLOWER_STALE_S) -> bool:
    """Whether a follower refreshed its beat within ``within`` seconds (the file's mtime, as the volume shows it)."""
    try:
        return time.time() - follower_path(log_dir).stat().st_mtime <= within
    except OSError:
        return False


def write_ack(log_dir: Path | str, attempt: int, actions: list[str]) -> Path:
    """The follower's answer to attempt ``attempt``'s end record: what it did (in words)."""
    return write_json(ack_path(log_dir, attempt), {"attempt": int(attempt), "actions": list(actions),
                                                   "time": _utc()})


def wait_for_ack(log_dir: Path | str, attempt: int, timeout: Optional[float] = None,
                 poll: float = 0.5) -> Optional[dict[str, Any]]:
    """The follower's ack of attempt ``attempt``, waited for up to ``timeout`` seconds (default: the environment's
    ``DAPO_ACK_TIMEOUT_S``, 0 when unset) while a follower is alive (:func:`follower_alive`: none, or one silent for
    minutes, is not waited for); None when none came."""
    if not follower_alive(log_dir):
        return read_json(ack_path(log_dir, attempt))
    if timeout is None:
        try:
            timeout = float(os.environ.get(ACK_TIMEOUT_ENV, "0") or 0)
        except ValueError:
            timeout = 0.0
    end = time.monotonic() + max(0.0, timeout)
    while True:
        ack = read_json(ack_path(log_dir, attempt))
        if ack is not None or time.monotonic() >= end:
            return ack
        time.sleep(poll)


# -- the run's verdict ------------------------------------------------------------------------------------------------
def verdict_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / VERDICT_FILE


def preset_key(preset_dict: Mapping[str, Any]) -> str:
    """What makes a verdict apply: the SHA-256 of the preset's resolved values (JSON, keys sorted)."""
    return hashlib.sha256(json.dumps(preset_dict, sort_keys=True, default=str).encode()).hexdigest()


def write_verdict(run_dir: Path | str, *, key: str, cause: str, message: str, step: int, attempt: Optional[int],
                  nodes: Iterable[Mapping[str, Any]] = ()) -> Path:
    """The run ends for good (module doc): every later attempt with the same preset exits at once."""
    return write_json(verdict_path(run_dir), {"final": True, "key": key, "cause": cause, "message": message,
                                              "step": int(step), "attempt": attempt,
                                              "nodes": [dict(n) for n in nodes], "time": _utc()})


def read_verdict(run_dir: Path | str, key: Optional[str] = None) -> Optional[dict[str, Any]]:
    """The final verdict of this run, or None (none; or, with ``key``, one for another preset)."""
    verdict = read_json(verdict_path(run_dir))
    if verdict is None or not verdict.get("final"):
        return None
    if key is not None and verdict.get("key") != key:
        return None
    return verdict


def verdict_refusal(run_dir: Path | str, verdict: Mapping[str, Any]) -> str:
    """What an attempt prints when it exits at once on a final verdict."""
    return (f"dapo train: the run was stopped for good at step {verdict.get('step')} by attempt "
            f"{verdict.get('attempt')} ({verdict.get('time')}): {verdict.get('cause')}: {verdict.get('message')} "
            f"-- this attempt trains nothing (exit code {EXIT_VERDICT}). Change the preset (the fix) and run again, "
            f"or delete {verdict_path(run_dir)} to run it unchanged.")

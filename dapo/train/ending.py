"""How an attempt ends on purpose: a stalled phase, a non-finite value, a health stop, an exhausted sampler, a full
volume, or an earlier final verdict -- each with a message instead of a traceback, an end record the next attempt
and the log follower read (:mod:`dapo.train.attempts`), and the exit code of its cause.

:class:`AttemptEnd` is made by ``dapo train`` (:mod:`dapo.train.cli`) as soon as the attempt log is open, before
anything is built, so that the start-up itself runs under the watchdog (:mod:`dapo.train.watchdog`); the loop
attaches itself and its backend when it exists (:meth:`AttemptEnd.attach`). The rules:

- **stalled** (exit 6): the watchdog thread calls :meth:`AttemptEnd.stall`. The evidence goes to
  ``<run dir>/evidence/attempt-<N>/``: the driver's Python stacks (every thread), and the backend's -- on verl, the
  stacks every Ray worker writes when asked (:mod:`dapo.backends.verl.worker_hooks`), the ranks that did not answer
  named with their nodes. Then the end record, the follower's ack, the attempt log's last line, and the process
  exits from the watchdog thread (the main thread is the one that is stuck). Not final: the next attempt resumes
  from the newest checkpoint.
- **non-finite** (exit 7): a non-finite loss, gradient norm, entropy, reward (:data:`NONFINITE_KEYS`) or weight ends
  the attempt at the step it appears, before that step is saved (:func:`nonfinite`). A bit flip on one GPU is
  transient, so the first time is not final; the same keys non-finite at the same step in an earlier attempt's end
  record make it final (:meth:`AttemptEnd.nonfinite`).
- **health stop** (3) and **sampler exhausted** (4) are final: a retry would resume into the same state.
- **no space** (9): the volume cannot hold the next checkpoint (:func:`space_shortfall`); not final -- the volume can
  be grown, or retention lowered, while the run waits.
- A **final** end writes the run's verdict (keyed by the preset, :func:`dapo.train.attempts.preset_key`); the next
  attempt reads it before anything else and exits at once with 8 (:meth:`AttemptEnd.refuse_on_verdict`).

Every end waits up to ``DAPO_ACK_TIMEOUT_S`` for the follower's ack before the process exits: the follower leaves
named nodes out of the next attempt, or stops the retries, before KubeRay builds the next cluster.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

from dapo.train import attempts, runlog
from dapo.train.step_metrics import STEP_PHASES

# the step metrics whose non-finite value ends the attempt: the loss, the gradient norm, the entropy
NONFINITE_KEYS = ("actor/pg_loss", "actor/loss", "actor/grad_norm", "actor/entropy", "actor/ppo_kl")
# how many rewards of the step's generated responses are not finite (the loop counts them; 0 on every sane step)
NONFINITE_REWARDS = "health/nonfinite_rewards"
NONFINITE_METRIC = "health/nonfinite"  # how many of the checks above failed at a step (0 on every sane step)


def nonfinite(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The :data:`NONFINITE_KEYS` whose value in ``metrics`` is NaN or infinite (absent keys are not checked), and
    :data:`NONFINITE_REWARDS` when it counts any."""
    bad = {}
    for key in NONFINITE_KEYS:
        v = metrics.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(float(v)):
            bad[key] = float(v)
    if metrics.get(NONFINITE_REWARDS):
        bad[NONFINITE_REWARDS] = float(metrics[NONFINITE_REWARDS])
    return bad


def python_stacks(header: str) -> str:
    """Every thread's Python stack in this process, named, under ``header``."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    out = [header.rstrip("\n"), ""]
    for ident, frame in frames.items():
        out.append(f"--- thread {names.get(ident, '?')} ({ident}) ---")
        out.extend(line.rstrip("\n") for line in traceback.format_stack(frame))
        out.append("")
    return "\n".join(out) + "\n"


def directory_bytes(path: Path | str) -> int:
    """Bytes of the regular files under ``path`` (0 when it does not exist)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def space_shortfall(root: Path | str, needed: int, reclaimable: int = 0) -> Optional[str]:
    """None when the file system of ``root`` can hold ``needed`` more bytes (after ``reclaimable`` bytes that
    retention deletes before the write), else the shortfall in words. A 5 % margin covers metadata and the loop's
    own files."""
    root = Path(root)
    probe = root if root.exists() else next((p for p in root.parents if p.exists()), Path("/"))
    free = int(shutil.disk_usage(str(probe)).free)
    want = int(needed * 1.05)
    if free + reclaimable >= want:
        return None
    gib = 1 << 30
    return (f"the volume holding {root} has {free / gib:.2f} GiB free (+ {reclaimable / gib:.2f} GiB retention frees "
            f"first); the next checkpoint needs about {want / gib:.2f} GiB")


class AttemptEnd:
    """The ends of one attempt (module docstring). ``attempt`` is the attempt log's number."""

    def __init__(self, run_dir: Path | str, attempt: Optional[int], key: str, *,
                 log: Callable[[str], None] = lambda m: print(m, flush=True)):
        self.run_dir = Path(run_dir)
        self.log_dir = self.run_dir / "logs"
        if attempt is None:  # no attempt log (--no-attempt-log): the next number the end records leave free
            attempt = max([r["attempt"] for r in attempts.end_records(self.log_dir)] or [0]) + 1
        self.attempt = int(attempt)
        self.key = key
        self.log = log
        self.backend: Any = None
        self.step_of: Callable[[], int] = lambda: 0
        self._ending = threading.Lock()

    def attach(self, backend: Any, step_of: Callable[[], int], log: Optional[Callable[[str], None]] = None) -> None:
        self.backend, self.step_of = backend, step_of
        if log is not None:
            self.log = log

    @property
    def evidence_dir(self) -> Path:
        return attempts.evidence_dir(self.run_dir, self.attempt)

    # -- the common end ------------------------------------------------------------------------------------------------
    def finish(self, cause: str, message: str, *, step: int, phase: Optional[str] = None, final: bool = False,
               nodes: Iterable[Mapping[str, Any]] = (), evidence: Optional[str] = None,
               extra: Optional[Mapping[str, Any]] = None) -> int:
        """Record the end (and the verdict when ``final``), wait for the follower, say what happens next; returns
        the exit code of ``cause``."""
        nodes = [dict(n) for n in nodes]
        suspects = getattr(self.backend, "suspect_nodes", None)
        for n in (suspects() if suspects is not None and cause != "complete" else []):
            if n not in nodes:
                nodes.append(dict(n))
        if final and cause != "verdict":  # an attempt refused by a verdict keeps that verdict as it was
            attempts.write_verdict(self.run_dir, key=self.key, cause=cause, message=message, step=step,
                                   attempt=self.attempt, nodes=nodes)
        attempts.write_end(self.log_dir, self.attempt, cause=cause, message=message, step=step, phase=phase,
                           final=final, nodes=nodes, evidence=evidence, extra=extra)
        ack = attempts.wait_for_ack(self.log_dir, self.attempt)
        if ack is not None:
            self.log(f"log follower: {'; '.join(ack.get('actions') or ['nothing to do'])}")
        code = attempts.CAUSES[cause]
        if final:
            self.log(f"the run is stopped for good ({attempts.verdict_path(self.run_dir)}): later attempts with this "
                     f"preset exit at once (exit code {attempts.EXIT_VERDICT}); change the preset to run again")
        return code

    def refuse_on_verdict(self) -> Optional[int]:
        """Exit code 8 (after saying why) when an earlier attempt stopped the run for good, else None."""
        verdict = attempts.read_verdict(self.run_dir, self.key)
        if verdict is None:
            return None
        text = attempts.verdict_refusal(self.run_dir, verdict)
        self.log(text)
        return self.finish("verdict", text, step=int(verdict.get("step") or 0), final=True,
                           nodes=verdict.get("nodes") or [])

    def crashed(self, exc: BaseException) -> None:
        """An exception ends the attempt (its traceback goes to the attempt log as usual): the end record names
        the nodes the error text names -- Ray's ActorDiedError gives the dead worker's ``pid`` and ``ip`` (and a dead
        node's id), which the backend maps to a rank and its Kubernetes node where it knows them."""
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        nodes = []
        pid, ip, ray_node = (re.search(rx, text) for rx in (r"\bpid: (\d+)", r"\bip: ([\w.:-]+)",
                                                             r"(?i)\bnode[ _]id:? ([0-9a-f]{16,})"))
        if pid or ip or ray_node:
            known = getattr(self.backend, "node_of", None)
            entry = known(int(pid.group(1)) if pid else None) if known is not None else None
            nodes.append(dict(entry or attempts.node_entry(None, why=""), ip=ip.group(1) if ip else None,
                              ray_node_id=ray_node.group(1) if ray_node else None,
                              why=f"named by the error that ended the attempt: {text.splitlines()[0][:200]}"))
        self.finish("error", text[:2000], step=self.step_of() + 1, nodes=nodes)

    # -- the causes ---------------------------------------------------------------------------------------------------
    def stall(self, phase: str, elapsed: float, budget: float) -> None:
        """The watchdog thread's handler: save the evidence, record the end, exit (exit code 6). Never returns."""
        if not self._ending.acquire(blocking=False):
            return
        # the step the stuck phase belongs to: a step's own phases run before the loop counts it done; its save and
        # validation after
        step = self.step_of() + (1 if phase in STEP_PHASES else 0)
        where = f"phase {phase} of step {step}" if phase != "startup" else "the attempt's start-up"
        header = (f"dapo watchdog: {where} has run {elapsed:.0f} s, past its budget of {budget:.0f} s "
                  f"(attempt {self.attempt}, pid {os.getpid()}, host {os.uname().nodename}, "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())})")
        self.log(f"WATCHDOG: {where} has run {elapsed:.0f} s, past its budget of {budget:.0f} s; saving stacks to "
                 f"{self.evidence_dir}")
        nodes: list[dict[str, Any]] = []
        try:
            self.evidence_dir.mkdir(parents=True, exist_ok=True)
            (self.evidence_dir / "stacks-driver.txt").write_text(python_stacks(header))
            request = getattr(self.backend, "request_stacks", None)
            if request is not None:
                nodes = list(request(self.evidence_dir, header) or [])
        except Exception as exc:  # the evidence is best effort; ending the attempt is not
            self.log(f"WATCHDOG: saving the evidence failed ({type(exc).__name__}: {exc})")
        for n in nodes:
            self.log(f"WATCHDOG: {n.get('why')}")
        message = (f"{where} ran {elapsed:.0f} s, past its budget of {budget:.0f} s "
                   f"(recipe.trainer.watchdog); stacks in {self.evidence_dir}")
        code = self.finish("stalled", message, step=step, phase=phase, nodes=nodes, evidence=str(self.evidence_dir),
                           extra={"elapsed_s": round(elapsed, 1), "budget_s": round(budget, 1)})
        self.log(f"WATCHDOG: ending this attempt (exit code {code}); the next attempt resumes from the newest "
                 "checkpoint")
        log = runlog.active()
        if log is not None:
            log.close(code)
        os._exit(code)

    def nonfinite(self, step: int, bad: Mapping[str, float], nodes: Iterable[Mapping[str, Any]] = (),
                  detail: str = "") -> int:
        """A non-finite value at ``step`` (nothing of that step is saved): exit code 7, final when an earlier attempt
        ended with the same keys non-finite at the same step."""
        keys = sorted(bad)
        seen = [r for r in attempts.end_records(self.log_dir)
                if r.get("cause") == "nonfinite" and r.get("step") == step and sorted(r.get("keys") or []) == keys]
        values = ", ".join(f"{k} = {bad[k]}" for k in keys)
        message = f"non-finite value at step {step}: {values}{f' ({detail})' if detail else ''}; nothing of step " \
                  f"{step} was saved"
        if seen:
            message += (f" -- the same as attempt {seen[-1]['attempt']} at the same step, so it is not a transient "
                        "fault: lower recipe.actor.optim.lr or look at the data of that step")
        self.log(f"NON-FINITE: {message}")
        return self.finish("nonfinite", message, step=step, final=bool(seen), nodes=nodes,
                           extra={"keys": keys, "values": {k: str(v) for k, v in bad.items()}})

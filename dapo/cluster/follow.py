"""Every attempt's driver log as one stream, from the first line to the run's end: the chart's log follower Job
(``kubectl logs -f job/<release>-train-logs``).

    python -m dapo.cluster.follow --log-dir /shared/checkpoints/P/E/logs --rayjob dapo-train --state-dir /state

The driver of each RayJob attempt writes ``<log dir>/attempt-<N>.log`` (:mod:`dapo.train.runlog`; the reference
runner's :mod:`dapo.reference.attempt_log`). The follower waits for the directory, prints each attempt of this run
in order -- a header line with its number and start time, then its lines as they are written, complete lines only
(a partial last line waits for its newline, and is printed with one added when the attempt ends without it) --
moves to the next attempt when a retry starts, and ends with one line saying how the run ended: exit 0 when the
last attempt's log ends with exit code 0; exit 1 when the run has failed for good -- the RayJob (``--rayjob``, read
with :mod:`dapo.cluster.rayjob_api`) is ``Failed``, ``Complete`` without success (a stopped job), or was deleted;
without API access, when an attempt fails and ``--backoff-limit`` + 1 attempts have run.

Until an attempt's driver log exists (the cluster being created, pods Pending on GPUs or a claim, images pulling, an
init container crash-looping), the follower explains the wait on stderr, ``[wait]`` lines, about every
``--waits-every`` seconds and only what changed: the RayJob's status and attempt, and the causes
:mod:`dapo.cluster.waits` reads from the release's pods and events (``--release``), one line per cause however many
pods share it. While a driver runs it goes on, ``[cluster]`` lines for what disrupts the attempt: a lost node, an
OOM-killed, evicted or preempted worker, a restarted container. When the run then fails, the final line names them.
Between attempts it acts when asked to (:mod:`dapo.cluster.keeper`, ``[attempts]`` lines): it answers each end
record, leaves failing nodes out, holds the run to its failure budget, ends an attempt whose driver froze.

Which attempts belong to the run: with the RayJob's status, those that started (:func:`dapo.train.runlog.started_at`,
else the file's mtime) at or after its creation -- a re-installed release keeps its earlier runs' logs in the same
directory; without it, every attempt in the directory.

Printing nothing twice. ``--state-dir`` (an emptyDir in the pod, which outlives a container restart) holds what has
been printed: the attempt, the byte offset, whether its header and the final line are out. Each write to stdout is
recorded as pending before it and done after it; a follower restarted in the same pod resumes after the last
recorded write and prints nothing again. A follower killed in the middle of a write (SIGKILL, OOM) may have cut it
short: the restarted one says so, on stderr with the byte range, and skips it (the lines stay in the file). A new
pod (the old one evicted, or lost with its node and its log) starts with an empty state dir and prints the run from
the beginning, once. ``--sidecar`` (the chart: a restartable init container, restarted in place) writes the exit
code to ``<state dir>/result`` for the pod's main container and waits for SIGTERM instead of exiting. Diagnostics
go to stderr, outside the run's stream on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from dapo.cluster import keeper as keeping
from dapo.cluster.rayjob_api import ApiUnavailable, RayJobApi, RayJobStatus
from dapo.cluster.waits import Waits
from dapo.train.runlog import attempt_numbers, exit_code_of, started_at

SUCCEEDED, FAILED = 0, 1
FIRST_LINE = 1 << 16  # longer first lines carry no start time we read
CHUNK = 1 << 18  # bytes read per write: memory stays flat whatever the log size


class Follower:
    """One run's attempts, printed once each (module doc). :meth:`run` returns the exit code."""

    def __init__(self, log_dir: Path, *, api: Optional[RayJobApi] = None, backoff_limit: Optional[int] = None,
                 state_dir: Optional[Path] = None, poll: float = 2.0, status_every: float = 15.0,
                 grace: float = 30.0, out_fd: int = 1, waits: Optional[Waits] = None, waits_every: float = 30.0,
                 keeper: Optional[keeping.Keeper] = None):
        self.log_dir, self.api, self.backoff_limit, self.keeper = Path(log_dir), api, backoff_limit, keeper
        self.state_path = Path(state_dir) / "state.json" if state_dir else None
        self.poll, self.status_every, self.grace, self.out_fd = poll, status_every, grace, out_fd
        self.status: Optional[RayJobStatus] = None  # the last status read
        self.seen = False  # the RayJob existed once
        self.over_since: Optional[float] = None  # when it was first seen terminal or gone
        self.next_status = 0.0
        self.stopping = False
        self.waits, self.waits_every, self.next_waits, self.said_status = waits, waits_every, 0.0, ""
        self._notes: set[str] = set()
        self._starts: dict[int, tuple[datetime, bool]] = {}
        self.state = {"attempt": None, "offset": 0, "last_line": "", "finished": {}, "ended": None,
                      "pending": None, "uid": ""}
        if self.state_path is not None and self.state_path.is_file():
            self.state.update(json.loads(self.state_path.read_text()))
            self._recover()

    # -- output and state ------------------------------------------------------------------------------------------
    def note(self, text: str) -> None:
        """A diagnostic on stderr (not the run's stream), once per process."""
        if text in self._notes:
            return
        self._notes.add(text)
        print(f"[follow] {text}", file=sys.stderr, flush=True)

    def _save(self) -> None:
        if self.state_path is not None:
            tmp = self.state_path.with_name(self.state_path.name + ".tmp")
            tmp.write_text(json.dumps(self.state))
            os.replace(tmp, self.state_path)

    def _emit(self, data: bytes, what: str, **after) -> None:
        """Write ``data`` to stdout once: recorded as pending (with the state after it), written, recorded done."""
        self.state["pending"] = {"what": what, "after": after}
        self._save()
        view = memoryview(data)
        while view:
            view = view[os.write(self.out_fd, view):]
        self.state.update(after)
        self.state["pending"] = None
        self._save()

    def _recover(self) -> None:
        pending = self.state.get("pending")
        if pending:
            self.state.update(pending["after"])
            self.state["pending"] = None
            self._save()
            self.note(f"the previous follower was stopped while printing {pending['what']}: it may be cut short in "
                      "`kubectl logs --previous`; it is not printed again (the file has it)")
        where = f"attempt {self.state['attempt']} at byte {self.state['offset']}" if self.state["attempt"] else \
            f"after attempts {sorted(self.state['finished'], key=int) or 'none'}"
        self.note(f"restarted: resuming {where}; what was printed before is in `kubectl logs --previous`")

    # -- attempts ----------------------------------------------------------------------------------------------------
    def _path(self, n: int) -> Path:
        return self.log_dir / f"attempt-{n}.log"

    def _started(self, n: int) -> Optional[tuple[datetime, bool]]:
        """When attempt n started and whether its first line says so (else: the file's mtime); None while its first
        line is still being written."""
        if n not in self._starts:
            try:
                with open(self._path(n), "rb") as f:
                    first = f.readline(FIRST_LINE)
                mtime = os.stat(self._path(n)).st_mtime
            except OSError:
                return None
            if not first.endswith(b"\n") and len(first) < FIRST_LINE:
                return None
            when = started_at(first)
            self._starts[n] = (when, True) if when else (datetime.fromtimestamp(mtime, timezone.utc), False)
        return self._starts[n]

    def _owned(self, n: int) -> Optional[bool]:
        """Whether attempt n belongs to the followed RayJob; None: cannot tell yet."""
        started = self._started(n)
        if started is None:
            return None
        if self.api is None:
            return True
        if self.status is None or not self.status.exists or self.status.created is None:
            return None
        return started[0] >= self.status.created

    def _next_attempt(self, after: int) -> Optional[int]:
        if not self.log_dir.is_dir():
            self.note(f"waiting for {self.log_dir} (the first attempt creates it)")
            return None
        for n in attempt_numbers(self.log_dir):
            if n > after:
                owned = self._owned(n)
                if owned is None:
                    return None
                if owned:
                    return n
        return None

    def _last_done(self) -> int:
        return max((int(k) for k in self.state["finished"]), default=0)

    def _start(self, n: int) -> None:
        when, said = self._started(n) or (None, False)
        stamp = when.strftime("%Y-%m-%d %H:%M:%S UTC") if said else "at an unknown time (not on its first line)"
        self._emit(f"==> attempt {n}, started {stamp}: {self._path(n)} <==\n".encode(), f"the header of attempt {n}",
                   attempt=n, offset=0, last_line="")

    def _pump(self, final: bool) -> None:
        """Print the complete lines of the current attempt written since the last call; ``final``: everything, a
        partial last line with a newline added."""
        n = self.state["attempt"]
        try:
            f = open(self._path(n), "rb")  # opened each time: NFS revalidates a file on open
        except OSError:
            return
        with f:
            while True:
                f.seek(self.state["offset"])
                data = f.read(CHUNK)
                if not data:
                    return
                cut = len(data) if final else data.rfind(b"\n") + 1
                if cut == 0:
                    if len(data) < CHUNK:
                        return  # a partial line: printed once its newline arrives
                    cut = len(data)  # a line longer than CHUNK: printed in pieces
                block = data[:cut]
                if final and len(data) < CHUNK and not block.endswith(b"\n"):
                    block += b"\n"
                last = block[:-1].rsplit(b"\n", 1)[-1] if block.endswith(b"\n") else b""
                start = self.state["offset"]
                self._emit(block, f"bytes {start}-{start + cut} of {self._path(n).name}", offset=start + cut,
                           last_line=last[:2000].decode("utf-8", "replace"))
                if len(data) < CHUNK:
                    return

    def _end(self, code: int, text: str) -> int:
        self._emit(f"==> {text} <==\n".encode(), "the final line", ended=code)
        return code

    # -- the RayJob --------------------------------------------------------------------------------------------------
    def _poll_status(self) -> bool:
        if self.api is None or time.monotonic() < self.next_status:
            return False
        self.next_status = time.monotonic() + self.status_every
        try:
            status = self.api.get()
        except ApiUnavailable as exc:
            self.note(f"{exc}; the run's end is judged from the attempt logs alone"
                      f" (backoffLimit {self.backoff_limit}), every attempt in {self.log_dir} counts")
            self.api, self.status, self.keeper = None, None, None
            return False
        except OSError as exc:  # the API server restarting, a network blip: keep the last status, retry later
            self.note(f"cannot read the RayJob status now ({exc}); retrying every {self.status_every:.0f} s")
            return False
        if status.exists:
            if self.state["uid"] and status.uid != self.state["uid"]:
                status = RayJobStatus(exists=False)  # deleted and created again: ours is gone
            else:
                self.seen = True
                if not self.state["uid"]:
                    self.state["uid"] = status.uid
                    self._save()
        elif not self.seen and not self.state["uid"]:
            self.note("waiting for the RayJob to be created")
        self.status = status
        gone = self.seen or bool(self.state["uid"])
        if (status.terminal or (not status.exists and gone)) and self.over_since is None:
            self.over_since = time.monotonic()
        return True

    def _over(self) -> bool:
        """The RayJob ended (or vanished) at least ``grace`` seconds ago: no more lines or attempts will come."""
        return self.over_since is not None and time.monotonic() - self.over_since >= self.grace

    def _failed_for_good(self) -> Optional[str]:
        """Why the run is over after a failed attempt (None: a retry may come)."""
        s, failed = self.status, sum(1 for c in self.state["finished"].values() if c != 0)
        if self.api is not None and s is not None:
            stopped = self.keeper.final_words() if self.keeper else ""
            if not s.exists and (self.seen or self.state["uid"]):
                return stopped + "the RayJob was deleted before the run succeeded"
            if s.terminal and not s.succeeded:
                return f"{stopped}the RayJob is {s.describe()}"
            return None
        if self.backoff_limit is not None and failed > self.backoff_limit:
            return f"{failed} attempt(s) failed, backoffLimit {self.backoff_limit}"
        return None  # no limit known: another attempt may always come

    # -- the waits before a driver log exists, the disruptions after (dapo.cluster.waits) -----------------------------
    def _explain(self) -> None:
        """About every ``waits_every`` s: the RayJob's status when it changed, and each new cause, once, on stderr --
        ``[wait]`` lines while no attempt is printing, ``[cluster]`` lines (disruptions only: a lost node, an
        OOM-killed, evicted or preempted worker) while one is."""
        if self.api is None or time.monotonic() < self.next_waits:
            return
        self.next_waits = time.monotonic() + self.waits_every
        running = self.state["attempt"] is not None
        tag = "[cluster]" if running else "[wait]"
        s = self.status
        if s is not None and s.exists and s.describe() != self.said_status:
            self.said_status = s.describe()
            print(f"{tag} RayJob {self.api.name}: {s.describe()}", file=sys.stderr, flush=True)
        if self.waits is not None:
            lines, note = self.waits.poll(running=running)
            if note:
                self.note(note)
            for line in lines:
                print(f"{tag} {line}", file=sys.stderr, flush=True)

    def _with_causes(self, why: str) -> str:
        """``why``, and what the cluster said: the disruptions seen while the last attempt ran, and the current
        causes when an attempt failed before its driver started (none printed yet, or more failed than printed)."""
        if self.waits is None:
            return why
        parts, ran = [], len(self.state["finished"])
        if self.waits.disruptions:
            parts.append(f"while its last attempt ran: {' | '.join(self.waits.disruptions[:6])}")
        s = self.status
        if self.waits.current and (not ran or (s is not None and s.failed > ran)):
            parts.append(f"before its driver started: {' | '.join(self.waits.current[:6])}")
        return "; ".join([why, *parts])

    # -- the loop ----------------------------------------------------------------------------------------------------
    def step(self) -> Optional[int]:
        """One round: read the status, print what is new, decide. Returns the exit code once the run ended."""
        fresh = self._poll_status()
        self._explain()
        if self.keeper is not None:
            self.keeper.step(self.status, self.state["attempt"], lambda n: bool(self._owned(n)),
                             self.waits.last if self.waits else None, fresh)
        if self.state["attempt"] is None:
            n = self._next_attempt(self._last_done())
            if n is not None:
                if self.waits is not None:
                    self.waits.new_attempt()  # its disruptions are its own
                self._start(n)
        n = self.state["attempt"]
        if n is not None:
            self._pump(final=False)
            code = exit_code_of(self.state["last_line"].encode(), n)
            if code is None and self._next_attempt(n) is None and not self._over():
                return None
            self._pump(final=True)  # the attempt ended: its last bytes, a partial line included
            self.state["finished"][str(n)] = code
            self.state.update(attempt=None, offset=0, last_line="")
            self._save()
            if code == 0:
                return self._end(SUCCEEDED, f"the run succeeded: attempt {n} exited with code 0")
            why = "exited with code " + str(code) if code is not None else "ended without an exit code in its log"
            self.note(f"attempt {n} {why}")
        if self.state["attempt"] is None and self._next_attempt(self._last_done()) is None:
            s = self.status
            if self.api is not None and s is not None and s.succeeded and self._over():
                return self._end(SUCCEEDED, f"the run succeeded: the RayJob is {s.describe()}")
            why = self._failed_for_good()
            if why and (self.api is None or self._over()):
                return self._end(FAILED, f"the run failed: {self._with_causes(why)}")
        return None

    def run(self, sidecar_result: Optional[Path] = None) -> int:
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: setattr(self, "stopping", True))
        try:
            code = self.state["ended"]
            while code is None and not self.stopping:
                code = self.step()
                if code is None:
                    time.sleep(self.poll)
            if code is None:
                return 128 + signal.SIGTERM
            if sidecar_result is not None:  # the pod's main container exits with it; this one waits for SIGTERM
                tmp = sidecar_result.with_name(sidecar_result.name + ".tmp")
                tmp.write_text(f"{code}\n")
                os.replace(tmp, sidecar_result)
                while not self.stopping:
                    time.sleep(1)
                return 0
            return code
        finally:
            signal.signal(signal.SIGTERM, previous)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dapo.cluster.follow", description=__doc__.split("\n\n")[0])
    p.add_argument("--log-dir", required=True, type=Path, help="the attempt-<N>.log directory (<run dir>/logs)")
    p.add_argument("--rayjob", default=None, help="the RayJob whose status ends the run (omit: the logs alone)")
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE") or None,
                   help="its namespace (default $POD_NAMESPACE, else the pod's service-account namespace)")
    p.add_argument("--api-server", default=None,
                   help="API server URL (default: in-cluster); e.g. http://127.0.0.1:8001 with `kubectl proxy`")
    p.add_argument("--backoff-limit", type=int, default=None, help="the RayJob's backoffLimit, for when its status "
                   "cannot be read (default: unknown, a failed attempt never ends the run)")
    p.add_argument("--state-dir", type=Path, default=None, help="what was printed, for a restart (an emptyDir)")
    p.add_argument("--sidecar", action="store_true", help="at the end write <state dir>/result and wait for "
                   "SIGTERM (a restartable init container)")
    p.add_argument("--poll", type=float, default=2.0, help="seconds between reads of the current log")
    p.add_argument("--status-every", type=float, default=15.0, help="seconds between reads of the RayJob status")
    p.add_argument("--grace", type=float, default=30.0, help="seconds to keep reading after the RayJob ended "
                   "(shared volumes show writes late)")
    p.add_argument("--release", default=None,
                   help="the Helm release (its pods' app.kubernetes.io/instance): explain waits from its pods and events")
    p.add_argument("--kind", default="train", choices=["train", "eval"], help="which RayJob of the release")
    p.add_argument("--claim", default=None, help="the shared claim, whose events also explain a wait")
    p.add_argument("--waits-every", type=float, default=30.0, help="seconds between looks at pods and events")
    keeping.add_arguments(p)  # what it does between attempts (dapo.cluster.keeper)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.sidecar and args.state_dir is None:
        ap.error("--sidecar needs --state-dir")
    api = None
    if args.rayjob:
        try:
            api = (RayJobApi(args.api_server, args.namespace or "default", args.rayjob) if args.api_server
                   else RayJobApi.in_cluster(args.rayjob, args.namespace))
        except (ApiUnavailable, OSError) as exc:
            print(f"[follow] {exc}; the run's end is judged from the attempt logs alone", file=sys.stderr)
    if args.state_dir is not None:
        args.state_dir.mkdir(parents=True, exist_ok=True)
    waits = Waits(api, release=args.release, kind=args.kind, claim=args.claim) if api and args.release else None
    follower = Follower(args.log_dir, api=api, backoff_limit=args.backoff_limit, state_dir=args.state_dir,
                        poll=args.poll, status_every=args.status_every, grace=args.grace, waits=waits,
                        waits_every=args.waits_every,
                        keeper=keeping.from_args(args, api, waits.selector) if waits else None)
    return follower.run(args.state_dir / "result" if args.sidecar else None)


if __name__ == "__main__":
    sys.exit(main())

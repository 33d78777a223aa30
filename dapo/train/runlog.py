"""The driver log of every attempt on the run's volume: ``<run dir>/logs/attempt-<N>.log``.

On a cluster the training driver's console is the Ray job log, which ``kubectl logs`` follows through the submitter
pod; both disappear with the head when KubeRay retries. :class:`AttemptLog` keeps a copy where the checkpoints are:

- ``N`` is the next free number (one more than the highest ``attempt-*.log`` present); the file is created with
  ``O_CREAT | O_EXCL``, so an existing log is never overwritten, even by two attempts starting at once;
- file descriptors 1 and 2 are redirected into pipes; two threads copy each pipe to the original console stream
  (stdout to stdout, stderr to stderr) and to the file, so everything is kept -- Python prints, warnings,
  tracebacks, native libraries and child processes that inherit the descriptors, and the lines of Ray workers the
  driver prints -- and the console shows what it showed before;
- the first line names the file and when the attempt started, in UTC (on the console too); the last one is the exit
  code (:func:`exit_code_of` reads it, :func:`started_at` the start). Within the file, stdout and stderr are
  interleaved chunk by chunk as the two threads copy them (like any ``2>&1``, not byte-exact).

:func:`run_logged` runs a command-line function under an attempt log (``dapo train``, ``dapo eval run``);
:mod:`dapo.cluster.follow` prints the logs of every attempt as one stream (the chart's log follower Job).

A process killed with SIGKILL loses at most what was still in the pipe (the threads write each chunk through at
once). A progress bar is drawn only on an interactive console (:func:`console`), never into the file.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Callable, Optional

ATTEMPT_RE = re.compile(r"^attempt-(\d+)\.log$")
_ACTIVE: Optional["AttemptLog"] = None

# The start time on an attempt's first line ("... | started 2025-06-01 12:00:00 UTC"), written by AttemptLog and by
# dapo.reference.attempt_log; the last line's exit code in either writer's words.
STARTED_FORMAT = "%Y-%m-%d %H:%M:%S UTC"
_STARTED_RE = re.compile(rb" \| started (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC\s*$")
_EXIT_RES = (
    re.compile(rb"^dapo: exit code (?P<code>-?\d+) \| log .*attempt-(?P<n>\d+)\.log\s*$"),  # AttemptLog.close
    re.compile(rb"^\[attempt_log\] attempt (?P<n>\d+) exited with status (?P<code>\d+)\s*$"),  # the reference runner
)


def started_stamp(when: Optional[float] = None) -> str:
    """``started <UTC time>``, the end of an attempt log's first line (parsed back by :func:`started_at`)."""
    return "started " + time.strftime(STARTED_FORMAT, time.gmtime(when))


def started_at(first_line: bytes) -> Optional[datetime]:
    """The start time (UTC) an attempt log's first line ends with, or None (an older log, another format)."""
    m = _STARTED_RE.search(first_line.rstrip(b"\r\n"))
    if not m:
        return None
    return datetime.strptime(m.group(1).decode(), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)


def exit_code_of(line: bytes, attempt: int) -> Optional[int]:
    """The exit code if ``line`` is the last line of attempt ``attempt``'s log (either writer's words), else None."""
    for rx in _EXIT_RES:
        m = rx.match(line.rstrip(b"\r\n"))
        if m and int(m.group("n")) == attempt:
            return int(m.group("code"))
    return None


def attempt_numbers(log_dir: Path | str) -> list[int]:
    """Numbers of the ``attempt-<N>.log`` files in ``log_dir``, ascending."""
    d = Path(log_dir)
    if not d.is_dir():
        return []
    return sorted(int(m.group(1)) for p in d.iterdir() if (m := ATTEMPT_RE.match(p.name)))


def create_attempt_file(log_dir: Path | str) -> tuple[int, Path, int]:
    """Create the next ``attempt-<N>.log`` exclusively; returns (N, path, an fd open for appending)."""
    d = Path(log_dir)
    d.mkdir(parents=True, exist_ok=True)
    n = (attempt_numbers(d) or [0])[-1] + 1
    while True:
        path = d / f"attempt-{n}.log"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        except FileExistsError:  # another attempt took this number in between
            n += 1
            continue
        return n, path, fd


def active() -> Optional["AttemptLog"]:
    """The attempt log of this process, if one is open."""
    return _ACTIVE


def console() -> Optional[IO[str]]:
    """An interactive console for a progress bar that must not go into the attempt log (None if there is none).

    With an attempt log open this is the original stderr, written around the pipe; without one, ``sys.stderr``."""
    if _ACTIVE is not None:
        return _ACTIVE.console_stderr if _ACTIVE.console_is_tty else None
    return sys.stderr if sys.stderr.isatty() else None


def note(text: str) -> None:
    """Write ``text`` (one line) into the attempt log only -- for lines shown on the console by other means."""
    if _ACTIVE is not None:
        _ACTIVE.write_file((text.rstrip("\n") + "\n").encode())


class AttemptLog:
    """Context manager: tee fds 1 and 2 into ``<log_dir>/attempt-<N>.log`` for the duration (module doc)."""

    def __init__(self, log_dir: Path | str, *, header: str = ""):
        self.log_dir = Path(log_dir)
        self.header = header
        self.number: Optional[int] = None
        self.path: Optional[Path] = None
        self._fd: Optional[int] = None
        self._lock = threading.Lock()
        self._saved: dict[int, int] = {}
        self._threads: list[threading.Thread] = []
        self.console_is_tty = False
        self.console_stderr: Optional[IO[str]] = None

    # -- writing -----------------------------------------------------------------------------------------------------
    def write_file(self, data: bytes) -> None:
        with self._lock:
            if self._fd is not None:
                os.write(self._fd, data)

    def _pump(self, read_fd: int, console_fd: int) -> None:
        while True:
            try:
                chunk = os.read(read_fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            try:
                os.write(console_fd, chunk)
            except OSError:  # the console went away (closed pipe): keep logging to the file
                pass
            self.write_file(chunk)
        os.close(read_fd)

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    def __enter__(self) -> "AttemptLog":
        global _ACTIVE
        if _ACTIVE is not None:
            raise RuntimeError(f"an attempt log is already open in this process: {_ACTIVE.path}")
        self.number, self.path, self._fd = create_attempt_file(self.log_dir)
        sys.stdout.flush()
        sys.stderr.flush()
        self.console_is_tty = os.isatty(2)
        for fd in (1, 2):
            saved = os.dup(fd)
            self._saved[fd] = saved
            r, w = os.pipe()
            os.dup2(w, fd)
            os.close(w)
            t = threading.Thread(target=self._pump, args=(r, saved), name=f"attempt-log-fd{fd}", daemon=True)
            t.start()
            self._threads.append(t)
        self.console_stderr = os.fdopen(os.dup(self._saved[2]), "w", buffering=1)
        _ACTIVE = self
        first = f"dapo: this attempt's log (stdout + stderr): {self.path}"
        if self.header:
            first += f" | {self.header}"
        self._both(f"{first} | {started_stamp()}\n")
        return self

    def _both(self, line: str) -> None:
        """``line`` into the file and onto the console's stdout directly: not through the pipes, whose two pump
        threads do not keep the order between stdout and stderr."""
        data = line.encode()
        self.write_file(data)
        try:
            os.write(self._saved.get(1, 1), data)
        except OSError:
            pass

    def close(self, exit_code: Optional[int] = None) -> None:
        global _ACTIVE
        if _ACTIVE is not self:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)  # closes the pipe's last write end held by fd: the pump reads EOF
        for t in self._threads:
            t.join(timeout=10)
        if exit_code is not None:  # after everything the pipes held
            self._both(f"dapo: exit code {exit_code} | log {self.path}\n")
        for saved in self._saved.values():
            os.close(saved)
        if self.console_stderr is not None:
            self.console_stderr.close()
            self.console_stderr = None
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = None
        self._saved.clear()
        self._threads.clear()
        _ACTIVE = None

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None and not isinstance(exc, (SystemExit, KeyboardInterrupt)):
            import traceback

            # the console gets the traceback from Python once it propagates; the file gets it here
            note("".join(traceback.format_exception(exc_type, exc, tb)))
            self.close(1)
            return None
        if isinstance(exc, KeyboardInterrupt):
            self.close(130)
        elif isinstance(exc, SystemExit):  # the status Python exits with: None -> 0, a message -> 1
            self.close(exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1))
        else:
            self.close(None)
        return None


def run_logged(log_dir: Path | str, fn: Callable[[], int], *, header: str, prog: str) -> int:
    """``fn()`` with this process's stdout and stderr teed into the next attempt log of ``log_dir``; its return value
    is the exit code on the log's last line (a traceback: 1, Ctrl-C or SIGTERM: 130, ``sys.exit(n)``: n). SIGTERM
    (``ray job stop``, a pod being deleted) interrupts like Ctrl-C, so the last lines reach the file instead of the
    process dying mid-write. Returns 2 with a message when the log cannot be created."""
    log = AttemptLog(log_dir, header=header)
    try:
        log.__enter__()
    except OSError as exc:
        print(f"{prog}: cannot create the attempt log in {log_dir}: {exc} (is the volume writable?)", file=sys.stderr)
        return 2
    previous = _sigterm_as_interrupt()
    try:
        rc = int(fn() or 0)
    except BaseException as exc:  # a traceback or Ctrl-C still ends up in the file
        log.__exit__(type(exc), exc, exc.__traceback__)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    log.close(rc)
    return rc


def _sigterm_as_interrupt():
    """SIGTERM raises KeyboardInterrupt (the loop then says which checkpoint a rerun resumes from and exits 130).
    Returns the previous handler (None when not in the main thread, where Python cannot install one)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")

    return signal.signal(signal.SIGTERM, interrupt)

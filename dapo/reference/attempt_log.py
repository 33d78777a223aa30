"""Run a command with its output teed to ``<log-dir>/attempt-<N>.log`` (the driver log of one RayJob attempt).

    python3 -m dapo.reference.attempt_log --log-dir /shared/ckpts/EXP/logs -- python3 -m recipe.dapo.src.main_dapo ...

The training RayJob of the reference runner wraps the upstream recipe with this, so each attempt (a KubeRay retry
builds a new cluster and resumes from the latest checkpoint) leaves its full driver log on the shared volume, beside
the checkpoints, after the cluster is gone. ``N`` is one more than the highest existing ``attempt-N.log``; the file
is created exclusively, so two attempts never share one. The command runs in ``--cwd`` (default: the log
directory; Hydra writes its ``outputs/<date>/<time>/.hydra`` record of the composed config there), its stdout and
stderr go, merged and unchanged, to this process's stdout and to the file, SIGTERM / SIGINT are passed on to it,
and its exit status is returned (128 + signal number when it was killed by a signal).

Standard library only: it runs on the reproduction image (Python 3.10, our package without extras).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import BinaryIO, Optional

from dapo.train.runlog import create_attempt_file, started_stamp


def open_next_attempt(log_dir: Path) -> tuple[int, BinaryIO]:
    """Create the next ``attempt-N.log`` exclusively (numbering of :func:`dapo.train.runlog.create_attempt_file`)."""
    n, _path, fd = create_attempt_file(log_dir)
    return n, os.fdopen(fd, "ab")


def run(cmd: list[str], log_dir: Path, cwd: Optional[Path] = None, out: Optional[BinaryIO] = None) -> int:
    """Run ``cmd`` teeing its merged output to the next attempt log; returns its exit status."""
    out = out if out is not None else sys.stdout.buffer
    n, log = open_next_attempt(log_dir)
    cwd = cwd or log_dir
    cwd.mkdir(parents=True, exist_ok=True)
    header = f"[attempt_log] attempt {n}: {' '.join(cmd)} (cwd {cwd}) | {started_stamp()}\n".encode()
    with log:
        log.write(header)
        out.write(header)
        out.flush()
        try:
            proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as exc:
            msg = f"[attempt_log] cannot start {cmd[0]!r}: {exc}\n".encode()
            log.write(msg)
            out.write(msg)
            out.flush()
            return 127

        def forward(signum, _frame):
            proc.send_signal(signum)

        old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            assert proc.stdout is not None
            while True:
                chunk = proc.stdout.read1(65536) if hasattr(proc.stdout, "read1") else proc.stdout.read(65536)
                if not chunk:
                    break
                log.write(chunk)
                log.flush()
                out.write(chunk)
                out.flush()
            rc = proc.wait()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        status = rc if rc >= 0 else 128 - rc
        tail = f"[attempt_log] attempt {n} exited with status {status}\n".encode()
        log.write(tail)
        out.write(tail)
        out.flush()
        os.fsync(log.fileno())
    return status


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dapo.reference.attempt_log", description=__doc__.splitlines()[0])
    ap.add_argument("--log-dir", required=True, type=Path, help="directory of the attempt-N.log files")
    ap.add_argument("--cwd", type=Path, default=None, help="working directory of the command (default: --log-dir)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command and its arguments")
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command given (python -m dapo.reference.attempt_log --log-dir DIR -- CMD ...)")
    return run(cmd, args.log_dir, args.cwd)


if __name__ == "__main__":
    sys.exit(main())

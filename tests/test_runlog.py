"""Each attempt's driver log on the run volume (dapo.train.runlog): next free number, never overwritten, stdout and
stderr (Python, native writes, child processes) both in the file and still on the console, the path on the first
line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from conftest import ROOT
from dapo.train.runlog import attempt_numbers, create_attempt_file

SCRIPT = textwrap.dedent("""
    import os, subprocess, sys
    from dapo.train.runlog import AttemptLog

    with AttemptLog(sys.argv[1], header="test") as log:
        print("py-stdout-line")
        print("py-stderr-line", file=sys.stderr)
        os.write(1, b"native-stdout-line\\n")
        os.write(2, b"native-stderr-line\\n")
        subprocess.run([sys.executable, "-c", "import sys; print('child-stdout-line'); "
                        "print('child-stderr-line', file=sys.stderr)"], check=True)
        log.close(int(sys.argv[2]))
    print("after-close-line")
    sys.exit(int(sys.argv[2]))
""")


def _attempt(log_dir: Path, rc: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", SCRIPT, str(log_dir), str(rc)], capture_output=True, text=True,
                          env=env, timeout=60)


def test_attempt_logs_number_up_keep_both_streams_and_still_print_to_the_console(tmp_path):
    log_dir = tmp_path / "run" / "logs"
    first = _attempt(log_dir, 0)
    second = _attempt(log_dir, 3)
    assert first.returncode == 0 and second.returncode == 3
    assert attempt_numbers(log_dir) == [1, 2]
    for n, proc, rc in ((1, first, 0), (2, second, 3)):
        path = log_dir / f"attempt-{n}.log"
        text = path.read_text()
        lines = text.splitlines()
        assert lines[0].startswith(f"dapo: this attempt's log (stdout + stderr): {path} | test")
        for what in ("py-stdout-line", "py-stderr-line", "native-stdout-line", "native-stderr-line",
                     "child-stdout-line", "child-stderr-line"):
            assert what in text, (what, text)
        assert lines[-1] == f"dapo: exit code {rc} | log {path}"
        assert "after-close-line" not in text
        # the console still shows everything, each stream on its own descriptor
        assert f"this attempt's log (stdout + stderr): {path}" in proc.stdout
        for what in ("py-stdout-line", "native-stdout-line", "child-stdout-line", "after-close-line"):
            assert what in proc.stdout and what not in proc.stderr
        for what in ("py-stderr-line", "native-stderr-line", "child-stderr-line"):
            assert what in proc.stderr and what not in proc.stdout
    assert "py-stdout-line" in (log_dir / "attempt-1.log").read_text()  # the first attempt's log was not replaced


def test_next_number_follows_the_highest_and_never_overwrites(tmp_path):
    (tmp_path / "attempt-2.log").write_text("kept\n")
    (tmp_path / "attempt-x.log").write_text("ignored\n")
    n, path, fd = create_attempt_file(tmp_path)
    os.close(fd)
    assert (n, path.name) == (3, "attempt-3.log")
    assert (tmp_path / "attempt-2.log").read_text() == "kept\n"


def test_concurrent_attempts_get_distinct_numbers(tmp_path):
    got: list[int] = []
    lock = threading.Lock()

    def create():
        n, _, fd = create_attempt_file(tmp_path)
        os.close(fd)
        with lock:
            got.append(n)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 9))


def test_a_traceback_reaches_the_file_and_the_exit_code_is_1(tmp_path):
    script = ("import sys\nfrom dapo.train.runlog import AttemptLog\nwith AttemptLog(sys.argv[1]):\n"
              "    raise RuntimeError('boom-in-the-loop')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 1
    text = (tmp_path / "attempt-1.log").read_text()
    assert "RuntimeError: boom-in-the-loop" in text and text.splitlines()[-1].startswith("dapo: exit code 1")
    assert proc.stderr.count("RuntimeError: boom-in-the-loop") == 1  # Python prints it once on the console


@pytest.mark.parametrize("argv", [["--dry-run"], ["--no-attempt-log", "--dry-run"]])
def test_dry_run_writes_no_attempt_log(tmp_path, argv, capsys):
    from dapo.train.cli import main

    assert main(["--preset", "tiny", "--run-dir", str(tmp_path / "run"), *argv]) == 0
    assert not (tmp_path / "run" / "logs").exists()


def test_dapo_train_writes_the_attempt_log_under_the_run_dir(tmp_path):
    """`dapo train` with a configuration the local backend refuses at setup still leaves its attempt log."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "dapo.train", "--preset", "tiny", "--run-dir", str(run_dir),
                           "--device", "cuda:99", "--no-progress"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    log = run_dir / "logs" / "attempt-1.log"
    text = log.read_text()
    assert f"this attempt's log (stdout + stderr): {log}" in proc.stdout.splitlines()[0]
    assert "cuda:99" in text and text.splitlines()[-1] == f"dapo: exit code 2 | log {log}"


def test_verl_run_dir_resolves_the_trainer_references():
    from dapo.config import load_preset
    from dapo.train.cli import build_parser, run_dir_of

    args = build_parser().parse_args(["--preset", "full"])
    assert run_dir_of(load_preset("full"), args) == Path("/shared/checkpoints/DAPO-verl/DAPO-Qwen2.5-32B")


LOOP_UNDER_A_TTY = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    from dapo.config import load_preset
    from dapo.train.loop import DAPOLoop
    from dapo.train.runlog import AttemptLog
    from loop_support import ScriptedBackend, make_rows

    preset = load_preset("tiny", ["recipe.data.train_batch_size=2", "recipe.data.gen_batch_size=4",
                                  "recipe.rollout.n=2", "recipe.actor.ppo_mini_batch_size=1",
                                  "recipe.trainer.logger=[console]", "recipe.trainer.total_training_steps=2",
                                  "recipe.trainer.save_freq=0", "recipe.trainer.test_freq=0",
                                  "recipe.trainer.val_before_train=false",
                                  "recipe.filter_groups.max_num_gen_batches=0"])
    with AttemptLog(sys.argv[1]) as log:
        loop = DAPOLoop(preset, ScriptedBackend(seed=0), make_rows([0.5] * 40), [], sys.argv[1] + "/run",
                        progress=True)
        log.close(loop.fit())
""")


def test_progress_bar_stays_on_the_console_and_each_line_is_logged_once(tmp_path):
    """On an interactive console the loop draws its bar there, never into the attempt log, and its step lines reach
    the log exactly once."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal 120 columns wide
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", LOOP_UNDER_A_TTY, str(tmp_path), str(ROOT / "tests")],
                            stdout=slave, stderr=slave, env=env)
    os.close(slave)
    console = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        console += chunk
    assert proc.wait(timeout=120) == 0, console.decode(errors="replace")[-3000:]
    text = (tmp_path / "attempt-1.log").read_text()
    for step in (1, 2):
        assert sum(line.startswith(f"step {step}/2 ") for line in text.splitlines()) == 1, text
    assert "\r" not in text and "DAPO:" not in text  # no progress bar in the file
    assert b"DAPO:" in console  # the bar is on the console


# a tiny run whose dynamic sampler never fills a batch (a 1-step warm start answers nothing right) with
# max_num_gen_batches unlimited: it stays in step 1 until it is stopped
STUCK = ["local.model.hidden_size=64", "local.model.num_hidden_layers=1", "local.model.num_attention_heads=2",
         "local.model.num_key_value_heads=2", "local.model.intermediate_size=128", "local.task.n_train=400",
         "local.task.n_val=8", "local.warm_start.steps=1", "recipe.data.train_batch_size=4",
         "recipe.data.gen_batch_size=6", "recipe.rollout.n=4", "recipe.actor.ppo_mini_batch_size=2",
         "local.micro_batch_size=8", "recipe.filter_groups.max_num_gen_batches=0", "recipe.trainer.logger=[console]",
         "recipe.trainer.val_before_train=false", "placement.device=cpu"]


def test_sigterm_stops_the_loop_like_ctrl_c_and_the_log_gets_its_last_lines(tmp_path):
    import signal
    import time

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "dapo.train", "--preset", "tiny", "--run-dir", str(run_dir),
                             "--no-progress", *STUCK], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    log = run_dir / "logs" / "attempt-1.log"
    deadline = time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:
            if log.is_file() and "after 10 generation batches" in log.read_text():
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    text = log.read_text()
    assert "interrupted during step 1; newest checkpoint: none" in text
    assert text.splitlines()[-1] == f"dapo: exit code 130 | log {log}"


def test_both_writers_start_with_the_utc_start_and_end_with_an_exit_code_the_reader_knows(tmp_path):
    """The follower finds an attempt's start on its first line and its end on its last, from dapo.train.runlog and
    from the reference runner's dapo.reference.attempt_log alike (each proc's file, not a copy of the format)."""
    import time
    from datetime import datetime, timezone

    from dapo.train.runlog import exit_code_of, started_at

    before = datetime.now(timezone.utc).replace(microsecond=0)
    ours = _attempt(tmp_path / "ours", 3)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ref = subprocess.run([sys.executable, "-m", "dapo.reference.attempt_log", "--log-dir", str(tmp_path / "ref"), "--",
                          sys.executable, "-c", "print('recipe line'); raise SystemExit(4)"], capture_output=True,
                         env=env, timeout=60)
    assert (ours.returncode, ref.returncode) == (3, 4)
    time.sleep(0.01)
    after = datetime.now(timezone.utc)
    for path, rc in ((tmp_path / "ours" / "attempt-1.log", 3), (tmp_path / "ref" / "attempt-1.log", 4)):
        lines = path.read_bytes().splitlines(keepends=True)
        assert before <= started_at(lines[0]) <= after, lines[0]
        assert exit_code_of(lines[-1], 1) == rc
        assert exit_code_of(lines[-1], 2) is None  # another attempt's exit line
        assert all(exit_code_of(line, 1) is None for line in lines[:-1])
    assert started_at(b"dapo: this attempt's log (stdout + stderr): /x/attempt-1.log | started 2025-06-01 "
                      b"12:00:00 CEST\n") is None  # an older log in a local time zone: unknown, not wrong
    assert exit_code_of(b"dapo: exit code -9 | log /r/logs/attempt-12.log\n", 12) == -9


@pytest.mark.parametrize("body, code", [("raise SystemExit()", 0), ("raise SystemExit(5)", 5),
                                        ("raise SystemExit('bad input')", 1), ("return 7", 7)])
def test_run_logged_writes_the_status_python_exits_with(tmp_path, body, code):
    script = (f"import sys\nfrom dapo.train.runlog import run_logged\ndef fn():\n    {body}\n"
              "sys.exit(run_logged(sys.argv[1], fn, header='t', prog='t'))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == code, proc.stderr
    last = (tmp_path / "attempt-1.log").read_text().splitlines()[-1]
    assert last == f"dapo: exit code {code} | log {tmp_path / 'attempt-1.log'}"


def test_dapo_eval_run_writes_an_attempt_log_under_its_output(tmp_path):
    """Each attempt of the evaluation RayJob (`dapo eval run --output DIR`) leaves DIR/logs/attempt-<N>.log, even when
    it stops at once (here: no checkpoint yet); without --output, or with --no-attempt-log, none."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    test_file = tmp_path / "aime.parquet"
    test_file.write_bytes(b"")
    base = [sys.executable, "-m", "dapo.eval", "run", "--checkpoint-dir", str(tmp_path / "ckpt"), "--test-file",
            str(test_file)]
    (tmp_path / "ckpt").mkdir()
    for n in (1, 2):
        proc = subprocess.run(base + ["--output", str(tmp_path / "out")], capture_output=True, text=True, env=env,
                              timeout=120)
        assert proc.returncode == 1, proc.stderr
        log = tmp_path / "out" / "logs" / f"attempt-{n}.log"
        text = log.read_text()
        assert "no checkpoint in" in text and text.splitlines()[-1] == f"dapo: exit code 1 | log {log}"
    proc = subprocess.run(base + ["--output", str(tmp_path / "out2"), "--no-attempt-log"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 1 and not (tmp_path / "out2" / "logs").exists()

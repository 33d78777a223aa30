"""Checkpoint retention (dapo.train.checkpoint.prune): the newest max_ckpt_to_keep complete checkpoints stay, at most
keep + 1 exist at any time, and a process killed while deleting never leaves the newest complete checkpoint -- or
any directory a reader would take for a checkpoint -- damaged."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT
from dapo.train import checkpoint as ckpt


def _write_backend(directory: str) -> None:
    d = Path(directory) / "actor"
    d.mkdir(parents=True)
    for i in range(20):  # many files, so a deletion can be interrupted half way
        (d / f"shard_{i:02d}.bin").write_bytes(os.urandom(256))


def _save(root: Path, step: int, keep) -> Path:
    return ckpt.save(root, step, _write_backend, {"step": step}, max_to_keep=keep)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(path.rglob("*")):
        if f.is_file():
            h.update(str(f.relative_to(path)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("keep, expected", [(1, [6]), (2, [5, 6]), (3, [4, 5, 6]), (None, [1, 2, 3, 4, 5, 6]),
                                            (0, [1, 2, 3, 4, 5, 6])])
def test_keeps_the_newest_max_ckpt_to_keep_complete_checkpoints(tmp_path, keep, expected):
    for step in range(1, 7):
        _save(tmp_path, step, keep)
    assert ckpt.complete_steps(tmp_path) == expected
    assert (tmp_path / ckpt.POINTER).read_text().strip() == "6"
    assert not list(tmp_path.glob(".trash-*")) and not list(tmp_path.glob(".tmp-*"))


def test_never_more_than_keep_plus_one_checkpoints_on_disk_during_a_save(tmp_path):
    seen = []

    def write(directory: str) -> None:
        _write_backend(directory)
        seen.append(len([p for p in tmp_path.iterdir() if p.name.startswith(("global_step_", ".tmp-", ".trash-"))]))

    for step in range(1, 6):
        ckpt.save(tmp_path, step, write, {"step": step}, max_to_keep=2)
    assert max(seen) == 3  # keep 2 complete + the one being written


def test_lowered_retention_is_applied_before_the_next_save_writes(tmp_path):
    for step in range(1, 5):
        _save(tmp_path, step, None)
    counts = []

    def write(directory: str) -> None:
        counts.append(len(ckpt.complete_steps(tmp_path)))
        _write_backend(directory)

    ckpt.save(tmp_path, 5, write, {"step": 5}, max_to_keep=1)
    assert counts == [1] and ckpt.complete_steps(tmp_path) == [5]


def test_an_interrupted_deletion_leaves_only_trash_and_the_newest_intact(tmp_path):
    for step in range(1, 4):
        _save(tmp_path, step, None)
    newest = _digest(tmp_path / "global_step_3")

    def dies_half_way(path: Path) -> None:
        files = sorted(Path(path).rglob("*.bin"))
        for f in files[: len(files) // 2]:
            f.unlink()
        raise KeyboardInterrupt  # the process goes away in the middle of rmtree

    with pytest.raises(KeyboardInterrupt):
        ckpt.prune(tmp_path, 1, _rmtree=dies_half_way)
    # the half-deleted checkpoint is no checkpoint any more: it sits under .trash-*
    assert ckpt.complete_steps(tmp_path) == [2, 3]
    assert len(list(tmp_path.glob(".trash-global_step_1-*"))) == 1
    assert ckpt.latest(tmp_path) == tmp_path / "global_step_3" and _digest(tmp_path / "global_step_3") == newest
    # the next prune (a resume, or the next save) clears the trash and finishes the job
    assert ckpt.prune(tmp_path, 1) == [2]
    assert ckpt.complete_steps(tmp_path) == [3] and not list(tmp_path.glob(".trash-*"))
    assert _digest(tmp_path / "global_step_3") == newest


KILLER = textwrap.dedent("""
    import os, shutil, signal, sys
    from pathlib import Path
    from dapo.train import checkpoint as ckpt

    root, where = Path(sys.argv[1]), sys.argv[2]
    real_rename = Path.rename

    def rename(self, target):
        if where == "before-rename" and Path(target).name.startswith("global_step_"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_rename(self, target)

    def rmtree(path):
        files = sorted(Path(path).rglob("*.bin"))
        for f in files[: len(files) // 2]:
            f.unlink()
        os.kill(os.getpid(), signal.SIGKILL)

    Path.rename = rename
    ckpt.prune(root, 1, _rmtree=rmtree)
""")


@pytest.mark.parametrize("where", ["before-rename", "mid-rmtree"])
def test_sigkill_during_deletion_never_damages_a_checkpoint(tmp_path, where):
    for step in range(1, 4):
        _save(tmp_path, step, None)
    before = {s: _digest(tmp_path / f"global_step_{s}") for s in (1, 2, 3)}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", KILLER, str(tmp_path), where], env=env, timeout=60,
                          capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    # whatever a reader still calls a checkpoint is byte-for-byte what was saved; the newest is always there
    remaining = ckpt.complete_steps(tmp_path)
    assert remaining[-1] == 3 and remaining == ([1, 2, 3] if where == "before-rename" else [2, 3])
    for s in remaining:
        assert _digest(tmp_path / f"global_step_{s}") == before[s]
    # the retry's save cleans up and keeps exactly max_ckpt_to_keep
    _save(tmp_path, 4, 1)
    assert ckpt.complete_steps(tmp_path) == [4] and not list(tmp_path.glob(".trash-*"))


def test_incomplete_step_directories_older_than_the_newest_are_removed(tmp_path):
    for step in (1, 2):
        _save(tmp_path, step, None)
    (tmp_path / "global_step_0" / "actor").mkdir(parents=True)  # e.g. a copy that never got its COMPLETE marker
    assert ckpt.prune(tmp_path, 5) == [0]
    assert ckpt.complete_steps(tmp_path) == [1, 2] and not (tmp_path / "global_step_0").exists()


@pytest.mark.parametrize("name", ["full", "early", "7b", "smoke"])
def test_gpu_presets_bound_their_checkpoints_and_verl_config_carries_it(name):
    from dapo.backends.verl import config as verl_config
    from dapo.config import load_preset

    preset = load_preset(name)
    keep = preset.recipe.trainer.max_ckpt_to_keep
    assert isinstance(keep, int) and keep >= 1
    assert verl_config.resolve(preset).cfg.trainer.max_actor_ckpt_to_keep == keep


def test_verl_backend_leaves_rotation_to_dapo_checkpoint():
    """verl's rotation forgets earlier attempts' checkpoints (its list lives in memory), so verl is told to delete
    nothing; dapo.train.checkpoint.prune (which scans the directory) does it for both backends."""
    from types import SimpleNamespace

    from dapo.backends.verl.workers import RayWorkers

    calls = []

    class WorkerGroup:
        def save_checkpoint(self, *args, **kwargs):
            calls.append((args, kwargs))

    workers = RayWorkers.__new__(RayWorkers)  # the GPU-side object without its Ray worker groups
    workers.trainer = SimpleNamespace(actor_rollout_wg=WorkerGroup())
    workers._awake = False
    workers.save_checkpoint("/ckpt/global_step_5/actor", 5)
    assert calls == [(("/ckpt/global_step_5/actor", None, 5), {"max_ckpt_to_keep": None})]

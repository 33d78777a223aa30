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


@pytest.mark.parametrize("name", ["full", "early", "7b", "smoke", "one-gpu"])
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


# --- the best checkpoint --------------------------------------------------------------------------------------------

def _run_with_scores(root: Path, scores: dict[int, float], keep: int, steps) -> None:
    """Save each step, then record its validation (the loop's order: save, then validate)."""
    for step in steps:
        _save(root, step, keep)
        if step in scores:
            ckpt.record_validation(root, step, scores[step])


def test_the_best_checkpoint_is_kept_besides_the_newest_even_when_it_is_old(tmp_path):
    scores = {1: 0.20, 2: 0.55, 3: 0.40, 4: 0.41, 5: 0.30, 6: 0.50, 7: 0.52, 8: 0.54}
    _run_with_scores(tmp_path, scores, keep=2, steps=range(1, 9))
    assert ckpt.best_step(tmp_path) == 2
    assert ckpt.complete_steps(tmp_path) == [2, 7, 8]
    assert ckpt.best_record(tmp_path) == {"step": 2, "score": 0.55}


def test_a_higher_score_moves_the_best_and_frees_the_old_one(tmp_path):
    scores = {1: 0.5, 2: 0.1, 3: 0.1, 4: 0.9, 5: 0.2, 6: 0.2}
    _run_with_scores(tmp_path, scores, keep=1, steps=range(1, 7))
    assert ckpt.complete_steps(tmp_path) == [4, 6]  # step 1 was the best until step 4 beat it
    assert ckpt.best_step(tmp_path) == 4


def test_a_tie_keeps_the_earlier_best_and_a_missing_score_changes_nothing(tmp_path):
    _run_with_scores(tmp_path, {1: 0.5, 2: 0.5, 3: float("nan")}, keep=1, steps=range(1, 4))
    ckpt.record_validation(tmp_path, 3, None)
    assert ckpt.best_step(tmp_path) == 1 and ckpt.complete_steps(tmp_path) == [1, 3]


def test_a_validation_without_a_checkpoint_of_its_step_is_not_a_best(tmp_path):
    _save(tmp_path, 5, 1)
    assert ckpt.record_validation(tmp_path, 0, 0.9) is None  # validation before training: nothing to keep
    assert ckpt.record_validation(tmp_path, 7, 0.9) is None  # a step validated but not saved
    assert not (tmp_path / ckpt.BEST).exists()


def test_the_best_record_survives_a_restart_and_a_lowered_retention(tmp_path):
    """Across retries: the record is a file beside the checkpoints; a new process (here: fresh calls) reads it."""
    _run_with_scores(tmp_path, {1: 0.2, 2: 0.8, 3: 0.3, 4: 0.3}, keep=3, steps=range(1, 5))
    assert ckpt.complete_steps(tmp_path) == [2, 3, 4] and ckpt.best_step(tmp_path) == 2
    assert ckpt.prune(tmp_path, 1) == [3]  # the resume-time prune of a lowered max_ckpt_to_keep
    _run_with_scores(tmp_path, {5: 0.1, 6: 0.1}, keep=1, steps=[5, 6])
    assert ckpt.complete_steps(tmp_path) == [2, 6] and ckpt.best_step(tmp_path) == 2


def test_a_record_whose_checkpoint_is_gone_is_replaced(tmp_path):
    _run_with_scores(tmp_path, {1: 0.9}, keep=1, steps=[1])
    ckpt.discard(tmp_path, 1)  # removed by hand
    _run_with_scores(tmp_path, {2: 0.1}, keep=1, steps=[2])
    assert ckpt.best_step(tmp_path) == 2


class _ScoredBackend:
    """A scripted backend (tests/loop_support.py) whose validation accuracy after its n-th update is ``acc[n]`` (0 when
    absent); its update count is part of its checkpoint."""

    @staticmethod
    def make(acc: dict[int, float]):
        from loop_support import ScriptedBackend

        class Scored(ScriptedBackend):
            done = 0

            def generate(self, prompts, sampling, group_ids=None):
                rollout = super().generate(prompts, sampling, group_ids)
                if sampling.validation:
                    n = len(rollout.response_text)
                    right = round(acc.get(self.done, 0.0) * n)
                    rollout.response_text[right:] = ["Answer: -1"] * (n - right)
                return rollout

            def update(self, batch, advantages, loss_mask=None):
                self.done += 1
                return super().update(batch, advantages, loss_mask)

            def save_checkpoint(self, directory):
                super().save_checkpoint(directory)
                (Path(directory) / "done.txt").write_text(str(self.done))

            def load_checkpoint(self, directory):
                super().load_checkpoint(directory)
                self.done = int((Path(directory) / "done.txt").read_text())

        return Scored()


def _loop_run(root: Path, backend, steps: int) -> None:
    from dapo.config import load_preset
    from dapo.train.loop import DAPOLoop
    from loop_support import make_rows

    over = ["recipe.trainer.save_freq=1", "recipe.trainer.test_freq=1", "recipe.trainer.max_ckpt_to_keep=1",
            "recipe.trainer.val_before_train=false", "recipe.trainer.logger=[console]",
            f"recipe.trainer.total_training_steps={steps}"]
    train, val = make_rows([0.5] * 64), make_rows([1.0] * 4, data_source="val")
    preset = load_preset("tiny", over)
    assert DAPOLoop(preset, backend, train, val, root, progress=False, log=lambda m: None).fit() == 0


def test_the_local_loop_keeps_its_best_validated_checkpoint_across_a_resume(tmp_path):
    """The loop (what both backends run) over a scripted backend whose validation accuracy peaks at step 2 and falls
    afterwards: after 6 steps with max_ckpt_to_keep 1, and again after a resumed run to step 8, step 2 is still
    there."""
    from loop_support import assert_the_kept_best_has_the_best_validation

    root = tmp_path / "checkpoints"
    for steps in (6, 8):
        _loop_run(tmp_path, _ScoredBackend.make({2: 1.0}), steps)
        assert ckpt.complete_steps(root) == [2, steps], ckpt.complete_steps(root)
        assert assert_the_kept_best_has_the_best_validation(tmp_path, 1, steps) == (2, 1.0)


def test_a_new_best_after_the_last_save_frees_the_old_best_before_the_run_ends(tmp_path):
    """The loop saves a step before validating it (verl's order): when the last step's validation beats an older
    best, the older one is deleted then, not left beside the newest until a next save that never comes."""
    from loop_support import assert_the_kept_best_has_the_best_validation

    _loop_run(tmp_path, _ScoredBackend.make({2: 0.5, 4: 1.0}), 4)
    root = tmp_path / "checkpoints"
    assert assert_the_kept_best_has_the_best_validation(tmp_path, 1, 4) == (4, 1.0)
    assert ckpt.complete_steps(root) == [4], ckpt.complete_steps(root)


def test_on_the_loop_a_tie_keeps_the_earliest_best_validated_step(tmp_path):
    """Steps 2 and 4 validate equally well, the others worse: the kept best is step 2, the first to reach the score
    (the rule the e2e and rehearsal checks read the run's metrics with)."""
    from loop_support import assert_the_kept_best_has_the_best_validation

    _loop_run(tmp_path, _ScoredBackend.make({1: 0.25, 2: 0.5, 3: 0.25, 4: 0.5}), 5)
    assert assert_the_kept_best_has_the_best_validation(tmp_path, 1, 5) == (2, 0.5)
    assert ckpt.complete_steps(tmp_path / "checkpoints") == [2, 5]

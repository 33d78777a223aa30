"""Atomic checkpoints of a DAPO run: a half-written checkpoint is never picked up.

Layout under ``<run_dir>/checkpoints/``::

    global_step_20/           one complete checkpoint
        actor/ ...            backend-owned: weights (HF directory), optimizer, scheduler, sampling RNG
        loop_state.pt         loop-owned: step, data cursor, sampler state, python/numpy/torch RNG states, history
        COMPLETE              written last, inside the temporary directory
    latest_checkpointed_iteration.txt   the newest complete step (verl's file name), replaced atomically

Writing: everything goes to ``.tmp-global_step_N-XXXX`` in the same directory, then one ``rename`` makes it
``global_step_N`` (atomic on POSIX within a file system), then the pointer file is replaced with ``os.replace``.
Reading (:func:`latest`) only considers ``global_step_*`` directories holding ``COMPLETE``; stale ``.tmp-*``
directories of a killed writer are removed on the next save.

Retention (``max_to_keep`` = ``recipe.trainer.max_ckpt_to_keep``, :func:`prune`): the newest ``max_to_keep``
complete checkpoints stay, older ones go -- except the checkpoint with the best validation score so far, which is
never deleted. :func:`record_validation` keeps that record in ``best_checkpoint.json`` beside the checkpoints (written
atomically, so it survives retries and resume like the checkpoints themselves): a validated step whose complete
checkpoint exists becomes the best when its score is higher than the recorded one (or the recorded one's checkpoint is
gone). At most ``max_to_keep + 2`` checkpoints then exist at any moment (the newest ``max_to_keep``, the best, the
one being written). A checkpoint is deleted in two steps: one ``rename`` to
``.trash-global_step_N-XXXX`` (atomic: from then on no reader counts it), then ``rmtree`` of the trash directory. A
process killed in the middle leaves either a complete ``global_step_N`` or a ``.trash-*`` directory, never a
half-deleted ``global_step_N``; leftovers are removed on the next save and on resume. The newest complete checkpoint
is never a candidate. :func:`save` prunes to ``max_to_keep`` *before* writing and again after, so the directory
holds at most ``max_to_keep + 1`` checkpoints besides the best at any moment (the bound ``dapo plan`` sizes the
volume with), even after a crash between a save and its pruning or after ``max_to_keep`` was lowered.

verl 0.9.1's own rotation (``BaseCheckpointManager.register_checkpoint`` / ``ensure_checkpoint_capacity``) keeps its
list of saved paths in memory -- a restarted job forgets the checkpoints of earlier attempts and never deletes them
-- and deletes with a plain ``rmtree``. The verl backend therefore passes ``max_ckpt_to_keep=None`` to verl's
``save_checkpoint`` (verl deletes nothing) and this module does the retention for both backends.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from dapo.util.fsutil import fsync_dir

POINTER = "latest_checkpointed_iteration.txt"
BEST = "best_checkpoint.json"
TRASH_PREFIX = ".trash-"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def checkpoint_root(run_dir: Path | str) -> Path:
    return Path(run_dir) / "checkpoints"


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU and, when present, CUDA) RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def complete_steps(root: Path | str) -> list[int]:
    """Steps of the complete checkpoints under ``root``, ascending."""
    root = Path(root)
    if not root.is_dir():
        return []
    steps = []
    for d in root.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and d.is_dir() and (d / "COMPLETE").exists():
            steps.append(int(m.group(1)))
    return sorted(steps)


def latest(root: Path | str) -> Optional[Path]:
    """The newest complete checkpoint directory, or None."""
    steps = complete_steps(root)
    return Path(root) / f"global_step_{steps[-1]}" if steps else None


def save(
    root: Path | str,
    step: int,
    write_backend: Callable[[str], None],
    loop_state: dict[str, Any],
    *,
    max_to_keep: Optional[int] = None,
) -> Path:
    """Write checkpoint ``step`` atomically; returns its directory. ``write_backend(dir)`` writes the backend part."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    prune(root, max_to_keep)  # room for this save within max_to_keep + 1 checkpoints, trash of a killed run gone
    final = root / f"global_step_{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-global_step_{step}-", dir=root))
    try:
        write_backend(str(tmp))
        torch.save(loop_state, tmp / "loop_state.pt")
        (tmp / "COMPLETE").write_text(f"{step}\n")
        fsync_dir(tmp)
        if final.exists():  # a re-save of the same step (e.g. a health stop right after a periodic save)
            old = root / f".tmp-old-{final.name}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    pointer_tmp = root / f".{POINTER}.tmp"
    pointer_tmp.write_text(f"{step}\n")
    os.replace(pointer_tmp, root / POINTER)
    fsync_dir(root)
    prune(root, max_to_keep)
    return final


def remove_trash(root: Path | str) -> list[str]:
    """Delete the ``.trash-*`` directories a killed deletion left behind; returns their names."""
    root = Path(root)
    if not root.is_dir():
        return []
    gone = []
    for trash in sorted(root.glob(f"{TRASH_PREFIX}*")):
        shutil.rmtree(trash, ignore_errors=True)
        gone.append(trash.name)
    return gone


def discard(root: Path | str, step: int, *, _rmtree: Callable[[Path], None] = shutil.rmtree) -> None:
    """Delete checkpoint ``step``: atomic rename to ``.trash-global_step_<step>-XXXX``, then remove that directory."""
    root = Path(root)
    src = root / f"global_step_{step}"
    trash = Path(tempfile.mkdtemp(prefix=f"{TRASH_PREFIX}{src.name}-", dir=root))
    dest = trash / src.name
    src.rename(dest)  # from here on no reader sees it as a checkpoint
    fsync_dir(root)
    _rmtree(trash)


def prune(root: Path | str, max_to_keep: Optional[int], *,
          _rmtree: Callable[[Path], None] = shutil.rmtree) -> list[int]:
    """Keep the newest ``max_to_keep`` complete checkpoints and the best one (:func:`best_step`; None or <= 0: keep
    all); returns the deleted steps.

    Also removes leftover trash, and ``global_step_*`` directories without ``COMPLETE`` that are older than the newest
    complete checkpoint (nothing can resume from them). The newest complete checkpoint is never touched."""
    root = Path(root)
    remove_trash(root)
    steps = complete_steps(root)
    if not steps:
        return []
    newest = steps[-1]
    deleted = []
    for s in victims(root, max_to_keep):
        if s == newest:  # unreachable by construction; a guard against a future edit
            raise RuntimeError(f"refusing to delete the newest complete checkpoint global_step_{s}")
        discard(root, s, _rmtree=_rmtree)
        deleted.append(s)
    return deleted


def victims(root: Path | str, max_to_keep: Optional[int]) -> list[int]:
    """The steps :func:`prune` deletes: complete checkpoints beyond the newest ``max_to_keep`` (never the best), and
    incomplete ``global_step_*`` directories older than the newest complete checkpoint."""
    root = Path(root)
    steps = complete_steps(root)
    if not steps:
        return []
    newest = steps[-1]
    out = steps[:-max_to_keep] if max_to_keep is not None and max_to_keep > 0 else []
    best = best_step(root)
    out = [s for s in out if s != best]
    for d in root.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and d.is_dir() and int(m.group(1)) < newest and not (d / "COMPLETE").exists():
            out.append(int(m.group(1)))
    return sorted(set(out))


def quarantine(root: Path | str, step: int, why: str) -> Path:
    """Move checkpoint ``step`` out of every reader's sight (``.nonfinite-global_step_<step>``, with ``why`` in a
    file beside its content): it stays on disk for a post-mortem, and no resume picks it up again."""
    root = Path(root)
    dest = root / f".nonfinite-global_step_{step}"
    if dest.exists():
        shutil.rmtree(dest, ignore_errors=True)
    (root / f"global_step_{step}").rename(dest)
    (dest / "QUARANTINED").write_text(why.rstrip("\n") + "\n")
    fsync_dir(root)
    return dest


def best_record(root: Path | str) -> Optional[dict[str, Any]]:
    """The recorded best validation (``{"step", "score"}``), or None (no record, or an unreadable one)."""
    try:
        rec = json.loads((Path(root) / BEST).read_text())
        return {"step": int(rec["step"]), "score": float(rec["score"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def best_step(root: Path | str) -> Optional[int]:
    """The step of the checkpoint with the best validation score so far, if that checkpoint is complete."""
    rec = best_record(root)
    if rec is None or rec["step"] not in complete_steps(root):
        return None
    return rec["step"]


def record_validation(root: Path | str, step: int, score: Optional[float]) -> Optional[int]:
    """Record the validation ``score`` of ``step``; it becomes the best when checkpoint ``step`` is complete and the
    score beats the recorded best (or that one's checkpoint is gone). Returns the best step afterwards."""
    root = Path(root)
    current = best_step(root)
    if score is None or math.isnan(score) or step not in complete_steps(root):
        return current
    rec = best_record(root)
    if current is not None and rec is not None and score <= rec["score"]:
        return current
    tmp = root / f".{BEST}.tmp"
    tmp.write_text(json.dumps({"step": int(step), "score": float(score)}) + "\n")
    os.replace(tmp, root / BEST)
    fsync_dir(root)
    return int(step)


def load_loop_state(ckpt_dir: Path | str) -> dict[str, Any]:
    return torch.load(Path(ckpt_dir) / "loop_state.pt", map_location="cpu", weights_only=False)

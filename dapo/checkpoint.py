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
"""

from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from dapo.fsutil import fsync_dir

POINTER = "latest_checkpointed_iteration.txt"
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
    if max_to_keep is not None and max_to_keep > 0:
        for s in complete_steps(root)[:-max_to_keep]:
            shutil.rmtree(root / f"global_step_{s}", ignore_errors=True)
    return final


def load_loop_state(ckpt_dir: Path | str) -> dict[str, Any]:
    return torch.load(Path(ckpt_dir) / "loop_state.pt", map_location="cpu", weights_only=False)

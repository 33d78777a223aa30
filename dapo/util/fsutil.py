"""Crash-safe file writes shared by every writer in the bundle (data files, checkpoints, eval answers, metrics).

The rule everywhere: write to a temporary sibling on the same file system, then ``os.replace`` it into place, so a
reader (or a rerun after ``kill -9``) sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory entry (a rename inside it) to disk; silently a no-op where the OS does not allow it."""
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_beside(path: str | os.PathLike, suffix: str = ".tmp") -> Path:
    """An empty temporary file next to ``path`` (same file system, so ``os.replace`` is atomic) with the permissions
    a normal file would get (``mkstemp`` makes it 0600, which other pods' users could not read)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    return Path(tmp)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None], *, durable: bool = False) -> Path:
    """Call ``write(tmp)`` on a temporary sibling of ``path``, then move it into place; the temporary file is removed
    on any failure. ``durable`` also fsyncs the file and its directory (survives a power cut, not only a crash)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_beside(path)
    try:
        write(tmp)
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str, *, durable: bool = False) -> Path:
    """Replace ``path`` with ``text`` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text), durable=durable)


def atomic_dir(final: str | os.PathLike, build: Callable[[Path], None]) -> Path:
    """Build a directory with ``build(tmp)`` in a temporary sibling and rename it to ``final`` when complete.

    An existing ``final`` is returned as is (it was completed earlier); a failed build leaves nothing behind."""
    final = Path(final)
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        build(tmp)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final

"""Turn a training checkpoint into an HF-format model directory that vLLM / Ray Serve LLM can serve.

Layouts understood (``CKPT`` = the run's ``trainer.default_local_dir``):

- **verl FSDP** (the cluster): ``CKPT/latest_checkpointed_iteration.txt`` names the step;
  ``CKPT/global_step_N/actor/`` holds ``fsdp_config.json`` (``world_size``), one ``model_world_size_W_rank_R.pt``
  per rank (the sharded state dict: DTensors, or plain replicated tensors) and ``huggingface/`` (config, tokenizer,
  generation config). The shards are merged by :mod:`dapo.eval.fsdp_merge`, with torch alone (the evaluation image
  has no verl): each DTensor is rebuilt from its ranks' local pieces following its device mesh and placements
  (``Shard(d)``: concatenate along ``d`` in mesh order, ``Replicate``: take one copy), checked against its global
  shape, cast to ``dtype`` (default bfloat16, what verl's own model merger writes) and streamed into
  ``model-0000i-of-0000n.safetensors`` files of at most ``max_shard_bytes`` with a ``model.safetensors.index.json``.
  Shards are memory-mapped and merged one entry at a time: peak memory is one output file (5 GB) plus one
  full-precision tensor, not the model. The merged weights equal those of
  ``python -m verl.model_merger merge --backend fsdp`` (tested against it).
- **verl at the reference commit 4f80e46** (the upstream DAPO recipe, ``train.runner: reference``): the same
  ``global_step_N/actor/model_world_size_W_rank_R.pt`` files (FSDP1 ``SHARDED_STATE_DICT`` with a 1-D ``fsdp``
  device mesh: DTensors, ``Shard(0)``), plus ``optim_*``/``extra_state_*`` files, ``huggingface/`` with config and
  tokenizer only (4f80e46's ``hf_model`` saves no weights) and ``global_step_N/data.pt``, but no
  ``fsdp_config.json``: the world size is read from the shard names, as that commit's ``scripts/model_merger.py``
  does (it lists ``model_world_size_<W>_rank_0.pt``).
- **verl with ``hf_model`` in ``checkpoint.save_contents``**: ``actor/huggingface/`` already holds full weights;
  it is served as is.
- **the local backend** (``dapo train`` with ``placement.backend: local``): ``RUN/checkpoints/global_step_N/actor/``
  is an HF directory, complete when ``global_step_N/COMPLETE`` exists; served as is. ``--checkpoint-dir`` may name
  ``RUN`` or ``RUN/checkpoints``.
- **an HF directory** (``config.json`` + weights): served as is.

Step selection: ``latest`` (the tracker file, else the highest ``global_step_N``) or a number. The export is written
to a temporary sibling directory, completed with a marker file (``.dapo-export.json``), and renamed into place
atomically: a target with the marker is reused (skipped), a target without it is never overwritten.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from dapo.eval.fsdp_merge import DEFAULT_MAX_SHARD_BYTES, DTYPES, WEIGHT_GLOBS, ExportError, merge_verl_fsdp

TRACKER = "latest_checkpointed_iteration.txt"
MARKER = ".dapo-export.json"
STEP_RE = re.compile(r"^global_step_(\d+)$")


@dataclass
class ExportResult:
    # The HF-format directory to serve.
    path: Path
    # The training step it comes from (None for a plain HF directory).
    step: Optional[int]
    # "merged" (written now), "reused" (an earlier complete export), "as-is" (already HF format).
    action: str
    source: Path


def has_weights(d: Path) -> bool:
    return any(any(d.glob(g)) for g in WEIGHT_GLOBS)


def is_hf_dir(d: Path) -> bool:
    return (d / "config.json").is_file() and has_weights(d)


def list_steps(ckpt_dir: Path) -> list[int]:
    if not ckpt_dir.is_dir():
        return []
    return sorted(int(m.group(1)) for p in ckpt_dir.iterdir() if p.is_dir() and (m := STEP_RE.match(p.name)))


def resolve_step(ckpt_dir: Union[str, Path], step: Union[str, int] = "latest") -> int:
    """The step to export: ``latest`` (tracker file, else the highest ``global_step_N``) or a given number."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        raise ExportError(f"checkpoint directory {ckpt_dir} does not exist")
    steps = list_steps(ckpt_dir)
    if str(step) == "latest":
        tracker = ckpt_dir / TRACKER
        if tracker.is_file():
            text = tracker.read_text().strip()
            try:
                n = int(text)
            except ValueError:
                raise ExportError(f"{tracker} does not hold a step number (it holds {text[:50]!r})") from None
            if n not in steps:
                raise ExportError(
                    f"{tracker} names step {n}, but {ckpt_dir / f'global_step_{n}'} does not exist "
                    f"(steps present: {steps or 'none'})"
                )
            return n
        if not steps:
            raise ExportError(f"no checkpoint in {ckpt_dir}: neither {TRACKER} nor any global_step_N directory")
        return steps[-1]
    try:
        n = int(step)
    except (TypeError, ValueError):
        raise ExportError(f"step must be 'latest' or a number, got {step!r}") from None
    if n not in steps:
        raise ExportError(f"no checkpoint for step {n} in {ckpt_dir} (steps present: {steps or 'none'})")
    return n


def checkpoint_root(checkpoint_dir: Union[str, Path]) -> Path:
    """``trainer.default_local_dir`` as given, or ``RUN/checkpoints`` for a local-backend run directory."""
    ckpt = Path(checkpoint_dir)
    if not list_steps(ckpt) and not (ckpt / TRACKER).exists() and (ckpt / "checkpoints").is_dir():
        return ckpt / "checkpoints"
    return ckpt


def complete_steps(checkpoint_dir: Union[str, Path]) -> list[int]:
    """The saved steps whose checkpoint is complete, ascending; a checkpoint still being written is never listed.

    - local backend (``global_step_N/COMPLETE`` / ``loop_state.pt`` present): the steps with ``COMPLETE`` (written
      last, and the directory is renamed into place);
    - verl: the steps up to the one ``latest_checkpointed_iteration.txt`` names (verl writes the tracker after the
      step's files, so a higher ``global_step_N`` is still being written);
    - neither: an error (nothing says which checkpoints are complete).
    """
    ckpt = checkpoint_root(checkpoint_dir)
    if not ckpt.is_dir():
        raise ExportError(f"checkpoint directory {ckpt} does not exist")
    if is_hf_dir(ckpt):
        raise ExportError(f"{ckpt} is a single HF model directory, not a run's checkpoint directory")
    steps = list_steps(ckpt)
    local = [s for s in steps if any((ckpt / f"global_step_{s}" / f).exists() for f in ("COMPLETE", "loop_state.pt"))]
    if local:
        return [s for s in steps if (ckpt / f"global_step_{s}" / "COMPLETE").exists()]
    tracker = ckpt / TRACKER
    if tracker.is_file():
        text = tracker.read_text().strip()
        try:
            last = int(text)
        except ValueError:
            raise ExportError(f"{tracker} does not hold a step number (it holds {text[:50]!r})") from None
        return [s for s in steps if s <= last]
    if not steps:
        return []
    raise ExportError(
        f"{ckpt} has checkpoints {steps} but neither {TRACKER} (verl) nor COMPLETE markers (local backend): cannot "
        "tell a finished checkpoint from one being written"
    )


def actor_dir(step_dir: Path) -> Path:
    return step_dir / "actor" if (step_dir / "actor").is_dir() else step_dir


def default_target(ckpt_dir: Path, step: int) -> Path:
    return ckpt_dir / f"global_step_{step}" / "hf"


# --------------------------------------------------------------------------------------------------------------------
# Atomic export
# --------------------------------------------------------------------------------------------------------------------


def _fsync_tree(d: Path) -> None:
    for p in sorted(d.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    for p in [d, d.parent]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _clean_stale_tmp(target: Path) -> None:
    """Remove temp dirs of earlier exports to ``target`` from this host whose process is gone."""
    host = socket.gethostname()
    for p in target.parent.glob(f".{target.name}.tmp-*"):
        m = re.match(rf"^\.{re.escape(target.name)}\.tmp-(.+)-(\d+)$", p.name)
        if not m or m.group(1) != host:
            continue
        try:
            os.kill(int(m.group(2)), 0)
        except ProcessLookupError:
            shutil.rmtree(p, ignore_errors=True)
        except PermissionError:
            pass


def _read_marker(target: Path) -> Optional[dict]:
    try:
        return json.loads((target / MARKER).read_text())
    except (FileNotFoundError, ValueError):
        return None


def export_checkpoint(
    checkpoint_dir: Union[str, Path],
    step: Union[str, int] = "latest",
    target: Union[str, Path, None] = None,
    *,
    dtype: str = "bfloat16",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    log=print,
) -> ExportResult:
    """Resolve the step, then merge (or reuse) an HF-format model for it. See the module docstring."""
    ckpt = Path(checkpoint_dir)
    if is_hf_dir(ckpt):
        return ExportResult(ckpt, None, "as-is", ckpt)
    ckpt = checkpoint_root(ckpt)  # a local-backend run directory -> RUN/checkpoints
    n = resolve_step(ckpt, step)
    step_dir = ckpt / f"global_step_{n}"
    actor = actor_dir(step_dir)
    as_is = _served_as_is(step_dir, actor, n, log)
    if as_is is not None:
        return as_is
    out = Path(target) if target else default_target(ckpt, n)
    if _finished_export(out, actor, n):
        log(f"[export] {out} is a complete export of step {n}: reusing it")
        return ExportResult(out, n, "reused", actor)
    return _merge(actor, out, n, dtype, max_shard_bytes, log)


def _served_as_is(step_dir: Path, actor: Path, n: int, log) -> Optional[ExportResult]:
    """The step's HF weights when it has them (the step directory, ``actor/``, or ``actor/huggingface``), None for
    a verl FSDP checkpoint to merge; :class:`ExportError` for anything else."""
    hf = actor / "huggingface"
    if (step_dir / "loop_state.pt").exists() and not (step_dir / "COMPLETE").exists():
        raise ExportError(f"{step_dir} is an incomplete local-backend checkpoint (no COMPLETE marker)")
    if is_hf_dir(step_dir):
        return ExportResult(step_dir, n, "as-is", step_dir)
    if is_hf_dir(actor):
        return ExportResult(actor, n, "as-is", actor)
    if is_hf_dir(hf):
        log(f"[export] {hf} already holds full HF weights (hf_model in save_contents): serving it as is")
        return ExportResult(hf, n, "as-is", actor)
    if not (actor / "fsdp_config.json").is_file() and not any(actor.glob("model_world_size_*_rank_0.pt")):
        raise ExportError(
            f"{step_dir} is neither a verl FSDP checkpoint (no actor/fsdp_config.json or "
            "actor/model_world_size_W_rank_0.pt) nor an HF model directory "
            f"(config.json + weights); contents: {sorted(p.name for p in step_dir.iterdir())[:10]}"
        )
    return None


def _finished_export(out: Path, actor: Path, n: int) -> bool:
    """``out`` holds our finished export of this step; :class:`ExportError` when it holds anything else."""
    marker = _read_marker(out)
    if marker is not None:
        if marker.get("step") != n or Path(marker.get("source", "")).resolve() != actor.resolve():
            raise ExportError(
                f"{out} holds an export of {marker.get('source')} step {marker.get('step')}, not of {actor} step {n}; "
                "choose another target"
            )
        return True
    if out.exists():
        raise ExportError(
            f"{out} exists but has no completion marker ({MARKER}): it is not a finished export of ours; "
            "remove it or choose another target"
        )
    return False


def _merge(actor: Path, out: Path, n: int, dtype: str, max_shard_bytes: int, log) -> ExportResult:
    """Merge the FSDP shards into a temporary directory beside ``out``, write the marker, fsync, rename into place
    (a concurrent export that finished first wins)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale_tmp(out)
    tmp = out.parent / f".{out.name}.tmp-{socket.gethostname()}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        log(f"[export] merging {actor} (step {n}) into {out} as {dtype}")
        files = merge_verl_fsdp(actor, tmp, dtype, max_shard_bytes)
        (tmp / MARKER).write_text(
            json.dumps(
                {
                    "source": str(actor.resolve()),
                    "step": n,
                    "dtype": dtype,
                    "weights": files,
                    "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    "host": socket.gethostname(),
                },
                indent=2,
            )
            + "\n"
        )
        _fsync_tree(tmp)
        try:
            os.rename(tmp, out)
        except OSError:
            if _read_marker(out) is not None:  # a concurrent export finished first
                shutil.rmtree(tmp, ignore_errors=True)
                return ExportResult(out, n, "reused", actor)
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"[export] wrote {out} ({len(files)} weight file(s))")
    return ExportResult(out, n, "merged", actor)


def main_args(args) -> int:
    try:
        res = export_checkpoint(args.checkpoint_dir, args.step, args.hf_dir, dtype=args.dtype)
    except ExportError as exc:
        print(f"export: error: {exc}")
        return 1
    print(json.dumps({"path": str(res.path), "step": res.step, "action": res.action}))
    return 0


def add_export_args(p: Any, *, required: bool = True) -> None:
    p.add_argument("--checkpoint-dir", required=required,
                   help="the run's checkpoint directory (trainer.default_local_dir), a global_step_N's parent")
    p.add_argument("--step", default="latest", help="'latest' (default) or a step number")
    p.add_argument("--hf-dir", default=None, help="where to write the HF model (default CKPT/global_step_N/hf)")
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="dtype of the exported weights")

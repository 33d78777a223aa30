"""``dapo train`` for ``placement.backend: local``: :func:`run` (what :mod:`dapo.train.cli` calls) and :func:`build`
(the backend and the prompt rows of a preset; the benchmarks and the GPU script build the same way).

Reads the DAPO-schema parquet files (:func:`dapo.data.files.read_rows`, as the verl backend does), builds the tiny
assets for ``recipe.model.path: builtin:tiny``, constructs :class:`dapo.backends.local.backend.LocalBackend` and runs
:class:`dapo.train.loop.DAPOLoop` on it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Optional


from dapo.backends.local.backend import LocalBackend, resolve_device
from dapo.data.files import read_rows

__all__ = ["build", "run"]


def build(preset, run_dir: Path, *, device: Optional[str] = None, assets_dir: Optional[Path] = None, log=print):
    """(backend, train_rows, val_rows, info) for ``preset`` on the local backend; builds the tiny assets if needed."""
    r = preset.recipe
    dev = resolve_device(device or preset.placement.device)  # fail before minutes of asset building
    info: dict[str, Any] = {}
    model_path, tok_path = r.model.path, r.model.tokenizer_path
    train_files, val_files = list(r.data.train_files), list(r.data.val_files)
    if model_path.startswith("builtin:"):
        from dapo.tiny.assets import prepare

        if model_path != "builtin:tiny":
            raise ValueError(f"recipe.model.path: unknown built-in model {model_path!r} (known: builtin:tiny)")
        assets = prepare(preset.local, Path(assets_dir) if assets_dir else run_dir / "assets", log=log)
        model_path, tok_path = str(assets.policy_dir), str(assets.policy_dir)
        train_files = train_files or [str(assets.train_file)]
        val_files = val_files or [str(assets.val_file)]
        info["assets"] = assets
    if not train_files:
        raise ValueError("recipe.data.train_files is empty")
    train_rows = read_rows(train_files, "recipe.data.train_files")
    val_rows = read_rows(val_files, "recipe.data.val_files") if val_files else []
    local = preset.local
    backend = LocalBackend(
        model_path,
        tok_path,
        r,
        device=dev,
        micro_batch_size=local.micro_batch_size if local else 64,
        seed=r.trainer.seed,
    )
    return backend, train_rows, val_rows, info


def run(preset, args, run_dir: Path) -> int:
    """``dapo train`` on the local backend in ``run_dir``: build/reuse assets, then the DAPO loop. Returns the exit
    code."""
    from dapo.train.loop import DAPOLoop
    from dapo.train.stream import configure_determinism

    run_dir = Path(run_dir)
    if getattr(args, "dry_run", False):
        import yaml

        print(f"# preset {preset.name!r} on the local backend; run dir {run_dir}")
        print(yaml.safe_dump(preset.to_dict(), sort_keys=False), end="")
        return 0
    run_dir.mkdir(parents=True, exist_ok=True)
    configure_determinism(preset.recipe.trainer.seed)
    t0 = time.time()
    try:
        backend, train_rows, val_rows, _ = build(preset, run_dir)
    except (ValueError, FileNotFoundError) as exc:  # bad device, data file, prompt column ...: say it, no traceback
        print(f"dapo train: {exc}", file=sys.stderr)
        return 2
    print(
        f"dapo train: preset {preset.name!r} on {backend.device} | model {backend.num_parameters / 1e6:.2f}M params | "
        f"{len(train_rows)} train / {len(val_rows)} val prompts | run dir {run_dir} "
        f"(setup {time.time() - t0:.0f}s)",
        flush=True,
    )
    loop = DAPOLoop(
        preset, backend, train_rows, val_rows, run_dir, progress=not getattr(args, "no_progress", False),
        ending=getattr(args, "attempt_end", None), watchdog=getattr(args, "watchdog", None),
    )
    try:
        return loop.fit()
    finally:
        backend.close()

"""One benchmark run: a preset with overrides trained by the local backend in this process, its summary and
validation curve (every ``dapo bench`` command that trains uses it).

Imports the local backend, :mod:`dapo.config` and :mod:`dapo.train` lazily (torch is loaded only when a run starts).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-").replace("--", "-")


def run_one(
    preset_name: str, overrides: list[str], run_dir: Path, assets_dir: Path, *, log=None, threads: Optional[int] = None
) -> dict[str, Any]:
    """Train one configuration with the local backend in this process; returns its summary (+ the val curve)."""
    import torch

    from dapo.backends.local.run import build
    from dapo.config import load_preset
    from dapo.train.loop import DAPOLoop
    from dapo.train.stream import configure_determinism

    if threads:
        torch.set_num_threads(threads)
    preset = load_preset(preset_name, overrides)
    run_dir.mkdir(parents=True, exist_ok=True)
    configure_determinism(preset.recipe.trainer.seed)
    quiet = log or (lambda s: None)
    backend, train_rows, val_rows, _ = build(preset, run_dir, assets_dir=assets_dir, log=quiet)
    loop = DAPOLoop(preset, backend, train_rows, val_rows, run_dir, progress=False, log=quiet)
    t0, c0 = time.time(), time.process_time()
    rc = loop.fit()
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    summary.update(exit_code=rc, wall_seconds=time.time() - t0, cpu_seconds=time.process_time() - c0)
    summary["counters"] = dict(getattr(backend, "counters", {}))
    from dapo.train.metrics import read_jsonl, val_accuracy

    recs = read_jsonl(run_dir / "metrics.jsonl")
    key = "train/gen_samples_total"
    samples = {int(r["step"]): r[key] for r in recs if r.get(key) is not None}
    summary["curve"] = [
        (int(r["step"]), val_accuracy(r), samples.get(int(r["step"]), 0.0 if int(r["step"]) == 0 else None))
        for r in recs if val_accuracy(r) is not None
    ]  # fmt: skip
    (run_dir / "bench_result.json").write_text(json.dumps(summary, indent=2))
    return summary

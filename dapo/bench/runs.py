"""One benchmark run: a preset with overrides trained by the local backend in this process, its summary and
validation curve (every ``dapo bench`` command that trains uses it).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional


# Every benchmark rung: console logging only, no checkpoints, a fresh start (the run directory is the cache).
BENCH_OVERRIDES = [
    "recipe.trainer.logger=[console]",
    "recipe.trainer.save_freq=0",
    "recipe.trainer.resume_mode=disable",
]


def cached_run(preset_name: str, overrides: list[str], run_dir: Path, assets_dir: Path, *,
               threads: Optional[int] = None, train: bool = True) -> Optional[dict[str, Any]]:
    """A rung's run for one seed: the finished result in ``run_dir`` (``bench_result.json``) if there is one, else
    trained now by :func:`run_one` with :data:`BENCH_OVERRIDES` first -- or ``None`` when ``train`` is false (a report
    from the finished runs only)."""
    done = run_dir / "bench_result.json"
    if done.exists():
        return json.loads(done.read_text())
    if not train:
        return None
    return run_one(preset_name, BENCH_OVERRIDES + overrides, run_dir, assets_dir, threads=threads)


def run_meta(command: str, results: dict[str, list[dict]], load0: float, t_start: float) -> str:
    """The lines a benchmark report opens with: the command, the machine and its load average at start and end, this
    invocation's wall time, and the runs' summed wall and CPU seconds."""
    import os
    import platform

    import torch

    runs = [r for rs in results.values() for r in rs]
    return (
        f"command: `{command.strip()}`\n\nmachine: {platform.machine()}, {os.cpu_count()} CPUs (torch's CPU kernels: "
        f"{torch.backends.cpu.get_cpu_capability()}), load average at start "
        f"{load0:.1f}, at end {os.getloadavg()[0]:.1f}; this invocation {time.time() - t_start:.0f}s wall; the "
        f"{len(runs)} runs: {sum(r['wall_seconds'] for r in runs):.0f}s wall, "
        f"{sum(r['cpu_seconds'] for r in runs):.0f}s CPU in total\n"
    )


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-").replace("--", "-")


def run_one(
    preset_name: str, overrides: list[str], run_dir: Path, assets_dir: Path, *, log=None, threads: Optional[int] = None
) -> dict[str, Any]:
    """Train one configuration with the local backend in this process; returns its summary (+ the val curve, and
    ``step_cpu_seconds``: the CPU seconds of each rollout step, which a loaded machine inflates far less than the
    wall clock)."""
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
    step_cpu: list[float] = []
    train_step = loop.train_step

    def cpu_timed_step(step: int) -> dict:  # the process's CPU seconds of each rollout step (validation excluded)
        c = time.process_time()
        metrics = train_step(step)
        step_cpu.append(time.process_time() - c)
        return metrics

    loop.train_step = cpu_timed_step
    t0, c0 = time.time(), time.process_time()
    rc = loop.fit()
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    summary.update(exit_code=rc, wall_seconds=time.time() - t0, cpu_seconds=time.process_time() - c0,
                   step_cpu_seconds=step_cpu)
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

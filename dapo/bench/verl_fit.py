"""``dapo bench verl-fit``: seconds per rollout step of the DAPO loop on verl's workers vs verl's own
``RayPPOTrainer.fit()``, side by side on the same worker groups, in one run.

One set of workers serves both. verl's ``RayPPOTrainer`` is built as its ``main_ppo`` builds it (its dataloader over
the preset's training file, its reward loop workers scoring with its ``dapo`` reward manager, GRPO advantages, our
``dapo`` loss registered in every worker) and ``init_workers`` runs once. Then rounds alternate: ``fit()`` for
``--steps`` steps, then :class:`dapo.train.loop.DAPOLoop` on a :class:`dapo.backends.verl.backend.VerlBackend` over
the same trainer (``RayWorkers.from_trainer``) for ``--steps`` steps. Same recipe for both: the preset's batch
(``train_batch_size`` prompts x ``n``), dynamic sampling off (the legacy trainer has none: the generation batch is the
training batch), no validation, no checkpoints. A step's time is each trainer's own ``timing_s/step`` (verl's file
logger; the loop's ``metrics.jsonl``); the first step of every round is dropped (warm-up). Prints the medians and the
ratio (loop / fit) and writes them to ``--out`` with the metric keys each trainer logged (counts, and fit()'s keys the
loop lacks); ``--keys-out`` writes fit()'s keys as the fixture the verl-on-CPU test checks the loop's against.

Each trainer runs as it does in production: fit() with verl's agent loop streaming every response through verl's
reward workers while it generates; the loop with that streaming switched off in the agent-loop workers (as
``dapo train`` builds them: the loop scores every response once, on the driver) and switched on again before the next
fit() round. The loop also writes its ``metrics.jsonl`` and console line every step.

On CPU (``--preset verl-tiny``) it runs in the vLLM-on-CPU venv (``make setup-vllm``); on a GPU node, any verl preset
with its own overrides.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

from dapo.config import load_preset

FIT_ONLY = ["recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=null", "recipe.trainer.save_freq=0",
            "recipe.trainer.test_freq=0", "recipe.trainer.val_before_train=false", "recipe.trainer.resume_mode=disable",
            "recipe.trainer.logger=[console]"]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dapo bench verl-fit", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="verl-tiny")
    p.add_argument("--steps", type=int, default=4, help="steps per round and trainer (the first is dropped)")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of fit() and the loop")
    p.add_argument("--run-dir", default="runs/bench-verl-fit", help="where both trainers write")
    p.add_argument("--out", default=None, help="JSON result file (default <run dir>/verl-fit.json)")
    p.add_argument("--keys-out", default=None, help="also write the metric keys fit() logged to this JSON file (the "
                   "fixture tests/fixtures/verl_fit_keys.json the verl-on-CPU test compares the loop's keys with)")
    p.add_argument("--record-calls", default=None, metavar="FILE",
                   help="first run one fit() round with --record-cadence and write the order of its verl calls to "
                        "FILE (dapo.bench.verl_calls; the CPU e2e's fixture: tests/fixtures/verl_fit_calls.json)")
    p.add_argument("--record-cadence", default="4,1,2", metavar="STEPS,SAVE_FREQ,TEST_FREQ",
                   help="steps, save_freq and test_freq of the recorded fit() round (validation before training on); "
                        "default: the CPU e2e's")
    p.add_argument("overrides", nargs="*", help="preset key=value overrides (e.g. recipe.data.train_batch_size=32)")
    return p


def _verl_dataset_file(train_file: str, run_dir: Path, split: str = "train") -> str:
    """The training file with ``data_source: math_dapo``: verl's reward manager picks its verifier by data source and
    knows the DAPO name, not the tiny task's; the rows are otherwise the same."""
    import pandas as pd

    df = pd.read_parquet(train_file)
    df["data_source"] = "math_dapo"
    out = run_dir / f"{split}-math_dapo.parquet"
    df.to_parquet(out)
    return str(out)


def _fit_trainer(cfg: Any) -> Any:
    """verl's own RayPPOTrainer with its datasets, as ``main_ppo_v0.TaskRunner.run`` builds it (workers started)."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.dataset.rl_dataset import collate_fn

    from dapo.backends.verl.workers import build_trainer

    model = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    train = create_rl_dataset(cfg.data.train_files, cfg.data, model.tokenizer, model.processor, is_train=True)
    val = create_rl_dataset(cfg.data.val_files, cfg.data, model.tokenizer, model.processor, is_train=False)
    trainer, _ = build_trainer(cfg, RayPPOTrainer, train_dataset=train, val_dataset=val, collate_fn=collate_fn,
                               train_sampler=create_rl_sampler(cfg.data, train))
    trainer.init_workers()
    return trainer


def _agent_loop_scoring(trainer: Any, handles: Any) -> None:
    """Set the reward workers verl's agent-loop workers stream responses to (None: no scoring while generating)."""
    import ray

    def put(worker: Any, h: Any) -> None:
        worker.reward_loop_worker_handles = h

    ray.get([w.__ray_call__.remote(put, handles) for w in trainer.async_rollout_manager.agent_loop_workers])


def fit_log_records(path: Path) -> list[dict]:
    """fit()'s step records from verl's file logger (``VERL_FILE_LOGGER_PATH``: one ``{"step", "data"}`` line per
    ``Tracking.log``), the ``data`` dicts in order."""
    from dapo.train.metrics import read_jsonl

    return [rec["data"] for rec in read_jsonl(path)]


def fit_keys(records: list[dict]) -> list[str]:
    """The metric keys of fit()'s step records (verl's file logger: one ``data`` dict per step), sorted."""
    return sorted(set().union(*(set(r) for r in records)) - {"step", "ts"})


def key_report(fit_records: list[dict], loop_records: list[dict], keys_out: Optional[str]) -> dict[str, Any]:
    """How many metric keys each trainer logged and which of fit()'s the loop lacked; with ``keys_out``, fit()'s
    keys written there as the fixture (verl's version and the command that regenerates it)."""
    import verl

    fit, loop = fit_keys(fit_records), fit_keys(loop_records)
    if keys_out:
        Path(keys_out).write_text(json.dumps({
            "verl": verl.__version__, "fit_keys": fit,
            "command": "dapo bench verl-fit --steps 2 --rounds 1 --keys-out tests/fixtures/verl_fit_keys.json",
        }, indent=1) + "\n")  # fmt: skip
    return {"fit_keys": len(fit), "loop_keys": len(loop), "fit_keys_missing_from_loop": sorted(set(fit) - set(loop))}


def _record_fit_calls(trainer: Any, cfg: Any, cadence: str, out: Path) -> None:
    """One fit() round with ``cadence`` (steps, save_freq, test_freq; validation before training), its verl calls
    recorded (:class:`dapo.bench.verl_calls.CallRecorder`) and written to ``out``; the trainer's settings restored."""
    from omegaconf import open_dict

    from dapo.bench.verl_calls import CallRecorder, canonical, split_steps

    steps, save_freq, test_freq = (int(x) for x in cadence.split(","))
    keys = {"total_training_steps": steps, "save_freq": save_freq, "test_freq": test_freq, "val_before_train": True}
    before = {k: cfg.trainer[k] for k in keys}
    total = trainer.total_training_steps
    with open_dict(cfg):
        cfg.trainer.update(keys)
    trainer.total_training_steps = steps
    recorder = CallRecorder(trainer)
    try:
        trainer.fit()
    finally:
        with open_dict(cfg):
            cfg.trainer.update(before)
        trainer.total_training_steps = total
    calls = canonical(recorder.events)
    start, per_step = split_steps(calls)
    if recorder.violations or len(per_step) != steps:
        raise SystemExit(f"dapo bench verl-fit: fit()'s recorded calls are not a clean run of {steps} steps: "
                         f"{recorder.violations or per_step}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "what": "verl 0.9.1 RayPPOTrainer.fit(): the order of its verl calls (dapo.bench.verl_calls), recorded by "
                "`dapo bench verl-fit --record-calls`",
        "cadence": {"steps": steps, "save_freq": save_freq, "test_freq": test_freq, "val_before_train": True},
        "canonical": {"startup": start, "steps": per_step}, "events": recorder.events,
    }, indent=1) + "\n")
    print(f"fit()'s verl calls ({steps} steps): start-up {start}, step 1 {per_step[0]} -> {out}", flush=True)


def _step_seconds(records: list[dict], key: str = "timing_s/step") -> list[float]:
    return [float(r[key]) for r in records if key in r]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from omegaconf import open_dict

    from dapo.backends.verl import config as verl_config
    from dapo.backends.verl.backend import VerlBackend
    from dapo.backends.verl.run import connect, prepare
    from dapo.backends.verl.workers import RayWorkers
    from dapo.data.files import read_rows
    from dapo.train.loop import DAPOLoop
    from dapo.train.metrics import read_jsonl

    run_dir = Path(args.run_dir).resolve()
    steps = int(args.steps)
    if steps < 2 or args.rounds < (0 if args.record_calls else 1):
        raise SystemExit("dapo bench verl-fit: --steps >= 2 (the first step of a round is dropped) and --rounds >= 1 "
                         "(0 with --record-calls)")
    environ = dict(os.environ)
    preset = load_preset(args.preset, [*args.overrides, *FIT_ONLY, f"recipe.trainer.total_training_steps={steps}",
                                       f"recipe.trainer.default_local_dir={run_dir}"])
    preset = prepare(preset, str(run_dir))
    cfg = verl_config.resolve(preset).cfg
    fit_log = run_dir / "verl-fit.jsonl"
    run_dir.mkdir(parents=True, exist_ok=True)
    with open_dict(cfg):
        cfg.data.train_files = [_verl_dataset_file(preset.recipe.data.train_files[0], run_dir)]
        cfg.data.val_files = [_verl_dataset_file(preset.recipe.data.val_files[0], run_dir, "val")]
        cfg.reward.num_workers = 1  # verl's reward loop scores fit()'s rollouts (the loop scores its own)
        cfg.trainer.logger = ["console", "file"]
    os.environ["VERL_FILE_LOGGER_PATH"] = str(fit_log)
    connect(cfg, environ)
    trainer = _fit_trainer(cfg)
    rows = read_rows(list(cfg.data.train_files), "recipe.data.train_files")  # the same rows fit() reads
    streaming = trainer.reward_loop_manager.reward_loop_workers
    backend = VerlBackend(cfg, preset, RayWorkers.from_trainer(trainer), trainer.tokenizer)
    fit_s: list[float] = []
    fit_records: list[dict] = []
    loop_records: list[dict] = []
    loop_s: list[float] = []
    if args.record_calls:
        _agent_loop_scoring(trainer, streaming)
        _record_fit_calls(trainer, cfg, args.record_cadence, Path(args.record_calls).resolve())
        if args.rounds == 0:
            return {"record_calls": str(args.record_calls)}
    for r in range(args.rounds):
        _agent_loop_scoring(trainer, streaming)
        t0 = time.time()
        trainer.fit()
        fit_wall = time.time() - t0
        records = fit_log_records(fit_log)  # verl's file logger starts the file anew per fit()
        fit_s += _step_seconds(records)[1:]
        fit_records += records
        loop_dir = run_dir / f"loop-round-{r}"
        _agent_loop_scoring(trainer, None)
        t0 = time.time()
        DAPOLoop(preset, backend, rows, [], loop_dir, progress=False).fit()
        loop_wall = time.time() - t0
        recs = [m for m in read_jsonl(loop_dir / "metrics.jsonl") if m.get("step", 0) >= 1]
        loop_s += _step_seconds(recs)[1:]
        loop_records += recs
        print(f"round {r + 1}/{args.rounds}: fit() {fit_wall:.1f}s, loop {loop_wall:.1f}s for {steps} steps each",
              flush=True)
    result = {
        "preset": preset.name, "steps_per_round": steps, "rounds": args.rounds,
        "batch": f"{preset.recipe.data.train_batch_size} prompts x {preset.recipe.rollout.n}",
        "verl_fit_step_s": fit_s, "dapo_loop_step_s": loop_s,
        "verl_fit_median_s": statistics.median(fit_s), "dapo_loop_median_s": statistics.median(loop_s),
        "machine": f"{os.cpu_count()} CPUs ({os.uname().machine})",
    }  # fmt: skip
    result["ratio_loop_over_fit"] = result["dapo_loop_median_s"] / result["verl_fit_median_s"]
    result.update(key_report(fit_records, loop_records, args.keys_out))
    out = Path(args.out) if args.out else run_dir / "verl-fit.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"seconds per rollout step (median of {len(fit_s)} / {len(loop_s)}): verl fit() "
          f"{result['verl_fit_median_s']:.2f}, DAPO loop {result['dapo_loop_median_s']:.2f} -> loop/fit "
          f"{result['ratio_loop_over_fit']:.3f} ({out})")
    return result


def cmd_verl_fit(argv: Optional[list[str]] = None) -> int:
    run(build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(cmd_verl_fit())

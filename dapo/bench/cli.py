"""``dapo bench``: benchmarks of the DAPO loop on the tiny task (not tests: they print measurements).

``dapo bench ablation``
    The paper's ablation ladder (Table 1) on the tiny task, every rung from the same warm start, several seeds::

        naive GRPO            clip 0.2/0.2, sample-level loss (seq-mean-token-mean), no overlong shaping, no filtering
        + overlong filtering  truncated responses dropped from the loss
        + clip-higher         eps_high 0.28
        + soft overlong       soft overlong punishment (eq. 13) instead of filtering, as the DAPO recipe does
        + token-level loss    token-mean (eq. 12)
        + dynamic sampling    filter groups (eq. 11) = DAPO (the tiny preset)
        DAPO + carry          off-paper: surplus kept groups carried into the next step, generation batch adapted
                              to the kept-group ratio (filter_groups.mode: carry; dapo.sampler)

    Every rung trains on ``train_batch_size`` prompts per step; without dynamic sampling the generation batch is
    the training batch, with it generation batches of ``gen_batch_size`` are added until the batch is full. Prints,
    per rung (mean over seeds), the rollout steps and generated responses to first reach each target validation
    accuracy, and the final accuracy; writes ``ablation.{md,json,png}`` in ``--out``. Runs are resumable: a finished
    (rung, seed) keeps its ``summary.json`` and is not rerun.

``dapo bench sampler``
    A simulation of Algorithm 1's sampling with the real :class:`dapo.sampler.DynamicSampler` (no model): each prompt
    group is kept independently with probability ``keep_rate``; prints generation batches per step and generated
    prompts per trained prompt for the reference and the carry sampler, next to the ``dapo plan`` model.

``dapo bench timing``
    A few tiny-preset steps; prints the share of the step time per phase (``timing_s/*``) and the share spent
    outside generation and the update (target <= 5 %).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Optional

LADDER: list[tuple[str, list[str]]] = [
    ("naive GRPO", [
        "recipe.actor.clip_ratio_high=0.2", "recipe.actor.loss_agg_mode=seq-mean-token-mean",
        "recipe.reward.overlong_buffer.enable=false", "recipe.reward.overlong_filter=false",
        "recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=null",
    ]),
    ("+ overlong filtering", [
        "recipe.actor.clip_ratio_high=0.2", "recipe.actor.loss_agg_mode=seq-mean-token-mean",
        "recipe.reward.overlong_buffer.enable=false", "recipe.reward.overlong_filter=true",
        "recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=null",
    ]),
    ("+ clip-higher", [
        "recipe.actor.clip_ratio_high=0.28", "recipe.actor.loss_agg_mode=seq-mean-token-mean",
        "recipe.reward.overlong_buffer.enable=false", "recipe.reward.overlong_filter=true",
        "recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=null",
    ]),
    ("+ soft overlong punishment", [
        "recipe.actor.clip_ratio_high=0.28", "recipe.actor.loss_agg_mode=seq-mean-token-mean",
        "recipe.reward.overlong_buffer.enable=true", "recipe.reward.overlong_filter=false",
        "recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=null",
    ]),
    ("+ token-level loss", [
        "recipe.actor.clip_ratio_high=0.28", "recipe.actor.loss_agg_mode=token-mean",
        "recipe.reward.overlong_buffer.enable=true", "recipe.reward.overlong_filter=false",
        "recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=null",
    ]),
    ("+ dynamic sampling (DAPO)", [
        "recipe.actor.clip_ratio_high=0.28", "recipe.actor.loss_agg_mode=token-mean",
        "recipe.reward.overlong_buffer.enable=true", "recipe.reward.overlong_filter=false",
        "recipe.filter_groups.enable=true",
    ]),
    ("DAPO + carry", [
        "recipe.actor.clip_ratio_high=0.28", "recipe.actor.loss_agg_mode=token-mean",
        "recipe.reward.overlong_buffer.enable=true", "recipe.reward.overlong_filter=false",
        "recipe.filter_groups.enable=true", "recipe.filter_groups.mode=carry",
    ]),
]  # fmt: skip


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


def _train_acc_last(run_dir: Path, k: int) -> Optional[float]:
    """Mean of ``train/gen_acc/mean`` (all responses sampled at the training temperature) over the last k steps."""
    from dapo.train.metrics import read_jsonl

    key = "train/gen_acc/mean"
    vals = [r[key] for r in read_jsonl(run_dir / "metrics.jsonl") if r.get(key) is not None]
    return float(sum(vals[-k:]) / len(vals[-k:])) if vals else None


def _second_half_mean(curve: list) -> Optional[float]:
    """Mean validation accuracy over the evaluations in the second half of the run (steps > last step / 2)."""
    last = max((s for s, a, _ in curve if a is not None), default=0)
    vals = [a for s, a, _ in curve if a is not None and s > last / 2]
    return float(sum(vals) / len(vals)) if vals else None


def _first_reach(curve: list, target: float) -> tuple[Optional[int], Optional[float]]:
    for step, acc, samples in curve:
        if step > 0 and acc is not None and acc >= target:
            return step, samples
    return None, None


def _fmt_mean(values: list[Optional[float]], spec: str, n: int) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "not reached"
    import numpy as np

    s = format(float(np.mean(got)), spec)
    return s if len(got) == n else f"{s} ({len(got)}/{n} seeds)"


def ablation_table(results: dict[str, list[dict]], targets: list[float]) -> str:
    import numpy as np

    head = ["rung"] + [f"steps to {t:.2f}" for t in targets] + [f"samples to {t:.2f}" for t in targets]
    head += ["val acc before", "final val acc (mean ± sd)", "val acc, 2nd half of the run", "train acc, last 10 steps",
             "CPU s / run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, runs in results.items():
        n = len(runs)
        row = [name]
        reach = {t: [_first_reach(r["curve"], t) for r in runs] for t in targets}
        row += [_fmt_mean([s for s, _ in reach[t]], ".1f", n) for t in targets]
        row += [_fmt_mean([x for _, x in reach[t]], ".0f", n) for t in targets]
        before = [r.get("val_acc_before") for r in runs]
        final = [r.get("val_acc_after") for r in runs if r.get("val_acc_after") is not None]
        tr = [r.get("train_acc_last10") for r in runs if r.get("train_acc_last10") is not None]
        row.append(_fmt_mean(before, ".3f", n))
        row.append(f"{np.mean(final):.3f} ± {np.std(final):.3f}" if final else "-")
        half = [_second_half_mean(r["curve"]) for r in runs]
        half = [h for h in half if h is not None]
        row.append(f"{np.mean(half):.3f} ± {np.std(half):.3f}" if half else "-")
        row.append(f"{np.mean(tr):.3f} ± {np.std(tr):.3f}" if tr else "-")
        row.append(f"{np.mean([r['cpu_seconds'] for r in runs]):.0f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def ablation_plot(results: dict[str, list[dict]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5))
    for name, runs in results.items():
        steps = sorted({s for r in runs for s, a, _ in r["curve"] if a is not None})
        mean = [np.mean([a for r in runs for s2, a, _ in r["curve"] if s2 == s]) for s in steps]
        ax1.plot(steps, mean, marker="o", markersize=3, label=name)
        xs = [
            np.mean([x for r in runs for s2, a, x in r["curve"] if s2 == s and x is not None] or [np.nan])
            for s in steps
        ]
        ax2.plot(xs, mean, marker="o", markersize=3, label=name)
    ax1.set_xlabel("rollout step")
    ax2.set_xlabel("generated responses")
    for ax in (ax1, ax2):
        ax.set_ylabel("validation accuracy (mean over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("DAPO ablation ladder on the tiny task")
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def cmd_ablation(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="dapo bench ablation", description="the DAPO ablation ladder on the tiny task")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated recipe.trainer.seed values")
    p.add_argument("--targets", default="0.95,0.99", help="validation accuracies to reach")
    p.add_argument("--out", default="runs/bench-ablation")
    p.add_argument("--rungs", default=None, help="comma-separated rung indices (default: all)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run")
    p.add_argument("overrides", nargs="*", help="preset overrides applied to every rung (e.g. shorter runs)")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    targets = [float(t) for t in args.targets.split(",")]
    out = Path(args.out)
    assets = out / "assets"
    rungs = LADDER if args.rungs is None else [LADDER[int(i)] for i in args.rungs.split(",")]
    base = [
        "recipe.trainer.logger=[console]",
        "recipe.trainer.save_freq=0",
        "recipe.trainer.resume_mode=disable",
    ]
    results: dict[str, list[dict]] = {}
    t_start = time.time()
    load0 = os.getloadavg()[0]
    for name, rung in rungs:
        results[name] = []
        for seed in seeds:
            run_dir = out / _slug(name) / f"seed{seed}"
            done = run_dir / "bench_result.json"
            if done.exists():
                res = json.loads(done.read_text())
            else:
                t0 = time.time()
                res = run_one(args.preset, base + rung + [f"recipe.trainer.seed={seed}"] + args.overrides, run_dir,
                              assets, threads=args.threads)  # fmt: skip
                nan = float("nan")
                print(f"[{time.time() - t_start:.0f}s] {name} seed {seed}: final val acc "
                      f"{res.get('val_acc_after', nan):.3f} (before {res.get('val_acc_before', nan):.3f})"
                      f", {res.get('gen_samples_total')} samples, {time.time() - t0:.0f}s wall, "
                      f"{res['cpu_seconds']:.0f}s CPU", flush=True)  # fmt: skip
            res["train_acc_last10"] = _train_acc_last(run_dir, 10)
            results[name].append(res)
    table = ablation_table(results, targets)
    out.mkdir(parents=True, exist_ok=True)
    png = ablation_plot(results, out / "ablation.png")
    cmd = "dapo bench ablation " + " ".join(argv)
    all_runs = [r for runs in results.values() for r in runs]
    meta = (
        f"command: `{cmd.strip()}`\n\nmachine: {platform.machine()}, {os.cpu_count()} CPUs, load average at start "
        f"{load0:.1f}, at end {os.getloadavg()[0]:.1f}; this invocation {time.time() - t_start:.0f}s wall; the "
        f"{len(all_runs)} runs: {sum(r['wall_seconds'] for r in all_runs):.0f}s wall, "
        f"{sum(r['cpu_seconds'] for r in all_runs):.0f}s CPU in total\n"
    )
    (out / "ablation.md").write_text(meta + "\n" + table + "\n")
    (out / "ablation.json").write_text(json.dumps({"targets": targets, "seeds": seeds, "results": results}, indent=2))
    print(table)
    print(f"\n{meta}\nplot: {png}")
    return 0


def simulate_sampler(mode: str, train_batch_size: int, gen_batch_size: int, keep_rate: float, *, n: int = 2,
                     steps: int = 200, seed: int = 0) -> dict[str, float]:
    """Run ``steps`` steps of the DynamicSampler on groups kept with probability ``keep_rate``; returns
    generated prompts per step, generation batches per step and generated prompts per trained prompt."""
    import numpy as np

    from dapo.sampler import DynamicSampler

    rng = np.random.default_rng(seed)
    s = DynamicSampler(train_batch_size, n, mode=mode, gen_batch_size=gen_batch_size, max_num_gen_batches=0)
    prompts = batches = 0
    gid = 0
    for _ in range(steps):
        while not s.is_full():
            size = s.suggested_gen_batch_size()
            mixed = rng.random(size) < keep_rate
            ids = np.repeat(np.arange(gid, gid + size), n)
            acc = np.zeros((size, n))
            acc[mixed, 0] = 1.0  # a group with one correct response varies; an all-zero group does not
            s.add(ids, acc.reshape(-1))
            gid += size
            prompts += size
            batches += 1
        s.selection()
        s.finish_step()
    return {"prompts_per_step": prompts / steps, "gen_batches_per_step": batches / steps,
            "prompts_per_trained_prompt": prompts / (steps * train_batch_size)}


def cmd_sampler(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="dapo bench sampler", description="reference vs carry sampler, simulated")
    p.add_argument("--train-batch-size", type=int, default=512)
    p.add_argument("--gen-batch-size", type=int, default=1536)
    p.add_argument("--keep-rates", default="0.2,0.3,0.4,0.5,0.7")
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args(argv)
    from dapo.plan.estimate import carry_prompts_per_step

    B, G = args.train_batch_size, args.gen_batch_size
    print(f"train_batch_size {B}, gen_batch_size {G}, {args.steps} simulated steps per cell; generated prompts per "
          "trained prompt (generation batches per step)")
    print("| keep rate | reference | carry | carry saves | plan model: reference | plan model: carry |")
    print("|---|---|---|---|---|---|")
    import math

    for k in [float(x) for x in args.keep_rates.split(",")]:
        ref = simulate_sampler("reference", B, G, k, steps=args.steps)
        car = simulate_sampler("carry", B, G, k, steps=args.steps)
        model_ref = math.ceil(B / (G * k)) * G / B
        model_car = carry_prompts_per_step(B, k) / B
        save = 1 - car["prompts_per_trained_prompt"] / ref["prompts_per_trained_prompt"]
        print(f"| {k:.2f} | {ref['prompts_per_trained_prompt']:.2f} ({ref['gen_batches_per_step']:.2f}) | "
              f"{car['prompts_per_trained_prompt']:.2f} ({car['gen_batches_per_step']:.2f}) | {save:.0%} | "
              f"{model_ref:.2f} | {model_car:.2f} |")
    return 0


PEER_SYSTEMS = ("ours, dynamic sampling off", "TRL GRPOTrainer", "ours, dynamic sampling on (DAPO)",
                "ours, DAPO + carry")


def _ours_steps(run_dir: Path) -> list[dict[str, float]]:
    """Per rollout step of a ``dapo train`` run: seconds per phase, generated responses (from metrics.jsonl)."""
    from dapo.train.metrics import read_jsonl

    out = []
    for r in read_jsonl(run_dir / "metrics.jsonl"):
        if "timing_s/step" not in r:
            continue
        gen, old, upd = r.get("timing_s/gen", 0.0), r.get("timing_s/old_log_prob", 0.0), r["timing_s/step"]
        out.append({"step": int(r["step"]), "step_s": upd, "gen_s": gen, "old_log_prob_s": old,
                    "update_s": upd - gen - old, "responses": r.get("train/num_gen_samples", 0.0)})  # fmt: skip
    return out


def peer_table(results: dict[str, list[dict]], skip_first: int = 1) -> str:
    """Markdown table: seconds per rollout step split into generation / old log-probs / rest (update), generated
    tokens per second, and the speed ratio against TRL; ``results[system]`` = one dict per round with ``steps``
    (per-step timings; the first ``skip_first`` steps of a round are warm-up and left out) and ``gen_tokens``,
    ``gen_seconds``."""
    import numpy as np

    head = ["system", "s / rollout step (mean ± sd over rounds)", "generation", "old log-probs", "update and rest",
            "generated tokens / s", "TRL s / step ÷ this"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    per_round: dict[str, list[float]] = {}
    parts: dict[str, dict[str, float]] = {}
    for name, rounds in results.items():
        per_round[name] = [float(np.mean([s["step_s"] for s in r["steps"][skip_first:]])) for r in rounds]
        parts[name] = {k: float(np.mean([np.mean([s[k] for s in r["steps"][skip_first:]]) for r in rounds]))
                       for k in ("gen_s", "old_log_prob_s", "update_s")}  # fmt: skip
    trl = per_round.get(PEER_SYSTEMS[1])
    for name, rounds in results.items():
        v = per_round[name]
        tps = [r["gen_tokens"] / r["gen_seconds"] for r in rounds if r.get("gen_seconds")]
        ratio = "-" if not trl or name == PEER_SYSTEMS[1] else f"{np.mean(trl) / np.mean(v):.2f}x"
        p = parts[name]
        lines.append(f"| {name} | {np.mean(v):.3f} ± {np.std(v):.3f} | {p['gen_s']:.3f} | {p['old_log_prob_s']:.3f} | "
                     f"{p['update_s']:.3f} | {np.mean(tps):.0f} | {ratio} |" if tps else
                     f"| {name} | {np.mean(v):.3f} ± {np.std(v):.3f} | {p['gen_s']:.3f} | {p['old_log_prob_s']:.3f} | "
                     f"{p['update_s']:.3f} | - | {ratio} |")  # fmt: skip
    return "\n".join(lines)


def peer_curve_table(results: dict[str, list[dict]]) -> str:
    """Validation accuracy (mean over rounds) against rollout steps and generated responses, per system."""
    import numpy as np

    steps = sorted({s for rounds in results.values() for r in rounds for s, _, _ in r["curve"]})
    head = ["system"] + [f"step {s}" for s in steps]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rounds in results.items():
        cells = [name]
        for s in steps:
            accs = [a for r in rounds for s2, a, _ in r["curve"] if s2 == s and a is not None]
            xs = [x for r in rounds for s2, _, x in r["curve"] if s2 == s and x is not None]
            cells.append(f"{np.mean(accs):.3f} @ {np.mean(xs):,.0f} resp." if accs and xs else
                         (f"{np.mean(accs):.3f}" if accs else "-"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _validate_dir(preset, model_dir: Path, val_rows: list, work: Path) -> float:
    """Validation accuracy of a saved policy with the same code (and sampling) as ``dapo train``'s validation."""
    from dapo.backends.local.backend import LocalBackend
    from dapo.train.loop import DAPOLoop
    from dapo.train.metrics import val_accuracy

    backend = LocalBackend(str(model_dir), str(model_dir), preset.recipe, device="cpu",
                           micro_batch_size=preset.local.micro_batch_size, seed=preset.recipe.trainer.seed)  # fmt: skip
    loop = DAPOLoop(preset, backend, val_rows, val_rows, work, progress=False, log=lambda s: None)
    return float(val_accuracy(loop.validate()))


def cmd_peers(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="dapo bench peers",
                                description="TRL's GRPOTrainer vs dapo train (dynamic sampling off / on), interleaved")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="rollout steps per run")
    p.add_argument("--test-freq", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads for every run (the same for all)")
    p.add_argument("--trl-python", default=os.environ.get("DAPO_TRL_PYTHON", ".venv-trl/bin/python"),
                   help="python of the TRL environment (make setup-trl)")
    p.add_argument("--out", default="runs/bench-peers")
    p.add_argument("--systems", default="0,1,2", help="comma-separated indices into: " + "; ".join(PEER_SYSTEMS))
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    import subprocess

    import numpy as np
    import torch

    from dapo.config import load_preset

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    systems = [PEER_SYSTEMS[int(i)] for i in args.systems.split(",")]
    if PEER_SYSTEMS[1] in systems and not Path(args.trl_python).exists():
        print(f"dapo bench peers: no TRL environment at {args.trl_python} (run `make setup-trl`, or pass "
              "--trl-python / --systems 0,2)", file=sys.stderr)  # fmt: skip
        return 2
    common = ["recipe.trainer.logger=[console]", "recipe.trainer.save_freq=0", "recipe.trainer.resume_mode=disable",
              f"recipe.trainer.total_training_steps={args.steps}", f"recipe.trainer.test_freq={args.test_freq}"]
    ds_off = ["recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=null"]
    # the systems' own settings come last: they define the system whatever the shared overrides say
    preset = load_preset(args.preset, common + args.overrides + ds_off)
    assets_dir = out / "assets"
    from dapo.backends.local.run import _read_rows
    from dapo.tiny.assets import prepare

    assets = prepare(preset.local, assets_dir, log=print)
    val_rows = _read_rows([str(assets.val_file)], "validation")
    results: dict[str, list[dict]] = {s: [] for s in systems}
    load0, t_start = os.getloadavg()[0], time.time()
    n_resp = preset.recipe.data.train_batch_size * preset.recipe.rollout.n
    for rnd in range(args.rounds):
        for name in systems:
            run_dir = out / f"round{rnd}" / _slug(name)
            t0 = time.time()
            if name == PEER_SYSTEMS[1]:
                cfg = {"recipe": preset.to_dict()["recipe"], "model": str(assets.policy_dir), "out": str(run_dir),
                       "train_file": str(assets.train_file), "steps": args.steps, "seed": preset.recipe.trainer.seed,
                       "test_freq": args.test_freq, "threads": args.threads}  # fmt: skip
                run_dir.mkdir(parents=True, exist_ok=True)
                (run_dir / "config.json").write_text(json.dumps(cfg, indent=2))
                env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]),
                           OMP_NUM_THREADS=str(args.threads))  # fmt: skip
                proc = subprocess.run([args.trl_python, "-m", "dapo.bench.peers_trl", str(run_dir / "config.json")],
                                      env=env, capture_output=True, text=True)  # fmt: skip
                if proc.returncode != 0:
                    print(proc.stdout[-3000:] + proc.stderr[-5000:], file=sys.stderr)
                    return 1
                res = json.loads((run_dir / "trl_result.json").read_text())
                steps = res["steps"]
                curve = [(0, None, 0.0)]
                for st in steps:
                    ck = run_dir / f"ckpt-{st['step']}"
                    if ck.exists():
                        curve.append((st["step"], _validate_dir(preset, ck, val_rows, run_dir / "val"),
                                      float(st["step"] * n_resp)))  # fmt: skip
                gen_tok = sum(s["gen_tokens"] for s in steps)
                gen_sec = sum(s["gen_s"] for s in steps)
                res_round = {"steps": steps, "curve": curve, "gen_tokens": gen_tok, "gen_seconds": gen_sec,
                             "trl_version": res["trl_version"], "wall_seconds": time.time() - t0}  # fmt: skip
            else:
                extra = {PEER_SYSTEMS[0]: ds_off, PEER_SYSTEMS[3]: ["recipe.filter_groups.mode=carry"]}.get(name, [])
                summ = run_one(args.preset, common + args.overrides + extra, run_dir, assets_dir,
                               threads=args.threads)  # fmt: skip
                c = summ["counters"]
                res_round = {"steps": _ours_steps(run_dir), "curve": summ["curve"], "gen_tokens": c["gen_tokens"],
                             "gen_seconds": c["gen_seconds"], "wall_seconds": time.time() - t0}  # fmt: skip
            results[name].append(res_round)
            print(f"[{time.time() - t_start:.0f}s] round {rnd + 1}/{args.rounds} {name}: "
                  f"{np.mean([s['step_s'] for s in res_round['steps'][1:]]):.3f} s/step", flush=True)
    # TRL's curve has no step-0 accuracy of its own: it starts from the same warm start as ours
    for name in systems:
        if name == PEER_SYSTEMS[1]:
            ref = next((r["curve"][0][1] for s in systems if s != name for r in results[s]), None)
            for r in results[name]:
                r["curve"][0] = (0, ref, 0.0)
    table, curves = peer_table(results), peer_curve_table(results)
    meta = (f"command: `dapo bench peers {' '.join(argv)}`\n\nmachine: {platform.machine()}, {os.cpu_count()} CPUs, "
            f"torch threads per run {args.threads}, load average at start {load0:.1f}, at end "
            f"{os.getloadavg()[0]:.1f}; {args.rounds} interleaved rounds x {args.steps} rollout steps of "
            f"{preset.recipe.data.train_batch_size} prompts x {preset.recipe.rollout.n}; first step of each run left "
            f"out of the timings; {time.time() - t_start:.0f}s wall\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / "peers.md").write_text(meta + "\n" + table + "\n\nValidation accuracy (mean over rounds) @ generated "
                                  "responses:\n\n" + curves + "\n")  # fmt: skip
    (out / "peers.json").write_text(json.dumps(results, indent=2, default=str))
    print(table + "\n\n" + curves + "\n\n" + meta)
    return 0


def cmd_timing(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="dapo bench timing", description="share of step time per phase (tiny preset)")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--out", default="runs/bench-timing")
    p.add_argument("--device", default="cpu")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    from dapo.train.metrics import STEP_PHASES, read_jsonl

    out = Path(args.out)
    over = [
        f"recipe.trainer.total_training_steps={args.steps}", "recipe.trainer.val_before_train=false",
        "recipe.trainer.test_freq=0", "recipe.trainer.save_freq=0", "recipe.trainer.logger=[console]",
        "recipe.trainer.resume_mode=disable", f"placement.device={args.device}",
    ] + args.overrides  # fmt: skip
    run_one(args.preset, over, out / "run", out / "assets")
    recs = [r for r in read_jsonl(out / "run" / "metrics.jsonl") if "timing_s/step" in r]
    recs = recs[1:] if len(recs) > 2 else recs  # the first step pays one-off warm-up costs
    total = sum(r["timing_s/step"] for r in recs)
    rows = []
    for ph in STEP_PHASES + ("other",):
        t = sum(r.get(f"timing_s/{ph}", 0.0) or 0.0 for r in recs)
        rows.append((ph, t, t / total if total else 0.0))
    print(f"{len(recs)} steps, {total:.2f}s total, {total / max(1, len(recs)):.2f}s per step")
    print(f"{'phase':<14}{'seconds':>10}{'share':>9}")
    for ph, t, sh in rows:
        print(f"{ph:<14}{t:>10.2f}{sh:>8.1%}")
    share = dict((ph, sh) for ph, _, sh in rows)
    outside = 1.0 - share["gen"] - share["update_actor"]
    overhead = share["reward"] + share["filter"] + share["adv"] + share["other"]
    print(f"outside generation and update: {outside:.1%} (of which old_log_prob, a model forward: "
          f"{share['old_log_prob']:.1%})")
    print(f"loop overhead (reward + filter + advantage + other): {overhead:.1%} (target <= 5%: "
          f"{'met' if overhead <= 0.05 else 'NOT met'})")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmds = {"ablation": cmd_ablation, "timing": cmd_timing, "sampler": cmd_sampler, "peers": cmd_peers}
    if not argv or argv[0] not in cmds:
        print("usage: dapo bench {ablation,timing,sampler,peers} [options]  (dapo bench ablation --help)",
              file=sys.stderr)
        return 2
    return cmds[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())

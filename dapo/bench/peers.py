"""``dapo bench peers``: TRL's GRPOTrainer side by side with ``dapo train`` (dynamic sampling off, on, and with
carry) on the tiny task, in interleaved rounds from the same warm start; prints seconds per rollout step split by
phase -- wall clock and the process's CPU seconds, which load from other processes inflates far less --, generated
tokens per second, and validation accuracy against generated responses (``peers.{md,json}``).
The TRL runs go through ``python -m dapo.bench.peers_trl`` in TRL's own environment (``make setup-trl``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Optional

from dapo.bench.runs import _slug, run_one


PEER_SYSTEMS = ("ours, dynamic sampling off", "TRL GRPOTrainer", "ours, dynamic sampling on (DAPO)",
                "ours, DAPO + carry")
# dynamic sampling off: the baseline system's (and the TRL configuration's) overrides
_DS_OFF = ["recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=null"]


def _ours_steps(run_dir: Path, step_cpu: Optional[list[float]] = None) -> list[dict[str, float]]:
    """Per rollout step of a ``dapo train`` run: seconds per phase, generated responses (from metrics.jsonl), and
    the step's CPU seconds (``step_cpu[step - 1]``, from :func:`dapo.bench.runs.run_one`) when given."""
    from dapo.train.metrics import read_jsonl

    out = []
    for r in read_jsonl(run_dir / "metrics.jsonl"):
        if "timing_s/step" not in r:
            continue
        gen, old, upd = r.get("timing_s/gen", 0.0), r.get("timing_s/old_log_prob", 0.0), r["timing_s/step"]
        out.append({"step": int(r["step"]), "step_s": upd, "gen_s": gen, "old_log_prob_s": old,
                    "update_s": upd - gen - old, "responses": r.get("train/num_gen_samples", 0.0)})  # fmt: skip
        if step_cpu and int(r["step"]) <= len(step_cpu):
            out[-1]["cpu_s"] = step_cpu[int(r["step"]) - 1]
    return out


def peer_table(results: dict[str, list[dict]], skip_first: int = 1) -> str:
    """Markdown table: seconds per rollout step split into generation / old log-probs / rest (update), generated
    tokens per second, and the speed ratio against TRL; ``results[system]`` = one dict per round with ``steps``
    (per-step timings; the first ``skip_first`` steps of a round are warm-up and left out) and ``gen_tokens``,
    ``gen_seconds``."""
    import numpy as np

    head = ["system", "s / rollout step (mean ± sd over rounds)", "generation", "old log-probs", "update and rest",
            "generated tokens / s", "TRL s / step ÷ this", "CPU s / rollout step", "TRL CPU s ÷ this"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def per_round(rounds: list[dict], key: str) -> list[float]:
        vals = [[s[key] for s in r["steps"][skip_first:] if key in s] for r in rounds]
        return [float(np.mean(v)) for v in vals if v]

    trl = {k: per_round(results.get(PEER_SYSTEMS[1], []), k) for k in ("step_s", "cpu_s")}
    for name, rounds in results.items():
        v, cpu = per_round(rounds, "step_s"), per_round(rounds, "cpu_s")
        p = {k: float(np.mean(per_round(rounds, k))) for k in ("gen_s", "old_log_prob_s", "update_s")}
        tps = [r["gen_tokens"] / r["gen_seconds"] for r in rounds if r.get("gen_seconds")]
        mine = name == PEER_SYSTEMS[1]
        ratio = "-" if not trl["step_s"] or mine else f"{np.mean(trl['step_s']) / np.mean(v):.2f}x"
        cpu_ratio = "-" if not trl["cpu_s"] or not cpu or mine else f"{np.mean(trl['cpu_s']) / np.mean(cpu):.2f}x"
        lines.append(f"| {name} | {np.mean(v):.3f} ± {np.std(v):.3f} | {p['gen_s']:.3f} | {p['old_log_prob_s']:.3f} | "
                     f"{p['update_s']:.3f} | {f'{np.mean(tps):.0f}' if tps else '-'} | {ratio} | "
                     f"{f'{np.mean(cpu):.3f} ± {np.std(cpu):.3f}' if cpu else '-'} | {cpu_ratio} |")  # fmt: skip
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


def _parser() -> argparse.ArgumentParser:
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
    return p


def cmd_peers(argv: list[str]) -> int:
    """The systems in interleaved rounds from the same warm start, then the tables (module docstring)."""
    args = _parser().parse_args(argv)
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
    # the systems' own settings come last: they define the system whatever the shared overrides say
    preset = load_preset(args.preset, common + args.overrides + _DS_OFF)
    assets_dir = out / "assets"
    from dapo.data.files import read_rows
    from dapo.tiny.assets import prepare

    assets = prepare(preset.local, assets_dir, log=print)
    val_rows = read_rows([str(assets.val_file)], "validation")
    results: dict[str, list[dict]] = {s: [] for s in systems}
    load0, t_start = os.getloadavg()[0], time.time()
    for rnd in range(args.rounds):
        for name in systems:
            run_dir = out / f"round{rnd}" / _slug(name)
            t0 = time.time()
            if name == PEER_SYSTEMS[1]:
                res_round = _trl_round(args, preset, assets, run_dir, val_rows)
                if res_round is None:
                    return 1
            else:
                extra = {PEER_SYSTEMS[0]: _DS_OFF, PEER_SYSTEMS[3]: ["recipe.filter_groups.mode=carry"]}.get(name, [])
                summ = run_one(args.preset, common + args.overrides + extra, run_dir, assets_dir,
                               threads=args.threads)  # fmt: skip
                c = summ["counters"]
                res_round = {"steps": _ours_steps(run_dir, summ.get("step_cpu_seconds")), "curve": summ["curve"],
                             "gen_tokens": c["gen_tokens"], "gen_seconds": c["gen_seconds"]}  # fmt: skip
            res_round["wall_seconds"] = time.time() - t0
            results[name].append(res_round)
            print(f"[{time.time() - t_start:.0f}s] round {rnd + 1}/{args.rounds} {name}: "
                  f"{np.mean([s['step_s'] for s in res_round['steps'][1:]]):.3f} s/step", flush=True)
    _write_report(argv, args, preset, systems, results, out, load0, t_start)
    return 0


def _trl_round(args: argparse.Namespace, preset, assets, run_dir: Path, val_rows: list) -> Optional[dict]:
    """One TRL run in TRL's environment (:mod:`dapo.bench.peers_trl`) and its validation curve from the saved
    policies; None (its output on stderr) when it fails."""
    import subprocess

    n_resp = preset.recipe.data.train_batch_size * preset.recipe.rollout.n
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
        return None
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
    return {"steps": steps, "curve": curve, "gen_tokens": gen_tok, "gen_seconds": gen_sec,
            "trl_version": res["trl_version"]}  # fmt: skip


def _write_report(argv: list[str], args: argparse.Namespace, preset, systems: list[str],
                  results: dict[str, list[dict]], out: Path, load0: float, t_start: float) -> None:
    """``peers.md`` (the machine, the tables) and ``peers.json``; the tables on stdout."""
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

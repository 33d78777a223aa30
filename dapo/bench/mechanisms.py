"""``dapo bench mechanisms``: DAPO's four mechanisms one at a time on the ``tiny-mech`` task (docs/ablation.md).

Every rung starts from the same warm-started policy and differs from full DAPO in one mechanism (``DAPO - X``), plus
naive GRPO (all four off) for the headline steps-to-target ratio::

    DAPO                       the preset: clip 0.2/0.28, token-mean, soft overlong punishment, dynamic sampling
    DAPO - clip-higher         clip_ratio_high 0.2                         (paper Fig. 2 / 3)
    DAPO - token-level loss    loss_agg_mode seq-mean-token-mean           (Fig. 4)
    DAPO - overlong shaping    no soft punishment, no filtering            (Fig. 5)
    DAPO - dynamic sampling    filter_groups off, generation batch = training batch   (Fig. 6)
    naive GRPO                 all four off

Before the runs it measures each mechanism's precondition on the warm-started policy (:mod:`dapo.bench.precondition`);
after them it writes, in ``--out``: ``mechanisms.md`` (the summary table, the effects in seed standard deviations,
the steps-to-target ratio), ``mechanisms.json`` and one figure per mechanism (mean ± seed sd per step). Finished runs
are cached (``<rung>/seed<k>/bench_result.json``) so the command resumes. The outcome of each mechanism, the targets
and the seeds are fixed in this module, before any run.

Imports :mod:`dapo.bench.runs`; :mod:`dapo.bench.mech_report`, :mod:`dapo.bench.precondition` (torch, the local
backend) lazily.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from dapo.bench.runs import _slug, cached_run, run_meta

OFF_CLIP_HIGHER = ["recipe.actor.clip_ratio_high=0.2"]
OFF_TOKEN_LEVEL = ["recipe.actor.loss_agg_mode=seq-mean-token-mean"]
OFF_OVERLONG = ["recipe.reward.overlong_buffer.enable=false", "recipe.reward.overlong_filter=false"]
OFF_DYNAMIC = ["recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=null"]

RUNGS: dict[str, list[str]] = {
    "DAPO": [],
    "DAPO - clip-higher": OFF_CLIP_HIGHER,
    "DAPO - token-level loss": OFF_TOKEN_LEVEL,
    "DAPO - overlong shaping": OFF_OVERLONG,
    "DAPO - dynamic sampling": OFF_DYNAMIC,
    "naive GRPO": OFF_CLIP_HIGHER + OFF_TOKEN_LEVEL + OFF_OVERLONG + OFF_DYNAMIC,
}

# mechanism -> (rung without it, paper figure, what the paper shows, outcome metric compared with / without and the
# sign the paper predicts for "with - without"). Outcomes are means over the second half of each run; fixed before
# the runs.
MECHANISMS: dict[str, dict] = {
    "clip-higher": {
        "without": "DAPO - clip-higher", "figure": "Fig. 2 / 3",
        "paper": "entropy stays up with eps_high 0.28 and collapses with 0.2; the up-clipped tokens are low-probability",
        "outcome": ("actor/entropy", +1), "curves": ["actor/entropy", "val"],
    },
    "token-level loss": {
        "without": "DAPO - token-level loss", "figure": "Fig. 4",
        "paper": "without it, entropy and response length grow unhealthily",
        # actor/entropy is aggregated with the rung's own loss_agg_mode (as verl does); rollout/entropy is the same
        # per-response mean for both rungs
        "outcome": ("response_length/mean", -1),
        "curves": ["actor/entropy", "rollout/entropy", "response_length/mean"],
    },
    "overlong shaping": {
        "without": "DAPO - overlong shaping", "figure": "Fig. 5",
        "paper": "overlong filtering stabilises training and raises accuracy (entropy lower, smoother)",
        "outcome": ("val", +1), "curves": ["val", "actor/entropy", "response_length/clip_ratio"],
    },
    "dynamic sampling": {
        "without": "DAPO - dynamic sampling", "figure": "Fig. 6",
        "paper": "the same accuracy in fewer rollout steps (more generation per step)",
        "outcome": ("val", +1), "curves": ["val", "val_per_sample"],
    },
}  # fmt: skip

# Headline: steps to a target naive GRPO reaches only after >= 20 steps. The target is fixed by this rule before the
# runs: naive GRPO's validation accuracy averaged over its seeds and over steps 20-24.
TARGET_WINDOW = (20, 24)


def _rung_runs(args, out: Path, assets: Path, names: list[str], seeds: list[int], log) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {}
    for name in names:
        results[name] = []
        for seed in seeds:
            run_dir = out / _slug(name) / f"seed{seed}"
            fresh, t0 = not (run_dir / "bench_result.json").exists(), time.time()
            res = cached_run(args.preset, RUNGS[name] + [f"recipe.trainer.seed={seed}"] + args.overrides, run_dir,
                             assets, threads=args.threads, train=not args.report_only)  # fmt: skip
            if res is None:
                continue
            if fresh:
                log(f"{name} seed {seed}: final val acc {res.get('val_acc_after')}, {res.get('gen_samples_total')} "
                    f"samples, {time.time() - t0:.0f}s wall, {res['cpu_seconds']:.0f}s CPU")  # fmt: skip
            res["run_dir"] = str(run_dir)
            results[name].append(res)
    return {k: v for k, v in results.items() if v}


def cmd_mechanisms(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="dapo bench mechanisms",
                                description="DAPO's four mechanisms, each with / without, on the tiny-mech task")
    p.add_argument("--preset", default="tiny-mech")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated recipe.trainer.seed values")
    p.add_argument("--out", default="runs/bench-mechanisms")
    p.add_argument("--rungs", default=None, help=f"comma-separated rung names (default: all of {list(RUNGS)})")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run")
    p.add_argument("--probe-prompts", type=int, default=64, help="warm-start prompts the precondition probe samples")
    p.add_argument("--report-only", action="store_true", help="report the finished runs only; train nothing")
    p.add_argument("overrides", nargs="*", help="preset overrides applied to every rung (e.g. shorter runs)")
    args = p.parse_args(argv)
    from dapo.bench.mech_report import write_report
    from dapo.bench.precondition import measure_preconditions

    seeds = [int(s) for s in args.seeds.split(",")]
    names = list(RUNGS) if args.rungs is None else [n.strip() for n in args.rungs.split(",")]
    unknown = [n for n in names if n not in RUNGS]
    if unknown:
        p.error(f"--rungs: unknown rung(s) {unknown}; known: {list(RUNGS)}")
    out = Path(args.out)
    assets = out / "assets"
    t_start, load0 = time.time(), os.getloadavg()[0]

    def log(msg: str) -> None:
        print(f"[{time.time() - t_start:.0f}s, load {os.getloadavg()[0]:.1f}] {msg}", flush=True)

    pre_file = out / "preconditions.json"
    if pre_file.exists():
        pre = json.loads(pre_file.read_text())
    elif args.report_only:
        pre = {}
    else:
        pre = measure_preconditions(args.preset, args.overrides, assets, n_prompts=args.probe_prompts)
        out.mkdir(parents=True, exist_ok=True)
        pre_file.write_text(json.dumps(pre, indent=2))
    log(f"preconditions at warm start: {pre}")
    results = _rung_runs(args, out, assets, names, seeds, log)
    meta = run_meta("dapo bench mechanisms " + " ".join(argv), results, load0, t_start)
    text = write_report(results, pre, out, meta, seeds, MECHANISMS, TARGET_WINDOW)
    print(text)
    return 0

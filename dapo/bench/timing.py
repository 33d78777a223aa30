"""``dapo bench timing``: a few tiny-preset steps; prints the share of the step time per phase (``timing_s/*``)
and the share spent outside generation and the update (target <= 5 %).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dapo.bench.runs import run_one


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

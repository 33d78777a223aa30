"""A plan as text (:func:`render_text`, what ``dapo plan`` prints) and the generated markdown tables of the docs
(:func:`markdown_block`, ``dapo plan --markdown``; :func:`update_docs` rewrites them between the ``DOCS_BEGIN`` /
``DOCS_END`` markers, docs/reproduce.md; tests/test_plan.py checks they are fresh).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from dapo.config import load_preset
from dapo.plan.calibration import ANCHORS
from dapo.plan.estimate import Plan, make_plan
from dapo.plan.models import PlanError
from dapo.plan.steps import PAPER_ROLLOUT_STEPS, step_semantics


def _fmt_s(s: Optional[float]) -> str:
    if s is None:
        return "?"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def _fmt_n(x: Optional[float]) -> str:
    if x is None:
        return "?"
    if x >= 1e9:
        return f"{x / 1e9:.2f}B"
    if x >= 1e6:
        return f"{x / 1e6:.1f}M"
    if x < 100 and x != int(x):
        return f"{x:.1f}"
    return f"{x:,.0f}"


def render_text(plan: Plan) -> str:
    m, t, tm, st, tot = plan.memory_gib, plan.tokens, plan.time_s, plan.steps, plan.totals
    tr, ro = m["train"], m["rollout"]
    cap = m["gpu_memory"]["total"]
    L = [f"dapo plan: preset {plan.preset} -- {plan.model} ({plan.params / 1e9:.1f}B params) on {plan.nodes} x "
         f"{plan.gpus_per_node} {plan.gpu_name} ({plan.world} GPUs)", ""]
    L.append(f"Memory per GPU (GiB, of {cap:.1f})")
    tb = m["train_at_budget"]
    L.append(f"  training peak  {tr['total']:6.1f} = params {tr['params_fp32']:.1f} + grads {tr['grads_fp32']:.1f} + "
             f"Adam {tr['adam_fp32']:.1f} (fp32, FSDP-sharded) + all-gather {tr['fsdp_gather']:.1f} + "
             f"activations {tr['activations']:.1f} + logits {tr['logits']:.1f} + context "
             f"({tr['tokens_per_gpu']:,.0f} tokens/GPU per micro-batch at the assumed lengths)")
    L.append(f"  at the budget  {tb['total']:6.1f}   (micro-batch filled to {tb['tokens_per_gpu']:,.0f} tokens/GPU: "
             "ppo_max_token_len_per_gpu)")
    L.append(f"  rollout        {ro['total']:6.1f} = vLLM {ro['vllm_budget']:.1f} (weights {ro['weights']:.1f} + KV "
             f"{ro['kv_cache']:.1f} = {_fmt_n(ro['kv_tokens_per_engine'])} tokens/engine, "
             f"{ro['max_len_sequences_in_kv']:.0f} max-length sequences) + FSDP resident {ro['fsdp_resident']:.1f}"
             " + context")
    over = f", raised to {ro['position_override']:,.0f} by hf_overrides" if ro["position_override"] else ""
    L.append(f"  vLLM context   max_model_len {ro['max_model_len']:,.0f} (prompt + response: rollout.max_model_len); the "
             f"model's config.json has {ro['model_positions']:,.0f} positions{over}")
    if m["host"]["offload_per_node"]:
        L.append(f"  host RAM       {m['host']['offload_per_node']:6.1f} per node for param/optimizer offload")
    L.append("")
    L.append(f"Tokens per rollout step (assumed mean prompt {t['mean_prompt']:,.0f}, mean response "
             f"{t['mean_response']:,.0f}, longest {t['tail_response']:,.0f})")
    ds = (f"; dynamic sampling keeps {st['keep_rate']:.0%} of groups -> {t['overgeneration']:.1f}x over-generation"
          if st["dynamic_sampling"] else "")
    L.append(f"  generated  {t['prompts_generated']:,.0f} prompts x {st['n']} = {t['responses_generated']:,.0f} "
             f"responses ({st['gen_rounds_per_step']} round(s) of {st['gen_batch_size']:,}{ds}) = "
             f"{_fmt_n(t['generated_tokens'])} tokens")
    L.append(f"  trained    {st['prompts_trained_per_step']:,} x {st['n']} = {t['sequences_trained']:,.0f} sequences = "
             f"{_fmt_n(t['trained_tokens'])} tokens, {st['gradient_steps_per_rollout_step']} gradient steps")
    L.append("")
    L.append("Time per rollout step (estimate)")
    bound = "tail-bound: the longest response" if tm["generation_tail_bound"] else "throughput-bound"
    L.append(f"  generation     {_fmt_s(tm['generation']):>10}  ({bound}; ~{tm['decode_concurrency']:,.0f} "
             "sequences per engine)")
    L.append(f"  old log-prob   {_fmt_s(tm['old_log_prob']):>10}")
    if tm["ref_log_prob"]:
        L.append(f"  ref log-prob   {_fmt_s(tm['ref_log_prob']):>10}")
    L.append(f"  update         {_fmt_s(tm['update']):>10}")
    L.append(f"  fixed          {_fmt_s(tm['overhead']):>10}")
    L.append(f"  = step         {_fmt_s(tm['step']):>10};  wall-clock incl. validation/test_freq and "
             f"checkpoint/save_freq: {_fmt_s(tm['wall_per_step'])}")
    if st["dynamic_sampling"] and plan.samplers:
        L.append(f"  dynamic sampling at keep rate {st['keep_rate']:.0%} (this preset: filter_groups.mode "
                 f"{plan.steps.get('sampler_mode', '?')}):")
        for mode, sm in plan.samplers.items():
            L.append(f"    {mode:<9} {sm['gen_batches_per_step']:.2f} x {st['gen_batch_size']:,} prompts/step: "
                     f"generation {_fmt_s(sm['generation_s'])}, step {_fmt_s(sm['step_s'])}, "
                     f"{_fmt_n(sm['gpu_hours'])} GPU-hours")
    L.append("")
    L.append("Steps")
    if st["dataset_rows"] is not None:
        L.append(f"  1 epoch of {st['dataset_rows']:,} rows = {st['gen_rounds_per_epoch']:,} generation rounds = "
                 f"{st['rollout_steps_per_epoch']:,} rollout steps = {st['gradient_steps_per_epoch']:,} gradient steps")
    L.append(f"  run: {_fmt_n(st['total_rollout_steps'])} rollout steps = {_fmt_n(st['total_gradient_steps'])} "
             f"gradient steps ({st['total_source']}); the paper: ~{st['paper_rollout_steps']} rollout steps")
    L.append("")
    L.append(f"Total: {_fmt_s(None if tot['hours'] is None else tot['hours'] * 3600)}, "
             f"{_fmt_n(tot['gpu_hours'])} GPU-hours ({tot['gpu_hours_per_rollout_step']:.1f} per rollout step)")
    L += _fault_lines(plan)
    if plan.checks:
        L.append("")
        L += [f"  {c}" for c in plan.checks]
    L.append("")
    L.append("Assumptions: " + ", ".join(f"{k}={v}" for k, v in plan.assumptions.items()))
    return "\n".join(L)


# --------------------------------------------------------------------------------------------------------------------
# Docs tables (docs/reproduce.md is generated from these; tests/test_plan.py checks it is fresh)
# --------------------------------------------------------------------------------------------------------------------

DOCS_BEGIN = "<!-- BEGIN generated by `dapo plan --markdown {block}` -->"
DOCS_END = "<!-- END generated -->"

# Published reference runs for the reproduction table (verl docs/algo/dapo.md, recipe/dapo/README.md and scripts).
WANDB_DAPO = "https://wandb.ai/verl-org/DAPO%20Reproduction%20on%20verl/workspace?nw=wmb4qxfht0n"
WANDB_DAPO_7B = "https://wandb.ai/verl-org/DAPO%20Reproduction%20on%20verl/runs/ow47vvon"
# preset -> (target / published result, image stack + verl commit, wandb reference run, paper-scale column?)
REFERENCE_RUNS: dict[str, tuple[str, str, str, bool]] = {
    "early": ("44 (verl: 44 on 16x8 H20)", "repro stack (verl `4f80e46`) or current (verl 0.9.1)",
              f"[verl-org workspace]({WANDB_DAPO}) (early run)", True),
    "full": ("50 (verl: 52 on 16x8 H800)", "repro stack (verl `4f80e46`) or current (verl 0.9.1)",
             f"[verl-org workspace]({WANDB_DAPO}) (DAPO run)", True),
    "7b": ("- (none published)", "current (verl 0.9.1); script from verl `a44b83c`",
           f"[verl-org run ow47vvon]({WANDB_DAPO_7B}) (linked from verl's DAPO 7B-Math scripts)", False),
    "smoke": ("- (pipeline check)", "current (verl 0.9.1)", "-", False),
}


def _fault_lines(plan: Plan) -> list[str]:
    """The "Faults" lines (:mod:`dapo.plan.faults`): time lost per fault and the effective training time share."""
    f, tot = plan.faults, plan.totals
    if not f:
        return []
    L = ["", "Faults (estimate: restart_s and the fault rate are assumptions; docs/deadlines.md)"]
    since, restart = _fmt_s(f["since_checkpoint_s"]), _fmt_s(f["restart_s"])
    if f["lost_per_hang_s"] is not None:
        L.append(f"  a hang   {_fmt_s(f['lost_per_hang_s']):>10} lost = watchdog {_fmt_s(f['detect_hang_s'])} + restart "
                 f"{restart} + {since} since the last checkpoint (half of save_freq)")
    L.append(f"  a crash  {_fmt_s(f['lost_per_crash_s']):>10} lost = at most {_fmt_s(f['detect_crash_s'])} to notice "
             f"(the process-group timeout) + restart {restart} + {since}")
    days = tot.get("days")
    over = f", {f['faults_per_day'] * days:.1f} over the run's {days:.1f} days" if days else ""
    L.append(f"  at {f['faults_per_day']:.3f} faults/day on {plan.world} GPUs{over}: effective training time "
             f"{f['effective_share']:.1%} of wall time")
    return L


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def markdown_block(block: str) -> str:
    """The generated markdown for one docs block (:data:`DOCS_BLOCKS`)."""
    if block == "presets":
        rows = []
        for name, (target, stack, wandb, paper_scale) in REFERENCE_RUNS.items():
            preset = load_preset(name)
            pl = make_plan(preset)
            cfg_steps = pl.steps["total_rollout_steps"]
            hw = f"{pl.nodes}x{pl.gpus_per_node} {pl.gpu.upper()}"
            if paper_scale:
                paper = make_plan(preset, total_rollout_steps=PAPER_ROLLOUT_STEPS)
                paper_txt = f"{_fmt_n(paper.totals['gpu_hours'])} ({_fmt_s(paper.totals['hours'] * 3600)})"
            else:
                paper_txt = "-"
            rows.append([
                f"`{name}`", target, hw, f"`{preset.recipe.model.path}`", stack,
                _fmt_s(pl.time_s["wall_per_step"]), paper_txt,
                f"{cfg_steps:,} steps: {_fmt_n(pl.totals['gpu_hours'])} ({_fmt_s(pl.totals['hours'] * 3600)})",
                wandb,
            ])
        tiny = load_preset("tiny")
        rows.append(["`tiny`", "- (CPU demo)", "one CPU", f"`{tiny.recipe.model.path}`", "current (.venv)", "-", "-",
                     f"{tiny.recipe.trainer.total_training_steps} steps on CPU (`make train`)", "-"])
        return _md_table(["preset", "target AIME-2024 avg@32", "hardware", "model", "image / verl",
                          "est. wall time / rollout step", f"est. GPU-hours to {PAPER_ROLLOUT_STEPS} rollout steps (paper)",
                          "est. GPU-hours as configured", "wandb reference run"], rows)
    if block == "calibration":
        rows = []
        for an in ANCHORS:
            pl = an.plan()
            est = pl.time_s["wall_per_step"]
            rows.append([an.name, _fmt_s(an.measured_s), _fmt_s(est), f"{est / an.measured_s - 1:+.0%}",
                         f"{_fmt_s(pl.time_s['generation'])} / {_fmt_s(pl.time_s['old_log_prob'])} / "
                         f"{_fmt_s(pl.time_s['update'])}", an.note, an.source])
        return _md_table(["setup", "published wall-clock / rollout step", "`dapo plan` estimate", "error",
                          "est. generation / old log-prob / update", "assumption", "source"], rows)
    if block == "epochs":
        rows = []
        for name in ("early", "full"):
            preset = load_preset(name)
            for fname, nrows in (("dapo-math-17k.parquet (hub, ~100x duplicated)", 1_791_700),
                                 ("dapo-math-17k-dedup.parquet", 17_917)):
                s = step_semantics(preset, nrows)
                rows.append([f"`{name}`", fname, f"{nrows:,}", f"{s.gen_rounds_per_epoch:,}",
                             f"{s.rollout_steps_per_epoch:,}", f"{s.gradient_steps_per_epoch:,}",
                             f"{s.epochs_for_paper:.2f}" if s.epochs_for_paper and s.epochs_for_paper < 10
                             else f"{s.epochs_for_paper:.1f}"])
        return _md_table(["preset", "train file", "rows", "generation rounds / epoch", "rollout steps / epoch",
                          "gradient steps / epoch", f"epochs for {PAPER_ROLLOUT_STEPS} rollout steps"], rows)
    if block == "checkpoints":
        return _checkpoint_table()
    if block == "steptime":
        return _step_time_table()
    if block == "faults":
        return _fault_table()
    raise PlanError(f"unknown docs block {block!r}; known: {', '.join(DOCS_BLOCKS)}")


def _checkpoint_table() -> str:
    """Per GPU preset: one checkpoint, how often, by how many ranks at once, and the aggregate write rate the shared
    volume needs (:func:`dapo.plan.memory.checkpoint_write`: the preflight's floor, charts/dapo/files/
    requirements.yaml)."""
    from dapo.plan.memory import checkpoint_write, fmt_bytes, storage

    rows = []
    for name in ("full", "early", "7b", "smoke"):
        preset = load_preset(name)
        need = checkpoint_write(preset, storage(preset)["per_checkpoint"])
        rate = need["minWriteBytesPerSecond"]
        rows.append([f"`{name}`", fmt_bytes(need["checkpointBytes"]),
                     f"{preset.recipe.trainer.save_freq} steps, ~{need['secondsBetweenSaves'] / 60:.0f} min",
                     f"{need['writeStreams']} ({preset.placement.nodes} x {preset.placement.gpus_per_node})",
                     f"{rate / 1e6:,.0f} MB/s", f"{need['checkpointBytes'] / rate / 60:.1f} min"])
    return _md_table(["preset", "one checkpoint", "saved every", "ranks writing at once", "aggregate write floor",
                      "one save at the floor"], rows)


def _step_time_table() -> str:
    """Per GPU preset: the estimated time of one rollout step without validation or a save (what ``timing_s/step``
    of an ordinary step shows), the wall time per step with both amortised (``validation / test_freq +
    checkpoint / save_freq``: what a run's pace averages), and trained tokens / (step seconds x GPUs)."""
    rows = []
    for name in ("full", "early", "7b", "smoke"):
        pl = make_plan(load_preset(name))
        t = pl.time_s
        rows.append([f"`{name}`", f"{pl.nodes} x {pl.gpus_per_node}", _fmt_s(t["step"]), _fmt_s(t["wall_per_step"]),
                     f"{pl.tokens['trained_tokens'] / (t['step'] * pl.nodes * pl.gpus_per_node):,.0f}"])
    return _md_table(["preset", "GPUs", "compute time / rollout step (no validation, no save)",
                      "wall time / rollout step (validation and saves amortised)",
                      "trained tokens / s / GPU"], rows)


def _fault_table() -> str:
    """Per GPU preset: the time a hang and a crash cost (detection + restart + half the checkpoint interval,
    :mod:`dapo.plan.faults`) and the effective training time at Llama 3's published interruption rate and at one
    fault a day."""
    from dapo.plan.faults import DAY_S

    rows = []
    for name in ("full", "early", "7b", "smoke"):
        pl = make_plan(load_preset(name))
        f = pl.faults
        worst = f["lost_per_hang_s"] or f["lost_per_crash_s"]
        rows.append([f"`{name}`", f"{pl.nodes} x {pl.gpus_per_node}",
                     f"{_fmt_s(f['lost_per_hang_s'])} = {_fmt_s(f['detect_hang_s'])} + {_fmt_s(f['restart_s'])} + "
                     f"{_fmt_s(f['since_checkpoint_s'])}", _fmt_s(f["lost_per_crash_s"]),
                     f"{f['faults_per_day']:.3f}/day: {f['effective_share']:.1%}",
                     f"{max(0.0, 1 - worst / DAY_S):.1%}"])
    return _md_table(["preset", "GPUs", "a hang costs (watchdog + restart + since the checkpoint)", "a crash costs",
                      "effective training time at Llama 3's rate", "at one fault a day"], rows)


DOCS_BLOCKS = ("presets", "calibration", "epochs", "checkpoints", "steptime", "faults")


def update_docs(path: str | os.PathLike) -> bool:
    """Rewrite every generated block in ``path``; returns whether the file changed."""
    p = Path(path)
    text = p.read_text()
    new = text
    for block in DOCS_BLOCKS:
        begin = DOCS_BEGIN.format(block=block)
        if begin not in new:
            continue
        head, rest = new.split(begin, 1)
        if DOCS_END not in rest:
            raise PlanError(f"{p}: '{begin}' has no matching '{DOCS_END}'")
        _, tail = rest.split(DOCS_END, 1)
        new = f"{head}{begin}\n{markdown_block(block)}\n{DOCS_END}{tail}"
    if new != text:
        p.write_text(new)
    return new != text

"""The preconditions of DAPO's mechanisms, measured on a warm-started policy before any run (``dapo bench
mechanisms``; docs/ablation.md). One probe serves every task, on :data:`dapo.tiny.warmstart.THREADS` torch thread(s)
with its own seed (:data:`PROBE_SEED`, no run's), so the same preset gives the same numbers on any machine whose
floats round alike.

1. One rollout of ``n_prompts`` training prompts x ``rollout.n`` responses with the training sampling, scored by the
   recipe's verifier:

   - ``length_cv``: coefficient of variation (sd / mean) of the response lengths, and ``long_wrong_share``: share of
     the responses longer than the median that are wrong -- the token-level loss acts where lengths vary widely and
     the long responses are mostly wrong;
   - ``cap_share``: share of responses cut by ``max_response_length`` -- overlong shaping acts on those;
   - ``uniform_group_share``: share of prompt groups whose responses are all correct or all wrong -- zero advantage,
     what dynamic sampling drops;
   - ``acc``, ``length_mean``.

2. The first :data:`CLIP_PROBE_STEPS` training steps of the preset itself (its loop, its update, a throwaway
   directory): ``clip_high_lowprob_clipped_share``, the share of the rewarded low-probability tokens (A > 0,
   pi_old < 0.2) that the upper clip stops (ratio > 1 + eps_high), and ``clip_high_lowprob_share``, the share of the
   up-clipped tokens with pi_old < 0.2 -- clip-higher acts when the policy leaves the clip range within a rollout
   step on low-probability tokens (the paper's Fig. 3). ``clip_high_pos_share`` (up-clipped / all tokens with A > 0)
   is reported too: most rewarded tokens have pi_old near 1 and cannot be up-clipped at all (ratio <= 1 / pi_old).

:data:`THRESHOLDS` are the levels each mechanism's precondition needs, fixed before the runs.
"""

from __future__ import annotations

from pathlib import Path

PROBE_SEED = 0
CLIP_PROBE_STEPS = 5  # lr warm-up: the first update runs at lr 0, the second at half the rate

# mechanism -> [(statistic, the least value it needs)], fixed before the runs (docs/ablation.md)
THRESHOLDS: dict[str, list[tuple[str, float]]] = {
    "clip-higher": [("clip_high_lowprob_clipped_share", 0.1), ("clip_high_lowprob_share", 0.5)],
    "token-level loss": [("length_cv", 0.65), ("long_wrong_share", 0.75)],
    "overlong shaping": [("cap_share", 0.2)],
    "dynamic sampling": [("uniform_group_share", 0.4)],
}


def rollout_preconditions(lengths, acc, truncated, group_ids) -> dict[str, float]:
    """The statistics of part 1 of the module docstring from one scored rollout (one entry per response)."""
    import numpy as np

    lengths = np.asarray(lengths, dtype=np.float64)
    acc = np.asarray(acc, dtype=bool)
    groups: dict = {}
    for g, a in zip(group_ids, acc):
        groups.setdefault(g, []).append(bool(a))
    long = lengths > np.median(lengths)
    return {
        "responses": int(lengths.size),
        "acc": float(acc.mean()),
        "length_mean": float(lengths.mean()),
        "length_cv": float(lengths.std() / lengths.mean()) if lengths.mean() > 0 else 0.0,
        "long_wrong_share": float((~acc[long]).mean()) if long.any() else 0.0,
        "cap_share": float(np.mean(np.asarray(truncated, dtype=bool))),
        "uniform_group_share": float(np.mean([all(v) or not any(v) for v in groups.values()])),
    }


def clip_preconditions(clip_counts, pos_tokens: float, pos_lowprob_tokens: float) -> dict[str, float]:
    """Part 2 of the module docstring from the up-clipped token counts per pi_old bin
    (:data:`dapo.backends.local.update.CLIP_HIGH_BINS`; summed over the probe's updates), the number of tokens with
    A > 0 those updates trained on, and how many of those had pi_old < 0.2 (the first bin)."""
    clipped = float(sum(clip_counts))
    return {
        "clip_high_tokens": clipped,
        "clip_high_pos_tokens": float(pos_tokens),
        "clip_high_pos_share": clipped / pos_tokens if pos_tokens > 0 else 0.0,
        "clip_high_lowprob_share": float(clip_counts[0]) / clipped if clipped > 0 else 0.0,
        "clip_high_pos_lowprob_tokens": float(pos_lowprob_tokens),
        "clip_high_lowprob_clipped_share": float(clip_counts[0]) / pos_lowprob_tokens if pos_lowprob_tokens else 0.0,
    }


def verdicts(pre: dict) -> dict[str, dict]:
    """mechanism -> {"holds": bool, "checks": [(statistic, value, needed)]} by :data:`THRESHOLDS`."""
    out = {}
    for mech, checks in THRESHOLDS.items():
        rows = [(k, pre.get(k), need) for k, need in checks]
        out[mech] = {"holds": all(v is not None and v >= need for _, v, need in rows), "checks": rows}
    return out


def _rollout_probe(backend, rows, recipe, n_prompts: int) -> dict:
    from dapo.backends.base import Sampling
    from dapo.reward import score_responses

    s = Sampling(n=recipe.rollout.n, temperature=recipe.rollout.temperature, top_p=recipe.rollout.top_p,
                 top_k=recipe.rollout.top_k, do_sample=True, max_tokens=recipe.data.max_response_length)  # fmt: skip
    rollout = backend.generate(list(rows[:n_prompts]), s)
    scored = score_responses(
        rollout.response_text, [row["reward_model"]["ground_truth"] for row in rollout.prompt_rows],
        rollout.response_length, max_response_length=recipe.data.max_response_length,
    )
    return rollout_preconditions(rollout.response_length, scored["acc"], rollout.truncated, rollout.group_ids)


def _clip_probe(preset, backend, train_rows, run_dir: Path) -> dict:
    """The preset's first training steps (its own loop and update) counting the up-clipped tokens and the tokens
    with A > 0 they trained on."""
    import numpy as np

    from dapo.backends.local.update import CLIP_HIGH_BINS, clip_high_key
    from dapo.train.loop import DAPOLoop

    pos = [0.0, 0.0]
    update = backend.update

    def counting_update(batch, advantages, loss_mask=None):
        adv = np.asarray(advantages, dtype=np.float64).reshape(-1)
        keep = np.ones_like(adv) if loss_mask is None else np.asarray(loss_mask, dtype=np.float64)
        mask = batch.data["response_mask"].numpy() * ((adv > 0) * keep)[:, None]
        pos[0] += float(mask.sum())
        pos[1] += float((mask * (np.exp(batch.data["old_log_prob"].numpy()) < CLIP_HIGH_BINS[1])).sum())
        return update(batch, advantages, loss_mask)

    backend.update = counting_update
    loop = DAPOLoop(preset, backend, train_rows, [], run_dir, progress=False, log=lambda s: None)
    counts = np.zeros(len(CLIP_HIGH_BINS) - 1)
    for step in range(1, CLIP_PROBE_STEPS + 1):
        m = loop.train_step(step)
        counts += [m.get(clip_high_key(k), 0.0) for k in range(len(counts))]
    return clip_preconditions(counts.tolist(), pos[0], pos[1])


def measure_preconditions(preset_name: str, overrides: list[str], assets_dir: Path, *, n_prompts: int = 64) -> dict:
    """Both parts of the module docstring on the warm-started policy of ``preset_name`` (+ ``overrides``), seeded
    with :data:`PROBE_SEED`, plus the warm start's facts (its weights' sha256)."""
    import tempfile

    from dapo.backends.local.run import build
    from dapo.config import load_preset
    from dapo.tiny.warmstart import THREADS, fixed_threads
    from dapo.train.stream import configure_determinism

    preset = load_preset(preset_name, list(overrides) + [f"recipe.trainer.seed={PROBE_SEED}",
                                                         "recipe.trainer.logger=[console]"])
    r = preset.recipe
    with tempfile.TemporaryDirectory() as tmp, fixed_threads(THREADS):
        configure_determinism(PROBE_SEED)
        backend, train_rows, _, info = build(preset, Path(tmp), assets_dir=assets_dir, log=lambda s: None)
        out = _rollout_probe(backend, train_rows, r, n_prompts)
        configure_determinism(PROBE_SEED)
        backend, train_rows, _, _ = build(preset, Path(tmp), assets_dir=assets_dir, log=lambda s: None)
        out.update(_clip_probe(preset, backend, train_rows, Path(tmp) / "clip"))
    ws = info["assets"].warm_start if "assets" in info else {}
    out.update(preset=preset_name, max_response_length=int(r.data.max_response_length),
               prompts=int(min(n_prompts, len(train_rows))), clip_probe_steps=CLIP_PROBE_STEPS,
               warm_start_sha256=ws.get("weights_sha256"), warm_start_threads=ws.get("threads"),
               warm_start_cpu_capability=ws.get("cpu_capability"))  # fmt: skip
    return out

"""The preconditions of DAPO's mechanisms, measured on a warm-started policy before any RL step
(``dapo bench mechanisms``; docs/ablation.md).

One rollout of ``n_prompts`` training prompts x ``rollout.n`` responses with the training sampling, scored by the
recipe's verifier, gives:

- ``length_cv``: coefficient of variation (sd / mean) of the response lengths -- token-level loss needs >= 0.5;
- ``long_wrong_share``: share of the responses longer than the median that are wrong -- long wrong responses exist;
- ``cap_share``: share of responses cut by ``max_response_length`` -- overlong handling needs >= 0.2;
- ``uniform_group_share``: share of prompt groups whose responses are all correct or all wrong -- dynamic sampling
  needs >= 0.4 (those groups have zero advantage and contribute no gradient);
- ``acc``: the accuracy of those responses.

The clip-higher precondition (the share of up-clipped tokens with pi_old < 0.2) needs an update, so it is read from
the first steps of the runs (``actor/pg_clip_high_old_prob/*``, :mod:`dapo.bench.mech_report`).

Imports the local backend, :mod:`dapo.config` and :mod:`dapo.reward` lazily.
"""

from __future__ import annotations

from pathlib import Path

THRESHOLDS = {"length_cv": 0.5, "cap_share": 0.2, "uniform_group_share": 0.4, "clip_high_lowprob_share": 0.5}


def rollout_preconditions(lengths, acc, truncated, group_ids) -> dict[str, float]:
    """The statistics of the module docstring from one scored rollout (one entry per response)."""
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


def measure_preconditions(preset_name: str, overrides: list[str], assets_dir: Path, *, n_prompts: int = 64) -> dict:
    """Sample ``n_prompts`` training prompts x ``rollout.n`` from the warm-started policy (seed 0 of its own stream,
    the first prompts of the training file) and return :func:`rollout_preconditions` of the scored responses."""
    import tempfile

    from dapo.backends.base import Sampling
    from dapo.backends.local.run import build
    from dapo.config import load_preset
    from dapo.reward import score_responses

    preset = load_preset(preset_name, list(overrides) + ["recipe.trainer.seed=0"])
    r = preset.recipe
    with tempfile.TemporaryDirectory() as tmp:
        backend, train_rows, _, _ = build(preset, Path(tmp), assets_dir=assets_dir, log=lambda s: None)
        s = Sampling(n=r.rollout.n, temperature=r.rollout.temperature, top_p=r.rollout.top_p, top_k=r.rollout.top_k,
                     do_sample=True, max_tokens=r.data.max_response_length)  # fmt: skip
        rollout = backend.generate(list(train_rows[:n_prompts]), s)
    scored = score_responses(
        rollout.response_text, [row["reward_model"]["ground_truth"] for row in rollout.prompt_rows],
        rollout.response_length, max_response_length=r.data.max_response_length,
    )
    out = rollout_preconditions(rollout.response_length, scored["acc"], rollout.truncated, rollout.group_ids)
    out["max_response_length"] = int(r.data.max_response_length)
    out["prompts"] = int(min(n_prompts, len(train_rows)))
    return out

"""A rollout step's metrics, computed from the numbers the loop holds: the training batch (:func:`batch_metrics`),
every generated response (:func:`generation_metrics`), the phase timings and throughput (:func:`timing_metrics`).

Each is the framework-free twin of a verl 0.9.1 ``RayPPOTrainer.fit()`` function, same names, same definitions
(:mod:`dapo.train.metric_names`): :func:`batch_metrics` of ``compute_data_metrics`` (``use_critic=False``; GRPO's
returns are its advantages), :func:`timing_metrics` of ``compute_timing_metrics`` and ``compute_throughout_metrics``.
The local backend logs these; the verl backend logs the values of verl's own functions on its ``DataProto``
(:mod:`dapo.backends.verl.fit_metrics`), which tests/test_fit_metrics.py checks equal to these on the same batch.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

STEP_PHASES = ("gen", "reward", "filter", "adv", "old_log_prob", "update_actor")
# verl's compute_timing_metrics: the phases it divides by a token count ("gen": response tokens, the others: all)
PER_TOKEN_PHASES = ("gen", "ref", "values", "adv", "update_critic", "update_actor")


def _stats(prefix: str, values: Any) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {f"{prefix}/mean": float("nan"), f"{prefix}/max": float("nan"), f"{prefix}/min": float("nan")}
    return {f"{prefix}/mean": float(v.mean()), f"{prefix}/max": float(v.max()), f"{prefix}/min": float(v.min())}


def batch_metrics(rewards: Any, adv: Any, response_length: Any, max_response_length: int,
                  prompt_length: Any = None, max_prompt_length: Optional[int] = None) -> dict[str, float]:
    """verl's ``compute_data_metrics`` of the training batch (after dynamic sampling), from one reward, advantage and
    length per response: ``critic/score|rewards/*`` over the non-aborted responses (length > 0; DAPO has no
    KL-in-reward, so rewards = scores), ``critic/advantages|returns/*`` over the response tokens (a response's
    advantage on each of its ``L_i`` tokens: the mean weighs by length), ``response_length/*`` (``clip_ratio``: share
    at ``max_response_length``), ``response_length_non_aborted/*``, ``response/aborted_ratio``, ``prompt_length/*``
    (``clip_ratio``: share at ``max_prompt_length``)."""
    lengths = np.asarray(response_length, dtype=np.float64)
    rewards = np.asarray(rewards, dtype=np.float64)
    adv = np.asarray(adv, dtype=np.float64)
    live = lengths > 0
    metrics = {**_stats("critic/score", rewards[live]), **_stats("critic/rewards", rewards[live])}
    for name in ("advantages", "returns"):
        tok = adv[live]
        metrics.update(_stats(f"critic/{name}", tok))
        if tok.size:
            metrics[f"critic/{name}/mean"] = float((tok * lengths[live]).sum() / lengths[live].sum())
    metrics.update(_stats("response_length", lengths))
    metrics["response_length/clip_ratio"] = float(np.mean(lengths == max_response_length))
    metrics.update(_stats("response_length_non_aborted", lengths[live]))
    metrics["response_length_non_aborted/clip_ratio"] = (
        float(np.mean(lengths[live] == max_response_length)) if live.any() else float("nan"))
    metrics["response/aborted_ratio"] = float(np.mean(~live))
    if prompt_length is not None:
        p = np.asarray(prompt_length, dtype=np.float64)
        metrics.update(_stats("prompt_length", p))
        if max_prompt_length is not None:
            metrics["prompt_length/clip_ratio"] = float(np.mean(p == max_prompt_length))
    return metrics


def generation_metrics(generated: dict[str, np.ndarray]) -> dict[str, float]:
    """``train/gen_*`` over every response generated in the step, kept or not, and the backend's ``rollout/*``
    statistics; ``generated`` maps score, reward, acc, overlong, truncated (and rollout_entropy, rollout_mean_prob
    when the backend has them) to one value per response."""
    metrics: dict[str, float] = {}
    if "score" in generated and generated["score"].size:
        metrics["train/gen_score/mean"] = float(generated["reward"].mean())
        metrics["train/gen_acc/mean"] = float(generated["acc"].mean())
        metrics["train/gen_overlong_ratio"] = float(generated["overlong"].mean())
        metrics["train/gen_truncated_ratio"] = float(generated["truncated"].mean())
    for k in ("entropy", "mean_prob"):
        if f"rollout_{k}" in generated:
            metrics[f"rollout/{k}"] = float(generated[f"rollout_{k}"].mean())
    return metrics


def timing_metrics(timing: dict[str, float], step_seconds: float, prompt_tokens: Optional[float] = None,
                   response_tokens: Optional[float] = None, n_gpus: int = 1) -> dict[str, float]:
    """``timing_s/<phase>`` (:data:`STEP_PHASES`), ``timing_s/step`` and the rest of the step (``timing_s/other``);
    with the training batch's token counts also verl's ``timing_per_token_ms/<phase>`` (ms per response token for
    ``gen``, per prompt + response token for the others) and ``perf/*``: ``total_num_tokens`` (prompt + response),
    ``time_per_step`` and ``throughput`` = tokens / (step seconds x ``n_gpus``)."""
    metrics = {f"timing_s/{k}": v for k, v in timing.items()}
    metrics["timing_s/step"] = step_seconds
    metrics["timing_s/other"] = max(0.0, step_seconds - sum(timing.values()))
    if prompt_tokens is None or response_tokens is None:
        return metrics
    total = float(prompt_tokens) + float(response_tokens)
    for k in PER_TOKEN_PHASES:
        if k in timing:
            tokens = float(response_tokens) if k == "gen" else total
            metrics[f"timing_per_token_ms/{k}"] = timing[k] * 1000 / tokens if tokens > 0 else 0.0
    metrics["perf/total_num_tokens"] = total
    metrics["perf/time_per_step"] = step_seconds
    metrics["perf/throughput"] = total / (step_seconds * int(n_gpus))
    return metrics

"""The metrics verl 0.9.1's ``RayPPOTrainer.fit()`` logs after a step, computed by verl's own functions on the verl
backend's training batch, so the values are what fit() would log for the same batch.

:func:`fit_metrics` builds the batch as fit() holds it when it computes them (``token_level_rewards`` = the scores, no
KL in reward; ``advantages`` = ``returns`` = each response's group advantage on its valid tokens, GRPO's
``compute_grpo_outcome_advantage``; ``global_token_num`` = attention-mask sums) and calls
``verl.trainer.ppo.metric_utils.compute_data_metrics`` (``use_critic=False``), ``compute_timing_metrics`` (its
``timing_per_token_ms/*``; ``timing_s/*`` are the loop's), ``compute_throughout_metrics`` (GPUs = ``trainer.nnodes x
n_gpus_per_node``, verl's resource pool) and, when vLLM returned its log-probs, the rollout-correction diagnostics
(``compute_rollout_correction_and_add_to_batch`` with ``algorithm.rollout_correction``, on a copy: the loop applies no
importance weights or rejection -- :mod:`dapo.backends.verl.passthrough` refuses those keys). ``perf/mfu/actor_infer``
comes from the log-prob pass itself (:meth:`dapo.backends.verl.workers.RayWorkers.compute_log_prob`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["fit_metrics", "metric_batch"]


def metric_batch(data: Any, advantages: np.ndarray) -> Any:
    """A view of the training ``DataProto`` with what verl's metric functions read, as fit() holds it after its
    advantage step (the tensors are shared, not copied; the added ones are new)."""
    import torch

    need = ("prompts", "responses", "response_mask", "attention_mask", "token_level_scores")
    missing = [k for k in need if k not in data.batch.keys()]
    if missing:
        raise RuntimeError(f"fit_metrics: the training batch lacks {missing} (scores are placed by "
                           "compute_old_log_probs)")
    keys = [k for k in (*need, "old_log_probs", "rollout_log_probs") if k in data.batch.keys()]
    extra = [k for k in ("__num_turns__",) if k in data.non_tensor_batch]
    batch = data.select(batch_keys=keys, non_tensor_batch_keys=extra, deepcopy=False)
    mask = batch.batch["response_mask"]
    adv = torch.as_tensor(np.asarray(advantages, dtype=np.float32)).reshape(-1)
    if adv.shape[0] != mask.shape[0]:
        raise ValueError(f"{mask.shape[0]} responses but {adv.shape[0]} advantages")
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    batch.batch["advantages"] = adv[:, None] * mask.float()
    batch.batch["returns"] = batch.batch["advantages"]
    batch.meta_info = {"global_token_num": torch.sum(batch.batch["attention_mask"], dim=-1).tolist()}
    return batch


def fit_metrics(data: Any, advantages: np.ndarray, timing: dict[str, float], cfg: Any, n_gpus: int
                ) -> dict[str, float]:
    """fit()'s data, per-token timing, throughput and rollout-correction metrics of the step (module docstring);
    ``timing`` holds the step's phase seconds and ``step``."""
    from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_throughout_metrics, compute_timing_metrics

    batch = metric_batch(data, advantages)
    metrics = dict(compute_data_metrics(batch=batch, use_critic=False))
    per_token = compute_timing_metrics(batch=batch, timing_raw=timing)
    metrics.update({k: v for k, v in per_token.items() if k.startswith("timing_per_token_ms/")})
    metrics.update(compute_throughout_metrics(batch=batch, timing_raw=timing, n_gpus=int(n_gpus)))
    corr = cfg.algorithm.get("rollout_correction", None)
    if corr is not None and "rollout_log_probs" in batch.batch.keys() and "old_log_probs" in batch.batch.keys():
        from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

        _, corr_metrics = compute_rollout_correction_and_add_to_batch(batch, corr)
        metrics.update(corr_metrics)
    return {k: float(v) for k, v in metrics.items()}

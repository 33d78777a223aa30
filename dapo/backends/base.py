"""The backend interface the one DAPO loop (:mod:`dapo.train.loop`) drives.

Two implementations: :mod:`dapo.backends.local.backend` (HF transformers in one process, CPU or one GPU) and
:mod:`dapo.backends.verl.backend` (verl worker groups on Ray: FSDP actor, vLLM rollout). The loop owns everything that
is the DAPO *algorithm* (reward + overlong shaping, dynamic sampling, group advantages, metrics, cadence, resume); a
backend owns everything that touches model weights (generation, log-probs, the optimizer step with the DAPO loss
from :mod:`dapo.loss`, checkpoints of weights/optimizer).

Data flow of one rollout step (paper Algorithm 1)::

    prompts = loop.next_prompts(gen_batch_size)                      # rows in the DAPO-Math-17k schema
    r = backend.generate(prompts, n, sampling)                        # -> Rollout (n responses per prompt)
    scores = loop.score(r)                                            # verifier + soft overlong punishment
    kept = sampler.add(...)                                           # dynamic sampling, may loop to generate more
    batch = backend.concat([backend.select(r, idx), ...])             # exactly train_batch_size * n responses
    backend.compute_old_log_probs(batch)                              # pi_old, recomputed before the update
    metrics = backend.update(batch, advantages, loss_mask)            # ppo_epochs x mini-batches of the DAPO loss

Responses of one prompt are contiguous in a Rollout (interleaved repeat, like verl's ``repeat(interleave=True)``)
and share a ``group_ids`` value.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np


@dataclass
class Sampling:
    """Generation settings for one call (train or validation)."""

    n: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    max_tokens: int = 16
    # a validation request (the loop's rollout.val sampling): backends draw it from its own random stream
    validation: bool = False


@dataclass
class Rollout:
    """Responses generated for a batch of prompts; one entry per response.

    ``data`` is backend-private (token tensors, a verl ``DataProto``, ...); the loop never looks inside it and only
    manipulates rollouts through :meth:`Backend.select` / :meth:`Backend.concat`.
    """

    group_ids: np.ndarray  # [N] int or str: responses of one prompt share an id (verl's "uid")
    prompt_rows: list[dict[str, Any]]  # [N] the source row of each response (ground truth, data_source, ...)
    response_text: list[str]  # [N] decoded responses (special tokens stripped)
    response_length: np.ndarray  # [N] int: generated tokens (EOS included when present)
    truncated: np.ndarray  # [N] bool: hit max_tokens without EOS
    data: Any = None
    # per-response generation statistics, e.g. {"entropy": [N], "mean_prob": [N]} when the backend has them
    stats: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.response_text)

    def take(self, index: np.ndarray, data: Any) -> "Rollout":
        """The responses at ``index`` (in that order) with the backend's already-selected private ``data``."""
        idx = np.asarray(index, dtype=np.int64).reshape(-1)
        return Rollout(
            group_ids=np.asarray(self.group_ids)[idx],
            prompt_rows=[self.prompt_rows[i] for i in idx],
            response_text=[self.response_text[i] for i in idx],
            response_length=np.asarray(self.response_length)[idx],
            truncated=np.asarray(self.truncated)[idx],
            data=data,
            stats={k: np.asarray(v)[idx] for k, v in self.stats.items()},
        )

    @staticmethod
    def join(rollouts: list["Rollout"], data: Any) -> "Rollout":
        """``rollouts`` in order with the backend's already-joined private ``data``; stats kept where all have them."""
        stat_keys = set.intersection(*(set(r.stats) for r in rollouts)) if rollouts else set()
        return Rollout(
            group_ids=np.concatenate([np.asarray(r.group_ids) for r in rollouts]),
            prompt_rows=[row for r in rollouts for row in r.prompt_rows],
            response_text=[t for r in rollouts for t in r.response_text],
            response_length=np.concatenate([np.asarray(r.response_length) for r in rollouts]),
            truncated=np.concatenate([np.asarray(r.truncated) for r in rollouts]),
            data=data,
            stats={k: np.concatenate([np.asarray(r.stats[k]) for r in rollouts]) for k in sorted(stat_keys)},
        )


class Backend(abc.ABC):
    """What the DAPO loop needs from a model runtime."""

    @abc.abstractmethod
    def generate(self, prompts: list[dict[str, Any]], sampling: Sampling, group_ids: Optional[list] = None) -> Rollout:
        """Generate ``sampling.n`` responses per prompt row. Rows carry the chat ``prompt`` list of the DAPO schema.

        ``group_ids`` (one per prompt) default to fresh unique ids.
        """

    @abc.abstractmethod
    def select(self, rollout: Rollout, index: np.ndarray) -> Rollout:
        """The responses at ``index`` (in that order), private data included."""

    @abc.abstractmethod
    def concat(self, rollouts: list[Rollout]) -> Rollout:
        """Rollouts joined in order."""

    @abc.abstractmethod
    def compute_old_log_probs(self, batch: Rollout) -> dict[str, float]:
        """Recompute log pi_old(o_t | q, o_<t) for the whole batch with the current weights (no grad) and keep it in
        ``batch.data``; returns metrics (``actor/entropy``, ``actor/mean_prob`` ...)."""

    @abc.abstractmethod
    def update(self, batch: Rollout, advantages: np.ndarray, loss_mask: Optional[np.ndarray] = None) -> dict[str, float]:
        """``ppo_epochs`` passes of mini-batch updates with the DAPO loss.

        ``advantages``: [N] one value per response (outcome reward => broadcast over its tokens).
        ``loss_mask``: [N] bool, False drops a response from the loss (overlong filtering); None keeps all.
        Returns metrics under verl's names (``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``,
        ``actor/ppo_kl``, ``actor/grad_norm``, ``actor/lr``).
        """

    @abc.abstractmethod
    def save_checkpoint(self, directory: str) -> None:
        """Write weights, optimizer and scheduler state into ``directory`` (the loop makes it atomic)."""

    @abc.abstractmethod
    def load_checkpoint(self, directory: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote."""

    #: devices one rollout step runs on (``perf/throughput`` is tokens per second per GPU, as verl's)
    n_gpus: int = 1

    def fit_metrics(self, batch: Rollout, advantages: np.ndarray, timing: dict[str, float]) -> dict[str, float]:
        """Metrics of the finished step computed by the backend itself, under verl's ``fit()`` names; they replace the
        loop's own values of the same names (:mod:`dapo.train.step_metrics`). ``timing`` holds the step's phase
        seconds and ``step``. Nothing by default; the verl backend returns what verl's own metric functions give on
        its ``DataProto`` (:mod:`dapo.backends.verl.fit_metrics`)."""
        return {}

    def rank_metrics(self, step: int) -> dict[str, float]:
        """Per-rank metrics of the finished step (``ranks/*``: the slowest rank over the median); {} with one rank."""
        return {}

    def suspect_nodes(self) -> list[dict[str, Any]]:
        """Nodes the backend saw misbehave without failing (a rank persistently slow), for the attempt's end record."""
        return []

    def weights_finite(self) -> Optional[bool]:
        """Whether every weight of the policy is finite (checked before a checkpoint is written and after one is
        loaded); None when the backend cannot tell cheaply."""
        return None

    def checkpoint_bytes(self) -> Optional[int]:
        """About how many bytes one checkpoint takes, before the first one exists (later ones are sized by the
        newest on disk); None when unknown."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (Ray actors, GPU memory)."""

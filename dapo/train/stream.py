"""The training data's order and the process's randomness: :class:`PromptStream` (the prompts of each generation batch,
epoch after epoch, with a resumable cursor), :func:`rollout_steps` (how many steps the data makes a run) and
:func:`configure_determinism` (seeds; deterministic torch kernels).
"""

from __future__ import annotations

import random

import numpy as np

__all__ = ["PromptStream", "configure_determinism", "rollout_steps"]


def rollout_steps(recipe, n_train_rows: int) -> int:
    """The run's length in rollout steps: ``recipe.trainer.total_training_steps``, else (as verl counts it)
    ``n_train_rows // gen_batch_size`` generation batches per epoch x ``total_epochs``."""
    t = recipe.trainer
    if t.total_training_steps is not None:
        return int(t.total_training_steps)
    gen_batch_size = recipe.data.gen_batch_size or recipe.data.train_batch_size
    per_epoch = n_train_rows // gen_batch_size
    if per_epoch < 1:
        raise ValueError(f"{n_train_rows} training prompts are fewer than one generation batch ({gen_batch_size})")
    return per_epoch * t.total_epochs


def configure_determinism(seed: int, deterministic: bool = True) -> None:
    """Seed python/numpy/torch and ask torch for deterministic kernels (exact reruns on CPU)."""
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)



class PromptStream:
    """Training prompts in epochs: a seeded permutation per epoch (or file order with ``shuffle=False``); a request
    that does not fit in the rest of the epoch starts the next one (the remainder is dropped, like a
    ``drop_last`` data loader). The cursor ``(epoch, pos)`` is the resumable state."""

    def __init__(self, num_rows: int, seed: int, shuffle: bool = True):
        if num_rows < 1:
            raise ValueError("the training data is empty")
        self.num_rows, self.seed, self.shuffle = num_rows, int(seed), shuffle
        self.epoch, self.pos = 0, 0
        self._order_epoch, self._order = -1, np.arange(num_rows)

    def order(self, epoch: int) -> np.ndarray:
        if epoch != self._order_epoch:
            self._order = (
                np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)
                if self.shuffle
                else np.arange(self.num_rows)
            )
            self._order_epoch = epoch
        return self._order

    def take(self, k: int) -> np.ndarray:
        if k > self.num_rows:
            raise ValueError(f"a generation batch of {k} prompts exceeds the {self.num_rows} training prompts")
        if self.pos + k > self.num_rows:
            self.epoch, self.pos = self.epoch + 1, 0
        out = self.order(self.epoch)[self.pos : self.pos + k]
        self.pos += k
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, s: dict[str, int]) -> None:
        self.epoch, self.pos = int(s["epoch"]), int(s["pos"])

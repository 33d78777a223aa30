"""Test helpers for the DAPO loop: a scripted numpy backend and shrunken tiny presets."""

from __future__ import annotations

import zlib
from typing import Any, Optional

import numpy as np

from dapo.backends.base import Backend, Rollout, Sampling

# metrics measured on the wall clock: they differ between two runs of the same seed (the tests compare the rest)
WALL_CLOCK = ("timing_s/", "timing_per_token_ms/", "perf/time_per_step", "perf/throughput", "perf/mfu/")


def wall_clock(name: str) -> bool:
    """Whether ``name`` is a wall-clock measurement (:data:`WALL_CLOCK`)."""
    return name.startswith(WALL_CLOCK)

# A tiny-preset variant that runs in seconds: a 1-layer model of hidden 64, a short warm start, few steps.
SMALL_TINY = [
    "local.model.hidden_size=64",
    "local.model.num_hidden_layers=1",
    "local.model.num_attention_heads=2",
    "local.model.num_key_value_heads=2",
    "local.model.intermediate_size=128",
    "local.task.n_train=400",
    "local.task.n_val=32",
    "local.warm_start.steps=30",
    "local.warm_start.batch_size=32",
    "recipe.data.train_batch_size=4",
    "recipe.data.gen_batch_size=6",
    "recipe.rollout.n=4",
    "recipe.actor.ppo_mini_batch_size=2",
    "local.micro_batch_size=8",
    "recipe.filter_groups.max_num_gen_batches=0",
    "recipe.trainer.logger=[console]",
    "placement.device=cpu",
]


def make_rows(p_correct: list[float], data_source: str = "fake") -> list[dict[str, Any]]:
    """DAPO-schema rows; ``extra_info.p`` is the chance the scripted policy answers a row correctly."""
    return [
        {
            "data_source": data_source,
            "prompt": [{"role": "user", "content": f"problem {i}"}],
            "reward_model": {"style": "rule", "ground_truth": str(100 + i)},
            "extra_info": {"index": i, "p": float(p)},
        }
        for i, p in enumerate(p_correct)
    ]


class ScriptedBackend(Backend):
    """A numpy backend: answers a row correctly with probability ``extra_info.p``; records what the loop sends.

    ``lengths``: response length of every response (``max_tokens`` -> truncated); ``entropy`` the value
    ``compute_old_log_probs`` reports.
    """

    def __init__(self, seed: int = 0, length: int = 5, entropy: float = 0.5, truncate_every: int = 0):
        self.rng = np.random.default_rng(seed)
        self.length, self.entropy, self.truncate_every = length, entropy, truncate_every
        self.generate_calls: list[tuple[int, Sampling]] = []
        self.updates: list[dict[str, Any]] = []
        self.saved: list[str] = []
        self.weights = 0.0  # stands for the model: each update adds the mean advantage

    def generate(self, prompts, sampling: Sampling, group_ids: Optional[list] = None) -> Rollout:
        self.generate_calls.append((len(prompts), sampling))
        if group_ids is None:
            group_ids = [f"val-{i}" for i in range(len(prompts))]
        n = sampling.n
        rows = [r for r in prompts for _ in range(n)]
        texts, lengths, trunc = [], [], []
        rng = self.rng
        if sampling.validation:  # like the local backend: its own stream, seeded from (not advancing) the training one
            rng = np.random.default_rng(zlib.crc32(repr(self.rng.bit_generator.state).encode()))
        for k, r in enumerate(rows):
            ok = rng.random() < r["extra_info"]["p"]
            texts.append(f"Answer: {r['reward_model']['ground_truth'] if ok else 'wrong'}")
            long = self.truncate_every and k % self.truncate_every == 0
            lengths.append(sampling.max_tokens if long else self.length)
            trunc.append(bool(long))
        N = len(rows)
        return Rollout(
            group_ids=np.asarray([g for g in group_ids for _ in range(n)], dtype=object),
            prompt_rows=rows,
            response_text=texts,
            response_length=np.asarray(lengths, dtype=np.int64),
            truncated=np.asarray(trunc, dtype=bool),
            data={"row": np.arange(N)},
        )

    def select(self, rollout: Rollout, index: np.ndarray) -> Rollout:
        idx = np.asarray(index, dtype=np.int64)
        return rollout.take(idx, {"row": rollout.data["row"][idx]})

    def concat(self, rollouts: list[Rollout]) -> Rollout:
        return Rollout.join(rollouts, {"row": np.concatenate([r.data["row"] for r in rollouts])})

    def compute_old_log_probs(self, batch: Rollout) -> dict[str, float]:
        batch.data["old"] = True
        return {"actor/entropy": self.entropy, "actor/mean_prob": 0.5}

    def update(self, batch: Rollout, advantages, loss_mask=None) -> dict[str, float]:
        assert batch.data.get("old"), "update before compute_old_log_probs"
        self.updates.append({
            "batch": batch, "advantages": np.asarray(advantages), "loss_mask": None if loss_mask is None
            else np.asarray(loss_mask),
        })  # fmt: skip
        self.weights += float(np.mean(advantages))
        return {"actor/pg_loss": 0.0, "actor/pg_clipfrac": 0.0, "actor/pg_clipfrac_lower": 0.0, "actor/lr": 1.0}

    def save_checkpoint(self, directory: str) -> None:
        import json
        import os

        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "scripted.json"), "w") as f:
            json.dump({"weights": self.weights, "rng": self.rng.bit_generator.state}, f)
        self.saved.append(directory)

    def load_checkpoint(self, directory: str) -> None:
        import json
        import os

        with open(os.path.join(directory, "scripted.json")) as f:
            st = json.load(f)
        self.weights = st["weights"]
        self.rng.bit_generator.state = st["rng"]


def assert_the_kept_best_has_the_best_validation(run_dir, save_freq: int, total_steps: int) -> tuple[int, float]:
    """The run's kept "best" checkpoint (``checkpoints/best_checkpoint.json``, kept by retention) is the argmax of the
    validation scores the run logged (``metrics.jsonl``, :func:`dapo.train.metrics.val_accuracy`) over the validated
    steps that have a checkpoint (step >= 1 on the save cadence: every ``save_freq``-th and the last); on a tie the
    earliest of them (the first to reach the score: a later equal score does not move the best). Returns that
    (step, score)."""
    from pathlib import Path

    from dapo.train.checkpoint import best_record, best_step, checkpoint_root, complete_steps
    from dapo.train.metrics import read_jsonl, val_accuracy

    def saved(step: int) -> bool:
        return step >= 1 and (step % save_freq == 0 or step == total_steps)

    scores = {int(r["step"]): val_accuracy(r) for r in read_jsonl(Path(run_dir) / "metrics.jsonl")
              if val_accuracy(r) is not None}
    validated = sorted((s, v) for s, v in scores.items() if saved(s))
    assert validated, f"{run_dir}: no validation of a saved step in metrics.jsonl: {scores}"
    step, score = max(validated, key=lambda sv: (sv[1], -sv[0]))
    root = checkpoint_root(run_dir)
    assert best_step(root) == step, (f"kept best {best_record(root)}, the run's best validation: step {step} "
                                     f"({score}) of {validated}")
    assert abs(best_record(root)["score"] - score) < 1e-9, f"kept best {best_record(root)}, its logged score {score}"
    assert step in complete_steps(root), (step, complete_steps(root))
    return step, score

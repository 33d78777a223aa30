"""The CPU proof of the one-GPU preset (tests/test_one_gpu_cpu.py): the stand-ins for its model and data, the swaps.

The stand-in model: the same architecture (``Qwen2ForCausalLM``) and config shape as the preset's model -- its
head_dim, grouped-query attention, MLP-to-hidden ratio, tied embeddings and context length, read from
:data:`dapo.plan.models.ARCHS` (the public config.json values) -- at tiny widths, saved with a tokenizer as a Hugging
Face directory; and locally made rows in DAPO-Math-17k's schema. Built by the tiny preset's own asset code
(:mod:`dapo.tiny.assets`: a tokenizer trained on the task corpus, the addition task written as DAPO-Math-17k rows, a
short supervised warm start so that RL has groups with mixed outcomes -- a model fresh from initialisation answers
nothing right and dynamic sampling starves).
What differs from the real model: the widths, the depth, the vocabulary (a few hundred tokens, not 151,936) and the
rope base (the tiny builder's 1e4). No download.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# layers and query heads of the stand-in (tiny); everything else follows the real model's ratios
LAYERS, HEADS = 2, 2
# one-digit additions (all 100 of them: 68 to train on, 32 held out) and a warm start of 100 steps x 64 (43 s on one
# core): then ~16% of sampled answers are right and ~40% of groups of 4 have mixed outcomes (measured), enough for
# dynamic sampling to fill small batches within the recipe's 10 generation batches
TASK = {"digits": 1, "n_train": 68, "n_val": 32}
WARM_START = {"steps": 100, "batch_size": 64}


def standin_spec(model_path: str):
    """The ``local:`` spec (:class:`dapo.config.LocalConfig`) of a stand-in for ``model_path``."""
    from dapo.config.schema import LocalConfig, TaskSpec, TinyModelSpec, WarmStartSpec
    from dapo.plan.models import resolve_arch

    a = resolve_arch(model_path)
    hidden = HEADS * a.head_dim
    kv = max(1, HEADS * a.num_kv_heads // a.num_heads)  # grouped-query attention, as the real model (14:2 -> 2:1)
    ratio = a.intermediate_size / a.hidden_size
    model = TinyModelSpec(hidden_size=hidden, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                          num_key_value_heads=kv, intermediate_size=int(round(hidden * ratio / 32)) * 32,
                          max_position_embeddings=a.max_position_embeddings, tie_word_embeddings=a.tie_word_embeddings)
    return LocalConfig(model=model, task=TaskSpec(**TASK), warm_start=WarmStartSpec(**WARM_START))


def build_standin(model_path: str, cache: Path):
    """(assets, spec): the stand-in's model + tokenizer directory and its DAPO-schema train / validation files."""
    from dapo.tiny.assets import prepare

    spec = standin_spec(model_path)
    return prepare(spec, Path(cache)), spec


# the preset keys the CPU proof changes (everything else is the preset's): the stand-ins, the platform, the scale
SWAPPED = (
    "recipe.model.path", "recipe.data.train_files", "recipe.data.val_files",  # the stand-ins
    "placement.accelerator", "recipe.model.use_remove_padding",  # the platform
    "recipe.data.max_prompt_length", "recipe.data.max_response_length", "recipe.reward.overlong_buffer.len",
    "recipe.data.train_batch_size", "recipe.data.gen_batch_size", "recipe.rollout.n",
    "recipe.actor.ppo_mini_batch_size", "recipe.trainer.total_training_steps", "recipe.trainer.default_local_dir",
)  # fmt: skip


def swaps(assets, run: Path, steps: int) -> list[str]:
    """The overrides of :data:`SWAPPED`, in order."""
    return [
        f"recipe.model.path={assets.policy_dir}",
        f"recipe.data.train_files=[{assets.train_file}]",
        f"recipe.data.val_files=[{assets.val_file}]",
        # verl on CPU (docs/verl.md), remove-padding off as on every CPU run (a GPU-only setting there)
        "placement.accelerator=cpu",
        "recipe.model.use_remove_padding=false",
        # the task's lengths (its prompts are ~67 tokens with its own tokenizer), the buffer scaled with them
        "recipe.data.max_prompt_length=96",
        "recipe.data.max_response_length=32",
        "recipe.reward.overlong_buffer.len=6",
        # 4 prompts x 4 per step from generation batches of 12 (the preset's 3x), 2 optimizer steps (the preset's)
        "recipe.data.train_batch_size=4",
        "recipe.data.gen_batch_size=12",
        "recipe.rollout.n=4",
        "recipe.actor.ppo_mini_batch_size=2",
        f"recipe.trainer.total_training_steps={steps}",
        f"recipe.trainer.default_local_dir={run}",
    ]


def flat(node: Any, prefix: str = "") -> dict[str, Any]:
    """A config (plain mapping) as {dotted key: leaf}."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def differences(preset: dict[str, Any], ran: dict[str, Any], rows: list) -> tuple[set[str], dict[str, tuple]]:
    """(keys that differ, {key: (preset's, run's)} of those no swap explains) between two verl configs written with
    interpolations unresolved (a key verl derives from another is equal when its source is); a swap explains a key
    when the settings table's row for it (``rows``: both configs' :class:`dapo.backends.verl.settings.Setting`)
    names a swapped preset key as its source."""
    a, b = flat(preset), flat(ran)
    allowed = {row.key for row in rows if any(k in row.source for k in SWAPPED)}
    differ = {k for k in a.keys() | b.keys() if a.get(k, "<absent>") != b.get(k, "<absent>")}
    unexplained = {k: (a.get(k, "<absent>"), b.get(k, "<absent>")) for k in differ
                   if k not in allowed and not any(k.startswith(x + ".") for x in allowed)}
    return differ, unexplained

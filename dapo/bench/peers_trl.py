"""TRL's ``GRPOTrainer`` on the tiny task, configured as close to the DAPO recipe as TRL allows (``dapo bench peers``).

Runs in TRL's own environment (``make setup-trl``: its transformers pin differs from verl's) as::

    python -m dapo.bench.peers_trl CONFIG.json

``CONFIG.json`` is written by :func:`dapo.bench.peers.cmd_peers` from the same preset ``dapo train`` uses:
:func:`grpo_kwargs` maps it onto ``trl.GRPOConfig`` (pure; tested without TRL). What TRL cannot express is stated
next to the mapping; the rest matches (model, tokenizer, prompts, prompts x n per step, sampling, max tokens, loss,
learning rate and schedule, optimizer, grad clip, mini-batches per rollout step). The reward is
:func:`dapo.reward.score_responses` -- the same verifier and soft overlong punishment -- on TRL's completions.

Writes ``<out>/trl_result.json``: per rollout step (one TRL generation = ``steps_per_generation`` optimizer steps) its
wall and CPU seconds, the seconds spent in generation, in the old-log-prob forward and in the rest of the step (the update), generated tokens;
and the policy saved as a HF directory at every ``test_freq`` steps (``<out>/ckpt-<step>``) so the caller validates it
with the same code as ``dapo train``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def grpo_kwargs(recipe: dict[str, Any], out_dir: str, steps: int, seed: int) -> dict[str, Any]:
    """``trl.GRPOConfig`` arguments equivalent to ``recipe`` (a preset's ``recipe`` section as a dict).

    Mapping (DAPO recipe -> TRL):

    - ``train_batch_size`` prompts x ``rollout.n`` per rollout step, ``ppo_mini_batch_size`` prompts per optimizer
      step -> ``num_generations`` = n, ``per_device_train_batch_size`` = mini x n, ``steps_per_generation`` =
      train / mini (TRL generates ``steps_per_generation`` x the per-device batch at once and, as the generation
      spans several optimizer steps, recomputes pi_old once per generation, as ours);
    - ``clip_ratio_low/high`` -> ``epsilon`` / ``epsilon_high``; dual clip ``clip_ratio_c`` -> ``delta`` (TRL's
      two-sided clip caps the ratio at ``delta`` for every token; DAPO's dual clip bounds the loss of negative-advantage
      tokens at ``c * |A|`` -- the closest TRL has, not the same formula);
    - ``loss_agg_mode`` token-mean -> ``loss_type`` "dapo" (token-level normalisation over the global batch);
      seq-mean-token-mean -> "grpo";
    - group-normalised advantages -> ``scale_rewards`` "group"; no KL -> ``beta`` 0;
    - AdamW lr / betas / weight decay / grad clip; verl's constant schedule with ``lr_warmup_steps`` rollout steps ->
      ``constant_with_warmup`` over ``lr_warmup_steps x steps_per_generation`` optimizer steps;
    - sampling: temperature / top-p / top-k, ``max_response_length`` -> ``max_completion_length``.

    Not expressible in TRL: dynamic sampling (filter_groups), the soft overlong punishment as a loss-side feature (it
    is applied here inside the reward function, as verl does).
    """
    data, ro, actor = recipe["data"], recipe["rollout"], recipe["actor"]
    n = int(ro["n"])
    mini, train = int(actor["ppo_mini_batch_size"]), int(data["train_batch_size"])
    if train % mini:
        raise ValueError(f"train_batch_size {train} is not a multiple of ppo_mini_batch_size {mini}")
    per_gen = train // mini
    agg = actor["loss_agg_mode"]
    loss_type = {"token-mean": "dapo", "seq-mean-token-mean": "grpo"}.get(agg)
    if loss_type is None:
        raise ValueError(f"recipe.actor.loss_agg_mode {agg!r} has no TRL loss_type equivalent")
    optim = actor["optim"]
    top_k = ro.get("top_k", -1)
    return {
        "output_dir": out_dir,
        "max_steps": steps * per_gen,
        "per_device_train_batch_size": mini * n,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": per_gen,
        "num_generations": n,
        "num_iterations": int(actor.get("ppo_epochs", 1)),
        "max_completion_length": int(data["max_response_length"]),
        "temperature": float(ro["temperature"]),
        "top_p": float(ro["top_p"]),
        "top_k": 0 if top_k is None or top_k <= 0 else int(top_k),  # TRL: 0 = off
        "epsilon": float(actor["clip_ratio_low"]),
        "epsilon_high": float(actor["clip_ratio_high"]),
        "delta": float(actor["clip_ratio_c"]),
        "loss_type": loss_type,
        "beta": 0.0,
        "scale_rewards": "group",
        "mask_truncated_completions": False,
        "learning_rate": float(optim["lr"]),
        "adam_beta1": float(optim["betas"][0]),
        "adam_beta2": float(optim["betas"][1]),
        "weight_decay": float(optim["weight_decay"]),
        "max_grad_norm": float(optim["clip_grad"]),
        "lr_scheduler_type": "constant_with_warmup",
        "warmup_steps": int(optim["lr_warmup_steps"]) * per_gen,
        "optim": "adamw_torch",
        "seed": int(seed),
        "use_cpu": True,
        "bf16": False,
        "fp16": False,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "shuffle_dataset": True,
        "log_completions": False,
    }


def make_reward_fn(recipe: dict[str, Any], tokenizer):
    """The DAPO reward (verifier + soft overlong punishment, :func:`dapo.reward.score_responses`) as a TRL reward
    function; ``completion_ids`` give the generated token counts (TRL keeps the EOS token in them: the same count as
    ours)."""
    from dapo.reward import score_responses

    ob = recipe["reward"]["overlong_buffer"]
    max_len = int(recipe["data"]["max_response_length"])

    def dapo_reward(prompts, completions, completion_ids, ground_truth, **_):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        lengths = [len(ids) for ids in completion_ids]
        scored = score_responses(
            texts, list(ground_truth), lengths, max_response_length=max_len, overlong_buffer_len=int(ob["len"]),
            overlong_penalty_factor=float(ob["penalty_factor"]), overlong_enable=bool(ob["enable"]),
        )
        return [float(x) for x in scored["reward"]]

    dapo_reward.__name__ = "dapo_reward"
    return dapo_reward


def main(argv: list[str]) -> int:
    """Build TRL's trainer from ``CONFIG.json``, time its phases, train, write ``trl_result.json`` (module doc)."""
    cfg = json.loads(Path(argv[0]).read_text())
    import torch

    torch.set_num_threads(int(cfg.get("threads") or torch.get_num_threads()))
    out = Path(cfg["out"])
    out.mkdir(parents=True, exist_ok=True)
    recipe = cfg["recipe"]
    trainer, tok = _trainer(cfg, out)
    timing = {"gen": 0.0, "old_log_prob": 0.0, "gen_tokens": 0}
    steps: list[dict[str, float]] = []
    _time_phases(trainer, timing)
    trainer.add_callback(_clock(trainer, tok, cfg, out, timing, steps))
    t0 = time.time()
    trainer.train()
    import trl

    (out / "trl_result.json").write_text(json.dumps({
        "trl_version": trl.__version__, "steps": steps, "wall_seconds": time.time() - t0,
        "grpo_config": {k: v for k, v in grpo_kwargs(recipe, "", 1, 0).items() if k not in ("output_dir",)},
    }, indent=2))  # fmt: skip
    return 0


def _trainer(cfg: dict[str, Any], out: Path) -> tuple[Any, Any]:
    """``trl.GRPOTrainer`` (and the tokenizer) on the preset's model, the training prompts and our reward."""
    import pandas as pd
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    recipe = cfg["recipe"]
    tok = AutoTokenizer.from_pretrained(cfg["model"])
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.float32)
    df = pd.read_parquet(cfg["train_file"])
    ds = Dataset.from_dict({
        "prompt": [[{"role": m["role"], "content": m["content"]} for m in p] for p in df["prompt"]],
        "ground_truth": [rm["ground_truth"] for rm in df["reward_model"]],
    })  # fmt: skip
    args = GRPOConfig(**grpo_kwargs(recipe, str(out / "trainer"), int(cfg["steps"]), int(cfg["seed"])))
    trainer = GRPOTrainer(model=model, reward_funcs=make_reward_fn(recipe, tok), args=args, train_dataset=ds,
                          processing_class=tok)  # fmt: skip
    return trainer, tok


def _time_phases(trainer: Any, timing: dict[str, float]) -> None:
    """Wrap the trainer's generation and its no-grad (old) log-prob forward to add their seconds (and the
    generated tokens) to ``timing``."""
    import torch

    gen_fn = trainer._generate_single_turn

    def timed_generate(*a, **k):
        t0 = time.perf_counter()
        res = gen_fn(*a, **k)
        timing["gen"] += time.perf_counter() - t0
        ids = res[0]  # (completion_ids, logprobs)
        timing["gen_tokens"] += int(sum(len(x) for x in ids))
        return res

    trainer._generate_single_turn = timed_generate
    lp_fn = trainer._get_per_token_logps_and_entropies

    def timed_logps(*a, **k):
        if torch.is_grad_enabled():
            return lp_fn(*a, **k)
        t0 = time.perf_counter()
        res = lp_fn(*a, **k)
        timing["old_log_prob"] += time.perf_counter() - t0
        return res

    trainer._get_per_token_logps_and_entropies = timed_logps


def _clock(trainer: Any, tok: Any, cfg: dict[str, Any], out: Path, timing: dict[str, float],
           steps: list[dict[str, float]]) -> Any:
    """A callback that appends one record per rollout step (``steps_per_generation`` optimizer steps) to ``steps``
    and saves the policy every ``test_freq`` rollout steps."""
    from transformers import TrainerCallback

    per_gen = trainer.args.steps_per_generation
    test_freq = int(cfg["test_freq"])
    n_resp = int(cfg["recipe"]["data"]["train_batch_size"]) * int(cfg["recipe"]["rollout"]["n"])

    class Clock(TrainerCallback):
        def __init__(self):
            self.t0 = None
            self.mark = dict(timing)

        def on_step_begin(self, args_, state, control, **kw):
            if state.global_step % per_gen == 0:
                self.t0, self.c0 = time.perf_counter(), time.process_time()
                self.mark = dict(timing)

        def on_step_end(self, args_, state, control, **kw):
            if state.global_step % per_gen:
                return
            step = state.global_step // per_gen
            total, cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
            gen = timing["gen"] - self.mark["gen"]
            old = timing["old_log_prob"] - self.mark["old_log_prob"]
            steps.append({"step": step, "step_s": total, "cpu_s": cpu, "gen_s": gen, "old_log_prob_s": old,
                          "update_s": total - gen - old, "gen_tokens": timing["gen_tokens"] - self.mark["gen_tokens"],
                          "responses": n_resp})  # fmt: skip
            if test_freq > 0 and (step % test_freq == 0 or step == int(cfg["steps"])):
                trainer.model.save_pretrained(str(out / f"ckpt-{step}"))
                tok.save_pretrained(str(out / f"ckpt-{step}"))

    return Clock()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python
"""Generate docs/fidelity.md: every key of the `early` and `full` presets beside the reference scripts' values.

The reference values below are DATA transcribed from the reference scripts (shell arithmetic evaluated) and from the
reference commit's trainer config -- never read from this bundle's code. The generator composes each preset into
verl 0.9.1's config (dapo.backends.verl.config.resolve), looks every reference key up there (under its 0.9.1 name when
verl renamed it) and fails if a value differs without a documented reason, or if a documented deviation no longer
differs (a stale document). ``--check`` compares the generated text with the file (tests/test_fidelity_doc.py runs it).

    python scripts/gen_fidelity.py            # (re)write docs/fidelity.md
    python scripts/gen_fidelity.py --check    # exit 1 if docs/fidelity.md is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "fidelity.md"

REFERENCE_REPO = "volcengine/verl"
REFERENCE_COMMIT = "4f80e465c2ec79ab9c3c30ec74b9745de61d0490"

# ---------------------------------------------------------------------------------------------------------------------
# Reference values: recipe/dapo/run_dapo_qwen2.5_32b.sh and run_dapo_early_qwen2.5_32b.sh at REFERENCE_COMMIT.
# ${HOME}/verl is written as ~/verl. Shell arithmetic is evaluated: $((1024 * 20)) = 20480, $((2048 + 20480)) = 22528.
# ---------------------------------------------------------------------------------------------------------------------
_COMMON: dict[str, Any] = {
    "data.train_files": "~/verl/data/dapo-math-17k.parquet",
    "data.val_files": "~/verl/data/aime-2024.parquet",
    "data.prompt_key": "prompt",
    "data.truncation": "left",
    "data.max_prompt_length": 2048,
    "data.max_response_length": 20480,
    "data.train_batch_size": 512,
    "actor_rollout_ref.rollout.n": 16,
    "algorithm.adv_estimator": "grpo",
    "algorithm.use_kl_in_reward": False,
    "algorithm.kl_ctrl.kl_coef": 0.0,
    "actor_rollout_ref.actor.use_kl_loss": False,
    "actor_rollout_ref.actor.kl_loss_coef": 0.0,
    "actor_rollout_ref.actor.clip_ratio_low": 0.2,
    "actor_rollout_ref.actor.clip_ratio_high": 0.28,
    "actor_rollout_ref.actor.clip_ratio_c": 10.0,
    "actor_rollout_ref.model.use_remove_padding": True,
    "actor_rollout_ref.actor.use_dynamic_bsz": True,
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": True,
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": True,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 22528,
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": 22528,
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 22528,
    "actor_rollout_ref.model.path": "~/verl/models/Qwen2.5-32B",
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.optim.lr_warmup_steps": 10,
    "actor_rollout_ref.actor.optim.weight_decay": 0.1,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
    "actor_rollout_ref.actor.fsdp_config.param_offload": True,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True,
    "actor_rollout_ref.actor.entropy_coeff": 0,
    "actor_rollout_ref.actor.grad_clip": 1.0,
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 8,
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.7,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 4,
    "actor_rollout_ref.rollout.enable_chunked_prefill": True,
    "actor_rollout_ref.rollout.max_num_batched_tokens": 22528,
    "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.top_p": 1.0,
    "actor_rollout_ref.rollout.top_k": -1,
    "actor_rollout_ref.rollout.val_kwargs.temperature": 1.0,
    "actor_rollout_ref.rollout.val_kwargs.top_p": 0.7,
    "actor_rollout_ref.rollout.val_kwargs.top_k": -1,
    "actor_rollout_ref.rollout.val_kwargs.do_sample": True,
    "actor_rollout_ref.rollout.val_kwargs.n": 1,
    "actor_rollout_ref.ref.fsdp_config.param_offload": True,
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": 8,
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": -1,
    "reward_model.reward_manager": "dapo",
    "reward_model.overlong_buffer.enable": True,
    "reward_model.overlong_buffer.len": 4096,
    "reward_model.overlong_buffer.penalty_factor": 1.0,
    "trainer.logger": ["console", "wandb"],
    "trainer.project_name": "DAPO-verl",
    "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 16,
    "trainer.val_before_train": True,
    "trainer.test_freq": 5,
    "trainer.save_freq": 5,
    "trainer.total_epochs": 1,
    "trainer.resume_mode": "auto",
    # recipe/dapo/runtime_env.yaml (the scripts' --runtime-env)
    "runtime_env.env_vars.TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
    "runtime_env.env_vars.VLLM_USE_V1": "1",
}

SCRIPTS: dict[str, tuple[str, dict[str, Any]]] = {
    "full": (
        "recipe/dapo/run_dapo_qwen2.5_32b.sh",
        {
            **_COMMON,
            "data.gen_batch_size": 1536,  # train_prompt_bsz * 3
            "algorithm.filter_groups.enable": True,
            "algorithm.filter_groups.max_num_gen_batches": 10,
            "algorithm.filter_groups.metric": "acc",
            "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
            "trainer.experiment_name": "DAPO-Qwen2.5-32B",
            "trainer.default_local_dir": "~/verl/ckpts/DAPO-verl/DAPO-Qwen2.5-32B",
        },
    ),
    "early": (
        "recipe/dapo/run_dapo_early_qwen2.5_32b.sh",
        {
            **_COMMON,
            "data.gen_batch_size": 512,
            "algorithm.filter_groups.enable": False,
            "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
            "trainer.experiment_name": "DAPO-Early-Qwen2.5-32B",
            "trainer.default_local_dir": "~/verl/ckpts/DAPO-verl/DAPO-Early-Qwen2.5-32B",
        },
    ),
}

# Keys the scripts leave at the reference commit's defaults (recipe/dapo/src/config/dapo_trainer.yaml at
# REFERENCE_COMMIT) whose 0.9.1 default differs or which matter to the result.
REFERENCE_DEFAULTS: dict[str, Any] = {
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.enforce_eager": True,
    "actor_rollout_ref.rollout.max_num_seqs": 1024,
    "actor_rollout_ref.rollout.engine_seed": 0,
    "actor_rollout_ref.rollout.do_sample": True,
    "actor_rollout_ref.actor.ppo_epochs": 1,
    "actor_rollout_ref.actor.shuffle": False,
    "actor_rollout_ref.actor.optim.warmup_style": "constant",
    "actor_rollout_ref.actor.checkpoint.contents": ["model", "hf_model", "optimizer", "extra"],
    "actor_rollout_ref.actor.strategy": "fsdp",
    "actor_rollout_ref.ref.strategy": "fsdp",
    "actor_rollout_ref.rollout.max_model_len": None,
    "algorithm.gamma": 1.0,
    "algorithm.lam": 1.0,
    "data.shuffle": True,
    "trainer.max_actor_ckpt_to_keep": None,
    "data.seed": 1,  # ray_trainer: train_dataloader_generator.manual_seed(config.data.get("seed", 1))
    "trainer.balance_batch": True,
    "trainer.total_training_steps": None,
}

# Reference key -> verl 0.9.1 key, with why it moved (same value expected).
RENAMED: dict[str, tuple[str, str]] = {
    "actor_rollout_ref.actor.grad_clip": (
        "actor_rollout_ref.actor.optim.clip_grad",
        "0.9.1 reads the clip from the optimizer config; `actor.grad_clip` is still accepted but unused (we set both)",
    ),
    "reward_model.reward_manager": (
        "reward.reward_manager.name",
        "0.9.1's main_ppo ignores `reward_model.reward_manager`; the reward loop reads `reward.reward_manager.name`",
    ),
    "reward_model.overlong_buffer.enable": (
        "reward.reward_kwargs.overlong_buffer_cfg.enable",
        "`reward_model.overlong_buffer.*` is gone; the DAPO reward manager reads `reward.reward_kwargs` "
        "(+ `max_resp_len`)",
    ),
    "reward_model.overlong_buffer.len": ("reward.reward_kwargs.overlong_buffer_cfg.len", "as above"),
    "reward_model.overlong_buffer.penalty_factor": (
        "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor",
        "as above",
    ),
    "actor_rollout_ref.rollout.engine_seed": ("actor_rollout_ref.rollout.seed", "renamed; 0.9.1 seeds replica r with "
                                              "`seed + r`"),
    "actor_rollout_ref.actor.optim.warmup_style": (
        "actor_rollout_ref.actor.optim.lr_scheduler_type",
        "renamed (`warmup_style` is deprecated); the same constant-with-linear-warm-up schedule",
    ),
    "actor_rollout_ref.actor.checkpoint.contents": ("actor_rollout_ref.actor.checkpoint.save_contents", "renamed"),
    "runtime_env.env_vars.TORCH_NCCL_AVOID_RECORD_STREAMS": (
        "ray_kwargs.ray_init.runtime_env.env_vars.TORCH_NCCL_AVOID_RECORD_STREAMS",
        "the scripts pass recipe/dapo/runtime_env.yaml to `ray job submit`; we put it in the job's Ray runtime env",
    ),
    "runtime_env.env_vars.VLLM_USE_V1": ("ray_kwargs.ray_init.runtime_env.env_vars.VLLM_USE_V1", "as above"),
}

# Documented value differences: reference key -> reason. Every difference must be here, and every entry must differ.
DEVIATIONS: dict[str, str] = {
    "data.train_files": "Deployment path only: the same file on the cluster's shared volume.",
    "data.val_files": "Deployment path only: the same file on the cluster's shared volume.",
    "actor_rollout_ref.model.path": "The Hugging Face id of the same weights (the reference points at a local "
    "download); `recipe.model.path=<dir>` uses a local copy.",
    "trainer.default_local_dir": "Deployment path only: checkpoints on the shared volume, so a restarted job "
    "resumes from them.",
    "trainer.max_actor_ckpt_to_keep": "Retention, not the recipe: the reference keeps every checkpoint (~400 GB "
    "each for 32B), which fills any volume and then fails every retry at its next save. The newest three and the "
    "best-scoring one stay ([storage.md](storage.md#checkpoints-and-retention)).",
    "trainer.total_training_steps": "Run length (full only): the paper's run reached its score at about 320 rollout "
    "steps, while the reference's `total_epochs: 1` over the hub file is 1,166 rollout steps, 3.6x that "
    "([reproduce.md](reproduce.md#3-steps-and-epochs-what-the-numbers-mean)); the override "
    "`recipe.trainer.total_training_steps=null` restores the one epoch. `early` keeps one epoch (3,499 rollout "
    "steps): no public source gives the step at which the early run reached its score.",
    "actor_rollout_ref.actor.strategy": "FSDP2 (`fully_shard`) instead of FSDP1: verl's README recommends it "
    "('better throughput and memory usage'), and the CPU run exercises it end to end. Same loss and optimizer; "
    "numbers differ only by reduction order. `actor_rollout_ref.actor.strategy=fsdp` selects FSDP1, untested here.",
    "actor_rollout_ref.ref.strategy": "Follows `actor.strategy` (verl interpolates it): FSDP2, as above.",
    "actor_rollout_ref.rollout.max_model_len": "Same context as the reference, whose vLLM rollout took "
    "`max_model_len or prompt_length + response_length`; verl 0.9.1 derives a null one from its copy of the model "
    "config (Qwen2.5-32B: 131,072; 7b with its override: 32,768, which vLLM refuses: it reads the model's own "
    "4,096). Set to prompt + response; a position override reaches vLLM through "
    "`rollout.engine_kwargs.vllm.hf_overrides`.",
    "actor_rollout_ref.actor.checkpoint.contents": "No `hf_model`: at the reference commit it wrote the HF config and "
    "tokenizer only (0.9.1 writes those anyway); in 0.9.1 it makes rank 0 gather and write the full fp32 model every "
    "save (for 32B ~122 GiB of host memory on one pod, every other rank waiting). `dapo eval export` merges the "
    "FSDP shards into the same HF weights.",
}

# Deviations that are not a config value: how the run differs from the reference beyond its keys.
BEHAVIOUR: list[tuple[str, str]] = [
    (
        "Dynamic sampling runs in our loop, not in verl's trainer",
        "verl 0.9.1 ships no DAPO trainer (its legacy trainer ignores `algorithm.filter_groups`, its v1 trainer "
        "replaces dynamic sampling by a replay buffer). `dapo.train.loop` with `dapo.sampler.DynamicSampler` "
        "implements the reference's `RayDAPOTrainer.fit` rule: keep a group when the std of its metric is > 0 (or it "
        "has one response), add batches of `gen_batch_size` prompts until `train_batch_size` groups are kept, keep "
        "the first `train_batch_size * n` responses, fail after `max_num_gen_batches`. `algorithm.filter_groups.*` "
        "is still written into verl's config so the printed config states the recipe.",
    ),
    (
        "Token-mean normalisation (full recipe): mini-batch instead of micro-batch",
        "verl 0.9.1 divides each micro-batch's token loss by the valid tokens of the whole mini-batch over all "
        "data-parallel ranks (eq. 12 over the mini-batch); the reference took each micro-batch's token mean weighted "
        "by its share of sequences (`loss * len(micro) / ppo_mini_batch_size_per_gpu`), so with dynamic batch sizes "
        "tokens in short micro-batches weigh more. `recipe.actor.token_mean_scope: microbatch` "
        "(`loss_mode=dapo_microbatch`) selects the reference's; the default `minibatch` (`loss_mode=dapo`) gives "
        "verl 0.9.1's. Identical for `seq-mean-token-mean` (early).",
    ),
    (
        "The policy loss is ours, registered in verl",
        "`actor_rollout_ref.actor.policy_loss.loss_mode=dapo` selects `dapo.loss.policy_loss` through verl's "
        "policy-loss registry; tests prove it equals `compute_policy_loss_vanilla` + `agg_loss`.",
    ),
    (
        "Rewards: our verifier, verl's reward loop as a cross-check",
        "`dapo.reward` scores once per response on the driver (the same numbers as verl's `math_dapo` and "
        "`DAPORewardManager`), placed like verl on the last valid token; verl's reward loop "
        "(`reward.reward_manager.name=dapo`) scores again on the workers only with `recipe.reward.verl_agreement: "
        "true` (`reward/verl_agreement`).",
    ),
    (
        "Rollout stack of verl 0.9.1",
        "vLLM as asynchronous replicas driven by the agent loop (`rollout.mode=async`), weights synced through the "
        "checkpoint engine; the reference ran vLLM in-process (SPMD). Same sampling parameters; the rollout's own "
        "log-probs feed only the `mean_prob` metric: pi_old is recomputed by the actor, as in the reference.",
    ),
    (
        "Batch balancing for every pass, on a copy for the log-probs",
        "The reference reorders the whole batch (`balance_batch`) before recomputing pi_old; the loop balances a copy "
        "for the old (and reference) log-probs, whose outputs come back in the batch's order, and the update with the "
        "same partitioning: every pass balanced as in `fit()`, the mini-batches the reference's.",
    ),
    (
        "Checkpoints and resume",
        "The loop's checkpoints (weights and optimizer through verl's `save_checkpoint`, plus the loop and sampler "
        "state) under `trainer.default_local_dir`, resumed with `resume_mode: auto`; the reference used verl's "
        "`global_step_N` layout.",
    ),
]

PRESETS = ("full", "early")


def _norm(v: Any) -> Any:
    """A value compared as the reference translation compares it (numbers as floats, sequences as lists)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    from dapo.reference.translate import _norm as norm_value

    if isinstance(v, (DictConfig, ListConfig)):
        v = OmegaConf.to_container(v, resolve=True)
    return norm_value(v)


def _same(ref: Any, ours: Any, key: str) -> bool:
    r, o = _norm(ref), _norm(ours)
    if key.endswith(("train_files", "val_files")) and isinstance(o, list) and len(o) == 1:
        o = o[0]
    return r == o


def _fmt(v: Any) -> str:
    v = _norm(v)
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        v = int(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def compare(name: str) -> tuple[list[dict[str, Any]], str]:
    """Rows (reference key, reference value, 0.9.1 key, our value, preset key, status) for one preset."""
    from omegaconf import OmegaConf

    from dapo.backends.verl import config as verl_config
    from dapo.backends.verl import settings as verl_settings
    from dapo.config import load_preset

    preset = load_preset(name)
    resolved = verl_config.resolve(preset)
    cfg = resolved.cfg
    sources = {s.key: s.source for s in verl_settings.settings(preset)}
    script, values = SCRIPTS[name]
    rows = []
    for origin, table in (("script", values), ("default", REFERENCE_DEFAULTS)):
        for ref_key, ref_val in table.items():
            key, _why = RENAMED.get(ref_key, (ref_key, ""))
            ours = OmegaConf.select(cfg, key, default="<missing>")
            if ours == "<missing>":
                raise SystemExit(f"gen_fidelity: {name}: verl key {key} (reference {ref_key}) is not in the config")
            same = _same(ref_val, ours, ref_key)
            if not same and ref_key not in DEVIATIONS:
                raise SystemExit(
                    f"gen_fidelity: {name}: {ref_key} = {_fmt(ref_val)} in the reference, {_fmt(ours)} here, and "
                    "DEVIATIONS gives no reason"
                )
            status = ("same" if ref_key not in RENAMED else "same (renamed)") if same else "deviation"
            src = sources.get(key, "")
            rows.append({
                "ref_key": ref_key + (" (default)" if origin == "default" else ""),
                "ref": _fmt(ref_val),
                "key": key,
                "ours": _fmt(ours),
                "preset": src if not src.startswith("fixed") else "fixed in dapo.backends.verl.settings",
                "status": status,
                "raw_key": ref_key,
            })
    return rows, script


def render() -> str:
    results = {name: compare(name) for name in PRESETS}
    used = {r["raw_key"] for rows, _ in results.values() for r in rows if r["status"] == "deviation"}
    stale = sorted(set(DEVIATIONS) - used)
    if stale:
        raise SystemExit(f"gen_fidelity: DEVIATIONS lists keys that no longer differ: {stale}")
    out = [
        "# Fidelity: the `early` and `full` presets beside the reference DAPO scripts",
        "",
        "<!-- generated by scripts/gen_fidelity.py from dapo/presets/*.yaml; do not edit by hand -->",
        "",
        f"Reference: `{REFERENCE_REPO}` at commit `{REFERENCE_COMMIT}`, the commit the DAPO README names for the "
        "AIME-2024 reproductions (`early` = DAPO w/o token-level loss and dynamic sampling, 44; `full` = DAPO, 50). "
        "Reference values are transcribed from the scripts (and, marked *(default)*, from that commit's "
        "`recipe/dapo/src/config/dapo_trainer.yaml` where the scripts keep a default); ours are read from the verl "
        "0.9.1 config that `dapo train --preset NAME` composes and validates "
        "(`python -m dapo.train --preset NAME --dry-run` prints it).",
        "",

        "## Key renames in verl 0.9.1",
        "",
        "| reference key | verl 0.9.1 key | why |",
        "|---|---|---|",
    ]
    for ref_key, (key, why) in RENAMED.items():
        out.append(f"| `{ref_key}` | `{key}` | {why} |")
    scripts = {name: results[name][1] for name in PRESETS}
    by_key: dict[str, dict[str, dict[str, Any]]] = {}
    for name in PRESETS:
        for r in results[name][0]:
            by_key.setdefault(r["ref_key"], {})[name] = r

    def preset_cell(r: dict[str, Any]) -> str:
        p = r["preset"]
        return f"`{p}`" if p and not p.startswith("fixed") else p.replace("fixed in ", "fixed: ")

    def alike(per: dict[str, dict[str, Any]]) -> bool:
        return len(per) == len(PRESETS) and len({r["ref"] for r in per.values()}) == 1 and all(
            r["status"] != "deviation" for r in per.values())

    out += ["", "## Every key", "",
            "Reference keys under their reference names (renamed ones in verl 0.9.1: the table above); "
            + "; ".join(f"`{n}` = `{s}`" for n, s in scripts.items()) + ". Where a preset deviates, the cell shows "
            "the reference's value, an arrow and ours (a **deviation**, explained below).", "",
            "**The same in both presets, and as in the reference:**", "",
            "| reference key | preset key | value |", "|---|---|---|"]
    for ref_key, per in by_key.items():
        if alike(per):
            r = next(iter(per.values()))
            out.append(f"| `{ref_key}` | {preset_cell(r)} | {r['ref']} |")
    out += ["", "**Different between the presets, or a deviation:**", "",
            "| reference key | preset key | " + " | ".join(f"`{n}`" for n in PRESETS) + " |",
            "|---|---|" + "---|" * len(PRESETS)]
    for ref_key, per in by_key.items():
        if alike(per):
            continue
        cells = []
        for name in PRESETS:
            r = per.get(name)
            cells.append("" if r is None else r["ref"] if r["status"] != "deviation"
                         else f"{r['ref']} -> {r['ours']} **deviation**")
        out.append(f"| `{ref_key}` | {preset_cell(next(iter(per.values())))} | " + " | ".join(cells) + " |")
    out += ["", "## Deviations", ""]
    seen: dict[str, list[str]] = {}
    for name in PRESETS:
        for r in results[name][0]:
            if r["status"] == "deviation":
                seen.setdefault(r["raw_key"], []).append(name)
    for raw, names in seen.items():
        out.append(f"- `{raw}` ({', '.join(f'`{n}`' for n in names)}): {DEVIATIONS[raw]}")
    out += ["", "## Deviations beyond config keys", ""]
    for i, (title, text) in enumerate(BEHAVIOUR, 1):
        out += [f"{i}. **{title}.** {text}", ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/fidelity.md differs from the generated text")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    text = render()
    if args.check:
        current = DOC.read_text() if DOC.exists() else ""
        if current != text:
            print(f"{DOC.relative_to(ROOT)} is stale: run python scripts/gen_fidelity.py", file=sys.stderr)
            return 1
        print(f"{DOC.relative_to(ROOT)} is up to date")
        return 0
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

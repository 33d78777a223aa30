"""The preset -> verl key table: every verl 0.9.1 config value the DAPO recipe sets, and where it comes from.

The preset (:mod:`dapo.config`) is the single source of truth. :func:`settings` turns it into a list of verl keys
and typed values (:class:`Setting`), each one naming the preset key it comes from (or why it is a fixed recipe
constant). :mod:`dapo.backends.verl.config` merges them into verl's composed config as they are; which other verl keys
a user may pass is :mod:`dapo.backends.verl.passthrough`; the reference translation
(:mod:`dapo.reference.translate`) takes the same rows in verl 4f80e46's key names.

:data:`LOSS_MODULE` names the module that registers the DAPO loss in verl (:mod:`dapo.backends.verl.loss`); the
table puts it in every Ray process's runtime env (``VERL_USE_EXTERNAL_MODULES``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dapo.backends.verl.cpu.plugin import PLATFORM_NAME as CPU_PLATFORM
from dapo.config import Preset

# The module that registers our policy losses in verl's registry; Ray workers import it through
# VERL_USE_EXTERNAL_MODULES (verl/__init__.py imports the listed modules in every process).
LOSS_MODULE = "dapo.backends.verl.loss"
# What every Ray worker of a run does for its reliability (the process-group timeout, stacks on request, the
# compute probe), imported the same way, after the loss.
HOOKS_MODULE = "dapo.backends.verl.worker_hooks"
# The CPU platform (dapo.backends.verl.cpu): the vLLM worker extension of patch 2 (VERL_PLATFORM: CPU_PLATFORM).
CPU_VLLM_EXTENSION = "dapo.backends.verl.cpu.vllm_worker.CPUReloadWorkerExtension"
# What verl's checkpoint manager writes at every save (checkpoint.save_contents): FSDP model shards, optimizer,
# extra state (lr scheduler, RNG); no "hf_model" full-weights copy (settings(); dapo.plan.memory sizes from this).
CHECKPOINT_CONTENTS = ("model", "optimizer", "extra")
# recipe.actor.token_mean_scope -> the verl loss_mode name registered by LOSS_MODULE.
LOSS_MODES = {"minibatch": "dapo", "microbatch": "dapo_microbatch"}


@dataclass(frozen=True)
class Setting:
    """One verl config value derived from the preset."""

    key: str  # dotted verl key, without Hydra's '+'
    value: Any
    source: str  # the preset key it comes from, or "fixed: <why>" for a recipe constant
    append: bool = False  # the key is not in verl's schema: the table adds it

    @property
    def owned(self) -> bool:
        """Preset-derived (not overridable through passthrough Hydra overrides)."""
        return not self.source.startswith("fixed")


def settings(preset: Preset) -> list[Setting]:
    """Every verl key this bundle sets, in a stable order, with its value and provenance: one table, a row per verl key
    (grouped: model, data, sampling, algorithm, actor loss and optimizer, reward, trainer, placement, fixed recipe
    constants, verl on CPU, the workers' env); the few conditions choose rows, not values."""
    r, p = preset.recipe, preset.placement
    par = p.parallel
    a, m, d, ro = r.actor, r.model, r.data, r.rollout
    out: list[Setting] = []

    def put(key: str, value: Any, source: str, append: bool = False) -> None:
        out.append(Setting(key, value, source, append))

    # model
    put("actor_rollout_ref.model.path", m.path, "recipe.model.path")
    if m.tokenizer_path is not None:
        put("actor_rollout_ref.model.tokenizer_path", m.tokenizer_path, "recipe.model.tokenizer_path")
    put("actor_rollout_ref.model.enable_gradient_checkpointing", m.enable_gradient_checkpointing,
        "recipe.model.enable_gradient_checkpointing")
    put("actor_rollout_ref.model.use_remove_padding", m.use_remove_padding, "recipe.model.use_remove_padding")
    put("actor_rollout_ref.model.trust_remote_code", m.trust_remote_code, "recipe.model.trust_remote_code")
    for k, v in sorted(m.override_config.items()):
        put(f"actor_rollout_ref.model.override_config.{k}", v, f"recipe.model.override_config.{k}", append=True)
    # data
    put("data.train_files", list(d.train_files), "recipe.data.train_files")
    put("data.val_files", list(d.val_files), "recipe.data.val_files")
    put("data.prompt_key", d.prompt_key, "recipe.data.prompt_key")
    put("data.train_batch_size", d.train_batch_size, "recipe.data.train_batch_size")
    put("data.gen_batch_size", d.gen_batch_size if d.gen_batch_size is not None else d.train_batch_size,
        "recipe.data.gen_batch_size")
    put("data.max_prompt_length", d.max_prompt_length, "recipe.data.max_prompt_length")
    put("data.max_response_length", d.max_response_length, "recipe.data.max_response_length")
    put("data.truncation", d.truncation, "recipe.data.truncation")
    put("data.shuffle", d.shuffle, "recipe.data.shuffle")
    put("data.seed", r.trainer.seed, "recipe.trainer.seed")
    # sampling
    put("actor_rollout_ref.rollout.n", ro.n, "recipe.rollout.n")
    put("actor_rollout_ref.rollout.temperature", ro.temperature, "recipe.rollout.temperature")
    put("actor_rollout_ref.rollout.top_p", ro.top_p, "recipe.rollout.top_p")
    put("actor_rollout_ref.rollout.top_k", ro.top_k, "recipe.rollout.top_k")
    for k in ("temperature", "top_p", "top_k", "n", "do_sample"):
        if k == "temperature" and not ro.val.do_sample:
            # verl's agent loop reads only temperature / top_p / top_k: greedy validation is temperature 0
            put("actor_rollout_ref.rollout.val_kwargs.temperature", 0.0, "recipe.rollout.val.do_sample (false: greedy)")
            continue
        put(f"actor_rollout_ref.rollout.val_kwargs.{k}", getattr(ro.val, k), f"recipe.rollout.val.{k}")
    # algorithm
    put("algorithm.adv_estimator", r.algorithm.adv_estimator, "recipe.algorithm.adv_estimator")
    put("algorithm.norm_adv_by_std_in_grpo", r.algorithm.norm_adv_by_std, "recipe.algorithm.norm_adv_by_std")
    put("algorithm.use_kl_in_reward", r.algorithm.use_kl_in_reward, "recipe.algorithm.use_kl_in_reward")
    put("algorithm.kl_ctrl.kl_coef", r.algorithm.kl_coef, "recipe.algorithm.kl_coef")
    fg = r.filter_groups
    put("algorithm.filter_groups.enable", fg.enable, "recipe.filter_groups.enable")
    put("algorithm.filter_groups.metric", fg.metric, "recipe.filter_groups.metric")
    put("algorithm.filter_groups.max_num_gen_batches", fg.max_num_gen_batches, "recipe.filter_groups.max_num_gen_batches")
    # actor loss + optimizer
    put("actor_rollout_ref.actor.policy_loss.loss_mode", LOSS_MODES[a.token_mean_scope], "recipe.actor.token_mean_scope")
    put("actor_rollout_ref.actor.clip_ratio_low", a.clip_ratio_low, "recipe.actor.clip_ratio_low")
    put("actor_rollout_ref.actor.clip_ratio_high", a.clip_ratio_high, "recipe.actor.clip_ratio_high")
    put("actor_rollout_ref.actor.clip_ratio_c", a.clip_ratio_c, "recipe.actor.clip_ratio_c")
    put("actor_rollout_ref.actor.loss_agg_mode", a.loss_agg_mode, "recipe.actor.loss_agg_mode")
    put("actor_rollout_ref.actor.entropy_coeff", a.entropy_coeff, "recipe.actor.entropy_coeff")
    put("actor_rollout_ref.actor.use_kl_loss", a.use_kl_loss, "recipe.actor.use_kl_loss")
    put("actor_rollout_ref.actor.kl_loss_coef", a.kl_loss_coef, "recipe.actor.kl_loss_coef")
    put("actor_rollout_ref.actor.kl_loss_type", a.kl_loss_type, "recipe.actor.kl_loss_type")
    put("actor_rollout_ref.actor.ppo_mini_batch_size", a.ppo_mini_batch_size, "recipe.actor.ppo_mini_batch_size")
    put("actor_rollout_ref.actor.ppo_epochs", a.ppo_epochs, "recipe.actor.ppo_epochs")
    o = a.optim
    put("actor_rollout_ref.actor.optim.lr", o.lr, "recipe.actor.optim.lr")
    put("actor_rollout_ref.actor.optim.lr_warmup_steps", o.lr_warmup_steps, "recipe.actor.optim.lr_warmup_steps")
    put("actor_rollout_ref.actor.optim.weight_decay", o.weight_decay, "recipe.actor.optim.weight_decay")
    put("actor_rollout_ref.actor.optim.clip_grad", o.clip_grad, "recipe.actor.optim.clip_grad")
    # verl 0.9.1 still accepts (and ignores) the old key; keep it equal so the printed config does not contradict
    put("actor_rollout_ref.actor.grad_clip", o.clip_grad, "recipe.actor.optim.clip_grad")
    put("actor_rollout_ref.actor.optim.betas", list(o.betas), "recipe.actor.optim.betas")
    # reward: verl's DAPO reward manager (its numbers equal dapo.reward's; the loop uses ours)
    ob = r.reward.overlong_buffer
    put("reward.reward_manager.name", "dapo", "fixed: the DAPO reward manager (rule-based verifier + overlong shaping)")
    put("reward.reward_kwargs.overlong_buffer_cfg.enable", ob.enable, "recipe.reward.overlong_buffer.enable", True)
    put("reward.reward_kwargs.overlong_buffer_cfg.len", ob.len, "recipe.reward.overlong_buffer.len", True)
    put("reward.reward_kwargs.overlong_buffer_cfg.penalty_factor", ob.penalty_factor,
        "recipe.reward.overlong_buffer.penalty_factor", True)
    put("reward.reward_kwargs.overlong_buffer_cfg.log", False, "fixed: reference value", True)
    put("reward.reward_kwargs.max_resp_len", d.max_response_length, "recipe.data.max_response_length", True)
    # trainer
    t = r.trainer
    put("trainer.total_epochs", t.total_epochs, "recipe.trainer.total_epochs")
    put("trainer.total_training_steps", t.total_training_steps, "recipe.trainer.total_training_steps")
    put("trainer.save_freq", t.save_freq, "recipe.trainer.save_freq")
    put("trainer.test_freq", t.test_freq, "recipe.trainer.test_freq")
    put("trainer.val_before_train", t.val_before_train, "recipe.trainer.val_before_train")
    put("trainer.project_name", t.project_name, "recipe.trainer.project_name")
    put("trainer.experiment_name", t.experiment_name, "recipe.trainer.experiment_name")
    put("trainer.default_local_dir", t.default_local_dir, "recipe.trainer.default_local_dir")
    put("trainer.resume_mode", t.resume_mode, "recipe.trainer.resume_mode")
    put("trainer.logger", list(t.logger), "recipe.trainer.logger")
    put("trainer.max_actor_ckpt_to_keep", t.max_ckpt_to_keep, "recipe.trainer.max_ckpt_to_keep")
    put("trainer.log_val_generations", t.log_val_generations, "recipe.trainer.log_val_generations")
    put("trainer.rollout_data_dir", t.rollout_data_dir, "recipe.trainer.rollout_data_dir")
    put("trainer.validation_data_dir", t.validation_data_dir, "recipe.trainer.validation_data_dir")
    # placement
    put("trainer.nnodes", p.nodes, "placement.nodes")
    put("trainer.n_gpus_per_node", p.gpus_per_node, "placement.gpus_per_node")
    put("actor_rollout_ref.actor.ulysses_sequence_parallel_size", par.ulysses_sp, "placement.parallel.ulysses_sp")
    put("actor_rollout_ref.ref.ulysses_sequence_parallel_size", par.ulysses_sp, "placement.parallel.ulysses_sp")
    put("actor_rollout_ref.rollout.tensor_model_parallel_size", par.rollout_tp, "placement.parallel.rollout_tp")
    put("actor_rollout_ref.rollout.gpu_memory_utilization", par.gpu_memory_utilization,
        "placement.parallel.gpu_memory_utilization")
    put("actor_rollout_ref.rollout.enable_chunked_prefill", par.enable_chunked_prefill,
        "placement.parallel.enable_chunked_prefill")
    put("actor_rollout_ref.rollout.max_num_batched_tokens", par.max_num_batched_tokens,
        "placement.parallel.max_num_batched_tokens")
    put("actor_rollout_ref.actor.use_dynamic_bsz", par.use_dynamic_bsz, "placement.parallel.use_dynamic_bsz")
    put("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", par.use_dynamic_bsz, "placement.parallel.use_dynamic_bsz")
    put("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", par.use_dynamic_bsz, "placement.parallel.use_dynamic_bsz")
    infer_len = par.log_prob_max_token_len_per_gpu or par.ppo_max_token_len_per_gpu
    put("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", par.ppo_max_token_len_per_gpu,
        "placement.parallel.ppo_max_token_len_per_gpu")
    put("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", infer_len, "placement.parallel.log_prob_max_token_len_per_gpu")
    put("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", infer_len,
        "placement.parallel.log_prob_max_token_len_per_gpu")
    if not par.use_dynamic_bsz:
        mbs = par.ppo_micro_batch_size_per_gpu
        put("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", mbs, "placement.parallel.ppo_micro_batch_size_per_gpu")
        put("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", mbs,
            "placement.parallel.ppo_micro_batch_size_per_gpu")
        put("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", mbs,
            "placement.parallel.ppo_micro_batch_size_per_gpu")
    put("actor_rollout_ref.actor.fsdp_config.param_offload", par.param_offload, "placement.parallel.param_offload")
    put("actor_rollout_ref.actor.fsdp_config.optimizer_offload", par.optimizer_offload,
        "placement.parallel.optimizer_offload")
    put("actor_rollout_ref.ref.fsdp_config.param_offload", par.param_offload, "placement.parallel.param_offload")
    put("actor_rollout_ref.actor.fsdp_config.fsdp_size", par.fsdp_size, "placement.parallel.fsdp_size")
    # fixed recipe constants: the reference commit's defaults where verl 0.9.1 changed them, and 0.9.1 requirements
    put("actor_rollout_ref.rollout.name", "vllm", "fixed: the reference rollout engine (0.9.1 has no default)")
    put("actor_rollout_ref.rollout.enforce_eager", True,
        "fixed: reference default (the DAPO README: CUDA graphs may degrade model performance)")
    put("actor_rollout_ref.rollout.max_num_seqs", 1024, "fixed: reference default (0.9.1 default 256)")
    # vLLM's context: one prompt + response. Left unset, verl 0.9.1 derives it from *its* copy of the HF config
    # (override_config included) while vLLM reads the model's own config.json and refuses a longer max_model_len
    # (vllm/config/model.py, _get_and_verify_max_len); the position override reaches vLLM through its hf_overrides.
    put("actor_rollout_ref.rollout.max_model_len", d.max_prompt_length + d.max_response_length,
        "recipe.data.max_prompt_length + recipe.data.max_response_length")
    if "max_position_embeddings" in m.override_config:
        put("actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides.max_position_embeddings",
            m.override_config["max_position_embeddings"], "recipe.model.override_config.max_position_embeddings",
            append=True)
    put("actor_rollout_ref.rollout.seed", 0, "fixed: reference engine_seed")
    # no hf_model: in 0.9.1 it makes rank 0 gather and write the whole fp32 model at every save (32B: ~122 GiB of host
    # memory on one pod, ~131 GB more per checkpoint, every other rank at a barrier), where the reference commit's
    # hf_model wrote the config and tokenizer only -- which 0.9.1 writes anyway; `dapo eval export` merges the FSDP
    # shards into the same HF weights when a checkpoint is scored (docs/fidelity.md)
    put("actor_rollout_ref.actor.checkpoint.save_contents", list(CHECKPOINT_CONTENTS),
        "fixed: the reference's contents without a full-weights hf_model copy (the export merges the shards)")
    # FSDP2 on every preset: verl's README recommends it ("better throughput and memory usage"; its CPU offload is
    # correct under gradient accumulation), and it is the FSDP the CPU run exercises end to end (docs/fidelity.md:
    # the reference ran FSDP1; the numbers differ only by reduction order). ref.strategy follows actor.strategy.
    put("actor_rollout_ref.actor.strategy", "fsdp2",
        "fixed: FSDP2 (verl's recommendation; the strategy the CPU run tests; reference default fsdp)")
    put("trainer.balance_batch", True, "fixed: reference default")
    put("trainer.use_v1", False, "fixed: the non-v1 worker groups; DAPO's loop is dapo.train.loop")
    if not r.reward.verl_agreement:
        # the loop scores every response on the driver; verl would start reward.num_workers (8) idle reward actors
        put("reward.num_workers", 0, "recipe.reward.verl_agreement")
    cpu_env: dict[str, str] = {}
    if p.accelerator == CPU_ACCELERATOR:
        for key, value, why, append in cpu_settings(preset):
            put(key, value, f"fixed: verl on CPU (placement.accelerator: cpu) -- {why}", append)
        cpu_env = CPU_ENV
    # every training process (Ray runtime env): the preset's env + our loss registration (+ the CPU platform's)
    env = {**cpu_env, **p.env, "VERL_USE_EXTERNAL_MODULES": f"{LOSS_MODULE},{HOOKS_MODULE}"}
    for k, v in env.items():
        src = ("fixed: registers the DAPO loss and the reliability hooks in Ray workers"
               if k == "VERL_USE_EXTERNAL_MODULES" else f"placement.env.{k}" if k in p.env
               else "fixed: verl on CPU (placement.accelerator: cpu)")
        put(f"ray_kwargs.ray_init.runtime_env.env_vars.{k}", str(v), src, True)
    return out


# placement.accelerator of a preset that runs verl's own workers on the host CPU (dapo.backends.verl.cpu)
CPU_ACCELERATOR = "cpu"
# logical Ray CPUs per logical GPU on the CPU platform (cpu_settings; the chart declares the same per worker pod)
CPU_RAY_CPUS_PER_GPU = 8
# the CPU platform's environment, in every process (the driver sets it before it imports verl's workers)
CPU_ENV = {
    "VERL_PLATFORM": CPU_PLATFORM,  # verl's platform selector: dapo.backends.verl.cpu.platform (a verl.plugins entry)
    "VERL_ENGINE_DEVICE": "cuda",  # verl registers its FSDP engine for cuda/npu only; the engine itself is generic
    "VLLM_TARGET_DEVICE": "cpu",  # vLLM's CPU platform (also implied by the CPU wheel's version suffix)
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache per vLLM replica (vLLM CPU does not size it from memory)
}


def cpu_settings(preset: Preset) -> list[tuple[str, Any, str, bool]]:
    """verl keys for its own workers on the host CPU: (key, value, why, append). Only for
    ``placement.accelerator: cpu`` (docs/verl.md, 'verl on CPU')."""
    world = preset.placement.nodes * preset.placement.gpus_per_node
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    out: list[tuple[str, Any, str, bool]] = [
        ("trainer.device", "cpu", "torch device of the workers", False),
        ("actor_rollout_ref.actor.use_torch_compile", False, "no torch.compile on CPU", False),
        ("actor_rollout_ref.actor.fsdp_config.use_torch_compile", False, "no torch.compile on CPU", False),
        ("actor_rollout_ref.ref.fsdp_config.use_torch_compile", False, "no torch.compile on CPU", False),
        ("actor_rollout_ref.rollout.dtype", "float32", "vLLM CPU in float32, as the actor", False),
        ("actor_rollout_ref.rollout.free_cache_engine", False, "vLLM CPU has no sleep mode", False),
        ("actor_rollout_ref.rollout.enable_sleep_mode", False, "vLLM CPU has no sleep mode", True),
        ("actor_rollout_ref.rollout.agent.num_workers", 1, "one agent-loop worker (each is a process)", False),
        ("actor_rollout_ref.rollout.checkpoint_engine.backend", "naive", "weights through shared memory", False),
        ("actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls", CPU_VLLM_EXTENSION,
         "vLLM CPU's in-place weight reload (patch 2)", True),
        ("actor_rollout_ref.model.override_config.attn_implementation", "sdpa", "no flash-attn on CPU", True),
        ("ray_kwargs.ray_init.num_gpus", world, "logical Ray GPUs: one slot per FSDP rank / vLLM replica "
         "(a local Ray only; a cluster's nodes declare theirs)", True),
        ("ray_kwargs.ray_init.num_cpus", CPU_RAY_CPUS_PER_GPU * world, "logical Ray CPUs: verl asks "
         "max_colocate_count (3) per GPU bundle plus the agent loop's and servers' actors; Ray counts slots, the OS "
         "shares the cores (a local Ray only)", False),
    ]
    for role in ("actor", "ref"):
        for k, v in fp32.items():
            out.append((f"actor_rollout_ref.{role}.fsdp_config.mixed_precision.{k}", v, "float32 on CPU", True))
    return out

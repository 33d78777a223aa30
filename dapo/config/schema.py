"""The preset schema: the typed dataclasses of one DAPO run -- a *recipe* (what to train) + a *placement* (where) +
the local backend's specifics (:class:`Preset`). Plain ``dataclasses`` with defaults; :mod:`dapo.config.loader` fills
them strictly from YAML, :mod:`dapo.config.rules` checks the cross-field rules.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_PENALTIES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")  # dapo.loss.kl_penalty (torch-free copy)


class ConfigError(ValueError):
    """A configuration problem; the message names the offending key and, where known, the file."""


# --------------------------------------------------------------------------------------------------------------------
# Recipe: what to train
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    # HF hub id or local directory of the policy; ``builtin:<name>`` builds a tiny model locally (no download).
    path: str = "Qwen/Qwen2.5-32B"
    # Tokenizer location when it differs from ``path``.
    tokenizer_path: Optional[str] = None
    # Keys merged into the HF model config before loading (e.g. ``max_position_embeddings: 32768``).
    override_config: dict[str, Any] = field(default_factory=dict)
    enable_gradient_checkpointing: bool = True
    use_remove_padding: bool = True
    trust_remote_code: bool = False


@dataclass
class DataConfig:
    # Parquet files in the DAPO-Math-17k schema (data_source, prompt [chat], ability, reward_model, extra_info).
    train_files: list[str] = field(default_factory=lambda: ["/data/dapo-math-17k.parquet"])
    val_files: list[str] = field(default_factory=lambda: ["/data/aime-2024.parquet"])
    prompt_key: str = "prompt"
    # Prompts per training step (after dynamic sampling).
    train_batch_size: int = 512
    # Prompts per generation round; null = train_batch_size.
    gen_batch_size: Optional[int] = None
    max_prompt_length: int = 2048
    max_response_length: int = 20480
    truncation: Literal["left", "right", "error"] = "left"
    shuffle: bool = True


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    # -1 = disabled (vLLM convention).
    top_k: int = -1
    # Samples per prompt.
    n: int = 1
    do_sample: bool = True


@dataclass
class RolloutConfig:
    # Samples per prompt (the group size G of the paper).
    n: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    # Sampling for validation (the DAPO recipe: T=1.0, top_p=0.7, one sample per row).
    val: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=1.0, top_p=0.7, top_k=-1, n=1))


@dataclass
class AlgorithmConfig:
    adv_estimator: Literal["grpo"] = "grpo"
    # Divide by the group std (GRPO); false gives Dr.GRPO-style centred rewards.
    norm_adv_by_std: bool = True
    # KL penalty in the token rewards (verl's apply_kl_penalty): not implemented by the DAPO loop -> must stay false/0
    # (use recipe.actor.use_kl_loss for a KL term).
    use_kl_in_reward: bool = False
    kl_coef: float = 0.0


@dataclass
class OptimConfig:
    lr: float = 1e-6
    # Linear warm-up steps, then constant (the recipe's schedule).
    lr_warmup_steps: int = 10
    weight_decay: float = 0.1
    # Max global grad norm.
    clip_grad: float = 1.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])


@dataclass
class ActorConfig:
    # Decoupled clip (Clip-Higher, paper eq. 10): ratio clipped to [1 - low, 1 + high].
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    # Dual-clip bound for negative advantages.
    clip_ratio_c: float = 10.0
    loss_agg_mode: str = "token-mean"
    # "minibatch": token-mean normalised over the whole mini-batch (correct token-level loss under gradient
    # accumulation / data parallel); "microbatch": the reference commit's per-micro-batch mean.
    token_mean_scope: Literal["minibatch", "microbatch"] = "minibatch"
    entropy_coeff: float = 0.0
    # KL loss against a frozen copy of the initial policy (verl's ppo_loss): + kl_loss_coef * agg(kl, mask).
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    # KL estimator (verl's kl_penalty): kl|k1, abs, mse|k2, low_var_kl|k3, each optionally with '+' (k2 gradient).
    kl_loss_type: str = "low_var_kl"
    # Prompts per optimizer mini-batch (x n responses).
    ppo_mini_batch_size: int = 32
    ppo_epochs: int = 1
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass
class OverlongBufferConfig:
    enable: bool = True
    # L_cache of the paper (eq. 13): the last ``len`` tokens before max_response_length are penalised linearly.
    len: int = 4096
    penalty_factor: float = 1.0


@dataclass
class RewardConfig:
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    # Overlong filtering: mask the loss of truncated responses (off in the DAPO recipes).
    overlong_filter: bool = False
    # Second opinion with math-verify, logged as its own metric; never changes the reward.
    math_verify: bool = False
    # verl backend: verl's reward loop also scores every rollout on the workers and reward/verl_agreement logs how
    # often it agrees with the loop's reward (a check that costs a second scoring pass; off: scored once).
    verl_agreement: bool = False


@dataclass
class FilterGroupsConfig:
    # Dynamic sampling (paper eq. 11): keep groups whose metric varies.
    enable: bool = False
    metric: Literal["acc", "score", "seq_reward", "seq_final_reward"] = "acc"
    # Generation rounds per step before giving up (<= 0: unlimited).
    max_num_gen_batches: int = 10
    # "reference": truncate surplus kept groups (paper); "carry": keep surplus for the next step and adapt the
    # over-sampling factor (off-paper).
    mode: Literal["reference", "carry"] = "reference"


HEALTH_GUARDS = ("entropy_collapse", "sampler_starving", "length_clip")


@dataclass
class HealthConfig:
    """DAPO health guards (:mod:`dapo.train.health`): warn -- or checkpoint and stop with exit code 3 -- when a run
    derails."""

    # entropy_collapse: actor/entropy below this for `patience` consecutive steps.
    entropy_min: float = 0.02
    # sampler_starving: train/num_gen_batches at its limit (filter_groups.max_num_gen_batches, or this value when
    # that is unlimited) for `patience` consecutive steps.
    starving_gen_batches: int = 10
    # length_clip: response_length/clip_ratio (responses at max_response_length) above this for `patience` steps.
    clip_ratio_max: float = 0.2
    # Consecutive steps a condition must hold before it fires.
    patience: int = 5
    # Guards that checkpoint and stop the run (exit code 3) instead of only warning.
    stop_on: list[Literal["entropy_collapse", "sampler_starving", "length_clip"]] = field(default_factory=list)


@dataclass
class WatchdogConfig:
    """The progress watchdog (:mod:`dapo.train.watchdog`): an attempt whose phase (start-up, a generation batch,
    log-probs, the update, a save, a validation) runs past its budget is ended (exit code 6) after its stacks are
    saved, and the next attempt resumes from the newest checkpoint. The defaults fit the 32B presets on 16 x 8 H100."""

    enable: bool = True
    # From the attempt's start to its first training phase: Ray, the worker groups, model load, vLLM engine start.
    startup_s: float = 3600.0
    # The first time a phase runs in an attempt (warm-up, compilation, the first checkpoint): its budget is at least
    # this.
    first_s: float = 3600.0
    # A phase that ran before: max(floor_s, multiple x the longest of its last `window` times).
    floor_s: float = 900.0
    multiple: float = 3.0
    window: int = 5
    # A checkpoint save: at least this (a 32B checkpoint is ~0.45 TB; the volume's write speed decides).
    save_s: float = 3600.0
    # How often the watchdog looks (and refreshes progress.json's heartbeat, which the log follower watches).
    poll_s: float = 5.0
    # How long it waits for the workers' stacks before it ends the attempt.
    evidence_wait_s: float = 20.0
    # A rank whose compute probe takes more than slow_ratio x the median for slow_steps steps in a row is named.
    slow_ratio: float = 1.5
    slow_steps: int = 3


@dataclass
class TrainerConfig:
    total_epochs: int = 1
    # Rollout steps; null = derived from epochs and data size.
    total_training_steps: Optional[int] = None
    save_freq: int = 5
    test_freq: int = 5
    val_before_train: bool = True
    seed: int = 1
    project_name: str = "DAPO"
    experiment_name: str = "DAPO-Qwen2.5-32B"
    # Where checkpoints go (on the shared volume on a cluster).
    default_local_dir: str = "/shared/ckpts/${trainer.project_name}/${trainer.experiment_name}"
    resume_mode: Literal["auto", "disable"] = "auto"
    logger: list[str] = field(default_factory=lambda: ["console", "wandb"])
    # Keep at most this many checkpoints (null: all).
    max_ckpt_to_keep: Optional[int] = None
    # Generation dumps (verl's trainer.* keys, same JSONL format): every step's training rollouts to
    # <rollout_data_dir>/<step>.jsonl, every validation to <validation_data_dir>/<step>.jsonl (null: off), and
    # log_val_generations validation samples per validation (chosen like verl) to <run dir>/val_generations.jsonl.
    rollout_data_dir: Optional[str] = None
    validation_data_dir: Optional[str] = None
    log_val_generations: int = 0
    # Health guards (entropy collapse, sampler starvation, responses piling up at the length cap).
    health: HealthConfig = field(default_factory=HealthConfig)
    # The progress watchdog: budgets per phase, after which an attempt that stopped progressing is ended.
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)


@dataclass
class RecipeConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


# --------------------------------------------------------------------------------------------------------------------
# Placement: where it runs
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class ParallelConfig:
    # Ulysses sequence parallel size for the actor.
    ulysses_sp: int = 1
    # vLLM tensor parallel size for the rollout.
    rollout_tp: int = 1
    gpu_memory_utilization: float = 0.7
    enable_chunked_prefill: bool = True
    max_num_batched_tokens: int = 8192
    use_dynamic_bsz: bool = True
    # Token budget per GPU for actor forward/backward with dynamic batching.
    ppo_max_token_len_per_gpu: int = 22528
    # Token budget per GPU for log-prob recomputation (null: same as ppo_max_token_len_per_gpu).
    log_prob_max_token_len_per_gpu: Optional[int] = None
    # Sequences per GPU per micro-batch when dynamic batching is off.
    ppo_micro_batch_size_per_gpu: int = 1
    param_offload: bool = False
    optimizer_offload: bool = False
    # FSDP shard group size (-1: shard over all GPUs; N < world: HSDP, replicas of N-GPU shard groups).
    fsdp_size: int = -1


@dataclass
class PlacementConfig:
    # "verl": verl worker groups on Ray (cluster); "local": one process, HF transformers (CPU or one GPU).
    backend: Literal["verl", "local"] = "verl"
    nodes: int = 1
    gpus_per_node: int = 8
    # Accelerator the preset was sized for (used by `dapo plan`).
    accelerator: str = "h100"
    # Local backend device: "cpu", "cuda", "cuda:N" or "auto".
    device: str = "auto"
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    # Environment for every training process (runtime env on Ray).
    env: dict[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------------------------
# Local / tiny specifics
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class TinyModelSpec:
    """A Qwen2-architecture model built locally from scratch (``model.path: builtin:tiny``)."""

    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 256
    tie_word_embeddings: bool = True
    # Size of the byte-level BPE vocabulary trained locally on the task corpus (= the embedding rows).
    vocab_size: int = 400
    # Seed of the random initialisation (and of the warm start's batches).
    seed: int = 0


@dataclass
class TaskSpec:
    """Synthetic math task written in the DAPO-Math-17k schema."""

    kind: Literal["addition"] = "addition"
    digits: int = 2
    # 0: operands with up to ``digits`` digits each (the tiny task). >= 1: each problem first draws its length d
    # uniformly from [min_digits, digits], then two d-digit operands, so the worked responses (one line per digit)
    # vary widely in length (the tiny-long task).
    min_digits: int = 0
    n_train: int = 4000
    n_val: int = 256
    seed: int = 1234


@dataclass
class WarmStartSpec:
    """Supervised warm start before RL so the policy starts with partial accuracy."""

    enable: bool = True
    steps: int = 300
    batch_size: int = 128
    lr: float = 3e-3
    # Fraction of carrying problems whose SFT label carries a plausible systematic mistake ("forgot the carry").
    mistake_rate: float = 0.5
    # Fraction of SFT labels that rewrite their working 1-3 times after ``Check:`` lines before answering: long
    # responses (correct in substance) that a length cap cuts; 0 (the default) leaves the tiny tasks unchanged.
    recheck_rate: float = 0.0
    # Fraction of the other SFT labels that write only the answer line (short responses, mostly wrong when sampled);
    # 0 (the default) leaves the tiny tasks unchanged.
    guess_rate: float = 0.0
    # Rechecking labels on carrying problems forget the carry with this probability instead of mistake_rate (long
    # responses that are wrong: the token-level loss's task); None (the default) uses mistake_rate.
    recheck_mistake_rate: Optional[float] = None
    # Probability that a line of working writes its two digits in the other order ("8+7=15"): a rare style the reward
    # ignores (clip-higher's task); 0 (the default) leaves the other tasks unchanged.
    swap_rate: float = 0.0


@dataclass
class LocalConfig:
    model: TinyModelSpec = field(default_factory=TinyModelSpec)
    task: TaskSpec = field(default_factory=TaskSpec)
    warm_start: WarmStartSpec = field(default_factory=WarmStartSpec)
    # Optimizer steps per rollout step are derived from ppo_mini_batch_size; this caps update micro-batches.
    micro_batch_size: int = 64


# --------------------------------------------------------------------------------------------------------------------
# Preset
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Preset:
    name: str = ""
    description: str = ""
    # AIME-2024 avg@32 the preset is expected to reach (documentation only).
    target_aime: Optional[float] = None
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    local: Optional[LocalConfig] = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def get(self, dotted: str) -> Any:
        """Value at a dotted path, e.g. ``recipe.actor.optim.lr``."""
        obj: Any = self
        for part in dotted.split("."):
            if dataclasses.is_dataclass(obj):
                if part not in {f.name for f in dataclasses.fields(obj)}:
                    raise ConfigError(f"unknown key '{dotted}'")
                obj = getattr(obj, part)
            elif isinstance(obj, dict):
                if part not in obj:
                    raise ConfigError(f"unknown key '{dotted}'")
                obj = obj[part]
            else:
                raise ConfigError(f"unknown key '{dotted}'")
        return obj

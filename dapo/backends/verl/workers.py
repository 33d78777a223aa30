"""The GPU side of the verl backend: the :class:`VerlWorkers` seam and :class:`RayWorkers`, its real implementation.

:class:`VerlWorkers` is the five things :class:`dapo.backends.verl.backend.VerlBackend` asks of the GPU side
(generate, log-probs, actor update, weight sync, checkpoints); tests drive the backend through a CPU stand-in of it.
:class:`RayWorkers` implements it with verl's own machinery, built the way verl's ``RayPPOTrainer`` builds it (non-v1
path: ``main_ppo_v0.TaskRunner`` role mapping and resource pool, ``RayPPOTrainer.init_workers``: FSDP actor + vLLM
rollout replicas in one hybrid worker group, the reference policy only when a KL term is on, the agent-loop rollout
manager, the checkpoint engine for weight sync); :func:`dapo_trainer_class` is verl's trainer without its dataloaders
(and, unless ``recipe.reward.verl_agreement``, without reward-loop workers for the agent loop). It needs the cluster
image (CUDA, vLLM) to run.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

__all__ = ["VerlWorkers", "RayWorkers", "build_trainer", "dapo_trainer_class"]


class VerlWorkers(Protocol):
    """The GPU side of the verl backend (the seam; :class:`RayWorkers` is the real one).

    All batches are ``verl.DataProto``. Shapes follow verl's agent loop: ``prompts`` ``[N, P]`` (left-padded),
    ``responses`` / ``response_mask`` ``[N, R]`` (right-padded), ``input_ids`` / ``attention_mask`` /
    ``position_ids`` ``[N, P + R]``.
    """

    dp_size: int  # the actor's data-parallel size (world / ulysses_sp)
    awake: bool  # the rollout replicas hold weights and KV cache (a sleep discards both: vLLM sleep level 2)

    def generate_sequences(self, gen_batch: Any, validate: bool) -> Any:
        """One response per row of ``gen_batch`` (rows already repeated ``n`` times) with the config's train or
        validation sampling; returns prompts/responses/response_mask/input_ids/attention_mask/position_ids
        (+ ``rm_scores`` and reward extra info when verl's reward loop scored them). Needs awake replicas."""

    def compute_log_prob(self, batch: Any) -> Any:
        """``old_log_probs`` and ``entropys`` ``[N, R]`` under the current weights (no grad); ``meta_info["mfu"]``:
        the pass's model-FLOPs utilisation when the workers measure it (verl's ``perf/mfu/actor_infer``)."""

    def compute_ref_log_prob(self, batch: Any) -> Any:
        """``ref_log_prob`` ``[N, R]`` under the reference policy (the initial weights; only with a KL loss)."""

    def update_actor(self, batch: Any) -> dict[str, float]:
        """``ppo_epochs`` x mini-batches of the configured policy loss; returns reduced ``actor/*`` metrics."""

    def sync_weights(self, step: int) -> None:
        """Push the actor's weights to the rollout replicas, waking them (verl's ``update_weights``)."""

    def sleep_replicas(self) -> None:
        """Free the replicas' GPU memory (weights and KV cache) for the actor's passes."""

    def profiler_hooks(self) -> dict[str, float]:
        """fit()'s per-step profiler calls, made as fit() makes them with profiling off (``global_profiler`` is
        refused), timed: ``timing_s/start_profile`` and ``timing_s/stop_profile``."""

    def save_checkpoint(self, directory: str, step: int) -> None: ...

    def load_checkpoint(self, directory: str) -> None: ...

    def close(self) -> None: ...


class RayWorkers:
    """:class:`VerlWorkers` over verl 0.9.1's Ray worker groups, built as ``RayPPOTrainer`` builds them.

    Role mapping and resource pool come from verl's non-v1 ``main_ppo_v0.BaseTaskRunner`` (hybrid
    ActorRollout[Ref] worker over ``trainer.nnodes x n_gpus_per_node`` GPUs; the fused reference policy only when
    ``need_reference_policy``, i.e. with ``use_kl_loss``); ``RayPPOTrainer.init_workers`` then spawns the workers,
    the vLLM replicas, the agent-loop rollout manager, verl's reward loop and the checkpoint engine. Our subclass
    skips verl's dataloaders (the DAPO loop owns the data) but keeps their side effect: the optimizer's
    ``total_training_steps``. Unless ``verl_agreement`` is on, the agent loop gets no reward-loop workers: the loop
    scores every response once on the driver (verl's reward loop would score each one again).

    The log-prob, reference and update passes are verl's own ``RayPPOTrainer`` methods (``_compute_old_log_prob``,
    ``_compute_ref_log_prob``, ``_update_actor``); :class:`VerlBackend` decides when the replicas sleep and when the
    weights are synced (verl's fit() order: generate, sleep, log-probs, update, save, ``update_weights``).
    """

    def __init__(self, cfg: Any, total_training_steps: int, *, verl_agreement: bool = False):
        trainer, model_config = build_trainer(cfg, dapo_trainer_class(total_training_steps, verl_agreement))
        self.tokenizer = model_config.tokenizer
        gen_eos = getattr(model_config.generation_config, "eos_token_id", None)
        self.eos_token_ids = set(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos] if gen_eos is not None else [])
        trainer.init_workers()  # ends with the rollout replicas asleep
        self._attach(trainer)

    @classmethod
    def from_trainer(cls, trainer: Any) -> "RayWorkers":
        """Over an already built ``RayPPOTrainer`` (after ``init_workers``: replicas asleep)."""
        self = cls.__new__(cls)
        self.tokenizer = getattr(trainer, "tokenizer", None)
        self.eos_token_ids = set()
        self._attach(trainer)
        return self

    def _attach(self, trainer: Any) -> None:
        self.trainer = trainer
        self.trainer.global_steps = 0
        self._awake = False
        self.dp_size = int(self.trainer._get_dp_size(self.trainer.actor_rollout_wg, "actor"))

    @property
    def awake(self) -> bool:
        return self._awake

    def sync_weights(self, step: int) -> None:
        self.trainer.global_steps = step
        self.trainer.checkpoint_manager.update_weights(step)  # wakes the replicas with the actor's weights
        self._awake = True

    def sleep_replicas(self) -> None:
        if self._awake:
            self.trainer.checkpoint_manager.sleep_replicas()
            self._awake = False

    def generate_sequences(self, gen_batch: Any, validate: bool) -> Any:
        from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto

        if not self._awake:
            raise RuntimeError("generate_sequences with the rollout replicas asleep: sync_weights(step) first")
        padded, pad = pad_dataproto_to_divisor(gen_batch, self.cfg_num_agent_workers)
        out = self.trainer.async_rollout_manager.generate_sequences(padded)
        return unpad_dataproto(out, pad_size=pad)

    @property
    def cfg_num_agent_workers(self) -> int:
        return int(self.trainer.config.actor_rollout_ref.rollout.agent.num_workers)

    def compute_log_prob(self, batch: Any) -> Any:
        self.sleep_replicas()
        out, mfu = self.trainer._compute_old_log_prob(batch)
        out.meta_info["mfu"] = mfu  # fit()'s perf/mfu/actor_infer
        return out

    def compute_ref_log_prob(self, batch: Any) -> Any:
        self.sleep_replicas()
        return self.trainer._compute_ref_log_prob(batch)

    def update_actor(self, batch: Any) -> dict[str, float]:
        from verl.utils.metric import reduce_metrics

        self.sleep_replicas()
        out = self.trainer._update_actor(batch)
        return {k: float(v) for k, v in reduce_metrics(out.meta_info["metrics"]).items()}

    def profiler_hooks(self) -> dict[str, float]:
        out = {}
        for name, hook in (("start_profile", self.trainer._start_profiling),
                           ("stop_profile", self.trainer._stop_profiling)):
            t0 = time.perf_counter()
            hook(False)  # fit(): do_profile is False unless global_profiler.steps names this step
            out[f"timing_s/{name}"] = time.perf_counter() - t0
        return out

    def save_checkpoint(self, directory: str, step: int) -> None:
        self.sleep_replicas()
        self.trainer.actor_rollout_wg.save_checkpoint(directory, None, step, max_ckpt_to_keep=None)

    def load_checkpoint(self, directory: str) -> None:
        self.sleep_replicas()
        self.trainer.actor_rollout_wg.load_checkpoint(directory, del_local_after_load=False)

    def close(self) -> None:
        """Nothing to release: fit() ends with the replicas as they are, and they go with the job's processes (a
        sleep here would be one more call than fit() makes, at a moment nothing needs the memory)."""


def build_trainer(cfg: Any, trainer_cls: Any, **kwargs: Any) -> tuple[Any, Any]:
    """``trainer_cls`` (verl's ``RayPPOTrainer`` or a subclass) built as verl's non-v1 ``TaskRunner.run`` builds it:
    the config resolved, the hybrid ActorRollout(Ref) role mapping and resource pool of ``BaseTaskRunner``, the
    tokenizer and processor of ``HFModelConfig``; ``kwargs`` go to the trainer (verl's datasets, for its own
    ``fit()``). Returns ``(trainer, model_config)``; ``init_workers`` is the caller's."""
    from omegaconf import OmegaConf

    from verl.trainer.main_ppo_v0 import BaseTaskRunner
    from verl.utils.config import omega_conf_to_dataclass

    OmegaConf.resolve(cfg)  # as verl's TaskRunner.run does before building anything
    runner = BaseTaskRunner()
    _, wg_cls = runner.add_actor_rollout_worker(cfg)
    runner.add_reward_model_resource_pool(cfg)
    pool = runner.init_resource_pool_mgr(cfg)
    model_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    trainer = trainer_cls(
        config=cfg,
        tokenizer=model_config.tokenizer,
        processor=model_config.processor,
        role_worker_mapping=runner.role_worker_mapping,
        resource_pool_manager=pool,
        ray_worker_group_cls=wg_cls,
        **kwargs,
    )
    return trainer, model_config


def dapo_trainer_class(total_training_steps: int, verl_agreement: bool) -> type:
    """verl's ``RayPPOTrainer`` with two changes: no dataloaders (the DAPO loop owns the data; their side effect, the
    optimizer's ``total_training_steps``, is kept) and, unless ``verl_agreement``, no reward-loop workers for the
    agent loop (``init_workers`` assigns ``self.reward_loop_manager`` and hands ``.reward_loop_workers`` to it)."""
    from omegaconf import open_dict

    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    class _DapoRayTrainer(RayPPOTrainer):
        def _create_dataloader(self, *args: Any, **kwargs: Any) -> None:
            self.total_training_steps = total_training_steps
            with open_dict(self.config):
                self.config.actor_rollout_ref.actor.optim.total_training_steps = total_training_steps

        @property
        def reward_loop_manager(self) -> Any:
            return self.__dict__.get("_dapo_reward_loop_manager")

        @reward_loop_manager.setter
        def reward_loop_manager(self, manager: Any) -> None:
            if manager is not None and not verl_agreement:
                manager = _NoAgentRewardLoop(manager)
            self.__dict__["_dapo_reward_loop_manager"] = manager

    return _DapoRayTrainer


class _NoAgentRewardLoop:
    """verl's ``RewardLoopManager`` with no workers offered to the agent loop (``reward_loop_workers`` is None), so
    generation does not score every response a second time; everything else is the manager's own."""

    reward_loop_workers = None

    def __init__(self, inner: Any):
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

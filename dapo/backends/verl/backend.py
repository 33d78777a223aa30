"""The verl backend: the one DAPO loop (:mod:`dapo.train.loop`) driving verl 0.9.1's worker groups on Ray.

verl's PyPI wheel has DAPO's loss pieces and reward manager but no DAPO trainer (its legacy trainer ignores
``algorithm.filter_groups``; its v1 trainer replaces dynamic sampling with a replay buffer). So the algorithm --
reward, dynamic sampling, group advantages, cadence, resume -- is our loop, and :class:`VerlBackend` is the thin
adapter that implements :class:`dapo.backends.base.Backend` over verl's GPU workers (the seam
:class:`dapo.backends.verl.workers.VerlWorkers`; its real implementation ``RayWorkers`` lives there too).

:class:`VerlBackend` does the batch plumbing with real ``DataProto`` objects (helpers in
:mod:`dapo.backends.verl.batch`): prompt rows -> DataProto (uid = group id, responses of a prompt contiguous:
``repeat(interleave=True)``), the rollout output joined back onto the prompt rows, reward placement,
``select``/``concat`` by DataProto indexing/concat, ``pi_old`` via ``compute_log_prob``, and the update: advantages
broadcast over tokens (``A_i * response_mask``), the batch reordered for balanced data-parallel work (verl's
``balance_batch``), then ``update_actor`` with our loss (``loss_mode=dapo``, :mod:`dapo.backends.verl.loss`).

Rewards: the loop scores every response once (:func:`dapo.reward.score_responses`: DAPO's verifier + soft overlong
punishment, the same numbers as verl's ``dapo`` reward manager) on the texts this backend decodes in one
``batch_decode``; the scores travel in ``Rollout.stats`` and are placed like verl on the last valid response token
(``token_level_scores[i, L_i - 1] = R_i``; no KL in reward: ``token_level_rewards = token_level_scores``). verl's own
reward loop (``reward.reward_manager.name=dapo``) scores the rollout on the workers only with
``recipe.reward.verl_agreement: true``; its result is then kept as ``verl_rm_scores`` and compared
(``reward/verl_agreement``), a live check that both verifiers agree.

Weights: one actor -> vLLM sync per step, in verl's fit() order -- generate, sleep the replicas, log-probs (and
reference log-probs with ``use_kl_loss``), update, save (when due), then ``update_weights`` before the next generation
or validation. The backend tracks the step whose weights the replicas hold apart from whether they are awake.

The ``dapo train`` entrypoint is :mod:`dapo.backends.verl.run`.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import numpy as np
import torch

from dapo.backends.base import Backend, Rollout, Sampling
from dapo.backends.verl.batch import (_as_messages, _dataproto, _mixed, _obj_array, balance_order, place_scores,
                                     valid_response_ids)
from dapo.backends.verl.workers import VerlWorkers
from dapo.config import ConfigError, Preset
from dapo.loss import agg_loss, masked_mean

__all__ = ["VerlBackend"]

# non-tensor keys verl's trainer keeps on the training batch (the rest goes to the rollout only)
_REWARD_KEYS = ("data_source", "reward_model", "extra_info", "uid")


class VerlBackend(Backend):
    """:class:`~dapo.backends.base.Backend` over verl worker groups. ``Rollout.data`` is a ``verl.DataProto``."""

    def __init__(self, cfg: Any, preset: Preset, workers: VerlWorkers, tokenizer: Any, eos_token_ids: Optional[set] = None):
        self.cfg = cfg
        self.preset = preset
        self.recipe = preset.recipe
        self.workers = workers
        self.tokenizer = tokenizer
        eos = set(eos_token_ids or ())
        if getattr(tokenizer, "eos_token_id", None) is not None:
            eos.add(int(tokenizer.eos_token_id))
        self.eos_token_ids = eos
        self.step = 0  # actor updates done (verl's global step for checkpoints and weight sync)
        self._next_gid = 0
        self._pending: dict[str, list[float]] = {}  # generation-side metrics, reported with the next step
        # "the replicas hold the weights of actor step N" (None: not synced since start / load); kept apart from
        # workers.awake because a sleep discards the weights while an update only makes them stale
        self._rollout_step: Optional[int] = None
        self.num_syncs = 0  # actor -> rollout weight transfers so far (one per step: tests count them)
        self.use_kl_loss = bool(self.cfg.actor_rollout_ref.actor.use_kl_loss)
        self.n_gpus = int(self.cfg.trainer.nnodes) * int(self.cfg.trainer.n_gpus_per_node)  # verl's resource pool
        if bool(self.cfg.algorithm.use_kl_in_reward):
            raise ConfigError("algorithm.use_kl_in_reward: not implemented by the DAPO loop (use recipe.actor."
                              "use_kl_loss); refusing a config the loop would silently ignore")

    # -- the rollout / trainer hand-over (verl's fit: generate, sleep, log-probs, update, save, update_weights) -------
    def _rollout_ready(self) -> None:
        """Replicas awake with the current actor weights: one ``update_weights`` when stale or asleep."""
        if self.workers.awake and self._rollout_step == self.step:
            return
        t0 = time.perf_counter()
        self.workers.sync_weights(self.step)
        self._rollout_step = self.step
        self.num_syncs += 1
        self._note("timing_s/update_weights", time.perf_counter() - t0)

    def _trainer_ready(self) -> None:
        """Replicas asleep, so the actor's passes (log-probs, update, checkpoint) have the GPU memory."""
        if self.workers.awake:
            self.workers.sleep_replicas()

    # -- generation --------------------------------------------------------------------------------------------------
    def _is_validation(self, s: Sampling) -> bool:
        ro, val = self.cfg.actor_rollout_ref.rollout, self.cfg.actor_rollout_ref.rollout.val_kwargs

        def same(a: Any, b: Any) -> bool:
            return abs(float(a) - float(b)) < 1e-9

        def matches(n, t, p, k, do_sample) -> bool:
            temp = s.temperature if s.do_sample else 0.0  # do_sample false = greedy = temperature 0 (verl_config)
            return (int(s.n) == int(n) and same(temp, t) and same(s.top_p, p) and int(s.top_k) == int(k)
                    and bool(s.do_sample) == bool(do_sample))  # fmt: skip

        if matches(ro.n, ro.temperature, ro.top_p, ro.top_k, ro.do_sample):
            return False
        if matches(val.n, val.temperature, val.top_p, val.top_k, val.do_sample):
            return True
        raise ConfigError(
            f"sampling {s} matches neither the train sampling (n={ro.n}, temperature={ro.temperature}, "
            f"top_p={ro.top_p}, top_k={ro.top_k}) nor the validation sampling (recipe.rollout.val: n={val.n}, "
            f"temperature={val.temperature}, top_p={val.top_p}, top_k={val.top_k}): verl's vLLM servers take their "
            "sampling parameters from the config"
        )

    def prompts_to_dataproto(self, prompts: list[dict[str, Any]], group_ids: list) -> Any:
        """Prompt rows (DAPO-Math-17k schema) -> the DataProto verl's dataset + collate would give, plus ``uid``."""
        key = self.recipe.data.prompt_key
        raw, sources, rms, extras, index = [], [], [], [], []
        for i, row in enumerate(prompts):
            where = f"prompt row {i}"
            if key not in row:
                raise ValueError(f"{where}: no '{key}' column (recipe.data.prompt_key)")
            rm = row.get("reward_model")
            if not isinstance(rm, dict) or "ground_truth" not in rm:
                raise ValueError(f"{where}: 'reward_model' must be a mapping with 'ground_truth'")
            raw.append(_as_messages(row[key], where))
            sources.append(row.get("data_source", "math_dapo"))
            rms.append(dict(rm))
            extra = dict(row.get("extra_info") or {})
            extras.append(extra)
            index.append(extra.get("index", i))
        n = len(prompts)
        DataProto = _dataproto()
        return DataProto.from_dict(
            tensors={"dummy_tensor": torch.zeros((n, 1), dtype=torch.uint8)},
            non_tensors={
                "raw_prompt": _obj_array(raw),
                "data_source": _obj_array(sources),
                "reward_model": _obj_array(rms),
                "extra_info": _obj_array(extras),
                "index": _obj_array(index),
                "tools_kwargs": _obj_array([{} for _ in range(n)]),
                "interaction_kwargs": _obj_array([{} for _ in range(n)]),
                "uid": _obj_array([str(g) for g in group_ids]),
            },
            meta_info={"temperature": float(self.cfg.actor_rollout_ref.rollout.temperature)},
        )

    def generate(self, prompts: list[dict[str, Any]], sampling: Sampling, group_ids: Optional[list] = None) -> Rollout:
        if not prompts:
            raise ValueError("generate() needs at least one prompt")
        validate = self._is_validation(sampling)
        if group_ids is None:
            group_ids = list(range(self._next_gid, self._next_gid + len(prompts)))
            self._next_gid += len(prompts)
        if len(group_ids) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(group_ids)} group ids")
        n = int(sampling.n)
        batch = self.prompts_to_dataproto(prompts, group_ids)
        # verl's trainer: everything but the reward keys goes to the rollout only (RayPPOTrainer._get_gen_batch)
        pop_keys = [k for k in batch.non_tensor_batch if k not in _REWARD_KEYS]
        gen_batch = batch.pop(batch_keys=[], non_tensor_batch_keys=pop_keys)
        gen_batch.non_tensor_batch.update(batch.non_tensor_batch)
        gen_batch.meta_info.update({
            "eos_token_id": getattr(self.tokenizer, "eos_token_id", None),
            "pad_token_id": getattr(self.tokenizer, "pad_token_id", None),
            "do_sample": bool(sampling.do_sample),
            "validate": validate,
            "global_steps": self.step,
        })  # fmt: skip
        self._rollout_ready()
        out = self.workers.generate_sequences(gen_batch.repeat(repeat_times=n, interleave=True), validate=validate)
        out = self._own_output(out)
        data = batch.repeat(repeat_times=n, interleave=True).union(out)
        data.pop(batch_keys=["dummy_tensor"])
        if "response_mask" not in data.batch.keys():
            data.batch["response_mask"] = data.batch["attention_mask"][:, data.batch["prompts"].shape[-1]:]
        gids = np.repeat(np.asarray(list(group_ids), dtype=object if _mixed(group_ids) else None), n)
        return self._rollout(data, [row for row in prompts for _ in range(n)], gids)

    def _own_output(self, out: Any) -> Any:
        """Rename verl's reward-loop outputs (``rm_scores`` and its extra info) to ``verl_*`` and drop meta_info, so
        rollouts concat cleanly and our reward is the only ``token_level_scores``."""
        extra = list(out.meta_info.get("reward_extra_keys", []) or [])
        timing = out.meta_info.get("timing") or {}
        for k, v in timing.items():  # verl's agent-loop statistics (per-request min/max/mean), verl's names
            self._note(f"timing_s/{k}", float(v))
        if "rm_scores" in out.batch.keys():
            out.batch["verl_rm_scores"] = out.batch.pop("rm_scores")
        for k in extra:
            if k in out.non_tensor_batch:
                out.non_tensor_batch[f"verl_{k}"] = out.non_tensor_batch.pop(k)
        out.meta_info = {}
        return out

    def _rollout(self, data: Any, rows: list[dict[str, Any]], group_ids: np.ndarray) -> Rollout:
        """The responses decoded in one ``batch_decode``; the loop scores them (once) and the scores travel in
        ``Rollout.stats`` to :meth:`update`, which places them as ``token_level_scores``."""
        ids, L, last = valid_response_ids(data)
        texts = list(self.tokenizer.batch_decode(ids, skip_special_tokens=True))
        max_len = int(self.cfg.data.max_response_length)
        truncated = (L >= max_len) & ~np.isin(last, sorted(self.eos_token_ids))  # full length and no EOS at the end
        prompt_len = data.batch["prompts"].shape[-1]
        stats: dict[str, np.ndarray] = {
            "prompt_length": data.batch["attention_mask"][:, :prompt_len].sum(-1).cpu().numpy().astype(np.float64),
        }
        if "rollout_log_probs" in data.batch.keys():
            m = data.batch["response_mask"].float()
            p = (data.batch["rollout_log_probs"].float().exp() * m).sum(-1) / m.sum(-1).clamp(min=1.0)
            stats["mean_prob"] = p.cpu().numpy().astype(np.float64)
        if "verl_rm_scores" in data.batch.keys():  # recipe.reward.verl_agreement: verl's reward loop scored too
            stats["verl_reward"] = data.batch["verl_rm_scores"].sum(-1).cpu().numpy().astype(np.float64)
        return Rollout(
            group_ids=group_ids,
            prompt_rows=rows,
            response_text=texts,
            response_length=L,
            truncated=truncated,
            data=data,
            stats=stats,
        )

    def _note(self, key: str, value: float) -> None:
        self._pending.setdefault(key, []).append(float(value))

    def _flush_notes(self) -> dict[str, float]:
        """Generation-side metrics since the last step, reduced over its generation batches."""
        out = {}
        for k, vals in self._pending.items():
            reduce = np.max if k.endswith("/max") else np.min if k.endswith("/min") else np.mean
            out[k] = float(reduce(vals))
        self._pending = {}
        return out

    # -- batch plumbing ----------------------------------------------------------------------------------------------
    def select(self, rollout: Rollout, index: np.ndarray) -> Rollout:
        idx = np.asarray(index, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= len(rollout)):
            raise IndexError(f"select: index out of range for a rollout of {len(rollout)} responses")
        return rollout.take(idx, rollout.data[idx])

    def concat(self, rollouts: list[Rollout]) -> Rollout:
        if not rollouts:
            raise ValueError("concat() of no rollouts")
        if len(rollouts) == 1:
            return rollouts[0]
        keys = set(rollouts[0].stats)
        for r in rollouts[1:]:
            if set(r.stats) != keys:
                raise ValueError(f"concat: rollouts carry different stats {sorted(keys)} vs {sorted(r.stats)}")
        return Rollout.join(rollouts, _dataproto().concat([r.data for r in rollouts]))

    # -- pi_old and the update ---------------------------------------------------------------------------------------
    def _balanced(self, data: Any) -> tuple[Any, Optional[np.ndarray], dict[str, float]]:
        """A copy of ``data`` in verl's balanced data-parallel order (``trainer.balance_batch``) and that order."""
        if not bool(self.cfg.trainer.balance_batch):
            return data, None, {}
        order, bal = balance_order(data.batch["attention_mask"], int(self.workers.dp_size))
        if np.array_equal(order, np.arange(len(order))):
            return data, None, bal
        sent = data[torch.as_tensor(order)]
        sent.meta_info = dict(data.meta_info)
        sent.meta_info["global_token_num"] = torch.sum(sent.batch["attention_mask"], dim=-1).tolist()
        return sent, order, bal

    @staticmethod
    def _unbalance(t: torch.Tensor, order: Optional[np.ndarray]) -> torch.Tensor:
        """Rows of a pass over the balanced copy, back in the batch's own order."""
        if order is None:
            return t
        return t[torch.as_tensor(np.argsort(order))]

    def compute_old_log_probs(self, batch: Rollout) -> dict[str, float]:
        """pi_old (and, with a KL loss, the reference log-probs) over a balanced copy of the batch, as verl's fit()
        balances before ``compute_log_prob``; the outputs come back in the batch's order."""
        data = batch.data
        for k in ("old_log_probs", "entropys", "ref_log_prob"):
            if k in data.batch.keys():
                data.batch.pop(k)
        if "reward" in batch.stats:
            place_scores(data, batch.stats["reward"])
            if "verl_reward" in batch.stats:
                agree = np.abs(np.asarray(batch.stats["verl_reward"]) - np.asarray(batch.stats["reward"])) < 1e-5
                self._note("reward/verl_agreement", float(np.mean(agree)))
        data.meta_info["global_token_num"] = torch.sum(data.batch["attention_mask"], dim=-1).tolist()
        self._trainer_ready()
        sent, order, _ = self._balanced(data)
        out = self.workers.compute_log_prob(sent)
        old = self._unbalance(out.batch["old_log_probs"].float(), order)
        ent = self._unbalance(out.batch["entropys"].float(), order)
        mask = data.batch["response_mask"]
        if old.shape != mask.shape:
            raise ValueError(f"compute_log_prob returned {tuple(old.shape)}, expected {tuple(mask.shape)}")
        data.batch["old_log_probs"] = old
        if self.use_kl_loss:  # verl's fit(): reference log-probs after pi_old, before the update
            ref = self.workers.compute_ref_log_prob(sent)
            data.batch["ref_log_prob"] = self._unbalance(ref.batch["ref_log_prob"].float(), order)
        metrics = self._flush_notes()
        metrics.update({
            "actor/entropy": float(agg_loss(ent, mask, self.recipe.actor.loss_agg_mode)),
            "actor/mean_prob": float(masked_mean(old.exp(), mask)),
            **({"perf/mfu/actor_infer": float(out.meta_info["mfu"])} if "mfu" in out.meta_info else {}),
        })  # fmt: skip
        if "rollout_log_probs" in data.batch.keys():
            # verl's fit() logs how far vLLM's token probabilities are from the actor's: the weight push's check
            from verl.utils.debug.metrics import calculate_debug_metrics

            metrics.update({k: float(v) for k, v in calculate_debug_metrics(data).items()})
        return metrics

    def update(self, batch: Rollout, advantages: np.ndarray, loss_mask: Optional[np.ndarray] = None) -> dict[str, float]:
        data = batch.data
        if "old_log_probs" not in data.batch.keys():
            raise RuntimeError("update() before compute_old_log_probs(): pi_old must be recomputed first")
        if self.use_kl_loss and "ref_log_prob" not in data.batch.keys():
            raise RuntimeError("use_kl_loss: update() needs the reference log-probs of compute_old_log_probs()")
        n = len(batch)
        adv = torch.as_tensor(np.asarray(advantages, dtype=np.float32)).reshape(-1)
        if adv.shape[0] != n:
            raise ValueError(f"{n} responses but {adv.shape[0]} advantages")
        mask = data.batch["response_mask"].clone()
        if loss_mask is not None:
            keep = torch.as_tensor(np.asarray(loss_mask, dtype=bool)).reshape(-1)
            if keep.shape[0] != n:
                raise ValueError(f"{n} responses but {keep.shape[0]} loss_mask entries")
            mask = mask * keep[:, None].to(mask.dtype)
        upd = data.select(batch_keys=[k for k in data.batch.keys() if k != "response_mask"], deepcopy=False)
        upd.batch["response_mask"] = mask
        upd.batch["advantages"] = adv[:, None] * mask.float()  # outcome advantage on every valid token
        upd.meta_info = {
            "temperature": float(self.cfg.actor_rollout_ref.rollout.temperature),
            "global_token_num": torch.sum(data.batch["attention_mask"], dim=-1).tolist(),
        }
        metrics: dict[str, float] = {}
        if bool(self.cfg.trainer.balance_batch):
            order, bal = balance_order(upd.batch["attention_mask"], int(self.workers.dp_size))
            upd.reorder(torch.as_tensor(order))
            metrics.update(bal)
        self._trainer_ready()
        metrics.update(self.workers.update_actor(upd))
        # verl's update: ppo_epochs passes over mini-batches of ppo_mini_batch_size prompts x n, one optimizer step each
        mini = int(self.cfg.actor_rollout_ref.actor.ppo_mini_batch_size) * int(self.cfg.actor_rollout_ref.rollout.n)
        metrics["actor/num_optimizer_steps"] = float(int(self.cfg.actor_rollout_ref.actor.ppo_epochs) * -(-n // mini))
        self.step += 1  # the replicas are stale now; the next generate() syncs them once (after any save)
        return metrics

    def fit_metrics(self, batch: Rollout, advantages: np.ndarray, timing: dict[str, float]) -> dict[str, float]:
        """What verl's fit() logs for this batch, by verl's own functions (:mod:`dapo.backends.verl.fit_metrics`)."""
        from dapo.backends.verl.fit_metrics import fit_metrics

        return {**fit_metrics(batch.data, advantages, timing, self.cfg, self.n_gpus), **self.workers.profiler_hooks()}

    # -- checkpoints -------------------------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self._trainer_ready()
        self.workers.save_checkpoint(os.path.join(directory, "actor"), self.step)
        with open(os.path.join(directory, "verl_backend.txt"), "w") as f:
            f.write(f"step {self.step}\nnext_gid {self._next_gid}\n")

    def load_checkpoint(self, directory: str) -> None:
        actor = os.path.join(directory, "actor")
        if not os.path.isdir(actor):
            raise FileNotFoundError(f"{directory}: no actor/ checkpoint written by the verl backend")
        self._trainer_ready()
        self.workers.load_checkpoint(actor)
        self._rollout_step = None  # the replicas hold other weights now: the next generate() syncs
        state = os.path.join(directory, "verl_backend.txt")
        if os.path.exists(state):
            with open(state) as f:
                kv = dict(line.split() for line in f if line.strip())
            self.step = int(kv.get("step", self.step))
            self._next_gid = int(kv.get("next_gid", self._next_gid))

    # -- the ranks (dapo.backends.verl.ranks; set by dapo.backends.verl.run) ----------------------------------------
    ranks: Any = None

    def rank_metrics(self, step: int) -> dict[str, float]:
        return self.ranks.probe(step) if self.ranks is not None else {}

    def request_stacks(self, dest: Any, header: str) -> list[dict[str, Any]]:
        return self.ranks.stacks(dest, header) if self.ranks is not None else []

    def node_of(self, pid: Optional[int]) -> Optional[dict[str, Any]]:
        return self.ranks.node_of(pid) if self.ranks is not None else None

    def suspect_nodes(self) -> list[dict[str, Any]]:
        return self.ranks.suspects() if self.ranks is not None else []

    def close(self) -> None:
        self.workers.close()

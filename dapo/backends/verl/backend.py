"""The verl backend: the one DAPO loop (:mod:`dapo.train.loop`) driving verl 0.9.1's worker groups on Ray.

verl's PyPI wheel has DAPO's loss pieces and reward manager but no DAPO trainer (its legacy trainer ignores
``algorithm.filter_groups``; its v1 trainer replaces dynamic sampling with a replay buffer). So the algorithm --
reward, dynamic sampling, group advantages, cadence, resume -- is our loop, and this module is the thin adapter that
implements :class:`dapo.backends.base.Backend` over verl's GPU workers:

- :class:`VerlWorkers` is the seam: the five things the backend asks of the GPU side (generate, log-probs, actor
  update, weight sync, checkpoints). :class:`RayWorkers` implements it with verl's own machinery, built the way
  verl's ``RayPPOTrainer`` builds it (non-v1 path: ``main_ppo_v0.TaskRunner`` role mapping and resource pool,
  ``RayPPOTrainer.init_workers``: FSDP actor + vLLM rollout replicas in one hybrid worker group, the reference policy
  only when a KL term is on, the agent-loop rollout manager, the checkpoint engine for weight sync). Tests drive the
  backend through a CPU stand-in of this seam.
- :class:`VerlBackend` does the batch plumbing with real ``DataProto`` objects: prompt rows -> DataProto (uid =
  group id, responses of a prompt contiguous: ``repeat(interleave=True)``), the rollout output joined back onto the
  prompt rows, reward placement, ``select``/``concat`` by DataProto indexing/concat, ``pi_old`` via
  ``compute_log_prob``, and the update: advantages broadcast over tokens (``A_i * response_mask``), the batch
  reordered for balanced data-parallel work (verl's ``balance_batch``), then ``update_actor`` with our loss
  (``loss_mode=dapo``, :mod:`dapo.backends.verl.loss`).

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

:func:`run` is the ``dapo train`` entrypoint for ``placement.backend: verl``: it resolves and validates verl's config
(:mod:`dapo.backends.verl.config`) before anything touches Ray, prints it, and (unless ``--dry-run``) trains.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional, Protocol

import numpy as np
import torch

from dapo.backends.base import Backend, Rollout, Sampling
from dapo.config import ConfigError, Preset
from dapo.loss import agg_loss, masked_mean

__all__ = ["VerlWorkers", "RayWorkers", "VerlBackend", "place_scores", "balance_order", "run"]

# non-tensor keys verl's trainer keeps on the training batch (the rest goes to the rollout only)
_REWARD_KEYS = ("data_source", "reward_model", "extra_info", "uid")


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
        """``old_log_probs`` and ``entropys`` ``[N, R]`` under the current weights (no grad)."""

    def compute_ref_log_prob(self, batch: Any) -> Any:
        """``ref_log_prob`` ``[N, R]`` under the reference policy (the initial weights; only with a KL loss)."""

    def update_actor(self, batch: Any) -> dict[str, float]:
        """``ppo_epochs`` x mini-batches of the configured policy loss; returns reduced ``actor/*`` metrics."""

    def sync_weights(self, step: int) -> None:
        """Push the actor's weights to the rollout replicas, waking them (verl's ``update_weights``)."""

    def sleep_replicas(self) -> None:
        """Free the replicas' GPU memory (weights and KV cache) for the actor's passes."""

    def save_checkpoint(self, directory: str, step: int) -> None: ...

    def load_checkpoint(self, directory: str) -> None: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------------------------------------------------
# Plain helpers (DataProto in/out; no GPU)
# --------------------------------------------------------------------------------------------------------------------


def _dataproto():
    from verl.protocol import DataProto

    return DataProto


def _obj_array(values: list[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def _as_messages(prompt: Any, where: str) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, np.ndarray):
        prompt = prompt.tolist()
    if not isinstance(prompt, (list, tuple)) or not all(isinstance(m, dict) and "content" in m for m in prompt):
        raise ValueError(f"{where}: 'prompt' must be a chat list [{{role, content}}, ...] (DAPO-Math-17k schema)")
    return [dict(m) for m in prompt]


def _mixed(values: Any) -> bool:
    return len({type(v) for v in values}) > 1


def response_lengths(data: Any) -> torch.Tensor:
    """Generated tokens per response (EOS included): the valid part of ``attention_mask`` after the prompt."""
    prompt_len = data.batch["prompts"].shape[-1]
    return data.batch["attention_mask"][:, prompt_len:].sum(-1)


def place_scores(data: Any, rewards: Any) -> None:
    """verl's reward placement: ``token_level_scores[i, L_i - 1] = R_i`` (last valid response token), zeros elsewhere;
    ``token_level_rewards`` = ``token_level_scores`` (no KL in the reward: ``use_kl_in_reward`` is refused)."""
    r = torch.as_tensor(np.asarray(rewards, dtype=np.float32)).reshape(-1)
    lengths = response_lengths(data)
    if r.shape[0] != lengths.shape[0]:
        raise ValueError(f"{lengths.shape[0]} responses but {r.shape[0]} rewards")
    if bool((lengths < 1).any()):
        raise ValueError("a response has no valid token: cannot place its reward")
    scores = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
    scores[torch.arange(r.shape[0]), lengths - 1] = r
    data.batch["token_level_scores"] = scores
    data.batch["token_level_rewards"] = scores.clone()


def balance_order(attention_mask: torch.Tensor, dp_size: int) -> tuple[np.ndarray, dict[str, float]]:
    """verl's ``balance_batch``: a permutation giving each of ``dp_size`` equal-size chunks a similar workload.

    Partitions by verl's Karmarkar-Karp (``get_seqlen_balanced_partitions`` over ``calculate_workload``), then within
    each partition shortest/longest sequences at both ends (verl's ordering). Returns (order, verl's balance metrics).
    """
    from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions, log_seqlen_unbalance

    n = attention_mask.shape[0]
    if dp_size <= 1 or n % dp_size:
        return np.arange(n), {}
    seqlen = attention_mask.view(n, -1).sum(-1)
    workload = calculate_workload(seqlen)
    parts = get_seqlen_balanced_partitions(workload.tolist(), k_partitions=dp_size, equal_size=True)
    ordered = []
    for part in parts:
        part = sorted(part, key=lambda i: (float(workload[i]), i))
        ordered.append(part[::2] + part[1::2][::-1])
    metrics = log_seqlen_unbalance(seqlen_list=seqlen.tolist(), partitions=ordered, prefix="global_seqlen")
    return np.asarray([i for part in ordered for i in part], dtype=np.int64), {k: float(v) for k, v in metrics.items()}


# --------------------------------------------------------------------------------------------------------------------
# The backend
# --------------------------------------------------------------------------------------------------------------------


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
        resp = data.batch["responses"]
        lengths = response_lengths(data)
        L = lengths.cpu().numpy().astype(np.int64)
        rows_ids = resp.cpu().tolist()
        ids = [r[: int(n)] for r, n in zip(rows_ids, L)]
        texts = list(self.tokenizer.batch_decode(ids, skip_special_tokens=True))
        max_len = int(self.cfg.data.max_response_length)
        eos = self.eos_token_ids
        truncated = np.asarray([int(n) >= max_len and (not t or t[-1] not in eos) for n, t in zip(L, ids)], dtype=bool)
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
        })  # fmt: skip
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
        self.step += 1  # the replicas are stale now; the next generate() syncs them once (after any save)
        return metrics

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

    def close(self) -> None:
        self.workers.close()


# --------------------------------------------------------------------------------------------------------------------
# The real GPU side: verl's worker groups on Ray (needs the cluster image: CUDA, vLLM)
# --------------------------------------------------------------------------------------------------------------------


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
        from omegaconf import OmegaConf

        from verl.trainer.main_ppo_v0 import BaseTaskRunner
        from verl.utils.config import omega_conf_to_dataclass

        OmegaConf.resolve(cfg)  # as verl's TaskRunner.run does before building anything
        runner = BaseTaskRunner()
        _, wg_cls = runner.add_actor_rollout_worker(cfg)
        runner.add_reward_model_resource_pool(cfg)
        pool = runner.init_resource_pool_mgr(cfg)
        model_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
        self.tokenizer = model_config.tokenizer
        gen_eos = getattr(model_config.generation_config, "eos_token_id", None)
        self.eos_token_ids = set(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos] if gen_eos is not None else [])
        trainer = dapo_trainer_class(total_training_steps, verl_agreement)(
            config=cfg,
            tokenizer=self.tokenizer,
            processor=model_config.processor,
            role_worker_mapping=runner.role_worker_mapping,
            resource_pool_manager=pool,
            ray_worker_group_cls=wg_cls,
        )
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
        out, _mfu = self.trainer._compute_old_log_prob(batch)
        return out

    def compute_ref_log_prob(self, batch: Any) -> Any:
        self.sleep_replicas()
        return self.trainer._compute_ref_log_prob(batch)

    def update_actor(self, batch: Any) -> dict[str, float]:
        from verl.utils.metric import reduce_metrics

        self.sleep_replicas()
        out = self.trainer._update_actor(batch)
        return {k: float(v) for k, v in reduce_metrics(out.meta_info["metrics"]).items()}

    def save_checkpoint(self, directory: str, step: int) -> None:
        self.sleep_replicas()
        self.trainer.actor_rollout_wg.save_checkpoint(directory, None, step, max_ckpt_to_keep=None)

    def load_checkpoint(self, directory: str) -> None:
        self.sleep_replicas()
        self.trainer.actor_rollout_wg.load_checkpoint(directory, del_local_after_load=False)

    def close(self) -> None:
        self.sleep_replicas()


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


# --------------------------------------------------------------------------------------------------------------------
# `dapo train` entrypoint for placement.backend: verl
# --------------------------------------------------------------------------------------------------------------------


def describe(preset: Preset, resolved: Any) -> str:
    """The header printed above the resolved config: what verl runs and what our loop does on top."""
    r = preset.recipe
    fg = r.filter_groups
    lines = [
        f"# dapo train --preset {preset.name}: verl 0.9.1 configuration (resolved; validated by verl.utils.config."
        "validate_config)",
        f"# world: {preset.placement.nodes} nodes x {preset.placement.gpus_per_node} GPUs; the DAPO loop (dapo.train.loop) "
        "drives verl's worker groups",
        "# dynamic sampling (dapo.train.loop, not verl's trainer): "
        + (f"on, metric {fg.metric}, max_num_gen_batches {fg.max_num_gen_batches}, mode {fg.mode}, "
           f"gen_batch_size {r.data.gen_batch_size or r.data.train_batch_size}" if fg.enable else "off"),
        f"# policy loss: actor_rollout_ref.actor.policy_loss.loss_mode="
        f"{resolved.cfg.actor_rollout_ref.actor.policy_loss.loss_mode} (token_mean_scope {r.actor.token_mean_scope})",
    ]
    lines += [f"# note: {n}" for n in resolved.notes]
    return "\n".join(lines)


def _read_rows(files: list[str], what: str) -> list[dict[str, Any]]:
    from dapo.backends.local.run import _read_rows as read

    return read(files, what)


def run(preset: Preset, args: Any, verl_overrides: list[str]) -> int:
    """Resolve + validate verl's config (before Ray), print it; unless ``--dry-run``, train with the DAPO loop."""
    from dapo.backends.verl import config as verl_config

    if getattr(args, "run_dir", None):
        raise ConfigError("--run-dir is for the local backend; on verl set recipe.trainer.default_local_dir=...")
    resolved = verl_config.resolve(preset, verl_overrides)
    print(describe(preset, resolved))
    print(verl_config.to_yaml(resolved.cfg), flush=True)
    if getattr(args, "dry_run", False):
        return 0

    import ray

    from dapo.train.loop import DAPOLoop

    cfg = resolved.cfg
    env = verl_config.runtime_env(cfg)
    os.environ.update({k: str(v) for k, v in env.get("env_vars", {}).items()})
    if not ray.is_initialized():
        ray.init(runtime_env=env, **{k: v for k, v in dict(cfg.ray_kwargs.ray_init).items() if k != "runtime_env"
                                     and v is not None})
    import dapo.backends.verl.loss  # noqa: F401  (the driver resolves loss names too)

    train_rows = _read_rows(list(preset.recipe.data.train_files), "recipe.data.train_files")
    val_rows = _read_rows(list(preset.recipe.data.val_files), "recipe.data.val_files")
    total_steps = preset.recipe.trainer.total_training_steps or _steps_for(preset, len(train_rows))
    run_dir = str(cfg.trainer.default_local_dir)
    reseed_rollout_for_resume(cfg, resume_step(preset, run_dir))
    workers = RayWorkers(cfg, total_steps, verl_agreement=preset.recipe.reward.verl_agreement)
    backend = VerlBackend(cfg, preset, workers, workers.tokenizer, eos_token_ids=workers.eos_token_ids)
    loop = DAPOLoop(preset, backend, train_rows, val_rows, run_dir, progress=not getattr(args, "no_progress", False))
    try:
        return int(loop.fit() or 0)
    finally:
        backend.close()


def resume_step(preset: Preset, run_dir: str) -> int:
    """The step the loop will resume from (``resume_mode: auto`` and a complete checkpoint), else 0."""
    if preset.recipe.trainer.resume_mode != "auto":
        return 0
    from dapo.train import checkpoint as ckpt

    latest = ckpt.latest(ckpt.checkpoint_root(run_dir))
    return int(ckpt.load_loop_state(latest)["step"]) if latest is not None else 0


def reseed_rollout_for_resume(cfg: Any, step: int) -> Optional[int]:
    """vLLM's sampling generator lives in the engines and is not checkpointable: a restarted engine starts its stream
    from ``rollout.seed`` again, so a resumed run would replay the random stream of step 1. Seed the engines with
    ``rollout.seed + step`` instead: a resume from step ``s`` always draws the same stream (reproducible per resume
    point), though not the uninterrupted run's (docs/verl.md, Resume). Returns the new seed (None: step 0)."""
    if step <= 0:
        return None
    from omegaconf import open_dict

    with open_dict(cfg):
        cfg.actor_rollout_ref.rollout.seed = int(cfg.actor_rollout_ref.rollout.seed) + int(step)
    return int(cfg.actor_rollout_ref.rollout.seed)


def _steps_for(preset: Preset, n_rows: int) -> int:
    """verl's count when total_training_steps is null: generation batches per epoch x epochs."""
    d = preset.recipe.data
    per_epoch = n_rows // (d.gen_batch_size or d.train_batch_size)
    if per_epoch < 1:
        raise ConfigError(f"recipe.data.train_files hold {n_rows} prompts, fewer than one generation batch")
    return per_epoch * preset.recipe.trainer.total_epochs

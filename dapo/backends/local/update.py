"""The policy update of the local backend: :class:`PolicyUpdate`, the ``compute_old_log_probs`` / ``update`` half of
:class:`dapo.backends.local.backend.LocalBackend` (which inherits it).

- ``compute_old_log_probs``: log pi_old of every response token with the current weights (logits / temperature, as
  verl), plus per-token entropy -> ``actor/entropy`` (aggregated with ``loss_agg_mode``, as verl) and
  ``actor/mean_prob``. Rows sampled with these very weights from pi_old's own distribution (temperature = the
  recipe's, no top-p / top-k, float32: ``Generation._sampling_is_pi_old``) take both from generation instead of a
  second forward pass (equal within 1e-5, ``tests/test_local_backend.py``); the others (a carried group, a bf16
  run, truncated sampling) are recomputed.
- ``update``: ``ppo_epochs`` passes over mini-batches of ``ppo_mini_batch_size`` prompts x ``n`` responses (in batch
  order, like verl), each split into micro-batches of ``local.micro_batch_size`` responses whose losses are
  :func:`dapo.loss.policy_loss` normalised by the whole mini-batch's token count (``global_tokens``; the token-level
  loss of eq. 12 under gradient accumulation) -- or per micro-batch with ``token_mean_scope: microbatch``. Then the
  global grad-norm clip and one AdamW step (skipped when the grad norm is not finite, like verl). The learning rate
  follows verl's ``constant`` schedule with linear warm-up, stepped once per rollout step:
  ``lr_s = lr * min(1, s / lr_warmup_steps)`` for the s-th update call (0-based; so the very first update runs at
  lr 0 when warm-up is on, exactly as verl 0.9.1). ``actor/lr`` is the rate the update used.
- ``recipe.actor.use_kl_loss``: a frozen copy of the initial model is the reference policy; its log-probs are computed
  after pi_old and ``kl_loss_coef * agg_loss(kl_penalty(log_prob, ref_log_prob, kl_loss_type), mask)`` is added to
  the loss, as verl's ``ppo_loss`` does. A mini-batch with no valid token (all overlong-filtered) is a zero-gradient
  optimizer step, as in verl with the DAPO loss.

:class:`PolicyUpdate` uses what ``LocalBackend.__init__`` sets: ``recipe``, ``model``, ``ref_model``, ``device``,
``optimizer``, ``scheduler``, ``micro_batch_size``, ``share_prefix``, ``autocast``, ``counters`` and
``_computed_tokens``. ``perf/mfu/actor`` and ``perf/mfu/actor_infer`` are verl's MFU of the two passes, logged where
the device's peak is known (:mod:`dapo.util.flops`).
"""

from __future__ import annotations

import math
import time
from typing import Optional

import numpy as np
import torch

from dapo.backends.base import Rollout
from dapo.loss import agg_loss, entropy_from_logits, kl_penalty, log_probs_from_logits, masked_mean, policy_loss
from dapo.util.flops import peak_flops, train_flops
from dapo.util.lm_forward import prompt_forward

__all__ = ["CLIP_HIGH_BINS", "PolicyUpdate", "clip_high_key"]

# pi_old bins of the up-clipped-token histogram (``actor/pg_clip_high_old_prob/<lo>``: token counts per update)
CLIP_HIGH_BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def clip_high_key(k: int) -> str:
    """Metric name of bin ``k`` of :data:`CLIP_HIGH_BINS` (tokens stopped by the upper clip with pi_old in it)."""
    return f"actor/pg_clip_high_old_prob/{CLIP_HIGH_BINS[k]:.1f}"


class PolicyUpdate:
    """Log-probs and the DAPO policy update (module docstring); a mixin of ``LocalBackend``."""

    def _forward_response(self, data: dict[str, torch.Tensor], idx: torch.Tensor, temperature: float, model=None):
        """Logits (/ temperature) aligned with the response tokens of rows ``idx``, trimmed to the needed width; the
        template prefix and each group's prompt computed once (:func:`dapo.util.lm_forward.prompt_forward`)."""
        r_ids, r_mask = data["response_ids"][idx], data["response_mask"][idx]
        keep_r = max(1, int(r_mask.sum(1).max()))
        r_ids, r_mask = r_ids[:, :keep_r].to(self.device), r_mask[:, :keep_r].to(self.device)
        with self.autocast():
            logits, last, _, _, computed = prompt_forward(
                model if model is not None else self.model, data["prompt_ids"][idx].to(self.device),
                data["prompt_mask"][idx].to(self.device), r_ids,
                share_prefix=self.share_prefix, share_groups=self.share_prefix,
            )
        self._computed_tokens += computed
        logits = logits[:, last : last + keep_r].float()
        if temperature and temperature > 0:
            logits = logits / temperature
        return logits, r_ids, r_mask, keep_r

    def _micro_batches(self, rows: range | list[int]) -> list[torch.Tensor]:
        rows = list(rows)
        return [torch.tensor(rows[i : i + self.micro_batch_size]) for i in range(0, len(rows), self.micro_batch_size)]

    def _mfu(self, key: str, data: dict[str, torch.Tensor], seconds: float, passes: int = 1,
             forward_only: bool = False, rows: Optional[list[int]] = None) -> dict[str, float]:
        """verl's ``perf/mfu/<key>``: model FLOPs of ``passes`` forward+backward passes over the sequences of ``rows``
        (all by default; prompt + response tokens, :func:`dapo.util.flops.train_flops`) / (seconds x the device's
        peak), / 3 for a forward-only pass; nothing where the device's peak is unknown (a CPU, an unlisted GPU) or
        no row was computed."""
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else str(self.device.type)
        peak = peak_flops(name)
        if peak is None or seconds <= 0 or rows == []:
            return {}
        seqlens = (data["prompt_mask"].sum(1) + data["response_mask"].sum(1))[rows if rows is not None else slice(None)]
        seqlens = seqlens.tolist()
        flops = train_flops(self.model.config, seqlens) * passes / (3.0 if forward_only else 1.0)
        return {f"perf/mfu/{key}": flops / (seconds * peak)}

    @torch.no_grad()
    def compute_old_log_probs(self, batch: Rollout) -> dict[str, float]:
        t0 = time.perf_counter()
        data = batch.data
        N, R = data["response_ids"].shape
        old = torch.zeros((N, R), dtype=torch.float32)
        ent = torch.zeros((N, R), dtype=torch.float32)
        stale = list(range(N))
        if "gen_log_prob" in data:  # sampled from pi_old itself with these very weights: reuse, recompute the rest
            fresh = data["weights_tag"][:, 0] == self._weights_tag
            old[fresh], ent[fresh] = data["gen_log_prob"][fresh], data["gen_entropy"][fresh]
            stale = torch.nonzero(~fresh).flatten().tolist()
        self.counters["old_log_prob_reused"] = self.counters.get("old_log_prob_reused", 0) + N - len(stale)
        was_training = self.model.training
        self.model.eval()
        for idx in self._micro_batches(stale):
            logits, r_ids, _, w = self._forward_response(data, idx, self.recipe.rollout.temperature)
            old[idx, :w] = log_probs_from_logits(logits, r_ids).cpu()
            ent[idx, :w] = entropy_from_logits(logits).cpu()
        self.model.train(was_training)
        mask = data["response_mask"]
        old = old * mask
        data["old_log_prob"] = old
        out = {
            "actor/entropy": float(agg_loss(ent, mask, self.recipe.actor.loss_agg_mode)),
            "actor/mean_prob": float(masked_mean(old.exp(), mask)),
            # the rows recomputed here (rows reused from generation cost this pass nothing)
            **self._mfu("actor_infer", data, time.perf_counter() - t0, forward_only=True, rows=stale),
        }
        if self.ref_model is not None:  # verl: reference log-probs after pi_old, before the update
            ref = torch.zeros((N, R), dtype=torch.float32)
            for idx in self._micro_batches(range(N)):
                logits, r_ids, _, w = self._forward_response(data, idx, self.recipe.rollout.temperature, self.ref_model)
                ref[idx, :w] = log_probs_from_logits(logits, r_ids).cpu()
            data["ref_log_prob"] = ref * mask
        return out

    def update(
        self, batch: Rollout, advantages: np.ndarray, loss_mask: Optional[np.ndarray] = None
    ) -> dict[str, float]:
        """``ppo_epochs`` x mini-batches of the DAPO loss, one optimizer step each (module docstring); returns the
        ``actor/*`` metrics."""
        a = self.recipe.actor
        data = batch.data
        if "old_log_prob" not in data:
            raise RuntimeError("update() before compute_old_log_probs(): pi_old must be recomputed first")
        N = len(batch)
        adv = torch.as_tensor(np.asarray(advantages, dtype=np.float32)).reshape(-1)
        if adv.shape[0] != N:
            raise ValueError(f"{N} responses but {adv.shape[0]} advantages")
        keep = torch.ones(N) if loss_mask is None else torch.as_tensor(np.asarray(loss_mask, dtype=np.float32))
        rmask_all = data["response_mask"].float() * keep[:, None]
        mini = a.ppo_mini_batch_size * self.recipe.rollout.n
        lr_used = self.optimizer.param_groups[0]["lr"]
        stats: dict[str, list[float]] = {k: [] for k in ("pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl",
                                                          "loss_tokens")}
        if a.use_kl_loss:
            if "ref_log_prob" not in data:
                raise RuntimeError("use_kl_loss: update() needs the reference log-probs of compute_old_log_probs()")
            stats["kl_loss"] = []
        grad_norms: list[float] = []
        self._clip_high_hist = torch.zeros(len(CLIP_HIGH_BINS) - 1)
        t0 = time.perf_counter()
        computed0 = self._computed_tokens
        self.model.train()
        for _ in range(a.ppo_epochs):
            for start in range(0, N, mini):
                grad_norms.append(self._mini_batch_step(data, list(range(start, min(N, start + mini))), rmask_all, adv,
                                                        stats))
        self.scheduler.step()
        self._new_weights_tag()  # rollouts sampled before this update are no longer pi_old's samples
        self.model.eval()
        self.counters["update_tokens"] += self._computed_tokens - computed0
        self.counters["update_seconds"] += time.perf_counter() - t0
        out = {f"actor/{k}": float(np.mean(v)) if v else 0.0 for k, v in stats.items()}
        out.update(self._mfu("actor", data, time.perf_counter() - t0, passes=a.ppo_epochs))
        out["actor/grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
        for k, count in enumerate(self._clip_high_hist.tolist()):
            out[clip_high_key(k)] = float(count)
        out["actor/lr"] = float(lr_used)
        if a.use_kl_loss:
            out["actor/kl_coef"] = float(a.kl_loss_coef)
        skipped = sum(1 for gn in grad_norms if not math.isfinite(gn))
        out["actor/num_optimizer_steps"] = float(len(grad_norms) - skipped)
        if skipped:
            out["actor/skipped_steps"] = float(skipped)
        return out

    def _mini_batch_step(self, data: dict[str, torch.Tensor], rows: list[int], rmask_all: torch.Tensor,
                         adv: torch.Tensor, stats: dict[str, list[float]]) -> float:
        """One optimizer step on the mini-batch ``rows``: the gradients of its micro-batches accumulated, the global
        grad-norm clip, then AdamW (skipped when the grad norm is not finite, like verl); returns the grad norm."""
        a = self.recipe.actor
        mb_mask = rmask_all[rows]
        mb_tokens = float(mb_mask.sum())
        mb_seqs = float((mb_mask.sum(1) > 0).sum())
        self.optimizer.zero_grad(set_to_none=True)
        mb_loss = mb_kl = 0.0
        if mb_tokens == 0:
            # every response masked (e.g. all truncated under overlong filtering): the loss is 0 with a zero
            # gradient (dapo.loss), so skip the forward passes but take the optimizer step verl takes with
            # zero gradients (AdamW moments and weight decay still advance)
            for prm in self.model.parameters():
                if prm.requires_grad:
                    prm.grad = torch.zeros_like(prm)
        for idx in self._micro_batches(rows if mb_tokens > 0 else []):
            done = self._micro_batch_backward(data, idx, rows, rmask_all, adv, mb_tokens, mb_seqs)
            if done is None:
                continue
            loss, kl_loss, met, loss_tokens = done
            mb_kl += kl_loss
            mb_loss += loss
            stats["loss_tokens"].append(loss_tokens)  # the token-mean's denominator
            for k in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
                stats[k].append(float(met[k]))
        gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), a.optim.clip_grad)
        gn = float(gn)
        if math.isfinite(gn):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        stats["pg_loss"].append(mb_loss)
        if a.use_kl_loss:
            stats["kl_loss"].append(mb_kl)
        return gn

    def _count_clip_high(self, log_prob: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, m: torch.Tensor) -> None:
        """Histogram of pi_old over the tokens the upper clip stops (A > 0 and ratio > 1 + eps_high): what the DAPO
        paper's Fig. 3 plots (its clip-higher motivation: the clipped tokens are mostly low-probability ones)."""
        eps_high = self.recipe.actor.clip_ratio_high
        ratio = torch.exp(torch.clamp(log_prob - old, -20, 20))
        up = (adv[:, None] > 0) & (ratio > 1 + eps_high) & (m > 0)
        if bool(up.any()):
            p_old = old[up].exp().clamp(0, 1 - 1e-9).cpu()
            edges = torch.tensor(CLIP_HIGH_BINS)
            self._clip_high_hist += torch.bincount(torch.bucketize(p_old, edges[1:-1], right=True),
                                                   minlength=len(edges) - 1).float()

    def _micro_batch_backward(self, data: dict[str, torch.Tensor], idx: torch.Tensor, rows: list[int],
                              rmask_all: torch.Tensor, adv: torch.Tensor, mb_tokens: float, mb_seqs: float
                              ) -> Optional[tuple[float, float, dict[str, torch.Tensor], float]]:
        """The backward pass of micro-batch ``idx``'s share of the mini-batch loss: :func:`dapo.loss.policy_loss`
        normalised by the mini-batch's tokens (``token_mean_scope: minibatch``; per micro-batch and divided by the
        accumulation steps otherwise), minus the entropy bonus, plus the KL loss. Returns (loss, KL loss, the loss's
        metrics, the token-mean's denominator), or None when the micro-batch has no token in the loss."""
        a = self.recipe.actor
        logits, r_ids, _, w = self._forward_response(data, idx, self.recipe.rollout.temperature)
        log_prob = log_probs_from_logits(logits, r_ids)
        m = rmask_all[idx, :w].to(self.device)
        if float(m.sum()) == 0:
            return None
        old = data["old_log_prob"][idx, :w].to(self.device)
        glob = a.token_mean_scope == "minibatch"
        loss, met = policy_loss(
            log_prob, old, adv[idx].to(self.device), m,
            clip_ratio_low=a.clip_ratio_low, clip_ratio_high=a.clip_ratio_high,
            clip_ratio_c=a.clip_ratio_c, loss_agg_mode=a.loss_agg_mode,
            global_tokens=mb_tokens if glob else None, global_seqs=mb_seqs if glob else None,
        )
        self._count_clip_high(log_prob.detach(), old, adv[idx].to(self.device), m)
        if not glob:  # the reference commit: per-micro-batch mean, divided by the accumulation steps
            loss = loss * (len(idx) / len(rows))
        if a.entropy_coeff:
            ent = entropy_from_logits(logits)
            ent_loss = agg_loss(
                ent, m, a.loss_agg_mode,
                global_tokens=mb_tokens if glob else None, global_seqs=mb_seqs if glob else None,
            )
            loss = loss - a.entropy_coeff * (ent_loss if glob else ent_loss * (len(idx) / len(rows)))
        kl = 0.0
        if a.use_kl_loss:  # verl's ppo_loss: + kl_loss_coef * agg(kl_penalty(log_prob, ref), mask)
            ref = data["ref_log_prob"][idx, :w].to(self.device)
            kl_loss = agg_loss(
                kl_penalty(log_prob, ref, a.kl_loss_type), m, a.loss_agg_mode,
                global_tokens=mb_tokens if glob else None, global_seqs=mb_seqs if glob else None,
            )
            if not glob:
                kl_loss = kl_loss * (len(idx) / len(rows))
            loss = loss + a.kl_loss_coef * kl_loss
            kl = float(kl_loss.detach())
        loss.backward()
        return float(loss.detach()), kl, met, mb_tokens if glob else float(m.sum())

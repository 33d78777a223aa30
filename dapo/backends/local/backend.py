"""The local backend: one process, a HF transformers causal LM on CPU or one CUDA GPU.

It implements :class:`dapo.backends.base.Backend` for :mod:`dapo.train.loop` (the same loop the verl backend runs on a
cluster):

- ``generate``: batched sampling with a KV cache (prefill each distinct prompt once, then repeat its cache ``n`` times
  -- the group shares the prompt), temperature / top-k / top-p or greedy, stop at EOS or ``max_tokens``; records the
  entropy of the sampling distribution and the probability of each sampled token (``Rollout.stats``).
- ``compute_old_log_probs``: log pi_old of every response token with the current weights (logits / temperature, as
  verl), plus per-token entropy -> ``actor/entropy`` (aggregated with ``loss_agg_mode``, as verl) and
  ``actor/mean_prob``.
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
- checkpoints: the weights as a HF model directory (``actor/``, loadable with ``from_pretrained``) and the optimizer,
  scheduler and sampling-generator states (``actor_state.pt``).

:func:`run` is the ``dapo train`` entrypoint for ``placement.backend: local``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from dapo.backends.base import Backend, Rollout, Sampling
from dapo.util.lm_forward import common_prefix_len, prompt_forward  # noqa: F401 (also imported from here)
from dapo.util.lm_forward import left_pad as _left_pad
from dapo.loss import agg_loss, entropy_from_logits, kl_penalty, log_probs_from_logits, masked_mean, policy_loss

__all__ = ["LocalBackend", "resolve_device", "run"]


def resolve_device(spec: str) -> torch.device:
    """``auto`` -> ``cuda`` when available else ``cpu``; otherwise ``cpu`` / ``cuda`` / ``cuda:N`` (checked)."""
    spec = (spec or "auto").strip()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(spec)
    except RuntimeError as exc:
        raise ValueError(f"placement.device: {spec!r} is not a device (cpu, cuda, cuda:N or auto)") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"placement.device: {spec!r} requested but no CUDA device is available (use --device cpu)")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"placement.device: {spec!r}: the local backend runs on cpu or one cuda device")
    return dev


def _repad(t: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    if t.shape[1] == width:
        return t
    pad = torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype, device=t.device)
    return torch.cat([pad, t] if left else [t, pad], dim=1)


def _preallocate_cache(cache, extra: int) -> None:
    """Give every layer of a ``DynamicCache`` room for ``extra`` more positions, written in place while decoding
    (the default layer concatenates -- copies -- its whole key/value tensors at every generated token)."""
    from transformers.cache_utils import DynamicLayer

    class _Preallocated(DynamicLayer):
        def __init__(self, keys: torch.Tensor, values: torch.Tensor):
            super().__init__()
            b, h, n, d = keys.shape
            self.kbuf = keys.new_empty((b, h, n + extra, d))
            self.vbuf = values.new_empty((b, h, n + extra, values.shape[-1]))
            self.kbuf[:, :, :n] = keys
            self.vbuf[:, :, :n] = values
            self.length = n
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
            self.keys, self.values = self.kbuf[:, :, :n], self.vbuf[:, :, :n]

        def update(self, key_states, value_states, *args, **kwargs):
            n = key_states.shape[-2]
            if self.length + n > self.kbuf.shape[2]:
                raise RuntimeError("decoding past the preallocated cache length")
            self.kbuf[:, :, self.length : self.length + n] = key_states
            self.vbuf[:, :, self.length : self.length + n] = value_states
            self.length += n
            self.keys, self.values = self.kbuf[:, :, : self.length], self.vbuf[:, :, : self.length]
            return self.keys, self.values

    cache.layers = [_Preallocated(layer.keys, layer.values) for layer in cache.layers]


class LocalBackend(Backend):
    """HF causal LM + tokenizer in this process (see the module docstring)."""

    # private tensors of a Rollout: name -> (pad value, left padded?)
    _FIELDS = {
        "prompt_ids": (None, True),
        "prompt_mask": (0, True),
        "response_ids": (None, False),
        "response_mask": (0, False),
        "old_log_prob": (0.0, False),
        "ref_log_prob": (0.0, False),
    }

    def __init__(
        self,
        model_path: str,
        tokenizer_path: Optional[str],
        recipe,
        *,
        device: str | torch.device = "cpu",
        micro_batch_size: int = 64,
        gen_chunk_size: int = 512,
        seed: int = 1,
        share_prefix: bool = True,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.recipe = recipe
        self.device = device if isinstance(device, torch.device) else resolve_device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or model_path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.eos_ids = self._eos_ids(model_path)
        overrides = dict(recipe.model.override_config or {})
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, trust_remote_code=recipe.model.trust_remote_code, dtype=torch.float32, **overrides
        ).to(self.device)
        if recipe.model.enable_gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.model.eval()
        a = recipe.actor
        if recipe.algorithm.use_kl_in_reward:  # dapo.config.validate refuses it already; never silently ignore it
            raise ValueError("recipe.algorithm.use_kl_in_reward: not implemented by the DAPO loop (use use_kl_loss)")
        # use_kl_loss: a frozen copy of the initial policy is the reference policy (verl's RefPolicy role); it is
        # never trained nor checkpointed (a resumed run rebuilds it from recipe.model.path, as verl does)
        self.ref_model = None
        if a.use_kl_loss:
            self.ref_model = copy.deepcopy(self.model).eval()
            self.ref_model.requires_grad_(False)
        if micro_batch_size < 1:
            raise ValueError(f"local.micro_batch_size must be >= 1, got {micro_batch_size}")
        self.micro_batch_size = micro_batch_size
        # compute a prompt prefix shared by a whole batch once (see prompt_forward); off with gradient checkpointing
        self.share_prefix = bool(share_prefix) and not recipe.model.enable_gradient_checkpointing
        self.gen_chunk_size = gen_chunk_size
        o = a.optim
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay
        )
        warmup = int(o.lr_warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, float(s) / float(max(1, warmup))) if warmup > 0 else 1.0
        )
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))
        self._prompt_cache: dict[str, list[int]] = {}
        self._warned_truncation = False
        self._next_gid = 0
        self.autocast = (
            (lambda: torch.autocast("cuda", dtype=torch.bfloat16))
            if self.device.type == "cuda"
            else contextlib.nullcontext
        )
        # cumulative token/time counters (bench/timing and the GPU script read them)
        # (update_tokens: positions run through forward+backward, the shared prompt prefix counted once)
        self.counters = {"gen_tokens": 0, "gen_seconds": 0.0, "update_tokens": 0, "update_seconds": 0.0}
        self._computed_tokens = 0

    # ---------------------------------------------------------------------------------------------------------------
    def _eos_ids(self, model_path: str) -> set[int]:
        ids = {int(self.tokenizer.eos_token_id)} if self.tokenizer.eos_token_id is not None else set()
        gen_cfg = Path(model_path) / "generation_config.json"
        if gen_cfg.exists():
            eos = json.loads(gen_cfg.read_text()).get("eos_token_id")
            ids |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if not ids:
            raise ValueError(f"{model_path}: the tokenizer has no eos_token; generation could never stop")
        return ids

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def encode_prompt(self, row: dict[str, Any]) -> list[int]:
        """Chat-templated prompt ids of a DAPO-schema row (``row[prompt_key]`` is the chat list), truncated per
        ``recipe.data.truncation`` to ``max_prompt_length``."""
        d = self.recipe.data
        chat = row.get(d.prompt_key)
        if chat is None:
            raise ValueError(f"prompt row has no '{d.prompt_key}' column (keys: {sorted(row)})")
        key = json.dumps(chat, sort_keys=True, default=str)
        ids = self._prompt_cache.get(key)
        if ids is None:
            if isinstance(chat, str):
                chat = [{"role": "user", "content": chat}]
            out = self.tokenizer.apply_chat_template(list(chat), add_generation_prompt=True, tokenize=True)
            ids = list(out["input_ids"] if hasattr(out, "keys") else out)
            if len(ids) > d.max_prompt_length:
                if d.truncation == "error":
                    where = row.get("extra_info", {}) or {}
                    raise ValueError(
                        f"prompt of {len(ids)} tokens exceeds recipe.data.max_prompt_length={d.max_prompt_length} "
                        f"(row index {where.get('index', '?')}, data_source {row.get('data_source', '?')}); "
                        "raise the limit or set recipe.data.truncation: left"
                    )
                if not self._warned_truncation:
                    self._warned_truncation = True
                    print(
                        f"warning: prompts longer than recipe.data.max_prompt_length={d.max_prompt_length} tokens are "
                        f"truncated ({d.truncation}); first one: {len(ids)} tokens", flush=True,
                    )
                ids = ids[-d.max_prompt_length :] if d.truncation == "left" else ids[: d.max_prompt_length]
            self._prompt_cache[key] = ids
        return ids

    # ---------------------------------------------------------------------------------------------------------------
    @staticmethod
    def _sample(logits: torch.Tensor, s: Sampling, gen: torch.Generator):
        """Next tokens from ``logits`` [B, V]; returns (tokens, entropy, prob) of the sampling distribution."""
        logits = logits.float()
        if not s.do_sample or s.temperature <= 0:
            logp = torch.log_softmax(logits, dim=-1)
            tok = logits.argmax(dim=-1)
        else:
            z = logits / s.temperature
            if s.top_k is not None and s.top_k > 0 and s.top_k < z.shape[-1]:
                kth = torch.topk(z, s.top_k, dim=-1).values[:, -1:]
                z = z.masked_fill(z < kth, float("-inf"))
            if s.top_p < 1.0:
                sorted_z, order = torch.sort(z, dim=-1, descending=True)
                cum = torch.softmax(sorted_z, dim=-1).cumsum(dim=-1)
                drop_sorted = cum - torch.softmax(sorted_z, dim=-1) >= s.top_p  # keep the smallest prefix >= top_p
                drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
                z = z.masked_fill(drop, float("-inf"))
            logp = torch.log_softmax(z, dim=-1)
            tok = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
        p = logp.exp()
        ent = -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)
        prob = p.gather(-1, tok[:, None]).squeeze(-1)
        return tok, ent, prob

    @torch.no_grad()
    def _generate_chunk(self, prompt_ids: list[list[int]], s: Sampling, gen: torch.Generator):
        n, dev = s.n, self.device
        ids, p_mask = _left_pad([torch.tensor(p, dtype=torch.long) for p in prompt_ids], self.pad_id)
        ids, p_mask = ids.to(dev), p_mask.to(dev)
        with self.autocast():
            logits, _, cache, mask, _ = prompt_forward(
                self.model, ids, p_mask, share_prefix=self.share_prefix, use_cache=True
            )
        logits = logits[:, -1]
        last_pos = mask.sum(1) - 1
        if n > 1:
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            mask = mask.repeat_interleave(n, dim=0)
            last_pos = last_pos.repeat_interleave(n, dim=0)
        N = mask.shape[0]
        _preallocate_cache(cache, s.max_tokens)
        finished = torch.zeros(N, dtype=torch.bool, device=dev)
        eos = torch.tensor(sorted(self.eos_ids), device=dev)
        toks, ents, probs = [], [], []
        for _ in range(s.max_tokens):
            tok, ent, prob = self._sample(logits, s, gen)
            tok = torch.where(finished, torch.full_like(tok, self.pad_id), tok)
            toks.append(tok)
            ents.append(torch.where(finished, torch.zeros_like(ent), ent))
            probs.append(torch.where(finished, torch.zeros_like(prob), prob))
            finished = finished | torch.isin(tok, eos)
            if bool(finished.all()):
                break
            mask = torch.cat([mask, torch.ones((N, 1), dtype=mask.dtype, device=dev)], dim=1)
            last_pos = last_pos + 1
            with self.autocast():
                out = self.model(
                    input_ids=tok[:, None], attention_mask=mask, position_ids=last_pos[:, None],
                    past_key_values=cache, use_cache=True,
                )
            cache, logits = out.past_key_values, out.logits[:, -1]
        resp = torch.stack(toks, dim=1) if toks else torch.zeros((N, 0), dtype=torch.long, device=dev)
        ent = torch.stack(ents, dim=1) if ents else torch.zeros((N, 0), device=dev)
        prob = torch.stack(probs, dim=1) if probs else torch.zeros((N, 0), device=dev)
        # response mask: every token up to and including the first EOS
        is_eos = torch.isin(resp, eos)
        after_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
        rmask = (~after_eos).long()
        truncated = ~is_eos.any(dim=1)
        return (
            ids.repeat_interleave(n, dim=0).cpu(), p_mask.repeat_interleave(n, dim=0).cpu(), resp.cpu(), rmask.cpu(),
            truncated.cpu(), ent.cpu(), prob.cpu(),
        )

    def generate(self, prompts: list[dict[str, Any]], sampling: Sampling, group_ids: Optional[list] = None) -> Rollout:
        if not prompts:
            raise ValueError("generate() needs at least one prompt")
        if group_ids is None:
            group_ids = list(range(self._next_gid, self._next_gid + len(prompts)))
            self._next_gid += len(prompts)
        if len(group_ids) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(group_ids)} group ids")
        t0 = time.perf_counter()
        encoded = [self.encode_prompt(r) for r in prompts]
        per_chunk = max(1, self.gen_chunk_size // max(1, sampling.n))
        parts = []
        was_training = self.model.training
        self.model.eval()
        gen = self.generator
        if sampling.validation:
            # validation draws from its own stream, seeded from (without advancing) the training generator: the
            # training samples after a validation -- or after a resume from a checkpoint saved before that
            # validation -- do not depend on it
            gen = torch.Generator(device=self.device)
            gen.manual_seed(zlib.crc32(self.generator.get_state().numpy().tobytes()))
        for start in range(0, len(prompts), per_chunk):
            parts.append(self._generate_chunk(encoded[start : start + per_chunk], sampling, gen))
        self.model.train(was_training)
        P = max(p[0].shape[1] for p in parts)
        R = max(p[2].shape[1] for p in parts)
        p_ids = torch.cat([_repad(p[0], P, self.pad_id, True) for p in parts])
        p_mask = torch.cat([_repad(p[1], P, 0, True) for p in parts])
        resp = torch.cat([_repad(p[2], R, self.pad_id, False) for p in parts])
        rmask = torch.cat([_repad(p[3], R, 0, False) for p in parts])
        truncated = torch.cat([p[4] for p in parts]).numpy()
        ent = torch.cat([_repad(p[5], R, 0.0, False) for p in parts])
        prob = torch.cat([_repad(p[6], R, 0.0, False) for p in parts])
        lengths = rmask.sum(dim=1)
        n = sampling.n
        texts = self.tokenizer.batch_decode(
            [r[: int(k)].tolist() for r, k in zip(resp, lengths)], skip_special_tokens=True
        )
        denom = lengths.clamp(min=1).float()
        self.counters["gen_tokens"] += int(lengths.sum())
        self.counters["gen_seconds"] += time.perf_counter() - t0
        return Rollout(
            group_ids=np.asarray([g for g in group_ids for _ in range(n)], dtype=object),
            prompt_rows=[r for r in prompts for _ in range(n)],
            response_text=texts,
            response_length=lengths.numpy().astype(np.int64),
            truncated=truncated.astype(bool),
            data={"prompt_ids": p_ids, "prompt_mask": p_mask, "response_ids": resp, "response_mask": rmask},
            stats={
                "entropy": ((ent * rmask).sum(1) / denom).numpy(),
                "mean_prob": ((prob * rmask).sum(1) / denom).numpy(),
                "prompt_length": p_mask.sum(1).numpy().astype(np.float64),
            },
        )

    # ---------------------------------------------------------------------------------------------------------------
    def select(self, rollout: Rollout, index: np.ndarray) -> Rollout:
        idx = np.asarray(index, dtype=np.int64).reshape(-1)
        t = torch.as_tensor(idx, dtype=torch.long)
        return rollout.take(idx, {k: v.index_select(0, t) for k, v in rollout.data.items()})

    def concat(self, rollouts: list[Rollout]) -> Rollout:
        if not rollouts:
            raise ValueError("concat of no rollouts")
        if len(rollouts) == 1:
            return rollouts[0]
        keys = set(rollouts[0].data)
        for r in rollouts[1:]:
            if set(r.data) != keys:
                raise ValueError(f"cannot concat rollouts with different fields: {sorted(keys)} vs {sorted(r.data)}")
        data = {}
        for k in keys:
            pad, left = self._FIELDS.get(k, (0, False))
            pad = self.pad_id if pad is None else pad
            width = max(r.data[k].shape[1] for r in rollouts)
            data[k] = torch.cat([_repad(r.data[k], width, pad, left) for r in rollouts])
        return Rollout.join(rollouts, data)

    # ---------------------------------------------------------------------------------------------------------------
    def _forward_response(self, data: dict[str, torch.Tensor], idx: torch.Tensor, temperature: float, model=None):
        """Logits (/ temperature) aligned with the response tokens of rows ``idx``, trimmed to the needed width."""
        r_ids, r_mask = data["response_ids"][idx], data["response_mask"][idx]
        keep_r = max(1, int(r_mask.sum(1).max()))
        r_ids, r_mask = r_ids[:, :keep_r].to(self.device), r_mask[:, :keep_r].to(self.device)
        with self.autocast():
            logits, last, _, _, computed = prompt_forward(
                model if model is not None else self.model, data["prompt_ids"][idx].to(self.device),
                data["prompt_mask"][idx].to(self.device), r_ids,
                share_prefix=self.share_prefix,
            )
        self._computed_tokens += computed
        logits = logits[:, last : last + keep_r].float()
        if temperature and temperature > 0:
            logits = logits / temperature
        return logits, r_ids, r_mask, keep_r

    def _micro_batches(self, rows: range | list[int]) -> list[torch.Tensor]:
        rows = list(rows)
        return [torch.tensor(rows[i : i + self.micro_batch_size]) for i in range(0, len(rows), self.micro_batch_size)]

    @torch.no_grad()
    def compute_old_log_probs(self, batch: Rollout) -> dict[str, float]:
        data = batch.data
        N, R = data["response_ids"].shape
        old = torch.zeros((N, R), dtype=torch.float32)
        ent = torch.zeros((N, R), dtype=torch.float32)
        was_training = self.model.training
        self.model.eval()
        for idx in self._micro_batches(range(N)):
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
        stats: dict[str, list[float]] = {k: [] for k in ("pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl")}
        if a.use_kl_loss:
            if "ref_log_prob" not in data:
                raise RuntimeError("use_kl_loss: update() needs the reference log-probs of compute_old_log_probs()")
            stats["kl_loss"] = []
        grad_norms, skipped, steps = [], 0, 0
        t0 = time.perf_counter()
        computed0 = self._computed_tokens
        self.model.train()
        for _ in range(a.ppo_epochs):
            for start in range(0, N, mini):
                rows = list(range(start, min(N, start + mini)))
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
                    logits, r_ids, _, w = self._forward_response(data, idx, self.recipe.rollout.temperature)
                    log_prob = log_probs_from_logits(logits, r_ids)
                    m = rmask_all[idx, :w].to(self.device)
                    if float(m.sum()) == 0:
                        continue
                    old = data["old_log_prob"][idx, :w].to(self.device)
                    glob = a.token_mean_scope == "minibatch"
                    loss, met = policy_loss(
                        log_prob, old, adv[idx].to(self.device), m,
                        clip_ratio_low=a.clip_ratio_low, clip_ratio_high=a.clip_ratio_high,
                        clip_ratio_c=a.clip_ratio_c, loss_agg_mode=a.loss_agg_mode,
                        global_tokens=mb_tokens if glob else None, global_seqs=mb_seqs if glob else None,
                    )
                    if not glob:  # the reference commit: per-micro-batch mean, divided by the accumulation steps
                        loss = loss * (len(idx) / len(rows))
                    if a.entropy_coeff:
                        ent = entropy_from_logits(logits)
                        ent_loss = agg_loss(
                            ent, m, a.loss_agg_mode,
                            global_tokens=mb_tokens if glob else None, global_seqs=mb_seqs if glob else None,
                        )
                        loss = loss - a.entropy_coeff * (ent_loss if glob else ent_loss * (len(idx) / len(rows)))
                    if a.use_kl_loss:  # verl's ppo_loss: + kl_loss_coef * agg(kl_penalty(log_prob, ref), mask)
                        ref = data["ref_log_prob"][idx, :w].to(self.device)
                        kl_loss = agg_loss(
                            kl_penalty(log_prob, ref, a.kl_loss_type), m, a.loss_agg_mode,
                            global_tokens=mb_tokens if glob else None, global_seqs=mb_seqs if glob else None,
                        )
                        if not glob:
                            kl_loss = kl_loss * (len(idx) / len(rows))
                        loss = loss + a.kl_loss_coef * kl_loss
                        mb_kl += float(kl_loss.detach())
                    loss.backward()
                    mb_loss += float(loss.detach())
                    for k in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
                        stats[k].append(float(met[k]))
                gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), a.optim.clip_grad)
                gn = float(gn)
                if math.isfinite(gn):
                    self.optimizer.step()
                    steps += 1
                else:
                    skipped += 1
                self.optimizer.zero_grad(set_to_none=True)
                grad_norms.append(gn)
                stats["pg_loss"].append(mb_loss)
                if a.use_kl_loss:
                    stats["kl_loss"].append(mb_kl)
        self.scheduler.step()
        self.model.eval()
        self.counters["update_tokens"] += self._computed_tokens - computed0
        self.counters["update_seconds"] += time.perf_counter() - t0
        out = {f"actor/{k}": float(np.mean(v)) if v else 0.0 for k, v in stats.items()}
        out["actor/grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
        out["actor/lr"] = float(lr_used)
        if a.use_kl_loss:
            out["actor/kl_coef"] = float(a.kl_loss_coef)
        out["actor/num_optimizer_steps"] = float(steps)
        if skipped:
            out["actor/skipped_steps"] = float(skipped)
        return out

    # ---------------------------------------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> None:
        d = Path(directory)
        (d / "actor").mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(d / "actor"))
        self.tokenizer.save_pretrained(str(d / "actor"))
        torch.save(
            {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "generator": self.generator.get_state(),
                "next_gid": self._next_gid,
            },
            d / "actor_state.pt",
        )

    def load_checkpoint(self, directory: str) -> None:
        from safetensors.torch import load_file

        d = Path(directory)
        files = sorted((d / "actor").glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{d / 'actor'}: no *.safetensors weights in this checkpoint")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        if set(missing) - tied or unexpected:
            raise ValueError(f"{d}: checkpoint does not match the model (missing {missing}, unexpected {unexpected})")
        if tied:
            self.model.tie_weights()
        st = torch.load(d / "actor_state.pt", map_location="cpu", weights_only=False)
        self.optimizer.load_state_dict(st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        self.generator.set_state(st["generator"])
        self._next_gid = int(st.get("next_gid", 0))


# --------------------------------------------------------------------------------------------------------------------
# `dapo train` entrypoint for placement.backend: local
# --------------------------------------------------------------------------------------------------------------------


def _read_rows(files: list[str], what: str) -> list[dict[str, Any]]:
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for f in files:
        if not Path(f).exists():
            raise FileNotFoundError(f"{what}: {f} does not exist")
        df = pd.read_parquet(f)
        for col in ("prompt", "reward_model"):
            if col not in df.columns:
                raise ValueError(
                    f"{what}: {f} has no '{col}' column (DAPO-Math-17k schema; columns: {list(df.columns)})"
                )
        rows.extend(_plain(r) for r in df.to_dict("records"))
    return rows


def _plain(obj):
    """numpy arrays / scalars from parquet -> plain lists / Python scalars (chat lists come back as arrays)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def build(preset, run_dir: Path, *, device: Optional[str] = None, assets_dir: Optional[Path] = None, log=print):
    """(backend, train_rows, val_rows, info) for ``preset`` on the local backend; builds the tiny assets if needed."""
    r = preset.recipe
    dev = resolve_device(device or preset.placement.device)  # fail before minutes of asset building
    info: dict[str, Any] = {}
    model_path, tok_path = r.model.path, r.model.tokenizer_path
    train_files, val_files = list(r.data.train_files), list(r.data.val_files)
    if model_path.startswith("builtin:"):
        from dapo.tiny.assets import prepare

        if model_path != "builtin:tiny":
            raise ValueError(f"recipe.model.path: unknown built-in model {model_path!r} (known: builtin:tiny)")
        assets = prepare(preset.local, Path(assets_dir) if assets_dir else run_dir / "assets", log=log)
        model_path, tok_path = str(assets.policy_dir), str(assets.policy_dir)
        train_files = train_files or [str(assets.train_file)]
        val_files = val_files or [str(assets.val_file)]
        info["assets"] = assets
    if not train_files:
        raise ValueError("recipe.data.train_files is empty")
    train_rows = _read_rows(train_files, "recipe.data.train_files")
    val_rows = _read_rows(val_files, "recipe.data.val_files") if val_files else []
    local = preset.local
    backend = LocalBackend(
        model_path,
        tok_path,
        r,
        device=dev,
        micro_batch_size=local.micro_batch_size if local else 64,
        seed=r.trainer.seed,
    )
    return backend, train_rows, val_rows, info


def run(preset, args) -> int:
    """``dapo train`` on the local backend: build/reuse assets, then the DAPO loop. Returns the exit code."""
    from dapo.train.loop import DAPOLoop, configure_determinism

    run_dir = Path(getattr(args, "run_dir", None) or preset.recipe.trainer.default_local_dir)
    if getattr(args, "dry_run", False):
        import yaml

        print(f"# preset {preset.name!r} on the local backend; run dir {run_dir}")
        print(yaml.safe_dump(preset.to_dict(), sort_keys=False), end="")
        return 0
    run_dir.mkdir(parents=True, exist_ok=True)
    configure_determinism(preset.recipe.trainer.seed)
    t0 = time.time()
    try:
        backend, train_rows, val_rows, _ = build(preset, run_dir)
    except (ValueError, FileNotFoundError) as exc:  # bad device, data file, prompt column ...: say it, no traceback
        print(f"dapo train: {exc}", file=sys.stderr)
        return 2
    print(
        f"dapo train: preset {preset.name!r} on {backend.device} | model {backend.num_parameters / 1e6:.2f}M params | "
        f"{len(train_rows)} train / {len(val_rows)} val prompts | run dir {run_dir} "
        f"(setup {time.time() - t0:.0f}s)",
        flush=True,
    )
    loop = DAPOLoop(
        preset, backend, train_rows, val_rows, run_dir, progress=not getattr(args, "no_progress", False)
    )
    try:
        return loop.fit()
    finally:
        backend.close()

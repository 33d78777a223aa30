"""Generation for the local backend: :class:`Generation`, the ``generate`` half of
:class:`dapo.backends.local.backend.LocalBackend` (which inherits it).

- ``generate``: batched sampling with a KV cache (prefill each distinct prompt once, then repeat its cache ``n`` times
  -- the group shares the prompt), temperature / top-k / top-p or greedy, stop at EOS or ``max_tokens``; records the
  entropy of the sampling distribution and the probability of each sampled token (``Rollout.stats``); when that
  distribution is pi_old's (``_sampling_is_pi_old``), the per-token log-probs and entropies too (``gen_log_prob``,
  ``gen_entropy``, with ``weights_tag``), which ``compute_old_log_probs`` then uses instead of a forward pass.
- the KV cache is preallocated for ``max_tokens`` more positions and written in place while decoding
  (:func:`_preallocate_cache`); chunks of prompts are re-padded to one width (:func:`_repad`, also the backend's
  ``concat``).

:class:`Generation` uses what ``LocalBackend.__init__`` sets: ``model``, ``device``, ``tokenizer``, ``pad_id``,
``eos_ids``, ``generator``, ``share_prefix``, ``gen_chunk_size``, ``autocast``, ``counters``, ``_next_gid``,
``recipe``, ``reuse_gen_log_probs``, ``_weights_tag`` and ``encode_prompt``.
"""

from __future__ import annotations

import time
import zlib
from typing import Any, Optional

import numpy as np
import torch

from dapo.backends.base import Rollout, Sampling
from dapo.util.lm_forward import left_pad as _left_pad
from dapo.util.lm_forward import prompt_forward

__all__ = ["Generation"]


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


class Generation:
    """Sampling of responses with a KV cache (module docstring); a mixin of ``LocalBackend``."""

    @staticmethod
    def _sample(logits: torch.Tensor, s: Sampling, gen: torch.Generator):
        """Next tokens from ``logits`` [B, V]; returns (tokens, entropy, log-prob of the token) of the sampling
        distribution."""
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
        return tok, ent, logp.gather(-1, tok[:, None]).squeeze(-1)

    def _sampling_is_pi_old(self, s: Sampling) -> bool:
        """True when ``s`` samples from exactly the distribution ``compute_old_log_probs`` evaluates: a training
        request, sampled at the recipe's temperature with no top-p / top-k truncation, in float32 (no autocast: under
        bf16 autocast the cached decoding and the full forward differ by more than rounding)."""
        return (
            self.reuse_gen_log_probs and s.do_sample and not s.validation and s.temperature > 0
            and s.temperature == self.recipe.rollout.temperature and s.top_p >= 1.0
            and (s.top_k is None or s.top_k <= 0) and self.device.type == "cpu"
        )

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
            tok, ent, lp = self._sample(logits, s, gen)
            tok = torch.where(finished, torch.full_like(tok, self.pad_id), tok)
            toks.append(tok)
            ents.append(torch.where(finished, torch.zeros_like(ent), ent))
            probs.append(torch.where(finished, torch.zeros_like(lp), lp))
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
        logp = torch.stack(probs, dim=1) if probs else torch.zeros((N, 0), device=dev)
        # response mask: every token up to and including the first EOS
        is_eos = torch.isin(resp, eos)
        after_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
        rmask = (~after_eos).long()
        truncated = ~is_eos.any(dim=1)
        return (
            ids.repeat_interleave(n, dim=0).cpu(), p_mask.repeat_interleave(n, dim=0).cpu(), resp.cpu(), rmask.cpu(),
            truncated.cpu(), ent.cpu(), logp.cpu(),
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
        logp = torch.cat([_repad(p[6], R, 0.0, False) for p in parts]) * rmask
        prob = logp.exp() * rmask
        lengths = rmask.sum(dim=1)
        n = sampling.n
        texts = self.tokenizer.batch_decode(
            [r[: int(k)].tolist() for r, k in zip(resp, lengths)], skip_special_tokens=True
        )
        denom = lengths.clamp(min=1).float()
        self.counters["gen_tokens"] += int(lengths.sum())
        self.counters["gen_seconds"] += time.perf_counter() - t0
        data = {"prompt_ids": p_ids, "prompt_mask": p_mask, "response_ids": resp, "response_mask": rmask}
        if self._sampling_is_pi_old(sampling):
            # the sampling distribution is pi_old's: keep its log-probs and entropies for compute_old_log_probs
            # (dapo.backends.local.update), tagged with the weights that produced them
            data["gen_log_prob"] = logp.float()
            data["gen_entropy"] = (ent * rmask).float()
            data["weights_tag"] = torch.full((len(resp), 1), self._weights_tag, dtype=torch.long)
        return Rollout(
            group_ids=np.asarray([g for g in group_ids for _ in range(n)], dtype=object),
            prompt_rows=[r for r in prompts for _ in range(n)],
            response_text=texts,
            response_length=lengths.numpy().astype(np.int64),
            truncated=truncated.astype(bool),
            data=data,
            stats={
                "entropy": ((ent * rmask).sum(1) / denom).numpy(),
                "mean_prob": ((prob * rmask).sum(1) / denom).numpy(),
                "prompt_length": p_mask.sum(1).numpy().astype(np.float64),
            },
        )

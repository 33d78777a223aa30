"""The local backend: one process, a HF transformers causal LM on CPU or one CUDA GPU.

:class:`LocalBackend` implements :class:`dapo.backends.base.Backend` for :mod:`dapo.train.loop` (the same loop the
verl backend runs on a cluster). It holds the model, tokenizer, optimizer and sampling generator, and is made of:

- ``generate``: batched sampling with a KV cache -- :class:`dapo.backends.local.generate.Generation`;
- ``compute_old_log_probs`` / ``update``: log-probs and the DAPO policy update (mini-batches, micro-batches, AdamW,
  verl's warm-up schedule, the KL loss) -- :class:`dapo.backends.local.update.PolicyUpdate`;
- here: the chat-templated prompt ids (``encode_prompt``), ``select`` / ``concat`` of rollouts, and checkpoints: the
  weights as a HF model directory (``actor/``, loadable with ``from_pretrained``) and the optimizer, scheduler and
  sampling-generator states (``actor_state.pt``).

:func:`dapo.backends.local.run.run` is the ``dapo train`` entrypoint for ``placement.backend: local``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from dapo.backends.base import Backend, Rollout
from dapo.backends.local.generate import Generation, _repad
from dapo.backends.local.update import PolicyUpdate

__all__ = ["LocalBackend", "resolve_device"]


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


class LocalBackend(Generation, PolicyUpdate, Backend):
    """HF causal LM + tokenizer in this process (see the module docstring)."""

    # private tensors of a Rollout: name -> (pad value, left padded?)
    _FIELDS = {
        "prompt_ids": (None, True),
        "prompt_mask": (0, True),
        "response_ids": (None, False),
        "response_mask": (0, False),
        "old_log_prob": (0.0, False),
        "ref_log_prob": (0.0, False),
        "gen_log_prob": (0.0, False),
        "gen_entropy": (0.0, False),
        "weights_tag": (0, False),
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
        reuse_gen_log_probs: bool = True,
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
        # pi_old from generation (dapo.backends.local.update.compute_old_log_probs) where the sampling distribution
        # is pi_old's; the tag names the weights a rollout was sampled with and changes at every update / load
        self.reuse_gen_log_probs = bool(reuse_gen_log_probs)
        self._new_weights_tag()

    def _new_weights_tag(self) -> None:
        self._weights_tag = int.from_bytes(os.urandom(7), "little")

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

    def weights_finite(self) -> bool:
        """Every parameter finite (a reduction per tensor on the model's device, one host sync for all)."""
        with torch.no_grad():
            return bool(torch.stack([torch.isfinite(p).all() for p in self.model.parameters()]).all())

    def checkpoint_bytes(self) -> int:
        """The weights and AdamW's two moments (same dtype as the weights), as :meth:`save_checkpoint` writes."""
        return 3 * sum(p.numel() * p.element_size() for p in self.model.parameters())

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
        self._new_weights_tag()
        self._next_gid = int(st.get("next_gid", 0))

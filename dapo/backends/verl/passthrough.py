"""Passthrough Hydra overrides: which verl keys outside the preset a ``dapo train`` user may set, and why not.

``key=value`` arguments of ``dapo train`` that are not preset keys go verbatim to verl's Hydra config, but only where
code the DAPO loop runs reads them (:data:`PASSTHROUGH_ALLOWED`). :func:`check_passthrough` refuses, each with a
:class:`~dapo.config.ConfigError`:

- a key the preset owns (one source of truth; :func:`dapo.backends.verl.settings.settings`): the error names the
  preset key to use instead;
- a key only verl's own ``RayPPOTrainer.fit()`` / ``main_ppo`` / its dataset reads (:data:`PASSTHROUGH_REFUSED`,
  with the reason: the loop would accept and silently skip it);
- any role's ``profiler`` (``actor_rollout_ref.{actor,ref,rollout}.profiler.*``, :data:`PROFILER_REFUSED`): the
  workers build a profiler from it, but only fit() starts and stops it around its steps.
"""

from __future__ import annotations

from typing import Optional

from dapo.backends.verl.settings import settings
from dapo.config import ConfigError, Preset


def override_key(text: str) -> str:
    """The verl key a Hydra override sets (or deletes), without Hydra's ``+``/``~``/``++`` prefix."""
    if "=" not in text:
        raise ConfigError(f"verl override {text!r} is not of the form key=value")
    return text.split("=", 1)[0].lstrip("+~").strip()


# verl keys outside the preset that a passthrough override may set: read by code the DAPO loop runs -- verl's
# workers (FSDP actor, reference), the vLLM servers and agent loop, verl's reward loop, Ray.
PASSTHROUGH_ALLOWED = ("actor_rollout_ref", "model_engine", "ray_kwargs", "reward", "trainer.device",
                       "trainer.ray_wait_register_center_timeout")  # fmt: skip
_FIT_ONLY = "read only by verl's RayPPOTrainer.fit() / main_ppo, which the DAPO loop (dapo.train.loop) replaces"
# Refused, most specific prefix first, each with the reason (the loop would accept and silently skip them).
PASSTHROUGH_REFUSED: dict[str, str] = {
    "actor_rollout_ref.rollout.full_determinism": f"{_FIT_ONLY}: main_ppo turns it into VERL_FULL_DETERMINISM / "
    "VLLM_BATCH_INVARIANT / PYTHONHASHSEED before ray.init; set those in placement.env instead",
    "algorithm.rollout_correction": f"{_FIT_ONLY}: rollout correction (importance weights / rejection sampling "
    "against pi_rollout) is applied in fit(); the DAPO loop recomputes pi_old instead (it logs fit()'s rollout_corr/* "
    "diagnostics with verl's defaults)",
    "global_profiler": f"{_FIT_ONLY}: the profiler is started and stopped around fit()'s steps",
    "skip": f"{_FIT_ONLY}: verl's SkipManager is driven by fit()",
    "trainer.esi_redundant_time": f"{_FIT_ONLY}: the expiry-driven save is decided in fit(); use "
    "recipe.trainer.save_freq",
    "data.filter_overlong_prompts": "verl's dataset filter: the loop reads recipe.data.train_files itself and "
    "verl's agent loop left-truncates prompts longer than recipe.data.max_prompt_length",
    "data": "verl's dataset and dataloader are not used: the loop reads recipe.data.* itself",
    "algorithm": f"{_FIT_ONLY}: advantages, filtering and KL are the loop's (recipe.algorithm.*, "
    "recipe.filter_groups.*, recipe.actor.use_kl_loss)",
    "trainer": f"{_FIT_ONLY} (the loop's trainer settings are recipe.trainer.*)",
    "critic": "GRPO advantages need no critic: verl builds none for this config",
    "reward_model": "verl 0.9.1's main_ppo ignores the legacy reward_model.* keys (the reward is the loop's)",
    "custom_reward_function": "the reward is the loop's (dapo.reward), not a custom verl reward function",
    "sandbox_fusion": "the reward is the loop's (dapo.reward): no sandbox",
    "distillation": f"{_FIT_ONLY}: no teacher model in the DAPO loop",
    "transfer_queue": "TransferQueue belongs to verl's v1 trainer (trainer.use_v1 is false here)",
}


# actor_rollout_ref.<role>.profiler.*: verl's workers read it (a ProfilerConfig per role), but only fit() calls
# start_profile / stop_profile (ray_trainer.py: `curr_step_profile`, global_profiler.steps), so under the DAPO loop
# it would be accepted and then nothing would be profiled.
PROFILER_REFUSED = (f"{_FIT_ONLY}: a role's profiler is configured in the workers but started and stopped only by "
                    "fit()'s steps (global_profiler.steps); profile the loop's processes with placement.env "
                    "settings of your profiler (e.g. nsys on the worker pods) instead")


def _under(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(prefix + ".")


def passthrough_refusal(key: str) -> Optional[str]:
    """Why a passthrough verl key is refused (None when the loop honours it). ``key`` has no Hydra prefix.

    The most specific prefix of either table decides: ``trainer.device`` (allowed: ``init_workers`` reads it) wins
    over ``trainer`` (refused: fit()'s), and ``actor_rollout_ref.rollout.full_determinism`` (refused) over
    ``actor_rollout_ref`` (allowed)."""
    if "profiler" in key.split("."):
        return PROFILER_REFUSED
    matches = [(len(p), p in PASSTHROUGH_REFUSED, p) for p in (*PASSTHROUGH_ALLOWED, *PASSTHROUGH_REFUSED)
               if _under(key, p)]
    if not matches:
        return f"'{key}' is no key the DAPO loop or verl's workers read (allowed: {', '.join(PASSTHROUGH_ALLOWED)})"
    _, refused, prefix = max(matches)
    return PASSTHROUGH_REFUSED[prefix] if refused else None


def check_passthrough(preset: Preset, overrides: list[str] | tuple[str, ...]) -> None:
    """Reject passthrough Hydra overrides of preset-owned keys (naming the preset key to set instead) and of keys
    the loop does not honour (:data:`PASSTHROUGH_REFUSED`, with the reason)."""
    owned = {s.key: s.source for s in settings(preset) if s.owned}
    for text in overrides:
        key = override_key(text)
        for verl_key, source in owned.items():
            if key == verl_key or verl_key.startswith(key + ".") or key.startswith(verl_key + "."):
                raise ConfigError(
                    f"verl override {text!r} sets '{verl_key}', which the preset owns: override '{source}' instead "
                    f"(e.g. {source}=...), so the loop, the manifests and verl agree"
                )
        why = passthrough_refusal(key)
        if why is not None:
            raise ConfigError(f"verl override {text!r} is refused: {why}")

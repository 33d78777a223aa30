"""The metric names both backends log and what each means: :data:`METRICS` (one table), :data:`BACKEND_ONLY` (what
only one backend can log, and why), :func:`describe`.

Names and definitions follow verl 0.9.1's ``RayPPOTrainer.fit()`` wherever fit() has the quantity: its
``compute_data_metrics`` (``critic/*``, ``response_length*/*``, ``prompt_length/*``, ``response/aborted_ratio``,
``num_turns/*``), ``compute_timing_metrics`` (``timing_s/*``, ``timing_per_token_ms/*``),
``compute_throughout_metrics`` (``perf/total_num_tokens``, ``perf/time_per_step``, ``perf/throughput``), its worker
metrics (``actor/*``, ``perf/mfu/*``) and the rollout-correction diagnostics (``rollout_corr/*``). The verl backend
computes them with those very functions on the batch it trains on (:mod:`dapo.backends.verl.fit_metrics`); the local
backend with their framework-free restatement (:mod:`dapo.train.step_metrics`). The fixture
``tests/fixtures/verl_fit_keys.json`` is the key set fit() logged, recorded from verl 0.9.1 by ``dapo bench verl-fit
--keys-out``; the verl-on-CPU test checks that the verl backend logs all of it.

The extra DAPO health metrics are ``actor/mean_prob``, ``train/kept_group_ratio`` and the ``train/gen_*`` statistics of
*all* generated responses (before dynamic sampling filters them; verl's ``critic/score/mean`` is over the filtered
training batch, which dynamic sampling biases towards 0).
"""

from __future__ import annotations

from typing import Optional

# name -> meaning. "{ds}" stands for a data_source, "{k}" for the number of validation samples per prompt.
METRICS: dict[str, str] = {
    # rollout / reward (verl names)
    "critic/score/mean": (
        "mean outcome reward of the training batch (verifier +-1 plus overlong penalty), after filtering"
    ),
    "critic/score/max": "max outcome reward of the training batch",
    "critic/score/min": "min outcome reward of the training batch",
    "critic/rewards/mean": "mean reward used for the advantages (= score: DAPO has no KL-in-reward)",
    "critic/rewards/max": "max reward used for the advantages",
    "critic/rewards/min": "min reward used for the advantages",
    "critic/advantages/mean": "token-mean of the advantages over response tokens",
    "critic/advantages/max": "max advantage",
    "critic/advantages/min": "min advantage",
    "response_length/mean": "mean response length (tokens, EOS included) of the training batch",
    "response_length/max": "max response length",
    "response_length/min": "min response length",
    "response_length/clip_ratio": "fraction of training responses that hit max_response_length",
    "prompt_length/mean": "mean prompt length (tokens)",
    "prompt_length/max": "max prompt length",
    "prompt_length/min": "min prompt length",
    "prompt_length/clip_ratio": "fraction of prompts that fill max_prompt_length (left-truncated or exactly that long)",
    "critic/returns/mean": "token-mean of the returns over response tokens (GRPO: the returns are the advantages)",
    "critic/returns/max": "max return",
    "critic/returns/min": "min return",
    "response_length_non_aborted/mean": "mean response length over the responses that are not aborted (length > 0)",
    "response_length_non_aborted/max": "max response length of the non-aborted responses",
    "response_length_non_aborted/min": "min response length of the non-aborted responses",
    "response_length_non_aborted/clip_ratio": "fraction of non-aborted responses that hit max_response_length",
    "response/aborted_ratio": "fraction of training responses with no token (aborted by the inference engine)",
    # actor (verl names, plus actor/mean_prob)
    "actor/entropy": (
        "mean per-token entropy of the policy on the training responses (at pi_old; aggregated with "
        "loss_agg_mode)"
    ),
    "actor/mean_prob": "mean probability pi_old assigns to the sampled response tokens",
    "actor/pg_loss": "policy-gradient loss (DAPO eq. 10/12), mean over mini-batches",
    "actor/pg_clipfrac": (
        "fraction of response tokens where the clipped term is active (ratio clipped at 1-eps_low or "
        "1+eps_high)"
    ),
    "actor/pg_clipfrac_lower": "fraction of response tokens hit by the dual clip (A < 0, ratio > c)",
    "actor/ppo_kl": "mean of log pi_old - log pi_theta over response tokens (approximate KL between updates)",
    "actor/grad_norm": "global gradient norm before clipping, mean over mini-batches",
    "actor/lr": "learning rate the update used",
    "actor/num_optimizer_steps": "optimizer steps taken this rollout step",
    "actor/loss_tokens": (
        "response tokens the token-mean loss divides by: the whole optimizer mini-batch over all data-parallel "
        "ranks (token_mean_scope minibatch) or the micro-batch (microbatch); mean over micro-batches"
    ),
    # dynamic sampling
    "train/num_gen_batches": "generation batches needed to fill the training batch (verl name)",
    "train/kept_group_ratio": "fraction of generated prompt groups kept by dynamic sampling (outcomes not all equal)",
    "train/num_gen_samples": "responses generated this step (all generation batches)",
    "train/num_groups_carried_in": "kept groups carried over from the previous step (filter_groups.mode: carry)",
    "train/gen_samples_total": "responses generated since the start of RL",
    "train/gen_score/mean": "mean outcome reward over all responses generated this step (before filtering)",
    "train/gen_acc/mean": "fraction of all responses generated this step that are correct (before filtering)",
    "train/gen_overlong_ratio": "fraction of generated responses penalised by the soft overlong punishment",
    "train/gen_truncated_ratio": "fraction of generated responses that hit max_response_length (no EOS)",
    "rollout/entropy": (
        "mean per-token entropy of the sampling distribution over all generated responses "
        "(backend-reported)"
    ),
    "rollout/mean_prob": (
        "mean probability of the sampled tokens under the sampling distribution, all generated responses"
    ),
    "train/num_filtered_responses": "responses dropped from the loss by overlong filtering (when enabled)",
    # the attempt's own checks (dapo.train.ending): recorded every step, 0 on every sane step
    "health/nonfinite": "how many of the step's loss, gradient norm, entropy, KL and reward checks were not finite "
                        "(a non-finite step ends the attempt before it is saved)",
    "health/nonfinite_rewards": "responses generated this step whose reward was not finite",
    "training/global_step": "rollout step (verl name)",
    "training/epoch": "pass over the training prompts (verl name)",
    # validation (verl names)
    "val-core/{ds}/acc/mean@{k}": (
        "validation accuracy avg@k: mean correctness over k samples of every validation prompt"
    ),
    "val-aux/{ds}/score/mean@{k}": "validation mean verifier score (+-1)",
    "val-aux/{ds}/response_length/mean": "validation mean response length",
    # timing (verl names where verl has them; plus filter)
    "timing_s/gen": "seconds generating (all generation batches of the step)",
    "timing_s/reward": "seconds in the verifier and overlong shaping",
    "timing_s/filter": "seconds in dynamic sampling (group filtering and batch assembly)",
    "timing_s/adv": "seconds computing group advantages",
    "timing_s/old_log_prob": "seconds recomputing pi_old log-probs",
    "timing_s/update_actor": "seconds in the policy update",
    "timing_s/step": "seconds for the whole rollout step",
    "timing_s/testing": "seconds validating",
    "timing_s/save_checkpoint": "seconds writing the checkpoint",
    "timing_s/other": "step seconds outside the phases above (loop overhead, logging)",
    "timing_per_token_ms/gen": "milliseconds of timing_s/gen per response token of the training batch",
    "timing_per_token_ms/adv": "milliseconds of timing_s/adv per token (prompt + response) of the training batch",
    "timing_per_token_ms/update_actor": "milliseconds of timing_s/update_actor per token (prompt + response)",
    # throughput (verl's compute_throughout_metrics)
    "perf/total_num_tokens": "tokens (prompt + response) of the training batch",
    "perf/time_per_step": "seconds for the whole rollout step (= timing_s/step)",
    "perf/throughput": "training-batch tokens per second per GPU: perf/total_num_tokens / (step seconds x GPUs)",
}

# Diagnostics only one backend has (everything else in METRICS is logged by both for the same recipe; the verl-on-CPU
# test compares the two runs' keys): name or prefix (ending in "/" or "_") -> what it is.
BACKEND_ONLY: dict[str, dict[str, str]] = {
    "verl": {
        "actor/loss": "verl's total actor loss (policy loss + entropy and KL terms), mean over micro-batches",
        "actor/perf/": "verl's per-worker memory readings (GPU allocator, host memory)",
        "ranks/": "every FSDP rank's compute probe (dapo.backends.verl.ranks): the slowest rank's seconds "
                  "(probe_s/max) over the median of the others (probe_s/median_others, probe_max_over_median), which "
                  "rank (probe_slowest_rank), how many answered, and the process-group timeout read back from them "
                  "(pg_timeout_s)",
        "perf/mfu/": "model-FLOPs utilisation of the actor's update (perf/mfu/actor) and of the pi_old pass "
                     "(actor_infer): achieved FLOPs / (device peak x ranks), verl's FlopsCounter. The local backend "
                     "logs both only where its device's peak is known (dapo.util.flops.peak_flops: a listed GPU); "
                     "verl also on CPU, against its nominal CPU peak",
        "rollout_corr/": "verl's rollout-vs-training mismatch of the sampled tokens (pi_rollout from vLLM vs pi_old "
                         "from the actor: kl, k3_kl, chi2_token/seq, ppl ratios; compute_offpolicy_metrics). The "
                         "local backend samples with the very model it trains: there is no second engine to drift",
        "num_turns/": "verl's agent loop counts the chat turns of each response (2: one prompt, one answer); the "
                      "local backend has no agent loop",
        "global_seqlen/": "verl's balance_batch statistics (tokens per data-parallel rank before/after balancing)",
        "timing_s/agent_loop/": "verl's agent-loop timings per request (generate, score, preemptions)",
        "timing_s/start_profile": "seconds in verl's per-step profiler start hook, called as fit() calls it with "
                                  "profiling off (the passthrough refuses global_profiler): ~0; the local backend "
                                  "has no profiler hooks",
        "timing_s/stop_profile": "seconds in verl's per-step profiler stop hook (as timing_s/start_profile)",
        "timing_s/update_weights": "seconds pushing the actor's weights into the vLLM replicas (one push per step)",
        "training/rollout_": "verl's check of the weight push: vLLM's vs the actor's probabilities of the sampled "
                             "tokens (|diff| max/mean/std, Pearson correlation; calculate_debug_metrics)",
        "reward/verl_agreement": "share of responses verl's reward loop scores like ours (recipe.reward.verl_agreement)",
    },
    "local": {
        "rollout/entropy": "entropy of the sampling distribution (the local backend has the full logits; vLLM returns "
                           "only the sampled tokens' log-probs)",
        "actor/pg_clip_high_old_prob/": "tokens stopped by the upper clip (A > 0, ratio > 1 + eps_high) in this update, "
                                        "per pi_old bin of width 0.2 named by its lower edge (the paper's Fig. 3)",
    },
}


def backend_only(name: str) -> Optional[str]:
    """The backend whose own diagnostic ``name`` is (:data:`BACKEND_ONLY`), or None for a metric both log."""
    for backend, table in BACKEND_ONLY.items():
        if any(name == k or (k.endswith(("/", "_")) and name.startswith(k)) for k in table):
            return backend
    return None



def val_acc_key(data_source: str, k: int) -> str:
    return f"val-core/{data_source}/acc/mean@{k}"


def val_score_key(data_source: str, k: int) -> str:
    return f"val-aux/{data_source}/score/mean@{k}"


def describe(name: str) -> Optional[str]:
    """The meaning of a metric name (templated names included; a backend's own diagnostics from
    :data:`BACKEND_ONLY`), or None when it is in neither table."""
    if name in METRICS:
        return METRICS[name]
    backend = backend_only(name)
    if backend is not None:
        table = BACKEND_ONLY[backend]
        return table.get(name) or next(v for k, v in table.items() if k.endswith(("/", "_")) and name.startswith(k))
    parts = name.split("/")

    def fits(a: str, b: str) -> bool:  # template part a vs name part b
        return a == b or a == "{ds}" or ("{k}" in a and b.startswith(a.split("{")[0]))

    for tmpl, text in METRICS.items():
        t = tmpl.split("/")
        if len(t) == len(parts) and all(fits(a, b) for a, b in zip(t, parts)):
            return text
    return None


"""Every verl preset composes into a complete verl 0.9.1 config that verl's own validation accepts, with the values
of the DAPO recipe; bad input is a clear error before anything touches Ray or a GPU.

The expected values are written here from the reproduction issue's list (the reference scripts' recipe), not read
from our presets or code.
"""

from __future__ import annotations

import re

import json

import pytest
import yaml

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402

from dapo.backends.verl import config as verl_config  # noqa: E402
from dapo.backends.verl import passthrough as verl_passthrough  # noqa: E402
from dapo.backends.verl import settings as verl_settings  # noqa: E402
from dapo.config import ConfigError, load_preset  # noqa: E402

# ---- the recipe, as the issue lists it ------------------------------------------------------------------------------
COMMON_32B = {
    "actor_rollout_ref.model.path": "Qwen/Qwen2.5-32B",
    "trainer.nnodes": 16,
    "trainer.n_gpus_per_node": 8,
    "algorithm.adv_estimator": "grpo",
    "data.train_batch_size": 512,
    "actor_rollout_ref.rollout.n": 16,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
    "data.max_prompt_length": 2048,
    "data.max_response_length": 20480,
    "reward.reward_kwargs.overlong_buffer_cfg.enable": True,
    "reward.reward_kwargs.overlong_buffer_cfg.len": 4096,
    "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": 1.0,
    "reward.reward_kwargs.max_resp_len": 20480,
    "reward.reward_manager.name": "dapo",
    "actor_rollout_ref.actor.clip_ratio_low": 0.2,
    "actor_rollout_ref.actor.clip_ratio_high": 0.28,
    "actor_rollout_ref.actor.clip_ratio_c": 10.0,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.optim.lr_warmup_steps": 10,
    "actor_rollout_ref.actor.optim.weight_decay": 0.1,
    "actor_rollout_ref.actor.optim.clip_grad": 1.0,
    "actor_rollout_ref.actor.entropy_coeff": 0.0,
    "algorithm.use_kl_in_reward": False,
    "actor_rollout_ref.actor.use_kl_loss": False,
    "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.top_p": 1.0,
    "actor_rollout_ref.rollout.top_k": -1,
    "actor_rollout_ref.rollout.val_kwargs.temperature": 1.0,
    "actor_rollout_ref.rollout.val_kwargs.top_p": 0.7,
    "actor_rollout_ref.rollout.val_kwargs.n": 1,
    "actor_rollout_ref.actor.use_dynamic_bsz": True,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 22528,
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 22528,
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 8,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 4,
    "actor_rollout_ref.actor.fsdp_config.param_offload": True,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True,
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.7,
    "actor_rollout_ref.rollout.enable_chunked_prefill": True,
    "actor_rollout_ref.rollout.max_num_batched_tokens": 22528,
    "actor_rollout_ref.model.use_remove_padding": True,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "trainer.total_epochs": 1,
    "trainer.save_freq": 5,
    "trainer.test_freq": 5,
    "trainer.val_before_train": True,
    "trainer.resume_mode": "auto",
    "ray_kwargs.ray_init.runtime_env.env_vars.VLLM_USE_V1": "1",
    "ray_kwargs.ray_init.runtime_env.env_vars.TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
    "ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES": "dapo.backends.verl.loss,dapo.backends.verl.worker_hooks",
    "actor_rollout_ref.actor.policy_loss.loss_mode": "dapo",
    "actor_rollout_ref.rollout.name": "vllm",
}
EXPECTED = {
    "early": {
        **COMMON_32B,
        "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
        "algorithm.filter_groups.enable": False,
        "data.gen_batch_size": 512,
    },
    "full": {
        **COMMON_32B,
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
        "algorithm.filter_groups.enable": True,
        "algorithm.filter_groups.metric": "acc",
        "algorithm.filter_groups.max_num_gen_batches": 10,
        "data.gen_batch_size": 1536,
    },
    "7b": {  # issue + recipe/dapo/test_dapo_7b_math.sh (the version with its reference W&B run)
        "actor_rollout_ref.model.path": "Qwen/Qwen2.5-Math-7B",
        "trainer.nnodes": 8,
        "data.max_response_length": 8192,
        "reward.reward_kwargs.max_resp_len": 8192,
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 4,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 4,
        "actor_rollout_ref.model.override_config.max_position_embeddings": 32768,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 20480,  # (2048 + 8192) * 2
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 30720,  # (2048 + 8192) * 3
        "actor_rollout_ref.rollout.max_num_batched_tokens": 10240,
        "actor_rollout_ref.rollout.gpu_memory_utilization": 0.8,
        "actor_rollout_ref.actor.fsdp_config.fsdp_size": 32,
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
        "trainer.total_training_steps": 200,
    },
    "smoke": {
        "trainer.nnodes": 1,
        "trainer.n_gpus_per_node": 8,
        "trainer.total_training_steps": 20,
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
        "algorithm.filter_groups.enable": True,
    },
    "one-gpu": {  # one FSDP rank and one colocated vLLM engine; the full algorithm
        "actor_rollout_ref.model.path": "Qwen/Qwen2.5-0.5B-Instruct",
        "trainer.nnodes": 1,
        "trainer.n_gpus_per_node": 1,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 1,
        "actor_rollout_ref.rollout.gpu_memory_utilization": 0.4,
        "data.max_prompt_length": 1024,
        "data.max_response_length": 3072,
        "actor_rollout_ref.rollout.max_model_len": 4096,
        "actor_rollout_ref.actor.fsdp_config.param_offload": False,
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload": False,
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
        "actor_rollout_ref.actor.clip_ratio_high": 0.28,
        "algorithm.filter_groups.enable": True,
        "algorithm.filter_groups.max_num_gen_batches": 10,
        "reward.reward_kwargs.overlong_buffer_cfg.enable": True,
        "actor_rollout_ref.rollout.free_cache_engine": True,  # vLLM sleeps while the actor trains on the same GPU
    },
}


@pytest.fixture(scope="module")
def resolved():
    return {name: verl_config.resolve(load_preset(name)) for name in EXPECTED}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_preset_composes_into_a_verl_config_that_verl_validates_with_the_recipe_values(resolved, name):
    cfg = resolved[name].cfg  # resolve() ran verl.utils.config.validate_config on it
    wrong = {}
    for key, want in EXPECTED[name].items():
        got = OmegaConf.select(cfg, key, default="<missing>")
        if not (got == want or (isinstance(want, float) and got == pytest.approx(want))):
            wrong[key] = (got, want)
    assert not wrong, f"{name}: (got, expected) {wrong}"
    # no KL anywhere -> verl builds no reference policy and no critic (GRPO)
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    with pytest.warns(UserWarning, match="Disabled critic"):  # verl says so for GRPO
        assert not need_critic(cfg)
    assert not need_reference_policy(cfg)
    # the whole config resolves (every interpolation) and is complete YAML
    text = verl_config.to_yaml(cfg)
    assert {"actor_rollout_ref", "data", "algorithm", "reward", "trainer", "ray_kwargs"} <= set(yaml.safe_load(text))


def test_7b_raises_the_model_context_that_the_base_model_ships_too_short():
    p = load_preset("7b", ["recipe.model.override_config={}"])
    with pytest.raises(ConfigError, match=r"max_position_embeddings.*4096.*10240"):
        verl_config.resolve(p)


def _hydra_text(value) -> str:
    """A value as a Hydra command-line override value (what `python -m verl.trainer.main_ppo KEY=VALUE` takes)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(_hydra_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_hydra_text(v)}" for k, v in value.items()) + "}"
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@pytest.mark.parametrize("name", ["full", "early", "7b", "smoke", "one-gpu", "verl-tiny"])
def test_the_typed_merge_equals_verls_own_command_line_composition(name):
    # the reference: Hydra composes verl's ppo_trainer from the same values written as main_ppo's command line
    preset = load_preset(name)
    r = verl_config.resolve(preset, ["actor_rollout_ref.rollout.max_num_seqs=512"])
    line = [f"{'+' if s.append else ''}{s.key}={_hydra_text(s.value)}" for s in r.settings]
    hydra = verl_config.compose(line + ["actor_rollout_ref.rollout.max_num_seqs=512"])
    assert OmegaConf.to_container(r.cfg, resolve=True) == OmegaConf.to_container(hydra, resolve=True)
    assert r.cfg.actor_rollout_ref.rollout.max_num_seqs == 512  # a recipe constant the user set is the user's


def test_the_preset_reaches_verl_as_typed_values():
    preset = load_preset("7b", ['recipe.trainer.experiment_name="007"', "recipe.actor.optim.lr=1e-6",
                                "placement.env.NCCL_DEBUG=INFO"])
    r = verl_config.resolve(preset)
    assert r.cfg.trainer.experiment_name == "007" and r.cfg.actor_rollout_ref.actor.optim.lr == 1e-6
    interpolated = [row.key for row in r.settings if isinstance(row.value, str) and "${" in row.value]
    assert interpolated == ["trainer.default_local_dir"]  # resolved before verl sees it in `dapo train`
    for row in r.settings:
        if row.key not in interpolated:
            got = OmegaConf.select(r.cfg, row.key)
            got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
            assert got == row.value and type(got) is type(row.value), (row.key, got, row.value)


def test_token_mean_scope_microbatch_selects_the_reference_loss(resolved):
    r = verl_config.resolve(load_preset("full", ["recipe.actor.token_mean_scope=microbatch"]))
    assert r.cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "dapo_microbatch"


def test_runtime_env_carries_the_recipe_env_and_the_loss_module(resolved):
    env = verl_config.runtime_env(resolved["full"].cfg, environ={})["env_vars"]
    assert env["VLLM_USE_V1"] == "1" and env["TORCH_NCCL_AVOID_RECORD_STREAMS"] == "1"
    assert env["VERL_USE_EXTERNAL_MODULES"] == "dapo.backends.verl.loss,dapo.backends.verl.worker_hooks"


def test_runtime_env_leaves_out_what_the_ray_job_already_sets_and_refuses_a_contradiction(resolved):
    cfg = resolved["full"].cfg
    # inside a RayJob whose runtime env already has the preset env: Ray rejects repeated keys, so they are dropped
    env = verl_config.runtime_env(cfg, environ={"VLLM_USE_V1": "1", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1"})
    assert "VLLM_USE_V1" not in env["env_vars"] and env["env_vars"]["VERL_USE_EXTERNAL_MODULES"]
    with pytest.raises(ConfigError, match="VLLM_USE_V1='0'.*VLLM_USE_V1='1'"):
        verl_config.runtime_env(cfg, environ={"VLLM_USE_V1": "0"})


def test_passthrough_overrides_reach_verl(resolved):
    r = verl_config.resolve(load_preset("full", ["recipe.trainer.log_val_generations=10"]),
                            ["actor_rollout_ref.rollout.max_num_seqs=512"])  # fmt: skip
    assert r.cfg.trainer.log_val_generations == 10 and r.cfg.actor_rollout_ref.rollout.max_num_seqs == 512


@pytest.mark.parametrize(
    "passthrough, match",
    [
        ("algorithm.rollout_correction.rollout_is=token", r"rollout correction"),
        ("global_profiler.steps=[1,2]", r"profiler"),
        ("skip.enable=true", r"SkipManager"),
        ("trainer.esi_redundant_time=10", r"save_freq"),
        ("actor_rollout_ref.rollout.full_determinism=true", r"placement\.env"),
        ("data.filter_overlong_prompts=true", r"left-truncates"),
        ("data.dataloader_num_workers=2", r"dataloader are not used"),
        ("trainer.critic_warmup=2", r"RayPPOTrainer\.fit\(\)"),
        ("algorithm.kl_ctrl.type=adaptive", r"KL are the loop's"),
        # the generation dumps are preset keys now (honoured by both backends)
        ("trainer.rollout_data_dir=/tmp/x", r"override 'recipe\.trainer\.rollout_data_dir'"),
    ],
)
def test_passthrough_keys_the_loop_does_not_honour_are_refused_with_the_reason(passthrough, match):
    with pytest.raises(ConfigError, match=match):
        verl_config.resolve(load_preset("full"), [passthrough])


def test_keys_verls_init_workers_reads_pass_through_although_fit_owns_their_parent():
    """The most specific prefix of the two tables decides: trainer.device is read by init_workers (allowed) under
    trainer.* (fit()'s, refused) -- the refused prefix used to win, and verl on CPU could not set its device."""
    for key in verl_passthrough.PASSTHROUGH_ALLOWED:
        assert verl_passthrough.passthrough_refusal(key) is None, key
        assert verl_passthrough.passthrough_refusal(key + ".sub") is None or "." in key, key
    cfg = verl_config.resolve(load_preset("smoke"), ["trainer.device=cpu",
                                                     "trainer.ray_wait_register_center_timeout=600"]).cfg
    assert cfg.trainer.device == "cpu" and cfg.trainer.ray_wait_register_center_timeout == 600
    assert verl_passthrough.passthrough_refusal("trainer.esi_redundant_time") is not None
    assert verl_passthrough.passthrough_refusal("actor_rollout_ref.rollout.full_determinism") is not None


def test_no_idle_verl_reward_workers_unless_verl_scores_too():
    """verl's reward loop starts reward.num_workers actors (8 by default) even when nothing asks them to score; the
    loop scores on the driver, so they exist only with recipe.reward.verl_agreement, and the count is the preset's."""
    assert verl_config.resolve(load_preset("full")).cfg.reward.num_workers == 0
    agreeing = verl_config.resolve(load_preset("full", ["recipe.reward.verl_agreement=true"])).cfg
    assert agreeing.reward.num_workers > 0
    with pytest.raises(ConfigError, match=r"override 'recipe\.reward\.verl_agreement'"):
        verl_config.resolve(load_preset("full"), ["reward.num_workers=4"])


def test_the_train_help_example_key_passes_through():
    from dapo.train.cli import build_parser

    text = " ".join(build_parser().format_help().split())
    example = re.search(r"e\.g\. (actor_rollout_ref\.\S+=\S+)", text).group(1)
    assert verl_passthrough.passthrough_refusal(example.split("=")[0]) is None
    verl_config.resolve(load_preset("full"), [example])


def test_use_kl_in_reward_and_non_left_truncation_are_refused():
    with pytest.raises(ConfigError, match=r"use_kl_in_reward.*not implemented by the DAPO loop"):
        load_preset("full", ["recipe.algorithm.use_kl_in_reward=true"])
    with pytest.raises(ConfigError, match=r"truncation.*left-truncates"):
        verl_config.resolve(load_preset("full", ["recipe.data.truncation=error"]))


def test_use_kl_loss_and_greedy_validation_reach_verls_config():
    over = ["recipe.actor.use_kl_loss=true", "recipe.actor.kl_loss_coef=0.001", "recipe.actor.kl_loss_type=k3+",
            "recipe.rollout.val.do_sample=false"]
    r = verl_config.resolve(load_preset("full", over))
    a = r.cfg.actor_rollout_ref.actor
    assert a.use_kl_loss and a.kl_loss_coef == 0.001 and a.kl_loss_type == "k3+"
    from verl.trainer.ppo.utils import need_reference_policy

    assert need_reference_policy(r.cfg)  # verl builds the reference policy the loop now feeds
    # the agent loop reads only temperature / top_p / top_k for validation: greedy = temperature 0
    assert r.cfg.actor_rollout_ref.rollout.val_kwargs.temperature == 0.0
    assert not r.cfg.actor_rollout_ref.rollout.val_kwargs.do_sample


# ---- bad input: a clear error naming the key, before any Ray / GPU ---------------------------------------------------


@pytest.mark.parametrize(
    "overrides, passthrough, match",
    [
        # an unknown verl key (Hydra's struct check) names the key
        ([], ["actor_rollout_ref.actor.no_such_key=1"], r"no_such_key"),
        # a key the preset owns: use the preset key instead
        ([], ["trainer.nnodes=2"], r"override 'placement\.nodes'"),
        ([], ["data.max_response_length=4096"], r"override 'recipe\.data\.max_response_length'"),
        # 32 prompts x 16 = 512 responses per optimizer step over dp = 3 nodes x 8 / sp 8 = 3 ranks
        (["placement.nodes=3"], [], r"ppo_mini_batch_size.*512 responses.*data-parallel size 3"),
        # rollout TP must divide the GPUs of a node (a vLLM replica lives on one node)
        (["placement.parallel.rollout_tp=3"], [], r"rollout_tp.*\(3\) must divide placement\.gpus_per_node \(8\)"),
        # Ulysses SP must divide the attention heads (Qwen2.5-32B: 40)
        (["placement.parallel.ulysses_sp=16"], [], r"ulysses_sp.*\(16\) must divide the model's 40 attention heads"),
        # vLLM TP must divide the attention heads too (Qwen2.5-Math-7B: 28 heads, TP 8)
        (["recipe.model.path=Qwen/Qwen2.5-Math-7B", "recipe.model.override_config={max_position_embeddings: 32768}",
          "placement.parallel.ulysses_sp=4", "placement.parallel.rollout_tp=8"], [], r"rollout_tp.*28 attention heads"),
        # a token budget that cannot hold one prompt + response
        (["placement.parallel.ppo_max_token_len_per_gpu=2048"], [], r"ppo_max_token_len_per_gpu.*22528"),
    ],
)
def test_bad_placement_is_a_clear_error(overrides, passthrough, match):
    with pytest.raises(ConfigError, match=match):
        verl_config.resolve(load_preset("full", overrides), passthrough)


def test_max_response_length_below_the_overlong_buffer_is_rejected():
    with pytest.raises(ConfigError, match=r"overlong_buffer\.len.*max_response_length \(2048\)"):
        load_preset("full", ["recipe.data.max_response_length=2048"])


def test_unknown_preset_and_unknown_preset_key_are_rejected():
    with pytest.raises(ConfigError, match='unknown preset "nope"'):
        load_preset("nope")
    with pytest.raises(ConfigError, match=r"placement\.parallel\.ulysses"):
        load_preset("full", ["placement.parallel.ulysses=4"])


def test_heads_are_read_from_a_local_model_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_attention_heads": 12, "num_key_value_heads": 2, "max_position_embeddings": 32768}))
    p = load_preset("full", [f"recipe.model.path={tmp_path}"])
    with pytest.raises(ConfigError, match=r"ulysses_sp.*\(8\) must divide the model's 12 attention heads"):
        verl_config.resolve(p)
    ok = verl_config.resolve(load_preset("full", [f"recipe.model.path={tmp_path}", "placement.parallel.ulysses_sp=4",
                                                  "placement.parallel.rollout_tp=4"]))
    assert ok.notes == []
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 12, "num_key_value_heads": 3}))
    with pytest.raises(ConfigError, match=r"ulysses_sp.*\(4\) and the model's 3 KV heads must divide one another"):
        verl_config.resolve(load_preset("full", [f"recipe.model.path={tmp_path}", "placement.parallel.ulysses_sp=4"]))


def test_unknown_remote_model_skips_head_checks_and_says_so():
    r = verl_config.resolve(load_preset("full", ["recipe.model.path=someorg/unknown-model"]))
    assert any("head" in n and "skipped" in n for n in r.notes)


def test_train_cli_rejects_bad_input_before_ray_starts(capsys):
    import ray

    from dapo.train.cli import main

    assert main(["--preset", "full", "placement.parallel.rollout_tp=3", "--dry-run"]) == 2
    assert main(["--preset", "full", "actor_rollout_ref.actor.nope=1"]) == 2  # not a dry run: still no Ray
    err = capsys.readouterr().err
    assert "rollout_tp" in err and "nope" in err
    assert not ray.is_initialized()


def test_dry_run_prints_the_complete_resolved_verl_config(capsys):
    from dapo.train.cli import main

    assert main(["--preset", "full", "--dry-run"]) == 0
    out = capsys.readouterr().out
    body = yaml.safe_load("\n".join(line for line in out.splitlines() if not line.startswith("#")))
    assert body["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"] == "dapo"
    assert body["trainer"]["default_local_dir"] == "/shared/checkpoints/DAPO-verl/DAPO-Qwen2.5-32B"  # resolved
    assert body["reward"]["reward_kwargs"]["overlong_buffer_cfg"]["len"] == 4096
    assert "dynamic sampling (dapo.train.loop, not verl's trainer): on, metric acc" in out


def test_the_one_gpu_cpu_proofs_swaps_change_only_the_verl_keys_they_own(tmp_path):
    """tests/test_one_gpu_cpu.py trains the one-gpu preset on CPU with these swaps (stand-in model and data, the CPU
    platform, the scale); here, without Ray: the composed config differs from the preset's only in keys whose settings
    row names a swapped preset key -- and one more change of the recipe would be caught."""
    from types import SimpleNamespace

    from one_gpu_standin import differences, swaps

    assets = SimpleNamespace(policy_dir=tmp_path / "policy", train_file=tmp_path / "train.parquet",
                             val_file=tmp_path / "val.parquet")
    over = swaps(assets, tmp_path / "run", 2)
    preset = verl_config.resolve(load_preset("one-gpu"))
    for extra, caught in (([], set()), (["recipe.actor.clip_ratio_high=0.3"], {"actor_rollout_ref.actor.clip_ratio_high"})):
        ran = verl_config.resolve(load_preset("one-gpu", over + extra))
        differ, unexplained = differences(OmegaConf.to_container(preset.cfg), OmegaConf.to_container(ran.cfg),
                                          preset.settings + ran.settings)
        assert set(unexplained) == caught, unexplained
        assert {"actor_rollout_ref.model.path", "trainer.device", "data.max_response_length"} <= differ

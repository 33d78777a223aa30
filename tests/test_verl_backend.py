"""The verl backend's batch plumbing with real verl ``DataProto`` objects, on CPU.

What is real here: the verl 0.9.1 config (composed and validated from a preset), ``DataProto`` and its
repeat/union/index/concat, verl's seq-length balancing, verl's DAPO reward manager (as the reference for reward
placement), verl's actor config dataclass and policy-loss registry (the stand-in's update runs our registered loss
through them), our sampler and loop.

What is a STAND-IN: :class:`CpuStandInWorkers` replaces the GPU side, ``dapo.backends.verl.workers.RayWorkers`` (FSDP
actor + vLLM replicas on Ray, which cannot run without GPUs). It has no model: responses come from a fixed script per
prompt group, log-probs from a fixed formula; it records every call so the tests can check what the backend would
send to the GPUs. A character-level tokenizer stands in for the model's tokenizer.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import get_policy_loss_fn  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.workers.reward_manager.dapo import DAPORewardManager  # noqa: E402

import dapo.backends.verl.loss  # noqa: E402,F401  (registers loss_mode=dapo, as VERL_USE_EXTERNAL_MODULES does on workers)
from dapo.backends.verl import config as verl_config  # noqa: E402
from dapo.backends.base import Sampling  # noqa: E402
from dapo.backends.verl.backend import VerlBackend  # noqa: E402
from dapo.backends.verl.batch import balance_order  # noqa: E402
from dapo.config import ConfigError, load_preset  # noqa: E402
from dapo.sampler import DynamicSampler  # noqa: E402

N = 4  # responses per prompt
SMALL = [
    "recipe.data.train_batch_size=4", "recipe.data.gen_batch_size=6", f"recipe.rollout.n={N}",
    "recipe.actor.ppo_mini_batch_size=2", "recipe.data.max_prompt_length=48", "recipe.data.max_response_length=32",
    "recipe.reward.overlong_buffer.len=8", "placement.gpus_per_node=2", "recipe.trainer.logger=[]",
    "recipe.trainer.total_training_steps=2", "recipe.trainer.test_freq=1", "recipe.trainer.save_freq=1",
    "recipe.filter_groups.max_num_gen_batches=4",
]  # fmt: skip


class CharTokenizer:
    """Stand-in tokenizer: one id per ASCII character; 0 = pad, 1 = EOS."""

    pad_token_id, eos_token_id = 0, 1
    pad_token, eos_token = "<pad>", "<eos>"

    def encode(self, text: str) -> list[int]:
        return [ord(c) + 2 for c in text]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        special = {0: self.pad_token, 1: self.eos_token}
        return "".join(("" if skip_special_tokens else special[i]) if i in special else chr(i - 2) for i in ids)

    def batch_decode(self, seqs, skip_special_tokens: bool = False) -> list[str]:
        self.batch_decodes = getattr(self, "batch_decodes", 0) + 1
        return [self.decode(s, skip_special_tokens=skip_special_tokens) for s in seqs]


class CpuStandInWorkers:
    """STAND-IN for the GPU worker groups (``RayWorkers``): scripted responses, formula log-probs, recorded calls.

    Prompt groups (by uid) are all-correct, all-wrong or mixed (correct / wrong / a ramble that hits the length limit
    without EOS), so dynamic sampling has groups to drop. With ``reward_loop`` (``recipe.reward.verl_agreement``)
    ``rm_scores`` come from verl's own DAPO reward manager, as verl's reward loop adds them on the real workers.
    The replicas' state is modelled: generation needs them awake, the actor's passes need them asleep.
    """

    def __init__(self, cfg, tokenizer, dp_size: int = 2, reward_loop: bool = False):
        self.cfg, self.tok, self.dp_size, self.reward_loop = cfg, tokenizer, dp_size, reward_loop
        self.awake = False  # verl's init_workers ends with the replicas asleep
        self.P, self.R = int(cfg.data.max_prompt_length), int(cfg.data.max_response_length)
        self.calls: list[tuple] = []
        self.updates: list[DataProto] = []
        ob = OmegaConf.create({"enable": True, "len": int(cfg.reward.reward_kwargs.overlong_buffer_cfg.len),
                               "penalty_factor": 1.0, "log": False})  # fmt: skip
        self.verl_reward = DAPORewardManager(tokenizer, num_examine=0, max_resp_len=self.R, overlong_buffer_cfg=ob)

    def _text(self, uid: str, k: int, gt: str) -> str:
        kind = zlib.crc32(uid.encode()) % 3
        choice = {0: "right", 1: "wrong"}.get(kind, ("right", "wrong", "ramble")[k % 3])
        if choice == "right":
            return "ok " * (k % 4) + f"Answer: {gt}"
        if choice == "wrong":
            return f"Answer: {int(gt) + 1}"
        return "blah " * self.R

    def generate_sequences(self, gen_batch: DataProto, validate: bool) -> DataProto:
        assert self.awake, "generation with the replicas asleep"
        self.calls.append(("generate", len(gen_batch), validate))
        nt = gen_batch.non_tensor_batch
        n = len(gen_batch)
        prompts = torch.zeros(n, self.P, dtype=torch.long)
        responses = torch.zeros(n, self.R, dtype=torch.long)
        p_mask = torch.zeros(n, self.P, dtype=torch.long)
        r_mask = torch.zeros(n, self.R, dtype=torch.long)
        seen: dict[str, int] = {}
        for i in range(n):
            uid = str(nt["uid"][i])
            k = seen[uid] = seen.get(uid, -1) + 1
            p_ids = self.tok.encode(nt["raw_prompt"][i][-1]["content"])[-self.P :]
            r_ids = (self.tok.encode(self._text(uid, k, nt["reward_model"][i]["ground_truth"])) + [1])[: self.R]
            prompts[i, self.P - len(p_ids) :] = torch.tensor(p_ids)  # left-padded, like verl's agent loop
            p_mask[i, self.P - len(p_ids) :] = 1
            responses[i, : len(r_ids)] = torch.tensor(r_ids)  # right-padded
            r_mask[i, : len(r_ids)] = 1
        attn = torch.cat([p_mask, r_mask], dim=1)
        out = DataProto.from_dict(tensors={
            "prompts": prompts, "responses": responses, "response_mask": r_mask,
            "input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attn,
            "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
            "rollout_log_probs": -0.3 * r_mask.float(),
        })  # fmt: skip
        out.meta_info = {"timing": {"agent_loop/x": 0.1}}
        if self.reward_loop:
            to_score = DataProto(batch=out.batch, non_tensor_batch={"reward_model": nt["reward_model"],
                                                                     "data_source": nt["data_source"]})  # fmt: skip
            scored = self.verl_reward(to_score, return_dict=True)
            out.batch["rm_scores"] = scored["reward_tensor"]
            for key, vals in scored["reward_extra_info"].items():
                out.non_tensor_batch[key] = np.asarray(vals)
            out.meta_info["reward_extra_keys"] = list(scored["reward_extra_info"])
        return out

    def compute_log_prob(self, batch: DataProto) -> DataProto:
        assert not self.awake, "log-probs with the replicas awake"
        self.calls.append(("compute_log_prob", len(batch)))
        self.log_prob_batches = getattr(self, "log_prob_batches", []) + [batch]
        m = batch.batch["response_mask"].float()
        old = -0.05 * ((batch.batch["responses"] % 5) + 1).float() * m
        return DataProto.from_dict(tensors={"old_log_probs": old, "entropys": 0.5 * m})

    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        assert not self.awake
        self.calls.append(("compute_ref_log_prob", len(batch)))
        m = batch.batch["response_mask"].float()
        return DataProto.from_dict(tensors={"ref_log_prob": -0.04 * ((batch.batch["responses"] % 3) + 1).float() * m})

    def update_actor(self, batch: DataProto) -> dict[str, float]:
        """Runs the configured loss from verl's registry on every mini-batch, split over ``dp_size`` ranks like
        verl's dispatch (global token count shared), with a perturbed log-prob standing in for the new policy."""
        assert not self.awake, "update with the replicas awake"
        self.calls.append(("update_actor", len(batch)))
        self.updates.append(batch)
        actor = omega_conf_to_dataclass(self.cfg.actor_rollout_ref.actor)  # what the worker builds from our config
        loss_fn = get_policy_loss_fn(actor.policy_loss.loss_mode)
        b = batch.batch
        new_lp = b["old_log_probs"] + 0.3 * torch.sin(b["responses"].float()) * b["response_mask"]
        mini = int(self.cfg.actor_rollout_ref.actor.ppo_mini_batch_size) * int(self.cfg.actor_rollout_ref.rollout.n)
        losses = []
        for s in range(0, len(batch), mini):
            rows = slice(s, s + mini)
            actor.global_batch_info.update(dp_size=self.dp_size, global_batch_size=mini,
                                           batch_num_tokens=float(b["response_mask"][rows].sum()))  # fmt: skip
            per = mini // self.dp_size
            total = 0.0
            for r in range(self.dp_size):
                rr = slice(s + r * per, s + (r + 1) * per)
                loss, _ = loss_fn(b["old_log_probs"][rr], new_lp[rr], b["advantages"][rr], b["response_mask"][rr],
                                  actor.loss_agg_mode, actor, None)  # fmt: skip
                total += float(loss)
            losses.append(total / self.dp_size)  # DDP/FSDP average over ranks
        return {"actor/pg_loss": float(np.mean(losses)), "actor/lr": 1e-6}

    def sync_weights(self, step: int) -> None:
        self.calls.append(("sync_weights", step))
        self.awake = True

    def sleep_replicas(self) -> None:
        self.calls.append(("sleep",))
        self.awake = False

    def profiler_hooks(self) -> dict[str, float]:
        return {}  # verl's RayPPOTrainer profiler hooks: none in the stand-in

    def save_checkpoint(self, directory: str, step: int) -> None:
        assert not self.awake, "checkpoint with the replicas awake"
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / "weights.txt").write_text(f"{step}\n")
        self.calls.append(("save", directory, step))

    def load_checkpoint(self, directory: str) -> None:
        assert not self.awake
        self.calls.append(("load", directory, int((Path(directory) / "weights.txt").read_text())))

    def close(self) -> None:
        self.calls.append(("close",))


def _rows(k: int, start: int = 0) -> list[dict]:
    out = []
    for i in range(start, start + k):
        a, b = i % 50, (7 * i) % 50
        out.append({
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": f"What is {a}+{b}? End with Answer: N"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": str(a + b), "style": "rule-lawyer"},
            "extra_info": {"index": i},
        })  # fmt: skip
    return out


@pytest.fixture(scope="module")
def setup():
    preset = load_preset("smoke", SMALL)
    cfg = verl_config.resolve(preset).cfg
    return preset, cfg


@pytest.fixture
def backend(setup):
    preset, cfg = setup
    tok = CharTokenizer()
    return VerlBackend(cfg, preset, CpuStandInWorkers(cfg, tok), tok)


def _train_sampling(preset) -> Sampling:
    ro = preset.recipe.rollout
    return Sampling(n=ro.n, temperature=ro.temperature, top_p=ro.top_p, top_k=ro.top_k, do_sample=True,
                    max_tokens=preset.recipe.data.max_response_length)  # fmt: skip


def test_generate_returns_verl_batch_with_contiguous_uid_groups_and_response_masks(backend, setup):
    preset, _ = setup
    rows = _rows(3)
    r = backend.generate(rows, _train_sampling(preset), group_ids=[10, 11, 12])
    assert len(r) == 3 * N and isinstance(r.data, DataProto) and len(r.data) == 3 * N
    assert r.group_ids.tolist() == [10] * N + [11] * N + [12] * N  # responses of a prompt are contiguous
    assert r.data.non_tensor_batch["uid"].tolist() == ["10"] * N + ["11"] * N + ["12"] * N
    assert [row["extra_info"]["index"] for row in r.prompt_rows] == [0] * N + [1] * N + [2] * N
    assert r.data.non_tensor_batch["reward_model"][N]["ground_truth"] == rows[1]["reward_model"]["ground_truth"]
    b = r.data.batch
    assert b["responses"].shape == (3 * N, 32) and b["prompts"].shape == (3 * N, 48)
    assert torch.equal(b["response_mask"].sum(-1), torch.as_tensor(r.response_length))
    assert torch.equal(b["response_mask"], b["attention_mask"][:, 48:])
    assert backend.workers.calls[-1] == ("generate", 3 * N, False)  # train sampling -> not a validation request
    texts = set(r.response_text)
    assert all("<eos>" not in t for t in texts)  # special tokens stripped, like verl's reward manager


def _score(preset, backend, r, tmp_path):
    """The loop's one scoring pass (DAPOLoop.score), which attaches the scores to the rollout."""
    from dapo.train.loop import DAPOLoop

    return DAPOLoop(preset, backend, _rows(8), [], tmp_path, progress=False, log=lambda m: None).score(r)


def test_reward_is_placed_on_the_last_valid_token_exactly_like_verls_dapo_reward_manager(setup, tmp_path):
    preset, cfg = setup
    tok = CharTokenizer()
    backend = VerlBackend(cfg, preset, CpuStandInWorkers(cfg, tok, reward_loop=True), tok)
    r = backend.generate(_rows(6), _train_sampling(preset))
    assert tok.batch_decodes == 1  # one batch_decode for the whole generation batch
    _score(preset, backend, r, tmp_path)
    agreement = backend.compute_old_log_probs(r)["reward/verl_agreement"]
    ours = r.data.batch["token_level_scores"]
    ob = OmegaConf.create({"enable": True, "len": 8, "penalty_factor": 1.0, "log": False})
    ref = DAPORewardManager(CharTokenizer(), num_examine=0, max_resp_len=32, overlong_buffer_cfg=ob)(r.data)
    assert torch.allclose(ours, ref), "reward tensor differs from verl's DAPORewardManager"
    last = torch.as_tensor(r.response_length) - 1
    assert torch.allclose(ours[torch.arange(len(r)), last], torch.as_tensor(r.stats["reward"], dtype=torch.float32))
    assert torch.equal(r.data.batch["token_level_rewards"], ours)  # no KL in reward
    # the run exercised every case: correct, wrong and truncated (overlong-penalised) responses
    assert {1.0, -1.0} <= set(r.stats["score"].tolist()) and r.truncated.any()
    assert np.all(r.stats["reward"][r.truncated] < -1.0)
    # verl's reward loop result (stand-in: verl's manager) is kept apart and agrees with ours
    assert "verl_rm_scores" in r.data.batch.keys() and "rm_scores" not in r.data.batch.keys()
    assert agreement == 1.0


def test_truncated_means_length_limit_without_eos(backend, setup):
    preset, _ = setup
    r = backend.generate(_rows(6), _train_sampling(preset))
    last = r.data.batch["responses"][torch.arange(len(r)), torch.as_tensor(r.response_length) - 1]
    expect = (torch.as_tensor(r.response_length) == 32) & (last != CharTokenizer.eos_token_id)
    assert r.truncated.tolist() == expect.tolist() and r.truncated.any() and not r.truncated.all()


def test_select_and_concat_keep_dataproto_rows_aligned_with_the_rollout(backend, setup, tmp_path):
    preset, _ = setup
    a = backend.generate(_rows(2), _train_sampling(preset), group_ids=[0, 1])
    b = backend.generate(_rows(2, start=2), _train_sampling(preset), group_ids=[2, 3])
    _score(preset, backend, a, tmp_path)
    _score(preset, backend, b, tmp_path)
    idx = np.array([7, 4, 5, 6])
    sel = backend.select(a, idx)
    assert sel.group_ids.tolist() == [1, 1, 1, 1]
    assert torch.equal(sel.data.batch["responses"], a.data.batch["responses"][torch.as_tensor(idx)])
    assert sel.response_text == [a.response_text[i] for i in idx]
    both = backend.concat([sel, b])
    assert len(both) == len(both.data) == 4 + 2 * N
    assert both.data.non_tensor_batch["uid"].tolist() == ["1"] * 4 + ["2"] * N + ["3"] * N
    assert torch.equal(both.data.batch["responses"][4:], b.data.batch["responses"])
    assert np.array_equal(both.stats["reward"][:4], a.stats["reward"][idx])
    with pytest.raises(IndexError):
        backend.select(a, np.array([2 * N]))


def test_dynamic_sampling_keeps_varying_groups_and_truncates_to_train_batch_size_times_n(backend, setup, tmp_path):
    preset, _ = setup
    d, fg = preset.recipe.data, preset.recipe.filter_groups
    sampler = DynamicSampler(train_batch_size=d.train_batch_size, n=N, enable=True, metric="acc",
                             max_num_gen_batches=fg.max_num_gen_batches, gen_batch_size=d.gen_batch_size)  # fmt: skip
    start = 0
    while not sampler.is_full():
        r = backend.generate(_rows(d.gen_batch_size, start), _train_sampling(preset),
                             group_ids=list(range(start, start + d.gen_batch_size)))  # fmt: skip
        start += d.gen_batch_size
        sampler.add(r.group_ids, _score(preset, backend, r, tmp_path)["acc"], batch=r)
    parts = sampler.selection()
    batch = backend.concat([backend.select(p.batch, p.indices) for p in parts])
    stats = sampler.finish_step()
    assert len(batch) == len(batch.data) == d.train_batch_size * N
    assert stats["num_gen_batches"] >= 2  # all-correct / all-wrong groups were dropped, so it had to generate more
    uids = batch.data.non_tensor_batch["uid"]
    for g in np.unique(uids):
        acc = batch.stats["acc"][uids == g]
        assert len(acc) == N and 0 < acc.sum() < N  # whole groups, each with varying outcomes


def test_update_sends_token_level_advantages_and_masks_filtered_responses(backend, setup):
    preset, cfg = setup
    r = backend.generate(_rows(4), _train_sampling(preset), group_ids=[0, 1, 2, 3])
    with pytest.raises(RuntimeError, match="compute_old_log_probs"):
        backend.update(r, np.zeros(len(r)))
    m = backend.compute_old_log_probs(r)
    assert {"actor/entropy", "actor/mean_prob", "timing_s/agent_loop/x"} <= set(m)
    assert m["actor/mean_prob"] == pytest.approx(float((r.data.batch["old_log_probs"].exp() * r.data.batch[
        "response_mask"]).sum() / r.data.batch["response_mask"].sum()), rel=1e-5)  # fmt: skip
    r.data.non_tensor_batch["row_tag"] = np.arange(len(r))
    adv = np.linspace(-1.5, 1.5, len(r))
    keep = np.ones(len(r), dtype=bool)
    keep[[1, 6]] = False  # overlong filtering of two responses
    out = backend.update(r, adv, keep)
    sent = backend.workers.updates[-1]
    assert "actor/pg_loss" in out and np.isfinite(out["actor/pg_loss"])
    # the stand-in received every response once (reordered for dp balance): follow rows by a tag column
    order = sent.non_tensor_batch["row_tag"].tolist()
    assert sorted(order) == list(range(len(r))) and order != list(range(len(r)))
    for j, i in enumerate(order):
        mask = r.data.batch["response_mask"][i].float() * float(keep[i])
        assert torch.allclose(sent.batch["advantages"][j], float(adv[i]) * mask)
        assert torch.equal(sent.batch["response_mask"][j].float(), mask)
        assert sent.non_tensor_batch["uid"][j] == r.data.non_tensor_batch["uid"][i]
    # the rollout itself is untouched (the loop's scores and advantages stay aligned with it)
    assert torch.equal(r.data.batch["response_mask"].sum(-1), torch.as_tensor(r.response_length))
    # no weight sync after the update: the next generation syncs (after a save, if one is due)
    assert backend.workers.calls[-1][0] == "update_actor" and backend.step == 1 and backend.num_syncs == 1
    backend.generate(_rows(1), _train_sampling(preset))
    assert [c for c in backend.workers.calls if c[0] == "sync_weights"] == [("sync_weights", 0), ("sync_weights", 1)]


def test_balance_order_gives_each_rank_a_similar_token_load():
    lengths = torch.tensor([30, 2, 28, 3, 25, 5, 27, 1])
    mask = (torch.arange(32)[None, :] < lengths[:, None]).long()
    order, metrics = balance_order(mask, dp_size=2)
    assert sorted(order.tolist()) == list(range(8))
    loads = [int(lengths[order[:4]].sum()), int(lengths[order[4:]].sum())]
    assert abs(loads[0] - loads[1]) <= 6 and metrics  # sequential halves would be 85 vs 36


def test_validation_sampling_is_chosen_by_the_config_and_other_sampling_is_refused(backend, setup):
    preset, _ = setup
    v = preset.recipe.rollout.val
    backend.generate(_rows(2), Sampling(n=v.n, temperature=v.temperature, top_p=v.top_p, top_k=v.top_k,
                                        do_sample=v.do_sample))  # fmt: skip
    assert backend.workers.calls[-1] == ("generate", 2 * v.n, True)
    with pytest.raises(ConfigError, match="neither the train sampling.*nor the validation sampling"):
        backend.generate(_rows(2), Sampling(n=N, temperature=0.6))


def test_bad_prompt_rows_name_the_row_and_column(backend, setup):
    preset, _ = setup
    rows = _rows(2)
    del rows[1]["reward_model"]
    with pytest.raises(ValueError, match="prompt row 1: 'reward_model'"):
        backend.generate(rows, _train_sampling(preset))


def test_the_dapo_loop_runs_and_resumes_on_the_verl_backend_over_the_stand_in(setup, tmp_path):
    from dapo.train.loop import DAPOLoop

    preset, cfg = setup
    tok = CharTokenizer()
    workers = CpuStandInWorkers(cfg, tok, reward_loop=True)
    train, val = _rows(60), _rows(5, start=100)
    logs: list[str] = []
    loop = DAPOLoop(preset, VerlBackend(cfg, preset, workers, tok), train, val, tmp_path, progress=False,
                    log=logs.append)  # fmt: skip
    assert loop.fit() == 0
    updates = [c for c in workers.calls if c[0] == "update_actor"]
    assert [c[1] for c in updates] == [4 * N, 4 * N]  # two steps of train_batch_size x n responses
    assert any(c == ("generate", 5, True) for c in workers.calls)  # validation with the val sampling
    saves = [c for c in workers.calls if c[0] == "save"]
    assert [c[2] for c in saves] == [1, 2]
    # one actor -> vLLM weight sync per step, save steps included, in verl's order: update, save, sync (then the
    # validation and the next step's generations run on the synced replicas)
    seq = [c[0] for c in workers.calls if c[0] in ("sync_weights", "update_actor", "save")]
    assert seq == ["sync_weights", "update_actor", "save", "sync_weights", "update_actor", "save", "sync_weights"]
    assert [c[1] for c in workers.calls if c[0] == "sync_weights"] == [0, 1, 2]
    import json

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0 and "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["reward/verl_agreement"] == 1.0 and r["train/kept_group_ratio"] < 1.0 for r in steps)
    # a restarted job with more steps continues from the step-2 checkpoint
    longer = load_preset("smoke", SMALL + ["recipe.trainer.total_training_steps=3"])
    workers2 = CpuStandInWorkers(cfg, tok)
    backend2 = VerlBackend(cfg, longer, workers2, tok)
    assert DAPOLoop(longer, backend2, train, val, tmp_path, progress=False, log=logs.append).fit() == 0
    loads = [c for c in workers2.calls if c[0] == "load"]
    assert len(loads) == 1 and loads[0][2] == 2
    assert [c[1] for c in workers2.calls if c[0] == "update_actor"] == [4 * N] and backend2.step == 3


def test_a_resumed_run_seeds_the_rollout_engines_by_the_resume_step(setup, tmp_path):
    from dapo.train import checkpoint as ckpt
    from dapo.backends.verl.config import resume_seed
    from dapo.backends.verl.run import resume_step

    preset, cfg = setup
    assert resume_step(preset, str(tmp_path)) == 0  # nothing to resume
    ckpt.save(ckpt.checkpoint_root(tmp_path), 7, lambda d: None, {"step": 7})
    assert resume_step(preset, str(tmp_path)) == 7
    assert resume_step(load_preset("smoke", SMALL + ["recipe.trainer.resume_mode=disable"]), str(tmp_path)) == 0
    c = OmegaConf.create(OmegaConf.to_container(cfg))
    base = int(c.actor_rollout_ref.rollout.seed)
    assert resume_seed(c, 7) == base + 7 == c.actor_rollout_ref.rollout.seed
    # resolve() seeds before verl validates: the config printed is the one the engines get
    resumed = verl_config.resolve(preset, resume_step=7)
    assert resumed.cfg.actor_rollout_ref.rollout.seed == base + 7 and "resumed at step 7" in " ".join(resumed.notes)
    assert verl_config.resolve(preset).cfg.actor_rollout_ref.rollout.seed == base


def test_greedy_validation_reaches_the_agent_loop_as_temperature_zero(tmp_path):
    preset = load_preset("smoke", SMALL + ["recipe.rollout.val.do_sample=false"])
    cfg = verl_config.resolve(preset).cfg
    assert cfg.actor_rollout_ref.rollout.val_kwargs.temperature == 0.0
    tok = CharTokenizer()
    backend = VerlBackend(cfg, preset, CpuStandInWorkers(cfg, tok), tok)
    from dapo.train.loop import DAPOLoop

    loop = DAPOLoop(preset, backend, _rows(8), _rows(2), tmp_path, progress=False, log=lambda m: None)
    backend.generate(_rows(2), loop.val_sampling)  # the loop's rollout.val sampling: do_sample false
    assert backend.workers.calls[-1] == ("generate", 2 * preset.recipe.rollout.val.n, True)


def test_loop_memory_model_counts_the_bytes_of_a_generation_batch_row(backend, setup):
    """dapo.plan.memory.row_bytes (what `dapo plan` sizes the loop with) against the tensors a generation batch really
    holds in the loop: the agent-loop output keys (stand-in shaped like verl 0.9.1's AgentLoopWorker._postprocess:
    int64 prompts, responses, response_mask, input_ids, attention_mask, position_ids; fp32 rollout_log_probs,
    rm_scores) plus whatever VerlBackend adds."""
    from dapo.plan.memory import row_bytes

    preset, cfg = setup
    r = backend.generate(_rows(3), _train_sampling(preset), group_ids=[20, 21, 22])
    held = sum(t.element_size() * t.numel() for t in r.data.batch.values())
    assert held == len(r) * row_bytes(int(cfg.data.max_prompt_length), int(cfg.data.max_response_length))


class PeakingWorkers(CpuStandInWorkers):
    """Validation answers right only on the weights of step 2 (the replicas' last sync), wrong on any other."""

    synced, validating = -1, False

    def sync_weights(self, step: int) -> None:
        self.synced = step
        super().sync_weights(step)

    def generate_sequences(self, gen_batch: DataProto, validate: bool) -> DataProto:
        self.validating = validate
        return super().generate_sequences(gen_batch, validate)

    def _text(self, uid: str, k: int, gt: str) -> str:
        if self.validating:
            return f"Answer: {gt}" if self.synced == 2 else f"Answer: {int(gt) + 1}"
        return super()._text(uid, k, gt)


def test_retention_on_the_verl_backend_keeps_the_best_checkpoint_across_a_resume(setup, tmp_path):
    """A run whose best validation is at step 2 of 5 (max_ckpt_to_keep 1) keeps global_step_2, and so does the
    resumed run to step 7: the verl backend saves through dapo.train.checkpoint (verl deletes nothing)."""
    from dapo.train import checkpoint as ckpt
    from dapo.train.loop import DAPOLoop

    _, cfg = setup
    tok = CharTokenizer()
    train, val = _rows(300), _rows(5, start=1000)
    for steps in (5, 7):
        preset = load_preset("smoke", SMALL + [f"recipe.trainer.total_training_steps={steps}",
                                               "recipe.trainer.max_ckpt_to_keep=1",
                                               "recipe.filter_groups.max_num_gen_batches=0",
                                               "recipe.trainer.val_before_train=false"])
        backend = VerlBackend(cfg, preset, PeakingWorkers(cfg, tok), tok)
        logs: list[str] = []
        assert DAPOLoop(preset, backend, train, val, tmp_path, progress=False, log=logs.append).fit() == 0, logs
        root = ckpt.checkpoint_root(tmp_path)
        assert ckpt.complete_steps(root) == [2, steps] and ckpt.best_step(root) == 2

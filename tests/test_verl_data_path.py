"""VerlBackend through verl 0.9.1's own data path, with only the Ray calls faked.

Real here: ``RayPPOTrainer._compute_old_log_prob`` / ``_compute_ref_log_prob`` / ``_update_actor`` / ``_get_dp_size`` /
``_start_profiling`` / ``_stop_profiling``
(bound to a minimal trainer object), ``DataProto`` pad / chunk / concat / union / ``to_tensordict``,
``left_right_2_no_padding`` / ``no_padding_2_padding``, the data-parallel split of verl's dispatch
(``_split_args_kwargs_data_proto``) and its collect (``BatchData.concat``), the engine worker's per-rank mini-batch
iterator (``tensordict_utils.make_iterator``), ``prepare_micro_batches``, and ``verl.workers.utils.losses.ppo_loss``
with our registered ``dapo`` loss, plus :class:`dapo.backends.verl.workers.RayWorkers` itself.

FAKE (the Ray side): the worker group runs its ranks one after the other in this process, in lock step per
mini-batch like the real ranks (the global token count is the sum over ranks: verl's all-reduce; the gradient is
the mean over ranks: DDP/FSDP); the "model" is one learnable logit per vocabulary id
(``log p(token) = -softplus(theta[token])``); the rollout manager returns batches shaped like the agent loop's
(left-padded prompts, right-padded responses); the checkpoint engine only records sleep / ``update_weights``.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
ray_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer", reason="verl's RayPPOTrainer (needs verl-core deps)")

import dapo.backends.verl.loss  # noqa: E402,F401  (registers loss_mode=dapo, as VERL_USE_EXTERNAL_MODULES does)
from dapo.backends.verl import config as verl_config  # noqa: E402
from dapo.backends.verl.backend import VerlBackend  # noqa: E402
from dapo.backends.verl.workers import RayWorkers  # noqa: E402
from dapo.config import load_preset  # noqa: E402
from dapo.loss import kl_penalty, policy_loss  # noqa: E402
from test_verl_backend import SMALL, CharTokenizer, _rows  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.single_controller.base.decorator import _split_args_kwargs_data_proto  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.workers.engine.utils import prepare_micro_batches  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

VOCAB = 160
DP = 2
MICRO = 2  # micro_batch_size_per_gpu


class FakeActorWorkerGroup:
    """The hybrid actor worker group with its ranks run in-process (module docstring)."""

    def __init__(self, cfg, log):
        self.cfg, self.log = cfg, log
        self._dispatch_info = {"actor": list(range(DP))}
        self.world_size = DP
        g = torch.Generator().manual_seed(0)
        self.theta = torch.nn.Parameter(torch.randn(VOCAB, generator=g))
        self.ref_theta = self.theta.detach().clone()  # the reference policy: the initial weights
        self.minibatches: list[dict] = []
        self.ranks_seen: list[list[int]] = []

    # -- model -------------------------------------------------------------------------------------------------------
    @staticmethod
    def _log_probs(theta: torch.Tensor, td) -> torch.Tensor:
        """Model output like the engine's: one value per token of the unpadded sequences (nested), position j holding
        log p(token j+1); no_padding_2_padding then shifts it onto the response tokens."""
        ids = td["input_ids"]
        values = ids.values()
        nxt = torch.roll(values, -1)
        lp = -torch.nn.functional.softplus(theta[nxt])
        return torch.nested.nested_tensor_from_jagged(lp, offsets=ids.offsets())

    def _ranks(self, td):
        (chunks,), _ = _split_args_kwargs_data_proto(DP, td)  # verl's dispatch: rank r gets the r-th chunk
        return [c.clone() for c in chunks]  # each rank receives its own (unlocked) copy through Ray

    def _infer(self, td, theta):
        outs = []
        for rank_td in self._ranks(td):
            mbs, _ = prepare_micro_batches(rank_td)
            lps = [self._log_probs(theta, mb) for mb in mbs]
            lp = tu.concat_nested_tensors(lps) if len(lps) > 1 else lps[0]
            outs.append(tu.get_tensordict({"log_probs": lp, "entropy": lp.detach().neg()}, {"metrics": {"mfu": 0.0}}))
        return outs

    def _collect(self, outs):
        out = tu.concat_tensordict(outs)
        tu.assign_non_tensor(out, metrics={"mfu": 0.0})
        return out

    def compute_log_prob(self, td):
        self.log.append(("compute_log_prob", len(td)))
        tu.assign_non_tensor(td, use_dynamic_bsz=False, micro_batch_size_per_gpu=MICRO)
        with torch.no_grad():
            return self._collect(self._infer(td, self.theta))

    def compute_ref_log_prob(self, td):
        self.log.append(("compute_ref_log_prob", len(td)))
        tu.assign_non_tensor(td, use_dynamic_bsz=False, micro_batch_size_per_gpu=MICRO)
        with torch.no_grad():
            return self._collect(self._infer(td, self.ref_theta))

    def update_actor(self, td):
        """verl's ``train_mini_batch`` per rank (its own iterator of mini_batch_size / dp rows) in lock step, then
        ``forward_backward_batch``: global token count all-reduced, ``prepare_micro_batches``, ``ppo_loss``."""
        self.log.append(("update_actor", len(td)))
        actor_cfg = omega_conf_to_dataclass(self.cfg.actor_rollout_ref.actor)
        ranks = self._ranks(td)
        iters = []
        for r, rank_td in enumerate(ranks):
            mini = tu.pop(rank_td, key="mini_batch_size")
            epochs, seed = tu.pop(rank_td, key="epochs", default=1), tu.pop(rank_td, key="seed", default=42)
            kwargs = tu.pop(rank_td, key="dataloader_kwargs", default={})
            iters.append(list(tu.make_iterator(rank_td, mini_batch_size=mini // DP, epochs=epochs, seed=seed + r,
                                               dataloader_kwargs=kwargs)))  # fmt: skip
        pg_losses = []
        for step_tds in zip(*iters):
            total_tokens = sum(float(t["loss_mask"].sum()) for t in step_tds)  # the all-reduce
            grads, rank_losses, rows = [], [], []
            for rank_td in step_tds:
                tu.assign_non_tensor(rank_td, batch_num_tokens=total_tokens, dp_size=DP, use_dynamic_bsz=False,
                                     micro_batch_size_per_gpu=MICRO)  # fmt: skip
                self.theta.grad = None
                loss_sum = 0.0
                mbs, _ = prepare_micro_batches(rank_td)
                for mb in mbs:
                    loss, metrics = ppo_loss(actor_cfg, {"log_probs": self._log_probs(self.theta, mb)}, mb)
                    loss.backward()
                    loss_sum += float(loss.detach())
                grads.append(self.theta.grad.detach().clone())
                rank_losses.append(loss_sum)
                rows.append(rank_td)
            self.minibatches.append({"tds": rows, "grad": torch.stack(grads).mean(0), "rank_losses": rank_losses,
                                     "tokens": total_tokens})  # fmt: skip
            pg_losses.append(sum(rank_losses) / DP)
        return tu.get_tensordict({}, {"metrics": {"mfu": 0.0, "pg_loss": pg_losses}})

    # -- the rest of the group's interface the backend touches ---------------------------------------------------------
    def save_checkpoint(self, directory, hdfs_path, step, max_ckpt_to_keep=None):
        self.log.append(("save", step))

    def load_checkpoint(self, directory, del_local_after_load=False):
        self.log.append(("load",))


class FakeCheckpointManager:
    def __init__(self, log):
        self.log = log

    def update_weights(self, step):
        self.log.append(("update_weights", step))

    def sleep_replicas(self):
        self.log.append(("sleep",))

    def wake_up_replicas(self):
        self.log.append(("wake",))


class FakeAgentLoopManager:
    """Shapes of verl's agent loop output: prompts [N, P] left-padded, responses [N, R] right-padded."""

    def __init__(self, cfg, tok, log):
        self.P, self.R = int(cfg.data.max_prompt_length), int(cfg.data.max_response_length)
        self.tok, self.log = tok, log

    def generate_sequences(self, batch: DataProto) -> DataProto:
        self.log.append(("generate", len(batch)))
        n = len(batch)
        prompts = torch.zeros(n, self.P, dtype=torch.long)
        responses = torch.zeros(n, self.R, dtype=torch.long)
        pm, rm = torch.zeros_like(prompts), torch.zeros_like(responses)
        for i in range(n):
            p = self.tok.encode(batch.non_tensor_batch["raw_prompt"][i][-1]["content"])[-self.P :]
            k = (i * 7) % 5
            text = "x" * (self.R + 3) if k == 4 else ("ok " * k + f"Answer: {i % 3}")
            r = (self.tok.encode(text) + [1])[: self.R]
            prompts[i, self.P - len(p) :], pm[i, self.P - len(p) :] = torch.tensor(p), 1
            responses[i, : len(r)], rm[i, : len(r)] = torch.tensor(r), 1
        attn = torch.cat([pm, rm], 1)
        return DataProto.from_dict(
            tensors={"prompts": prompts, "responses": responses, "response_mask": rm,
                     "input_ids": torch.cat([prompts, responses], 1), "attention_mask": attn,
                     "position_ids": (attn.cumsum(-1) - 1).clamp(min=0)},
            meta_info={"timing": {"agent_loop/generate_sequences/mean": 0.01}},
        )  # fmt: skip


def _trainer(cfg, tok):
    """A minimal object carrying verl's own RayPPOTrainer methods; only its Ray handles are fakes."""
    log: list[tuple] = []
    t = types.SimpleNamespace()
    t.config = cfg
    t.actor_rollout_wg = FakeActorWorkerGroup(cfg, log)
    t.ref_policy_wg = t.actor_rollout_wg  # verl fuses the reference into the ActorRolloutRef worker
    t.ref_in_actor = False
    t.distillation_config = None
    t.checkpoint_manager = FakeCheckpointManager(log)
    t.async_rollout_manager = FakeAgentLoopManager(cfg, tok, log)
    t.tokenizer = tok
    cls = ray_trainer.RayPPOTrainer
    for name in ("_compute_old_log_prob", "_compute_ref_log_prob", "_update_actor", "_get_dp_size", "_start_profiling",
                 "_stop_profiling"):
        setattr(t, name, types.MethodType(getattr(cls, name), t))
    return t, log


def _setup(extra=()):
    preset = load_preset("smoke", SMALL + ["recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=null",
                                           "recipe.data.train_batch_size=4", "recipe.actor.ppo_mini_batch_size=2",
                                           *extra])  # fmt: skip
    cfg = verl_config.resolve(preset).cfg
    tok = CharTokenizer()
    trainer, log = _trainer(cfg, tok)
    workers = RayWorkers.from_trainer(trainer)
    return preset, cfg, tok, trainer, log, VerlBackend(cfg, preset, workers, tok)


def _expected_minibatch(mb: dict, theta_before: torch.Tensor, actor_cfg, use_kl: bool, ref_theta: torch.Tensor):
    """The token-mean loss over the WHOLE mini-batch (all ranks' rows), computed directly with dapo.loss."""
    theta = theta_before.clone().requires_grad_(True)
    lps, olds, advs, masks, refs = [], [], [], [], []
    for td in mb["tds"]:
        lps.append(FakeActorWorkerGroup._log_probs(theta, td))
        padded = td.select("response_mask", "old_log_probs", "advantages", *(["ref_log_prob"] if use_kl else []))
        padded = padded.to_padded_tensor()
        olds.append(padded["old_log_probs"])
        advs.append(padded["advantages"])
        masks.append(padded["response_mask"])
        if use_kl:
            refs.append(padded["ref_log_prob"])
    from verl.workers.utils.padding import no_padding_2_padding

    lp = torch.cat([no_padding_2_padding(x, td) for x, td in zip(lps, mb["tds"])])
    old, adv, mask = torch.cat(olds), torch.cat(advs), torch.cat(masks).bool()
    loss, _ = policy_loss(lp, old, adv, mask, clip_ratio_low=actor_cfg.clip_ratio_low,
                          clip_ratio_high=actor_cfg.clip_ratio_high, clip_ratio_c=actor_cfg.clip_ratio_c)  # fmt: skip
    if use_kl:
        kl = kl_penalty(lp, torch.cat(refs), actor_cfg.kl_loss_type)
        loss = loss + actor_cfg.kl_loss_coef * (kl * mask).sum() / mask.sum().clamp(min=1)
    loss.backward()
    return float(loss.detach()), theta.grad


@pytest.mark.parametrize("use_kl", [False, True])
def test_each_rank_applies_the_token_mean_over_the_whole_mini_batch_through_verls_own_path(use_kl):
    extra = ["recipe.actor.use_kl_loss=true", "recipe.actor.kl_loss_coef=0.3"] if use_kl else []
    preset, cfg, tok, trainer, log, backend = _setup(extra)
    wg = trainer.actor_rollout_wg
    with torch.no_grad():
        wg.theta.add_(0.3 * torch.randn(VOCAB, generator=torch.Generator().manual_seed(1)))  # policy != reference
    sampling = __import__("test_verl_backend")._train_sampling(preset)
    r = backend.generate(_rows(4), sampling, group_ids=[0, 1, 2, 3])
    backend.compute_old_log_probs(r)
    # pi_old from verl's _compute_old_log_prob equals the model's log-probs of the response tokens, row by row
    resp, mask = r.data.batch["responses"], r.data.batch["response_mask"].float()
    expect_old = -torch.nn.functional.softplus(wg.theta.detach()[resp]) * mask
    torch.testing.assert_close(r.data.batch["old_log_probs"] * mask, expect_old, atol=1e-6, rtol=0)
    if use_kl:
        expect_ref = -torch.nn.functional.softplus(wg.ref_theta[resp]) * mask
        torch.testing.assert_close(r.data.batch["ref_log_prob"] * mask, expect_ref, atol=1e-6, rtol=0)
    else:
        assert "ref_log_prob" not in r.data.batch.keys()
    theta_before = wg.theta.detach().clone()
    adv = np.linspace(-1.2, 1.5, len(r))
    keep = np.ones(len(r), dtype=bool)
    keep[[2, 9]] = False
    out = backend.update(r, adv, keep)
    actor_cfg = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert len(wg.minibatches) == 2  # 4 prompts x 4 responses / (2 prompts x 4) per mini-batch
    for mb in wg.minibatches:
        assert len(mb["tds"]) == DP and all(len(td) == 4 // DP * 4 // 2 for td in mb["tds"])
        want_loss, want_grad = _expected_minibatch(mb, theta_before, actor_cfg, use_kl, wg.ref_theta)
        # every rank's loss is its share of the mini-batch token mean; DDP's gradient mean is the global gradient
        assert sum(mb["rank_losses"]) / DP == pytest.approx(want_loss, rel=1e-5, abs=1e-7)
        torch.testing.assert_close(mb["grad"], want_grad, atol=1e-6, rtol=1e-5)
    assert out["actor/pg_loss"] == pytest.approx(np.mean([sum(m["rank_losses"]) / DP for m in wg.minibatches]))


def test_a_mini_batch_with_no_valid_token_gives_zero_loss_and_zero_gradient_through_ppo_loss():
    preset, cfg, tok, trainer, log, backend = _setup()
    wg = trainer.actor_rollout_wg
    r = backend.generate(_rows(4), __import__("test_verl_backend")._train_sampling(preset), group_ids=[0, 1, 2, 3])
    backend.compute_old_log_probs(r)
    keep = np.zeros(len(r), dtype=bool)  # every response masked (e.g. all truncated under overlong filtering)
    out = backend.update(r, np.linspace(-1, 1, len(r)), keep)
    assert [mb["tokens"] for mb in wg.minibatches] == [0.0, 0.0]
    for mb in wg.minibatches:
        assert mb["rank_losses"] == [0.0, 0.0] and torch.equal(mb["grad"], torch.zeros(VOCAB))
    assert out["actor/pg_loss"] == 0.0


def test_the_old_log_prob_pass_sees_verls_balanced_order_and_outputs_come_back_in_batch_order():
    preset, cfg, tok, trainer, log, backend = _setup()
    wg = trainer.actor_rollout_wg
    seen = []
    real = wg.compute_log_prob

    def spy(td):
        seen.append(td["responses"].clone() if "responses" in td.keys() else None)
        return real(td)

    wg.compute_log_prob = spy
    r = backend.generate(_rows(4), __import__("test_verl_backend")._train_sampling(preset), group_ids=[0, 1, 2, 3])
    backend.compute_old_log_probs(r)
    from dapo.backends.verl.batch import balance_order

    order, _ = balance_order(r.data.batch["attention_mask"], DP)
    assert not np.array_equal(order, np.arange(len(order)))
    assert torch.equal(seen[0], r.data.batch["responses"][torch.as_tensor(order)])  # verl's _balance_batch order
    resp, mask = r.data.batch["responses"], r.data.batch["response_mask"].float()
    expect = -torch.nn.functional.softplus(wg.theta.detach()[resp]) * mask
    torch.testing.assert_close(r.data.batch["old_log_probs"] * mask, expect, atol=1e-6, rtol=0)


def test_the_loop_syncs_weights_once_per_step_after_the_save_in_verls_order(tmp_path):
    from dapo.train.loop import DAPOLoop

    preset, cfg, tok, trainer, log, backend = _setup(["recipe.trainer.total_training_steps=3",
                                                      "recipe.trainer.save_freq=2", "recipe.trainer.test_freq=1"])
    loop = DAPOLoop(preset, backend, _rows(40), _rows(3, start=100), tmp_path, progress=False, log=lambda m: None)
    assert loop.fit() == 0
    events = [e for e in log if e[0] in ("update_weights", "sleep", "generate", "compute_log_prob", "update_actor",
                                         "save")]  # fmt: skip
    names = [e[0] for e in events]
    # before training: sync, validate. Each step: generate (awake), sleep, log-probs, update, [save], sync, validate.
    step = ["generate", "sleep", "compute_log_prob", "update_actor"]
    assert names == (["update_weights", "generate"]
                     + step + ["update_weights", "generate"]
                     + step + ["save", "update_weights", "generate"]
                     + step + ["save", "update_weights", "generate"])  # fmt: skip
    assert [e[1] for e in events if e[0] == "update_weights"] == [0, 1, 2, 3]
    # DataProto pad / unpad around the agent loop: 3 validation prompts x 1 padded to the 8 agent-loop workers,
    # 4 training prompts x 4 = 16 rows already divisible
    assert [e[1] for e in events if e[0] == "generate"] == [8, 16, 8, 16, 8, 16, 8]
    assert backend.num_syncs == 4  # one per step plus the initial one


def test_the_loops_verl_calls_equal_a_real_fits_recording_through_to_close(tmp_path):
    """The loop over RayWorkers (verl's trainer methods, fake Ray handles) with the cadence of the recorded fit()
    (tests/fixtures/verl_fit_calls.json: a real RayPPOTrainer.fit() on the verl-tiny workers) makes the same verl
    calls in the same order, start-up and every step, and closing the backend adds none (fit() ends without one)."""
    import json
    from pathlib import Path

    from dapo.bench.verl_calls import CallRecorder, canonical, order_violations, split_steps
    from dapo.train.loop import DAPOLoop

    fit = json.loads((Path(__file__).parent / "fixtures" / "verl_fit_calls.json").read_text())
    c = fit["cadence"]
    preset, cfg, tok, trainer, log, backend = _setup([
        f"recipe.trainer.total_training_steps={c['steps']}", f"recipe.trainer.save_freq={c['save_freq']}",
        f"recipe.trainer.test_freq={c['test_freq']}", f"recipe.trainer.val_before_train={c['val_before_train']}"])
    recorder = CallRecorder(trainer)
    loop = DAPOLoop(preset, backend, _rows(40), _rows(3, start=100), tmp_path, progress=False, log=lambda m: None)
    assert loop.fit() == 0
    backend.close()
    assert order_violations(recorder.events) == []
    start, steps = split_steps(canonical(recorder.events))
    assert start == fit["canonical"]["startup"]
    assert steps == fit["canonical"]["steps"]


@pytest.mark.parametrize("agreement", [False, True])
def test_verls_reward_loop_scores_the_rollout_again_only_with_verl_agreement(agreement):
    import inspect

    from dapo.backends.verl.workers import dapo_trainer_class

    # the hook point: init_workers assigns self.reward_loop_manager and hands its workers to the agent loop
    src = inspect.getsource(ray_trainer.RayPPOTrainer.init_workers)
    assert "self.reward_loop_manager = RewardLoopManager(" in src
    assert "self.reward_loop_manager.reward_loop_workers if enable_agent_reward_loop" in src
    cls = dapo_trainer_class(10, agreement)
    assert issubclass(cls, ray_trainer.RayPPOTrainer)
    trainer = cls.__new__(cls)  # no Ray: only the attribute hook is exercised
    manager = types.SimpleNamespace(reward_loop_workers=["w0", "w1"], compute_rm_score=lambda b: "scored")
    trainer.reward_loop_manager = manager
    got = trainer.reward_loop_manager
    assert got.reward_loop_workers == (["w0", "w1"] if agreement else None)
    assert got.compute_rm_score(None) == "scored"  # everything else is verl's manager


def test_balance_order_is_verls_own_balance_batch():
    from dapo.backends.verl.batch import balance_order

    g = torch.Generator().manual_seed(4)
    lengths = torch.randint(3, 60, (16,), generator=g)
    mask = (torch.arange(64)[None, :] < lengths[:, None]).long()
    batch = DataProto.from_dict(tensors={"attention_mask": mask, "row": torch.arange(16)})
    fake = types.SimpleNamespace(actor_rollout_wg=types.SimpleNamespace(_dispatch_info={"actor": [0, 1, 2, 3]}))
    fake._get_dp_size = types.MethodType(ray_trainer.RayPPOTrainer._get_dp_size, fake)
    verl_metrics: dict = {}
    ray_trainer.RayPPOTrainer._balance_batch(fake, batch, verl_metrics)
    ours, our_metrics = balance_order(mask, 4)
    assert batch.batch["row"].tolist() == ours.tolist()
    assert our_metrics == pytest.approx({k: float(v) for k, v in verl_metrics.items()})

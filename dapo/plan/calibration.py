"""Calibration anchors: published wall-clock measurements of DAPO runs the time model of
:mod:`dapo.plan.estimate` is checked against (``ANCHORS``; tests/test_plan.py, the ``calibration`` docs table).
"""

from __future__ import annotations

from dataclasses import dataclass

from dapo.config import load_preset
from dapo.plan.assumptions import Assumptions
from dapo.plan.estimate import Plan, make_plan


@dataclass(frozen=True)
class Anchor:
    name: str
    preset: str
    overrides: tuple[str, ...]
    gpu: str
    nodes: int
    mean_response_len: int
    measured_s: float  # wall-clock seconds per rollout step
    source: str
    note: str

    def plan(self) -> Plan:
        return make_plan(load_preset(self.preset, list(self.overrides)), self.gpu, self.nodes,
                         assumptions=Assumptions(mean_response_len=self.mean_response_len))


_VERL_7B_H20 = (
    "recipe.model.path=Qwen/Qwen2.5-Math-7B", "recipe.data.max_response_length=28672",
    "recipe.data.gen_batch_size=512", "recipe.filter_groups.enable=false", "recipe.trainer.test_freq=20",
    "recipe.trainer.save_freq=-1", "placement.parallel.rollout_tp=4", "placement.parallel.ulysses_sp=4",
    "placement.parallel.gpu_memory_utilization=0.8", "placement.parallel.ppo_max_token_len_per_gpu=61440",
    "placement.parallel.max_num_batched_tokens=30720", "placement.parallel.param_offload=true",
    "placement.parallel.optimizer_offload=true", "placement.parallel.fsdp_size=2",
)
_VERL_7B_SRC = ("verl docs/advance/fully_async.md, 'Asynchronous Training on 7B Model' (colocate sync, DAPO, "
                "Qwen2.5-Math-7B, 28k responses, H20); wall time of 400 rollout steps / 400")

ANCHORS: tuple[Anchor, ...] = (
    Anchor("DAPO 32B, 128 x A800", "full", (), "a800", 16, 3000,
           5 * 86400 / 230,
           "https://github.com/verl-project/verl/issues/795 (230 rollout steps in 5 days on 128 A800)",
           "mean response 3,000 assumed over the first 230 steps (DAPO-32B lengths grow from ~1k towards 4-5k)"),
    Anchor("DAPO 7B-Math, 32 x H20", "7b", _VERL_7B_H20, "h20", 4, 1000, (89 * 3600 + 5 * 60) / 400,
           _VERL_7B_SRC + ": 3d17h5m (timing_s/step 790)", "mean response 1,000 assumed (Qwen2.5-Math-7B)"),
    Anchor("DAPO 7B-Math, 64 x H20", "7b", _VERL_7B_H20, "h20", 8, 1000, (41 * 3600 + 32 * 60) / 400,
           _VERL_7B_SRC + ": 1d17h32m (timing_s/step 365)", "mean response 1,000 assumed (Qwen2.5-Math-7B)"),
    Anchor("DAPO 7B-Math, 128 x H20", "7b", _VERL_7B_H20, "h20", 16, 1000, (40 * 3600 + 48 * 60) / 400,
           _VERL_7B_SRC + ": 1d16h48m (timing_s/step 356)", "mean response 1,000 assumed (Qwen2.5-Math-7B)"),
)

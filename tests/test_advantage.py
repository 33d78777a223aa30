"""dapo.advantage.group_advantages equals verl 0.9.1's compute_grpo_outcome_advantage (GRPO, paper eq. 9)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import torch

from dapo.advantage import group_advantages, group_index, token_advantages

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl 0.9.1 is the reference implementation")


def verl_grpo(scores: torch.Tensor, ids, norm_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """verl's advantage of each response (outcome reward on the last token; the value is broadcast over tokens)."""
    t = 4
    rewards = torch.zeros(len(scores), t, dtype=scores.dtype)
    rewards[:, -1] = scores
    mask = torch.ones(len(scores), t)
    adv, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, np.asarray(ids, dtype=object), epsilon=eps,
                                                       norm_adv_by_std_in_grpo=norm_by_std)  # fmt: skip
    return adv[:, 0]


def random_groups(seed: int):
    """Groups of 1..6 responses with DAPO-like rewards (±1 plus overlong penalties), shuffled uuid ids."""
    rng = np.random.default_rng(seed)
    ids, scores = [], []
    for _ in range(12):
        gid = str(uuid.UUID(int=int(rng.integers(0, 2**63))))
        size = int(rng.integers(1, 7))
        ids += [gid] * size
        scores += list(rng.choice([-1.0, 1.0], size) - rng.choice([0.0, 0.0, 0.25, 0.7], size))
    order = rng.permutation(len(ids))  # groups need not be contiguous
    return [ids[i] for i in order], np.asarray(scores)[order]


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_group_advantages_equal_verl_grpo(seed, norm_by_std):
    ids, scores = random_groups(seed)
    ref = verl_grpo(torch.tensor(scores, dtype=torch.float32), ids, norm_by_std).numpy()
    ours_np = group_advantages(scores, ids, norm_by_std=norm_by_std)
    ours_t = group_advantages(torch.tensor(scores, dtype=torch.float32), ids, norm_by_std=norm_by_std)
    np.testing.assert_allclose(ours_np, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours_t.numpy(), ref, rtol=1e-5, atol=1e-6)


def test_integer_group_ids_and_singletons_equal_verl():
    ids = [0, 0, 0, 1, 2, 2]
    scores = torch.tensor([1.0, -1.0, -1.0, 0.75, 1.0, 1.0], dtype=torch.float64)
    ref = verl_grpo(scores, ids)
    ours = group_advantages(scores, ids)
    torch.testing.assert_close(ours, ref)
    assert float(ours[3]) == pytest.approx(0.75 / (1 + 1e-6))  # a group of one: mean 0, std 1
    assert float(ours[4]) == 0.0 and float(ours[5]) == 0.0  # an all-equal group carries no signal


def test_return_kind_follows_input():
    ids = ["a", "a", "b", "b"]
    assert isinstance(group_advantages(np.array([1.0, 0.0, 1.0, 1.0], dtype=np.float32), ids), np.ndarray)
    assert group_advantages(np.array([1.0, 0.0, 1.0, 1.0], dtype=np.float32), ids).dtype == np.float32
    assert isinstance(group_advantages([1, 0, 1, 1], ids), np.ndarray)
    t = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.bfloat16), ids)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16
    assert group_advantages(torch.tensor([1, 0, 1, 1]), ids).dtype == torch.float32


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="group_ids has 3"):
        group_advantages(np.zeros(4), ["a", "a", "b"])
    with pytest.raises(ValueError, match="position 1"):
        group_advantages(np.array([0.0, np.nan]), ["a", "a"])
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(np.zeros((2, 2)), ["a", "b"])
    with pytest.raises(TypeError, match="position 0"):
        group_index([["unhashable"]])


def test_group_index_is_dense_in_order_of_first_appearance():
    inverse, k = group_index(np.array(["z", "a", "z", "m"]))
    assert k == 3 and inverse.tolist() == [0, 1, 0, 2]


def test_token_advantages_broadcast_over_the_response_mask():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = token_advantages(np.array([0.5, -2.0]), mask)
    assert out.tolist() == [[0.5, 0.5, 0.0], [-2.0, 0.0, 0.0]]

"""Health guards on constructed metric streams, and one end-to-end stop (checkpoint + exit code 3)."""

from __future__ import annotations

import pytest

from dapo.config import HealthConfig, load_preset
from dapo.train.health import EXIT_HEALTH_STOP, HealthGuard
from dapo.train.loop import DAPOLoop
from loop_support import ScriptedBackend, make_rows


def _feed(guard, stream):
    return [(step, e) for step, m in enumerate(stream, start=1) for e in guard.observe(step, m)]


def test_entropy_collapse_fires_after_patience_consecutive_low_steps_and_rearms():
    g = HealthGuard(HealthConfig(entropy_min=0.1, patience=3))
    low, ok = {"actor/entropy": 0.05}, {"actor/entropy": 0.5}
    events = _feed(g, [low, low, ok, low, low, low, low, ok, low, low, low])
    assert [s for s, _ in events] == [6, 11]  # streak broken at step 3; one warning per episode; re-armed at step 8
    assert all(e.guard == "entropy_collapse" and not e.stop for _, e in events)
    assert "clip_ratio_high" in events[0][1].message


def test_sampler_starving_uses_max_num_gen_batches_or_the_fallback_limit():
    g = HealthGuard(HealthConfig(patience=2), max_num_gen_batches=4)
    events = _feed(g, [{"train/num_gen_batches": 4.0}, {"train/num_gen_batches": 3.0}, {"train/num_gen_batches": 4.0},
                       {"train/num_gen_batches": 4.0}])  # fmt: skip
    assert [(s, e.guard) for s, e in events] == [(4, "sampler_starving")]
    assert "gen_batch_size" in events[0][1].message
    unlimited = HealthGuard(HealthConfig(patience=1, starving_gen_batches=7), max_num_gen_batches=0)
    assert _feed(unlimited, [{"train/num_gen_batches": 6.0}]) == []
    assert len(_feed(unlimited, [{"train/num_gen_batches": 7.0}])) == 1
    off = HealthGuard(HealthConfig(patience=1), max_num_gen_batches=1, filter_enabled=False)
    assert _feed(off, [{"train/num_gen_batches": 1.0}]) == []


def test_length_clip_fires_when_responses_pile_up_at_the_cap():
    g = HealthGuard(HealthConfig(clip_ratio_max=0.2, patience=2, stop_on=["length_clip"]), max_response_length=32)
    events = _feed(g, [{"response_length/clip_ratio": 0.5}, {"response_length/clip_ratio": 0.25}])
    assert len(events) == 1 and events[0][1].stop and events[0][1].guard == "length_clip"
    assert "max_response_length=32" in events[0][1].message
    assert _feed(HealthGuard(HealthConfig(patience=1)), [{"response_length/clip_ratio": 0.2}]) == []  # not above


def test_guard_state_survives_a_resume():
    a = HealthGuard(HealthConfig(entropy_min=0.1, patience=3))
    _feed(a, [{"actor/entropy": 0.0}] * 2)
    b = HealthGuard(HealthConfig(entropy_min=0.1, patience=3))
    b.load_state_dict(a.state_dict())
    assert len(b.observe(3, {"actor/entropy": 0.0})) == 1


def test_unknown_guard_names_are_rejected():
    with pytest.raises(ValueError, match="unknown guards"):
        HealthGuard(HealthConfig(stop_on=["entropy"]))


def test_entropy_collapse_with_stop_on_checkpoints_and_exits_3(tmp_path, capsys):
    preset = load_preset("tiny", [
        "recipe.data.train_batch_size=2", "recipe.data.gen_batch_size=4", "recipe.rollout.n=4",
        "recipe.actor.ppo_mini_batch_size=1", "recipe.trainer.logger=[console]",
        "recipe.trainer.total_training_steps=10", "recipe.trainer.save_freq=0", "recipe.trainer.test_freq=0",
        "recipe.trainer.val_before_train=false", "recipe.filter_groups.max_num_gen_batches=0",
        "recipe.trainer.health.entropy_min=0.05", "recipe.trainer.health.patience=3",
        "recipe.trainer.health.stop_on=[entropy_collapse]",
    ])  # fmt: skip
    backend = ScriptedBackend(entropy=0.001)
    logs = []
    loop = DAPOLoop(preset, backend, make_rows([0.5] * 40), [], tmp_path, progress=False, log=logs.append)
    assert loop.fit() == EXIT_HEALTH_STOP
    assert loop.step == 3 and len(backend.updates) == 3
    assert (tmp_path / "checkpoints" / "global_step_3" / "COMPLETE").exists()
    assert any(line.startswith("HEALTH STOP: entropy collapse") for line in logs)
    assert any("exit code 3" in line for line in logs)

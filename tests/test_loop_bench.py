"""`dapo bench ablation`: the ladder is the paper's (one change per rung, ending at the DAPO recipe = the tiny
preset), and the table counts steps and samples to a target from the validation curve."""

from __future__ import annotations

from dapo.bench.ablation import LADDER, _first_reach, ablation_table
from dapo.config import load_preset


def _settings(overrides):
    return _settings_of("tiny", overrides)


def _settings_of(preset, overrides):
    p = load_preset(preset, overrides)
    r = p.recipe
    return {
        "clip_ratio_high": r.actor.clip_ratio_high,
        "loss_agg_mode": r.actor.loss_agg_mode,
        "overlong_buffer": r.reward.overlong_buffer.enable,
        "overlong_filter": r.reward.overlong_filter,
        "dynamic_sampling": r.filter_groups.enable,
        "sampler_mode": r.filter_groups.mode,
    }


def test_ladder_changes_one_thing_per_rung_and_ends_at_the_tiny_preset():
    rungs = [_settings(o) for _, o in LADDER]
    assert rungs[0] == {"clip_ratio_high": 0.2, "loss_agg_mode": "seq-mean-token-mean", "overlong_buffer": False,
                        "overlong_filter": False, "dynamic_sampling": False, "sampler_mode": "reference"}  # fmt: skip
    changed = [{k for k in a if a[k] != b[k]} for a, b in zip(rungs, rungs[1:])]
    assert changed == [
        {"overlong_filter"},
        {"clip_ratio_high"},
        {"overlong_buffer", "overlong_filter"},  # the soft punishment replaces filtering, as in the DAPO recipe
        {"loss_agg_mode"},
        {"dynamic_sampling"},
        {"sampler_mode"},  # DAPO + carry (off-paper)
    ]
    assert LADDER[-2][0] == "+ dynamic sampling (DAPO)"
    assert rungs[-2] == _settings([])  # the DAPO rung is the tiny preset itself
    assert rungs[-2] == _settings_of("tiny-long", LADDER[-2][1]) and _settings_of("tiny-long", []) == rungs[-2]


def test_table_counts_steps_and_samples_to_each_target():
    runs = [
        {"curve": [(0, 0.6, 0.0), (5, 0.91, 640.0), (10, 0.96, 1280.0)], "val_acc_before": 0.6, "val_acc_after": 0.96,
         "train_acc_last10": 0.9, "cpu_seconds": 100.0},
        {"curve": [(0, 0.6, 0.0), (5, 0.97, 900.0), (10, 0.95, 1700.0)], "val_acc_before": 0.6, "val_acc_after": 0.95,
         "train_acc_last10": 0.92, "cpu_seconds": 120.0},
    ]  # fmt: skip
    assert _first_reach(runs[0]["curve"], 0.95) == (10, 1280.0)
    assert _first_reach(runs[0]["curve"], 0.99) == (None, None)
    table = ablation_table({"rung": runs}, [0.95, 0.99])
    row = table.splitlines()[-1]
    assert row.startswith("| rung | 7.5 | not reached | 1090 | not reached | 0.600 | 0.955 ± 0.005 | 0.955 ± 0.005 | "
                          "0.910 ± 0.010 |")


def test_bench_verl_fit_is_a_bench_command_and_refuses_a_round_with_no_measured_step(capsys):
    """`dapo bench verl-fit` drops the first step of every round as warm-up: one step a round would measure nothing,
    so it is refused before any environment is touched."""
    import pytest

    from dapo.bench.cli import main

    assert main([]) == 2 and "verl-fit" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"--steps >= 2"):
        main(["verl-fit", "--steps", "1"])

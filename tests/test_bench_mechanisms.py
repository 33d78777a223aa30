"""`dapo bench mechanisms`: each rung turns off exactly its mechanism (the DAPO rung is the tiny-mech preset, naive
GRPO turns off all four), the preconditions and effect sizes are computed as documented, and the one command runs a
2-step rung pair end to end, writes its report and figures, and reuses its cached runs (the wiring, not the
science)."""

from __future__ import annotations

import json

import numpy as np

from dapo.bench.mech_report import effect
from dapo.bench.mechanisms import MECHANISMS, RUNGS, cmd_mechanisms
from dapo.bench.precondition import rollout_preconditions
from dapo.config import load_preset

def _settings_of(preset, overrides):
    r = load_preset(preset, overrides).recipe
    return {"clip_ratio_high": r.actor.clip_ratio_high, "loss_agg_mode": r.actor.loss_agg_mode,
            "overlong_buffer": r.reward.overlong_buffer.enable, "overlong_filter": r.reward.overlong_filter,
            "dynamic_sampling": r.filter_groups.enable}  # fmt: skip


OFF = {"clip-higher": {"clip_ratio_high"}, "token-level loss": {"loss_agg_mode"},
       "overlong shaping": {"overlong_buffer"}, "dynamic sampling": {"dynamic_sampling"}}  # fmt: skip


def test_each_rung_turns_off_exactly_its_mechanism_and_naive_grpo_all_four():
    dapo = _settings_of("tiny-mech", RUNGS["DAPO"])
    assert dapo == _settings_of("tiny-mech", []) and dapo["clip_ratio_high"] == 0.28 and dapo["dynamic_sampling"]
    assert dapo["loss_agg_mode"] == "token-mean" and dapo["overlong_buffer"] and not dapo["overlong_filter"]
    for mech, spec in MECHANISMS.items():
        rung = _settings_of("tiny-mech", RUNGS[spec["without"]])
        assert {k for k in dapo if dapo[k] != rung[k]} == OFF[mech], mech
    naive = _settings_of("tiny-mech", RUNGS["naive GRPO"])
    assert {k for k in dapo if dapo[k] != naive[k]} == set().union(*OFF.values())


def test_preconditions_from_one_scored_rollout():
    lengths = [10, 10, 40, 40, 10, 10, 10, 10]
    acc = [True, True, False, False, True, True, True, True]
    pre = rollout_preconditions(lengths, acc, [False, False, True, True] + [False] * 4, [0, 0, 0, 0, 1, 1, 1, 1])
    assert pre["cap_share"] == 0.25 and pre["long_wrong_share"] == 1.0 and pre["acc"] == 0.75
    assert pre["uniform_group_share"] == 0.5  # group 1 all correct, group 0 mixed
    assert abs(pre["length_cv"] - np.std(lengths) / np.mean(lengths)) < 1e-12


def test_effect_size_is_in_seed_standard_deviations_with_the_documented_verdicts():
    e = effect([1.0, 1.2, 1.4], [0.0, 0.2, 0.4], +1)
    assert abs(e["d"] - 1.0 / 0.2) < 1e-9 and e["verdict"] == "yes"
    assert effect([1.0, 1.2, 1.4], [0.0, 0.2, 0.4], -1)["verdict"] == "opposite"
    assert effect([0.1, 0.3, 0.5], [0.0, 0.2, 0.4], +1)["verdict"] == "same direction, within noise"


def _with_d(d: float) -> list[float]:
    """Seed values whose effect against [0, 1, 2] is exactly ``d`` (both seed sds 1, so the pooled sd is 1)."""
    return [d, d + 1.0, d + 2.0]


def test_the_verdict_threshold_is_two_seed_standard_deviations_on_both_sides():
    """|d| >= 2 is "yes", below it "within noise", for either sign of the paper's effect: a threshold of 1 would turn
    docs/ablation.md's d = -1.1 and +1.1 verdicts into "yes", and one of 3 would call d = 2.5 "within noise"."""
    base = [0.0, 1.0, 2.0]
    for d, sign, verdict in [
        (1.5, +1, "same direction, within noise"), (1.1, +1, "same direction, within noise"),
        (1.99, +1, "same direction, within noise"), (2.0, +1, "yes"), (2.5, +1, "yes"),
        (-1.5, -1, "same direction, within noise"), (-1.1, -1, "same direction, within noise"),
        (-2.0, -1, "yes"), (-2.5, -1, "yes"), (2.5, -1, "opposite"), (-2.5, +1, "opposite"),
    ]:  # fmt: skip
        e = effect(_with_d(d), base, sign)
        assert abs(e["d"] - d) < 1e-12, (d, e["d"])
        assert e["verdict"] == verdict, (d, sign, e["verdict"])


SMALL = [
    "local.model.hidden_size=64", "local.model.num_hidden_layers=1", "local.model.num_attention_heads=2",
    "local.model.num_key_value_heads=2", "local.model.intermediate_size=128", "local.task.n_train=200",
    "local.task.n_val=8", "local.warm_start.steps=2", "recipe.data.train_batch_size=2", "recipe.data.gen_batch_size=3",
    "recipe.rollout.n=2", "recipe.actor.ppo_mini_batch_size=1", "recipe.trainer.total_training_steps=2",
    "recipe.trainer.test_freq=1", "recipe.data.max_response_length=8", "recipe.reward.overlong_buffer.len=2",
    "recipe.rollout.val.n=1", "placement.device=cpu",
    # an untrained policy gets every answer wrong: dynamic sampling would find no mixed group (wiring, not science)
    "recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=null",
]  # fmt: skip


def test_one_command_runs_a_two_step_rung_pair_writes_the_report_and_reuses_cached_runs(tmp_path, capsys):
    out = tmp_path / "bench"
    argv = ["--rungs", "DAPO,DAPO - clip-higher", "--seeds", "1,2", "--threads", "1", "--probe-prompts", "4",
            "--out", str(out)] + SMALL  # fmt: skip
    assert cmd_mechanisms(argv) == 0
    pre = json.loads((out / "preconditions.json").read_text())
    assert pre["responses"] == 8 and 0 <= pre["uniform_group_share"] <= 1
    text = (out / "mechanisms.md").read_text()
    assert "| clip-higher |" in text and "mech-clip-higher.png" in text and "| token-level loss |" in text
    assert (out / "mech-clip-higher.png").stat().st_size > 0
    report = json.loads((out / "mechanisms.json").read_text())
    assert [len(report["runs"][k]) for k in ("DAPO", "DAPO - clip-higher")] == [2, 2]
    assert all(r["exit_code"] == 0 for runs in report["runs"].values() for r in runs)
    assert all(len([s for s, a, _ in r["curve"] if a is not None]) == 3 for r in report["runs"]["DAPO"])
    done = sorted(out.glob("*/seed*/bench_result.json"))
    assert len(done) == 4
    stamps = [p.stat().st_mtime_ns for p in done]
    capsys.readouterr()
    assert cmd_mechanisms(argv) == 0  # cached: no run is redone
    assert [p.stat().st_mtime_ns for p in done] == stamps
    assert "s wall" not in "".join(line for line in capsys.readouterr().out.splitlines() if "seed" in line)


def test_headline_target_is_naive_grpos_level_at_steps_20_to_24_and_counts_steps_and_responses():
    from dapo.bench.mech_report import headline

    def run(accs, per_step):
        return {"curve": [(s, a, s * per_step) for s, a in zip(range(0, 2 * len(accs), 2), accs)]}

    naive = [run([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.6, 0.6, 0.6, 0.7, 0.7, 0.7, 0.7], 128)] * 2
    dapo = [run([0.1, 0.4, 0.6, 0.7, 0.8] + [0.8] * 8, 400), run([0.1, 0.3, 0.5, 0.7, 0.8] + [0.8] * 8, 400)]
    hl = headline({"naive GRPO": naive, "DAPO": dapo}, (20, 24))
    assert abs(hl["target"] - 0.7) < 1e-12  # naive's validations at steps 20, 22, 24
    assert hl["naive GRPO"]["steps"] == [18.0, 18.0] and hl["DAPO"]["steps"] == [6.0, 6.0]
    assert abs(hl["ratio_steps"] - 6 / 18) < 1e-12 and abs(hl["ratio_samples"] - (6 * 400) / (18 * 128)) < 1e-12

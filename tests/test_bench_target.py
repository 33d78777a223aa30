"""The steps-to-target measure of `dapo bench mechanisms` (dapo.bench.target): the target from naive GRPO's final
gain and the warm start's validation noise, smoothed crossings, the ratio's bootstrap interval over seeds and the
verdict against <= 0.5x."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dapo.bench.target import headline, ratio_interval, ratio_verdict, smoothed, steps_to_target, target_rule


def _curve(accs: list[float], per_step: float = 100.0) -> list[tuple]:
    return [(s, a, s * per_step) for s, a in enumerate(accs)]


def test_a_single_noisy_validation_does_not_reach_the_target_the_smoothed_curve_must():
    c = _curve([0.10, 0.10, 0.30, 0.10, 0.10, 0.22, 0.22, 0.22, 0.22])
    sm = dict(smoothed(c))
    assert sm[2] == pytest.approx(0.5 / 3) and sm[5] == pytest.approx(0.54 / 3) and sm[8] == pytest.approx(0.22)
    # the spike at step 2 crosses 0.2 alone; the centred mean of 3 validations first does at step 6
    assert steps_to_target(c, 0.2) == (6, 600.0)
    assert steps_to_target(c, 0.2, width=1) == (2, 200.0)
    assert steps_to_target(c, 0.5) == (None, None)


def test_the_target_is_a_fraction_of_naive_grpos_final_gain_and_must_clear_the_validation_noise():
    naive = [_curve([0.10] + [0.20] * 9 + [0.30] * 5), _curve([0.12] + [0.20] * 9 + [0.30] * 5)]
    dapo = [_curve([0.08] + [0.40] * 14), _curve([0.10] + [0.40] * 14)]
    r = target_rule(naive, naive + dapo, n_problems=100)
    assert r["a0"] == pytest.approx(0.10) and r["sigma_val"] == pytest.approx(np.std([.1, .12, .08, .1], ddof=1))
    assert r["gain"] == pytest.approx(0.20) and r["target"] == pytest.approx(0.20)
    assert r["se_set"] == pytest.approx(math.sqrt(0.1 * 0.9 / 100))
    assert r["decidable"] and r["margin_sd"] == pytest.approx(0.1 / (r["sigma_val"] / math.sqrt(3)))
    noisy = [_curve([0.10] + [0.2] * 14), _curve([0.20] + [0.2] * 14), _curve([0.0] + [0.2] * 14)]
    assert not target_rule(noisy, noisy, 100)["decidable"]  # gain 0.1 -> 0.05 above a0, sd of step 0 0.1


def test_the_ratio_interval_is_a_bootstrap_over_seeds_and_the_verdict_uses_its_upper_end():
    ratio, lo, hi = ratio_interval([4, 4, 4], [10, 10, 10])
    assert (ratio, lo, hi) == (0.4, 0.4, 0.4)
    ratio, lo, hi = ratio_interval([3, 5, 7], [10, 12, 14])
    assert ratio == pytest.approx(5 / 12) and lo < ratio < hi and lo >= 3 / 14 and hi <= 7 / 10
    assert ratio_interval([3, 5, 7], [10, 12, 14]) == (ratio, lo, hi)  # seeded
    assert ratio_verdict(0.4, 0.45) == "meets <= 0.5x"
    assert ratio_verdict(0.4, 0.7).startswith("meets <= 0.5x at the point estimate only")
    assert ratio_verdict(0.62, 0.9) == "misses 0.5x by 0.12x"
    with pytest.raises(ValueError):
        ratio_interval([], [1])


def test_headline_reports_each_seed_group_apart_and_counts_a_miss_as_past_the_run():
    naive = {s: _curve([0.1] + [0.1 + 0.02 * k for k in range(1, 25)]) for s in (1, 2, 7)}  # 0.58 at 24
    dapo = {1: _curve([0.1] + [0.5] * 24), 2: _curve([0.1] + [0.5] * 24), 7: _curve([0.1] * 25)}
    hl = headline(dapo, naive, n_problems=128, total_steps=24, groups={"pre": [1, 2], "held": [7], "all": [1, 2, 7]})
    t = hl["rule"]["target"]
    assert t == pytest.approx(0.1 + 0.5 * (np.mean([0.1 + 0.02 * k for k in range(20, 25)]) - 0.1))
    pre, held = hl["groups"]["pre"], hl["groups"]["held"]
    assert pre["DAPO"]["steps"] == [1, 1] and pre["naive GRPO"]["reached"] == 2
    assert held["DAPO"]["steps"] == [None] and held["DAPO"]["reached"] == 0
    n7 = held["naive GRPO"]["steps"][0]
    assert held["ratio"] == pytest.approx(25 / n7)  # the miss counts as step 25, a lower bound
    assert hl["groups"]["all"]["seeds"] == [1, 2, 7] and pre["verdict"] == "meets <= 0.5x"


def test_a_seed_group_short_of_its_seeds_gets_its_ratio_but_no_verdict():
    """DAPO reaching the target at step 1 against naive GRPO's ~12 would "meet <= 0.5x"; with naive GRPO's seed 3
    unfinished the pre-registered group reports its ratio over seeds 1, 2 and "2 of 3 seeds, no verdict"."""
    naive = {s: _curve([0.1] + [0.1 + 0.02 * k for k in range(1, 25)]) for s in (1, 2)}
    dapo = {s: _curve([0.1] + [0.5] * 24) for s in (1, 2, 3)}
    hl = headline(dapo, naive, n_problems=128, total_steps=24, groups={"pre": [1, 2, 3]})
    g = hl["groups"]["pre"]
    assert g["seeds"] == [1, 2] and g["ratio"] < 0.5 and g["hi"] < 0.5
    assert g["verdict"] == "2 of 3 seeds, no verdict"


def test_a_target_inside_the_validation_noise_gets_the_ratio_but_no_verdict():
    """naive GRPO that barely moves (step-0 validations 0.005 apart, gain about as large) puts the target inside the
    noise: the ratio is still reported, but the rule gives no verdict ("meets" / "misses") on an undecidable target."""
    naive = {s: _curve([0.065 + 0.005 * (s % 2)] + [0.07] * 24) for s in (1, 2, 3)}
    dapo = {s: _curve([0.065 + 0.005 * (s % 2)] + [0.30] * 24) for s in (1, 2, 3)}
    hl = headline(dapo, naive, n_problems=128, total_steps=24, groups={"pre": [1, 2, 3]})
    assert not hl["rule"]["decidable"]
    g = hl["groups"]["pre"]
    assert g["ratio"] == pytest.approx(np.mean(g["DAPO"]["steps"]) / np.mean(g["naive GRPO"]["steps"]))
    assert g["verdict"] == "target not decidable (within validation noise), no verdict"


def test_each_headline_is_reported_on_its_own_task_with_its_own_target_steps_and_figure(tmp_path):
    """Two headlines (tiny-mech, 24 steps; tiny-long, 30 steps) in one report: each gets its own target from its own
    naive GRPO runs, its own section and figure, and a run that never reaches its target counts as its own task's
    steps + 1."""
    from dapo.bench.mech_report import write_report
    from dapo.bench.mechanisms import HEADLINES

    def run(accs: list[float]) -> dict:
        return {"curve": _curve(accs), "run_dir": str(tmp_path / "none"), "val_acc_after": accs[-1]}

    flat_mech = [0.07] + [0.075] * 24  # naive GRPO barely moves: not decidable
    results = {("tiny-mech", "DAPO"): {s: run([0.05 + 0.01 * s] + [0.09] * 24) for s in (1, 2, 3)},
               ("tiny-mech", "naive GRPO"): {s: run(flat_mech) for s in (1, 2, 3)},
               ("tiny-long", "DAPO"): {s: run([0.30 + 0.01 * s] + [0.30] * 30) for s in (1, 2, 3)},
               ("tiny-long", "naive GRPO"): {s: run([0.30 + 0.01 * s] + [0.30 + 0.02 * k for k in range(1, 31)])
                                             for s in (1, 2, 3)}}  # fmt: skip
    text = write_report(results, {}, tmp_path, "meta", {"pre-registered": [1, 2, 3]}, {}, HEADLINES)
    report = __import__("json").loads((tmp_path / "mechanisms.json").read_text())
    mech, long = report["headlines"]["headline"], report["headlines"]["headline-long"]
    assert mech["preset"] == "tiny-mech" and not mech["rule"]["decidable"]
    assert long["preset"] == "tiny-long" and long["rule"]["decidable"]
    assert long["rule"]["target"] == pytest.approx(0.32 + 0.5 * (np.mean([0.30 + 0.02 * k for k in range(26, 31)])
                                                                 - 0.32))  # a0: every run's step 0, 0.32
    g = long["groups"]["pre-registered"]
    assert g["DAPO"]["reached"] == 0 and g["ratio"] > 1  # DAPO flat at 0.30 never reaches it: counted as 31
    assert g["ratio"] == pytest.approx(31 / np.mean(g["naive GRPO"]["steps"]))
    assert g["verdict"].startswith("misses 0.5x")
    assert "headline (tiny-mech) target" in text and "headline-long (tiny-long) target" in text
    assert (tmp_path / "mech-headline.png").stat().st_size > 0 and (tmp_path / "mech-headline-long.png").stat().st_size

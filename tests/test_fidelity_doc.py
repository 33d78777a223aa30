"""docs/fidelity.md is generated from the presets and the reference values, and is fresh."""

from __future__ import annotations

import importlib.util

import pytest

from conftest import ROOT

pytest.importorskip("verl")


def _gen():
    spec = importlib.util.spec_from_file_location("gen_fidelity", ROOT / "scripts" / "gen_fidelity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fidelity_doc_is_fresh():
    gen = _gen()
    text = gen.render()
    assert (ROOT / "docs" / "fidelity.md").read_text() == text, "stale: run python scripts/gen_fidelity.py"


def test_every_reference_key_is_in_the_doc_and_only_documented_deviations_differ():
    gen = _gen()
    for name in gen.PRESETS:
        rows, _ = gen.compare(name)
        assert {r["raw_key"] for r in rows} == set(gen.SCRIPTS[name][1]) | set(gen.REFERENCE_DEFAULTS)
        # full stops at the paper's ~320 rollout steps; early keeps the reference's one epoch
        expected = set(gen.DEVIATIONS) - ({"trainer.total_training_steps"} if name == "early" else set())
        assert {r["raw_key"] for r in rows if r["status"] == "deviation"} == expected


def test_an_undocumented_difference_fails_the_generator(monkeypatch):
    gen = _gen()
    monkeypatch.setitem(gen.SCRIPTS["full"][1], "actor_rollout_ref.actor.clip_ratio_high", 0.2)
    with pytest.raises(SystemExit, match="clip_ratio_high.*no reason"):
        gen.compare("full")

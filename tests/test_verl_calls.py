"""The call recorder the CPU e2e and `dapo bench verl-fit --record-calls` share (dapo.bench.verl_calls): what it
records on a trainer, how the order is normalised, and which orders break the GPU-memory protocol."""

from __future__ import annotations

from types import SimpleNamespace

from dapo.bench.verl_calls import CallRecorder, canonical, order_violations, split_steps


def _trainer(log: list):
    def f(name):
        return lambda *a, **k: log.append(name)

    return SimpleNamespace(
        checkpoint_manager=SimpleNamespace(update_weights=f("uw"), sleep_replicas=f("sleep"), wake_up_replicas=f("wake")),
        async_rollout_manager=SimpleNamespace(generate_sequences=f("gen")),
        actor_rollout_wg=SimpleNamespace(save_checkpoint=f("save"), load_checkpoint=f("load")),
        _compute_old_log_prob=f("lp"), _compute_ref_log_prob=f("ref"), _update_actor=f("upd"),
    )


def _batch(validate: bool):
    return SimpleNamespace(meta_info={"validate": validate})


def test_the_recorder_wraps_the_calls_keeps_their_effect_and_notes_the_replicas_state():
    inner: list = []
    sunk: list = []
    t = _trainer(inner)
    rec = CallRecorder(t, sink=sunk.append)
    t.checkpoint_manager.update_weights(0)
    t.async_rollout_manager.generate_sequences(_batch(True))
    t.async_rollout_manager.generate_sequences(_batch(False))
    t.async_rollout_manager.generate_sequences(_batch(False))  # a second generation batch (dynamic sampling)
    t.checkpoint_manager.sleep_replicas()
    t.checkpoint_manager.sleep_replicas()  # no-op: already asleep
    t._compute_old_log_prob(None)
    t._update_actor(None)
    with rec.paused():
        t.actor_rollout_wg.save_checkpoint("probe")  # not the run's
    t.actor_rollout_wg.save_checkpoint("x")
    t.checkpoint_manager.update_weights(1)
    assert inner == ["uw", "gen", "gen", "gen", "sleep", "sleep", "lp", "upd", "save", "save", "uw"]
    assert [e["call"] for e in sunk] == [e["call"] for e in rec.events] and all(e["seconds"] >= 0 for e in sunk)
    assert rec.violations == []
    calls = canonical(rec.events)
    assert calls == ["update_weights", "validate", "generate", "sleep", "old_log_prob", "update", "save",
                     "update_weights"]
    assert split_steps(calls) == (["update_weights", "validate"],
                                  [["generate", "sleep", "old_log_prob", "update", "save", "update_weights"]])


def test_generation_asleep_sync_awake_and_actor_passes_awake_are_violations():
    ev = [{"call": c} for c in ("generate", "update_weights", "update_weights", "old_log_prob", "sleep", "save")]
    v = order_violations(ev)
    assert len(v) == 3 and "generate while the replicas are asleep" in v[0]
    assert "update_weights while the replicas are awake" in v[1] and "old_log_prob while" in v[2]

"""How an attempt ends on purpose (dapo.train.ending): which values count as non-finite, the volume's shortfall, the
end record of a crash naming the node the error names, and a verdict's refusal."""

from __future__ import annotations

import math
import shutil
from collections import namedtuple

from dapo.train import attempts
from dapo.train.ending import NONFINITE_REWARDS, AttemptEnd, nonfinite, space_shortfall


def test_nonfinite_names_each_bad_check_and_ignores_absent_keys():
    assert nonfinite({"actor/pg_loss": 0.1, "actor/grad_norm": 3.0}) == {}
    bad = nonfinite({"actor/pg_loss": float("nan"), "actor/grad_norm": float("inf"), "actor/entropy": 1.0,
                     NONFINITE_REWARDS: 2.0, "critic/score/mean": float("nan")})
    assert set(bad) == {"actor/pg_loss", "actor/grad_norm", NONFINITE_REWARDS}
    assert math.isnan(bad["actor/pg_loss"]) and bad[NONFINITE_REWARDS] == 2.0


def test_space_shortfall_counts_what_retention_frees_first(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(100 << 30, 90 << 30, 10 << 30))
    assert space_shortfall(tmp_path, 9 << 30) is None
    short = space_shortfall(tmp_path, 12 << 30)
    assert "10.00 GiB free" in short and "12.60 GiB" in short  # the 5 % margin
    assert space_shortfall(tmp_path, 12 << 30, reclaimable=4 << 30) is None
    assert space_shortfall(tmp_path / "not" / "yet", 1 << 20) is None  # sized on the nearest existing parent


class _Ranks:
    def node_of(self, pid):
        return attempts.node_entry("gpu-node-11", why="", pod="dapo-train-worker-7", rank=5) if pid == 4242 else None


def test_a_crash_names_the_node_of_the_dead_worker(tmp_path):
    end = AttemptEnd(tmp_path, 3, "k", log=lambda m: None)
    end.attach(_Ranks(), lambda: 41)
    exc = RuntimeError("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
                       "\tclass_name: WorkerDict\n\tactor_id: 3f1a\n\tpid: 4242\n\tip: 10.1.2.3\n"
                       "The actor is dead because its worker process has died.")
    end.crashed(exc)
    rec = attempts.read_end(tmp_path / "logs", 3)
    assert rec["cause"] == "error" and rec["exit_code"] == 1 and rec["step"] == 42 and not rec["final"]
    (node,) = rec["nodes"]
    assert node["node"] == "gpu-node-11" and node["rank"] == 5 and node["ip"] == "10.1.2.3"
    assert node["why"].startswith("named by the error that ended the attempt: RuntimeError")


def test_a_verdict_for_this_preset_refuses_the_attempt_and_another_preset_does_not(tmp_path):
    first = AttemptEnd(tmp_path, 1, "key-a", log=lambda m: None)
    assert first.refuse_on_verdict() is None
    assert first.finish("health_stop", "entropy collapse", step=9, final=True) == attempts.EXIT_HEALTH_STOP
    said = []
    again = AttemptEnd(tmp_path, 2, "key-a", log=said.append)
    assert again.refuse_on_verdict() == attempts.EXIT_VERDICT and "stopped for good at step 9" in said[0]
    assert attempts.read_end(tmp_path / "logs", 2)["final"] is True
    assert attempts.read_verdict(tmp_path)["attempt"] == 1 and attempts.read_verdict(tmp_path)["cause"] == "health_stop"
    assert AttemptEnd(tmp_path, 3, "key-b", log=lambda m: None).refuse_on_verdict() is None

"""Generation dumps (trainer.rollout_data_dir / validation_data_dir / log_val_generations) in verl 0.9.1's formats,
compared with verl's own RayPPOTrainer methods, and written by the loop on both backends' behalf."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest

from dapo.train.generations import dump_generations, pick_val_generations
from loop_support import ScriptedBackend, make_rows

ray_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer", reason="verl 0.9.1 is the reference")


def _sample(n: int = 7):
    inputs = [f"problem {i % 4} text" for i in range(n)]
    outputs = [f"Answer: {i}" for i in range(n)]
    gts = [str(i % 3) for i in range(n)]
    rewards = [float(i % 2) - 0.25 * i for i in range(n)]
    extra = {"score": np.asarray([1.0 if i % 2 else -1.0 for i in range(n)]), "acc": np.asarray([i % 2 == 1 for i in
             range(n)]), "pred": [str(i) for i in range(n)], "short": [1, 2]}  # fmt: skip
    return inputs, outputs, gts, rewards, extra


def test_dump_generations_writes_exactly_what_verls_write_generations_writes(tmp_path):
    inputs, outputs, gts, rewards, extra = _sample()
    ours = dump_generations(tmp_path / "ours", 3, inputs, outputs, gts, rewards, extra)
    verl_extra = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in extra.items()}
    ray_trainer.RayPPOTrainer._write_generations(inputs, outputs, gts, rewards, verl_extra, str(tmp_path / "verl"), 3)
    theirs = tmp_path / "verl" / "3.jsonl"
    assert [json.loads(x) for x in open(ours)] == [json.loads(x) for x in open(theirs)]
    first = json.loads(open(ours).readline())
    assert first["score"] == -1.0 and first["step"] == 3 and "short" not in first  # verl's override / length rules


@pytest.mark.parametrize("n", [0, 3, 50])
def test_pick_val_generations_chooses_the_samples_verl_logs(n):
    inputs, outputs, _, rewards, _ = _sample(12)
    logged = []
    fake = types.SimpleNamespace(
        config=types.SimpleNamespace(trainer=types.SimpleNamespace(log_val_generations=n, logger=["console"])),
        validation_generations_logger=types.SimpleNamespace(log=lambda loggers, samples, step: logged.append(samples)),
        global_steps=5,
    )
    ray_trainer.RayPPOTrainer._maybe_log_val_generations(fake, inputs, outputs, rewards)
    assert pick_val_generations(inputs, outputs, rewards, n) == (logged[0] if logged else [])


def test_the_loop_dumps_training_and_validation_generations_per_step(tmp_path):
    from dapo.config import load_preset
    from dapo.train.loop import DAPOLoop

    over = ["recipe.data.train_batch_size=4", "recipe.data.gen_batch_size=4", "recipe.rollout.n=2",
            "recipe.actor.ppo_mini_batch_size=2", "recipe.trainer.total_training_steps=2",
            "recipe.trainer.test_freq=2", "recipe.trainer.save_freq=0", "recipe.trainer.logger=[]",
            "recipe.rollout.val.n=2", "recipe.filter_groups.enable=false",
            f"recipe.trainer.rollout_data_dir={tmp_path / 'rollouts'}",
            f"recipe.trainer.validation_data_dir={tmp_path / 'val'}", "recipe.trainer.log_val_generations=3"]
    preset = load_preset("tiny", over)
    loop = DAPOLoop(preset, ScriptedBackend(), make_rows([0.5] * 40), make_rows([0.5] * 5, "v"), tmp_path / "run",
                    progress=False, log=lambda m: None)  # fmt: skip
    assert loop.fit() == 0
    for step in (1, 2):
        recs = [json.loads(x) for x in open(tmp_path / "rollouts" / f"{step}.jsonl")]
        assert len(recs) == 4 * 2 and all(r["step"] == step for r in recs)
        assert {"input", "output", "gts", "score", "step", "acc", "pred"} <= set(recs[0])
        assert all(r["score"] == (1.0 if r["acc"] else -1.0) for r in recs)  # verl: the verifier's score column
    assert sorted(p.name for p in (tmp_path / "val").iterdir()) == ["0.jsonl", "2.jsonl"]  # before RL + test_freq
    val = [json.loads(x) for x in open(tmp_path / "val" / "2.jsonl")]
    assert len(val) == 5 * 2 and val[0]["input"] == "problem 0"
    picked = [json.loads(x) for x in open(tmp_path / "run" / "val_generations.jsonl")]
    assert [r["step"] for r in picked] == [0, 0, 0, 2, 2, 2]

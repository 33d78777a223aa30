"""Training validation over several files (``recipe.data.val_files``: AIME-2024, AIME-2025, MATH-500): one
``val-core/<data_source>/acc/mean@k`` per data source, equal to what verl 0.9.1's trainer computes from the same
scored samples (``process_validation_metrics`` + its val-core naming)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dapo.data import benchmarks
from dapo.data.files import read_rows
from dapo.config import load_preset
from dapo.data.files import write_rows
from dapo.train.loop import DAPOLoop
from loop_support import ScriptedBackend, make_rows

BASE = [
    "recipe.data.train_batch_size=4", "recipe.data.gen_batch_size=6", "recipe.rollout.n=4",
    "recipe.actor.ppo_mini_batch_size=2", "recipe.trainer.logger=[console]", "recipe.trainer.total_training_steps=2",
    "recipe.trainer.test_freq=1", "recipe.trainer.save_freq=0", "recipe.filter_groups.max_num_gen_batches=0",
    "recipe.rollout.val.n=3",
]  # fmt: skip
P_CORRECT = {"aime24": 0.8, "aime25": 0.3, "math500": 0.5}


def val_files(tmp_path) -> list[str]:
    """Three small validation files built like `dapo data prepare` builds the benchmarks (one copy per problem)."""
    files = []
    for name in P_CORRECT:
        b = benchmarks.get(name)
        small = benchmarks.Benchmark(**{**b.__dict__, "problems": 4, "copies": 1})
        raw = [{"problem": f"{name} problem {i}", "answer": str(10 + i), "subject": "Algebra", "level": 1}
               for i in range(4)]
        files.append(str(write_rows(benchmarks.build_rows(small, raw, name), tmp_path / b.file)))
    return files


def test_several_val_files_give_one_val_core_metric_per_data_source_equal_to_verls(tmp_path):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    files = val_files(tmp_path)
    rows = read_rows(files, "recipe.data.val_files")  # what both backends (local, verl) read
    assert [r["data_source"] for r in rows] == ["math_dapo"] * 4 + ["aime25"] * 4 + ["math"] * 4
    for r in rows:  # the scripted policy's chance of answering right, per benchmark
        r["extra_info"]["p"] = P_CORRECT[{"math_dapo": "aime24", "aime25": "aime25", "math": "math500"}[
            r["data_source"]]]
    preset = load_preset("tiny", BASE + [f"recipe.data.val_files={json.dumps(files)}"])
    assert list(preset.recipe.data.val_files) == files
    backend = ScriptedBackend(seed=3)
    seen = []
    generate = backend.generate

    def recording(prompts, sampling, group_ids=None):
        out = generate(prompts, sampling, group_ids)
        if group_ids is None:
            seen.append(out)
        return out

    backend.generate = recording
    loop = DAPOLoop(preset, backend, make_rows([0.5] * 30), rows, tmp_path / "run", progress=False,
                    log=lambda s: None)  # fmt: skip
    assert loop.fit() == 0
    ours = loop.val_history[-1][1]
    keys = sorted(k for k in ours if k.startswith("val-core/"))
    assert keys == ["val-core/aime25/acc/mean@3", "val-core/math/acc/mean@3", "val-core/math_dapo/acc/mean@3"]

    rollout = seen[-1]  # the last validation: verl's trainer on the same samples (each row its own uid, n each)
    scored = loop.score(rollout)
    sources = np.asarray([r["data_source"] for r in rollout.prompt_rows], dtype=object)
    infos = {"reward": scored["score"].tolist(), "score": scored["score"].tolist(), "acc": scored["acc"].tolist()}
    verl = RayPPOTrainer._val_metrics_update(None, sources, list(rollout.group_ids), infos, [])
    for k in keys:
        assert ours[k] == pytest.approx(verl[k], abs=1e-12), k
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary["val_acc_by_source"]) == set(keys)
    assert all(set(v) == {"0", "1", "2"} for v in summary["val_acc_by_source"].values())


def test_benchmark_data_sources_are_scored_by_verls_math_dapo_verifier():
    """verl's own reward loop (reward manager ``dapo`` -> ``default_compute_score``) picks the verifier by
    data_source: every benchmark's name must route to ``math_dapo``, the verifier our loop uses."""
    from verl.utils.reward_score import default_compute_score
    from verl.utils.reward_score.math_dapo import compute_score as math_dapo

    text = "Some work.\nAnswer: \\frac{1}{2}"
    for b in benchmarks.BENCHMARKS.values():
        assert default_compute_score(b.data_source, text, "\\frac{1}{2}") == math_dapo(text, "\\frac{1}{2}"), b.name


def test_verl_backend_validates_each_data_source_with_verls_own_reward_loop_agreeing(tmp_path):
    """The same over the verl backend (verl DataProto plumbing, verl's DAPO reward manager on the stand-in workers):
    verl's reward loop routes every benchmark's data_source to math_dapo (it raises for an unknown one) and the loop
    logs one val-core metric per source."""
    pytest.importorskip("verl")
    from test_verl_backend import SMALL, CharTokenizer, CpuStandInWorkers, _rows

    from dapo.backends.verl import config as verl_config
    from dapo.backends.verl.backend import VerlBackend

    preset = load_preset("smoke", SMALL)
    cfg = verl_config.resolve(preset).cfg
    tok = CharTokenizer()
    val = _rows(6, start=100)
    for row, b in zip(val, [b for b in benchmarks.BENCHMARKS.values() for _ in range(2)]):
        row["data_source"] = b.data_source
    loop = DAPOLoop(preset, VerlBackend(cfg, preset, CpuStandInWorkers(cfg, tok), tok), _rows(60), val,
                    tmp_path, progress=False, log=lambda s: None)  # fmt: skip
    assert loop.fit() == 0
    last = loop.val_history[-1][1]
    k = preset.recipe.rollout.val.n
    assert sorted(key for key in last if key.startswith("val-core/")) == sorted(
        f"val-core/{b.data_source}/acc/mean@{k}" for b in benchmarks.BENCHMARKS.values())

"""Several benchmarks per checkpoint and every checkpoint of a run (`dapo eval run --benchmarks ... --step all`) with
the serving layer replaced by a fake OpenAI endpoint: one serving per checkpoint, each benchmark scored as it should
be (MATH-500 by the DAPO verifier and math-verify side by side), one table per checkpoint, one results table across
steps, checkpoints still being written never picked, reruns skip what is done."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dapo.data import benchmarks

from dapo.eval import results as eval_results
from dapo.data.files import write_rows
from dapo.eval.scoring import math_verify_answer
from eval_support import read_results
from test_eval_client import FakeOpenAI

pytest.importorskip("math_verify")


def bench_file(path: Path, name: str, answers: list[str], copies: int = 2) -> Path:
    """A small file of benchmark ``name`` built by the same code as `dapo data prepare` (problems x copies)."""
    b = benchmarks.get(name)
    raw = [{"problem": f"[{name}] problem {i}", "answer": a, "subject": "Algebra", "level": 2}
           for i, a in enumerate(answers)]
    small = benchmarks.Benchmark(**{**b.__dict__, "problems": len(raw), "copies": copies})
    return write_rows(benchmarks.build_rows(small, raw, "fixture"), path)


# per benchmark, the answer the fake model gives to problem i (what it prints after "Answer:")
GIVEN = {
    "aime24": ["7", "12", "99"],  # right, right, wrong
    "aime25": ["5", "0"],  # wrong, wrong
    "math500": ["\\frac{6}{4}", "\\frac{1}{3}", "[2,5)"],  # equal to the truth but not as strings; right; wrong
}
TRUTH = {"aime24": ["7", "12", "100"], "aime25": ["4", "1"], "math500": ["\\frac{3}{2}", "\\frac{1}{3}", "[2,6)"]}


def model(body, n):
    name, i = re.search(r"\[(\w+)\] problem (\d+)", body["messages"][0]["content"]).groups()
    return f"Work.\nAnswer: {GIVEN[name][int(i)]}"


def local_run(root: Path, steps: list[int], writing: int) -> Path:
    """A local-backend run: complete checkpoints (COMPLETE) plus one still being written (no COMPLETE yet)."""
    ckpt = root / "run" / "checkpoints"
    for s in [*steps, writing]:
        d = ckpt / f"global_step_{s}"
        d.mkdir(parents=True)
        (d / "loop_state.pt").write_bytes(b"")
        (d / "actor").mkdir()
        (d / "actor" / "config.json").write_text("{}")
        (d / "actor" / "model.safetensors").write_bytes(b"")
        if s != writing:
            (d / "COMPLETE").write_text(f"{s}\n")
    return root / "run"


@pytest.fixture
def fake_serving(monkeypatch):
    from dapo.eval import serve as eval_serve

    calls: dict = {"start": [], "stop": []}

    def start(cfg):
        calls["start"].append(cfg.model_id)
        calls["srv"].model = cfg.model_id  # the endpoint now serves this checkpoint
        return calls["srv"].url + "/v1"

    monkeypatch.setattr(eval_serve, "init_ray", lambda *a, **k: None)
    monkeypatch.setattr(eval_serve, "cluster_gpus", lambda: 0.0)
    monkeypatch.setattr(eval_serve, "start", start)
    monkeypatch.setattr(eval_serve, "stop", lambda shutdown_ray=True: calls["stop"].append(shutdown_ray))
    with FakeOpenAI(model) as srv:
        calls["srv"] = srv
        yield calls


def test_math_verify_scores_equivalent_latex_that_the_dapo_verifier_under_counts():
    from dapo.reward import compute_score

    cases = [  # (answer line, ground truth, math-verify says correct)
        ("\\frac{6}{4}", "\\frac{3}{2}", True), ("1.5", "\\frac{3}{2}", True), ("3/2", "\\frac{3}{2}", True),
        ("(C)", "\\text{(C)}", True), ("[2, 5)", "[2,5)", True), ("2\\sqrt{3}", "2\\sqrt3", True),
        ("10\\%", "10", True), ("$\\frac{3}{2}$", "\\frac32", True), ("8", "7", False), ("[2,5]", "[2,5)", False),
    ]  # fmt: skip
    for given, truth, right in cases:
        assert math_verify_answer(f"Some work.\nAnswer: {given}", truth) is right, (given, truth)
    # where they differ, it is the DAPO verifier's exact string match that misses an equal value
    assert not compute_score("Answer: \\frac{6}{4}", "\\frac{3}{2}")["acc"]
    assert math_verify_answer("so the answer is \\boxed{\\frac{6}{4}}", "\\frac{3}{2}"), "no Answer: line -> boxed"
    assert not math_verify_answer("", "7") and not math_verify_answer("Answer: \\frac{", "7")


def test_all_checkpoints_all_benchmarks_one_serving_each_and_one_results_table(tmp_path, fake_serving):
    from dapo.eval import cli as evaluate

    files = {n: bench_file(tmp_path / f"{n}.parquet", n, TRUTH[n]) for n in GIVEN}
    run = local_run(tmp_path, [10, 20, 30], writing=40)
    out = tmp_path / "eval"
    argv = ["run", "--checkpoint-dir", str(run), "--step", "all", "--output", str(out), "--no-progress",
            "--benchmarks", ",".join(f"{n}={p}" for n, p in files.items()), "--max-tokens", "64", "--device", "cpu"]
    assert evaluate.main(argv) == 0
    assert fake_serving["start"] == ["run-step10", "run-step20", "run-step30"], "one serving per complete checkpoint"
    assert fake_serving["stop"] == [False, False, True]
    assert not (out / "global_step_40").exists(), "a checkpoint still being written is never picked"

    table = read_results(out / "results.csv")
    assert [(r["step"], r["benchmark"]) for r in table] == [(s, n) for s in (10, 20, 30) for n in sorted(GIVEN)]
    by = {(r["step"], r["benchmark"]): r for r in table}
    for s in (10, 20, 30):
        a24, a25, m500 = by[(s, "aime24")], by[(s, "aime25")], by[(s, "math500")]
        assert (a24["problems"], a24["k"], a24["avg"], a24["pass"], a24["cons"]) == (3, 2, pytest.approx(2 / 3),
                                                                                     pytest.approx(2 / 3),
                                                                                     pytest.approx(2 / 3))
        assert a24["score"] == pytest.approx(66.67) and a24["comparable_scorer"] == "dapo"
        assert a25["avg"] == 0.0 and a25["avg_math_verify"] is None
        assert m500["avg"] == pytest.approx(1 / 3) and m500["avg_math_verify"] == pytest.approx(2 / 3)
        assert m500["cons_math_verify"] == pytest.approx(2 / 3) and m500["comparable_scorer"] == "math_verify"
        assert m500["score"] == pytest.approx(66.67)
        assert all(r["complete"] and r["truncation_rate"] == 0.0 and r["response_length_mean"] == 3.0
                   for r in (a24, a25, m500))  # fmt: skip
        step_table = json.loads((out / f"global_step_{s}" / "benchmarks.json").read_text())
        assert [r["benchmark"] for r in step_table] == list(GIVEN)
    # every row of every benchmark answered once per checkpoint
    assert len(fake_serving["srv"].requests) == 3 * 2 * (3 + 2 + 3)

    # rerun: nothing left to do -> no serving, the table unchanged; a new checkpoint -> only it is evaluated
    before = (out / "results.csv").read_text()
    assert evaluate.main(argv) == 0
    assert len(fake_serving["start"]) == 3 and (out / "results.csv").read_text() == before
    (run / "checkpoints" / "global_step_40" / "COMPLETE").write_text("40\n")
    assert evaluate.main(argv) == 0
    assert fake_serving["start"][3:] == ["run-step40"]
    assert [r["step"] for r in read_results(out / "results.csv")] == [10] * 3 + [20] * 3 + [30] * 3 + [
        40] * 3


def test_stride_picks_steps_divisible_by_it_and_verl_tracker_bounds_the_complete_steps(tmp_path, fake_serving):
    from dapo.eval import cli as evaluate
    from dapo.eval.export import complete_steps
    from dapo.eval.fsdp_merge import ExportError

    f = bench_file(tmp_path / "a.parquet", "aime25", TRUTH["aime25"])
    ckpt = tmp_path / "verl"
    for s in (5, 10, 15, 20):  # verl layout; the tracker says 15: step 20 is still being written
        d = ckpt / f"global_step_{s}" / "actor" / "huggingface"
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
        (d / "model.safetensors").write_bytes(b"")
    with pytest.raises(ExportError, match="cannot tell a finished checkpoint"):
        complete_steps(ckpt)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("15")
    assert complete_steps(ckpt) == [5, 10, 15]
    assert evaluate.main(["run", "--checkpoint-dir", str(ckpt), "--step", "all", "--stride", "10", "--output",
                          str(tmp_path / "out"), "--benchmarks", f"aime25={f}", "--no-progress"]) == 0  # fmt: skip
    assert fake_serving["start"] == ["verl-step10"]
    assert evaluate.main(["run", "--checkpoint-dir", str(ckpt), "--step", "10", "--stride", "2", "--test-file",
                          str(f)]) == 2  # fmt: skip


def test_unknown_benchmark_or_missing_file_is_a_usage_error(tmp_path, capsys):
    from dapo.eval import cli as evaluate

    run = local_run(tmp_path, [1], writing=2)
    assert evaluate.main(["run", "--checkpoint-dir", str(run), "--benchmarks", "aime24,gsm8k", "--data-dir",
                          str(tmp_path)]) == 2  # fmt: skip
    assert "unknown benchmark 'gsm8k'" in capsys.readouterr().err
    assert evaluate.main(["run", "--checkpoint-dir", str(run), "--benchmarks", "aime25", "--data-dir",
                          str(tmp_path)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert f"{tmp_path / 'aime-2025.parquet'} of aime25 does not exist (run `dapo data prepare`)" in err


def test_report_draws_accuracy_per_benchmark_against_step_beside_the_published_points(tmp_path, fake_serving, capsys):
    from dapo.eval import cli as evaluate
    from dapo.train import report
    from dapo.data.benchmarks import PUBLISHED

    files = {n: bench_file(tmp_path / f"{n}.parquet", n, TRUTH[n]) for n in ("aime24", "math500")}
    run = local_run(tmp_path, [2, 4], writing=6)
    out = tmp_path / "eval"
    assert evaluate.main(["run", "--checkpoint-dir", str(run), "--step", "all", "--output", str(out), "--no-progress",
                          "--benchmarks", ",".join(f"{n}={p}" for n, p in files.items())]) == 0  # fmt: skip
    capsys.readouterr()
    assert report.main([str(out)]) == 0
    text = capsys.readouterr().out
    assert (out / "accuracy.png").stat().st_size > 10_000
    assert "step 2:" in text and "step 4:" in text
    assert any(line.split()[:4] == ["math500", "3", "x", "2"] for line in text.splitlines()), text
    # the published points are the paper's/repository's end-of-training AIME-2024 avg@32, nothing invented
    assert sorted(p["avg"] for p in PUBLISHED["aime24"]) == [0.44, 0.50] and set(PUBLISHED) == {"aime24"}


def test_score_rescores_stored_answers_without_an_endpoint(tmp_path, fake_serving, capsys):
    from dapo.eval import cli as evaluate

    f = bench_file(tmp_path / "m.parquet", "math500", TRUTH["math500"])
    run = local_run(tmp_path, [1], writing=2)
    out = tmp_path / "eval"
    assert evaluate.main(["run", "--checkpoint-dir", str(run), "--step", "all", "--output", str(out), "--no-progress",
                          "--benchmarks", f"math500={f}"]) == 0  # fmt: skip
    d = out / "global_step_1" / "math500"
    summary = json.loads((d / "summary.json").read_text())
    # as if scored before math-verify existed: drop its column, the table follows the summaries
    summary["metrics_by_scorer"] = {"dapo": summary["metrics"]}
    (d / "summary.json").write_text(json.dumps(summary))
    eval_results.write_results(out)
    assert read_results(out / "results.csv")[0]["avg_math_verify"] is None
    n_requests = len(fake_serving["srv"].requests)
    assert evaluate.main(["score", str(out)]) == 0
    assert len(fake_serving["srv"].requests) == n_requests and len(fake_serving["start"]) == 1, "no generation"
    again = json.loads((d / "summary.json").read_text())
    assert again["metrics_by_scorer"]["math_verify"]["acc/mean@2"] == pytest.approx(2 / 3)
    assert again["config"]["checkpoint"]["step"] == 1, "the run's checkpoint record is kept"
    assert read_results(out / "results.csv")[0]["avg_math_verify"] == pytest.approx(2 / 3)
    assert evaluate.main(["score", str(tmp_path / "nothing-here")]) == 2

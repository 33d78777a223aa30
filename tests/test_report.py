"""`dapo report RUN`: health plots regenerated from metrics.jsonl; metric line formatting; JSONL robustness."""

from __future__ import annotations

import json

from dapo.train.metrics import MetricsLogger, format_step_line, read_jsonl, truncate_jsonl
from dapo.train.report import main as report_main


def _write_run(run_dir, steps=5):
    log = MetricsLogger(run_dir, ["console"])
    log.log({"val-core/tiny-addition/acc/mean@1": 0.5}, 0)
    for s in range(1, steps + 1):
        log.log({
            "response_length/mean": 20.0 + s, "critic/score/mean": 0.1 * s, "train/gen_score/mean": 0.05 * s,
            "actor/entropy": 0.3 / s, "actor/mean_prob": 0.8, "train/num_gen_batches": 2.0,
            "actor/pg_clipfrac": 0.01, "actor/pg_clipfrac_lower": 0.0, "train/kept_group_ratio": 0.6,
            "response_length/clip_ratio": 0.0, "timing_s/step": 1.5, "train/gen_acc/mean": 0.6,
        }, s)  # fmt: skip
    log.log({"val-core/tiny-addition/acc/mean@1": 0.8}, steps)
    log.close()


def test_report_regenerates_the_health_png_from_jsonl(tmp_path, capsys):
    _write_run(tmp_path)
    (tmp_path / "health.png").unlink(missing_ok=True)
    assert report_main([str(tmp_path)]) == 0
    png = tmp_path / "health.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "validation accuracy: step 0: 0.500, step 5: 0.800" in out


def test_report_names_how_each_attempt_ended_where_its_evidence_is_and_what_the_follower_did(tmp_path, capsys):
    from dapo.cluster.budget import RunRecord
    from dapo.train import attempts

    _write_run(tmp_path)
    attempts.write_end(tmp_path / "logs", 1, cause="stalled", message="gen passed its budget", step=3)
    attempts.write_end(tmp_path / "logs", 2, cause="complete", message="done", step=5)
    (attempts.evidence_dir(tmp_path, 1) / "dapo-train-abc-worker-x").mkdir(parents=True)
    record = RunRecord(tmp_path, "uid")
    record.add_failure(attempt=1, cause="stalled", message="gen", nodes={"gpu-3": "rank 2 stuck"}, recorded=True)
    record.leave_out({"gpu-3": "rank 2 stuck"}, 1, 4)
    record.save()
    assert report_main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "attempts: 1 stalled at step 3; 2 complete at step 5" in out
    assert f"evidence: {tmp_path / 'evidence'} (attempt-1)" in out
    assert "the follower counted 1 failed attempt(s); nodes left out: gpu-3" in out


def test_report_on_a_directory_without_metrics_fails_with_a_message(tmp_path, capsys):
    assert report_main([str(tmp_path)]) == 1
    assert "no metrics" in capsys.readouterr().err


def test_torn_last_line_is_skipped_and_truncate_keeps_earlier_steps(tmp_path):
    _write_run(tmp_path)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "actor/ent')  # a writer killed mid-line
    recs = read_jsonl(tmp_path / "metrics.jsonl")
    assert max(r["step"] for r in recs) == 5
    truncate_jsonl(tmp_path / "metrics.jsonl", 2)
    assert sorted({r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")}) == [0, 1, 2]


def test_step_line_is_one_readable_line():
    line = format_step_line(12, 60, {"train/gen_score/mean": 0.41, "train/gen_acc/mean": 0.7,
                                     "response_length/mean": 11.2, "train/num_gen_batches": 2.0,
                                     "train/kept_group_ratio": 0.55, "timing_s/step": 3.2})  # fmt: skip
    assert line.startswith("step 12/60 | score 0.41 | acc 0.70 | len 11.2 | gen_batches 2 | kept 0.55")
    assert "\n" not in line and "entropy -" in line


def test_non_finite_values_are_stored_as_null(tmp_path):
    log = MetricsLogger(tmp_path, [])
    log.log({"a": float("nan"), "b": 1}, 1)
    log.close()
    rec = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert rec["a"] is None and rec["b"] == 1.0


def test_wandb_failure_never_stops_logging(tmp_path, monkeypatch):
    import sys
    import types

    fake = types.ModuleType("wandb")

    def boom(*a, **k):
        raise RuntimeError("no network")

    fake.init = boom
    fake.Settings = lambda **k: None
    monkeypatch.setitem(sys.modules, "wandb", fake)
    warnings = []
    log = MetricsLogger(tmp_path, ["wandb"], warn=warnings.append)
    log.log({"x": 1.0}, 1)
    log.close()
    assert any("wandb logging off" in w for w in warnings)
    assert read_jsonl(tmp_path / "metrics.jsonl")[0]["x"] == 1.0

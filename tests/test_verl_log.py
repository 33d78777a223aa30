"""`dapo report` reads the reference runner's driver logs: verl's console metric lines, as verl 4f80e46 prints them
(through Ray's actor prefix), become the same records as our metrics.jsonl."""

from __future__ import annotations

import numbers

from dapo.train import report
from dapo.train.verl_log import attempt_logs, parse_line, read_console_logs


def concat_dict_to_str_4f80e46(dict, step):
    # verl/utils/logger/aggregate_logger.py at 4f80e465c2ec79ab9c3c30ec74b9745de61d0490, verbatim
    output = [f'step:{step}']
    for k, v in dict.items():
        if isinstance(v, numbers.Number):
            output.append(f'{k}:{v:.3f}')
    output_str = ' - '.join(output)
    return output_str


def _line(step: int, metrics: dict) -> str:
    return f"\x1b[36m(TaskRunner pid=3301)\x1b[0m {concat_dict_to_str_4f80e46(metrics, step)}\n"


def test_console_lines_of_each_attempt_become_step_records_and_a_retry_replaces_redone_steps(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "attempt-1.log").write_text(
        "[attempt_log] attempt 1: python3 -m recipe.dapo.src.main_dapo ...\n"
        + _line(0, {"val-core/math_dapo/acc/mean@32": 0.0625})
        + "(TaskRunner pid=3301) step: not a metric line\n"
        + _line(1, {"critic/score/mean": -0.8125, "response_length/mean": 1234.5, "train/num_gen_batches": 2,
                    "actor/entropy": float("nan"), "note": "text is not logged"})
        + _line(2, {"critic/score/mean": -0.5})
        + "Traceback (most recent call last):\n"
    )
    (logs / "attempt-2.log").write_text(
        _line(2, {"critic/score/mean": -0.25}) + _line(2, {"val-core/math_dapo/acc/mean@32": 0.1})
        + _line(3, {"critic/score/mean": -0.125})
    )
    (logs / "attempt-10.log").write_text(_line(4, {"critic/score/mean": 0.5}))  # numeric order, not text order
    assert [p.name for p in attempt_logs(logs)] == ["attempt-1.log", "attempt-2.log", "attempt-10.log"]
    records = read_console_logs(attempt_logs(logs))
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    assert records[0] == {"step": 0, "val-core/math_dapo/acc/mean@32": 0.062}  # {:.3f}: 0.0625 prints as 0.062
    assert records[1]["response_length/mean"] == 1234.5 and records[1]["train/num_gen_batches"] == 2.0
    assert records[1]["actor/entropy"] != records[1]["actor/entropy"] and "note" not in records[1]  # nan kept
    assert records[2] == {"step": 2, "critic/score/mean": -0.25, "val-core/math_dapo/acc/mean@32": 0.1}
    assert parse_line("step:5") is None and parse_line("global step:5 - a:b") is None


def test_dapo_report_plots_a_reference_log_directory(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "attempt-1.log").write_text("".join(
        _line(s, {"critic/score/mean": -1 + s / 10, "response_length/mean": 100.0 + s, "timing_s/step": 60.0,
                  **({"val-core/math_dapo/acc/mean@32": s / 100} if s % 5 == 0 else {})})
        for s in range(0, 11)))
    assert report.main([str(logs)]) == 0
    out = capsys.readouterr().out
    assert "validation accuracy: step 0: 0.000, step 5: 0.050, step 10: 0.100" in out
    assert (logs / "health.png").stat().st_size > 0
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "attempt-1.log").write_text("no metrics here\n")
    assert report.main([str(empty)]) == 1

"""`dapo data`: schema validation that names row and column, unique-prompt statistics, de-duplication, the AIME file,
and an idempotent, crash-safe `prepare` (local mirror and a stubbed hub; the real hub is unreachable here)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo.data import benchmarks

from dapo.data import cli as data_cli
from dapo.data import prepare as data
from dapo.data.files import check_file, dedup_file, sha256_file, write_rows
from dapo.data.parquet import DataError
from dapo.data.schema import REQUIRED_COLUMNS

TEMPLATE = ("Solve the following math problem step by step. The last line of your response should be of the form "
            "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{q}\n\n"
            'Remember to put your answer on its own line after "Answer:".')


def rows_of(path) -> list[dict]:
    """A file's rows in the DAPO schema's columns (the tests check the file itself with check_file)."""
    return pq.read_table(path).select(list(REQUIRED_COLUMNS)).to_pylist()


def row(i: int, **change) -> dict:
    """One row in the DAPO-Math-17k schema for problem ``i``."""
    r = {
        "data_source": "math_dapo",
        "prompt": [{"role": "user", "content": TEMPLATE.format(q=f"What is {i} + {i}?")}],
        "ability": "MATH",
        "reward_model": {"ground_truth": str(2 * i), "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": i},
    }
    r.update(change)
    return r


def write(path: Path, rows: list[dict]) -> Path:
    """Fixture writer: pyarrow directly (bypasses our validation so bad rows can be written)."""
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def duplicated(unique: int, repeats: int) -> list[dict]:
    """``unique`` problems, each ``repeats`` times, interleaved like the hub file."""
    return [row(i) for _ in range(repeats) for i in range(unique)]


def no_temp_files(directory: Path) -> bool:
    return not [p for p in directory.iterdir() if p.name.startswith(".") and not p.name.endswith(".rejected")]


# ---------------------------------------------------------------------------------------------------- validation


def test_valid_file_reports_unique_vs_total_prompts(tmp_path):
    report = check_file(write(tmp_path / "t.parquet", duplicated(5, 4)), batch_rows=3)
    assert report.ok, report.summary()
    assert (report.rows, report.unique_prompts, report.min_repeats, report.max_repeats) == (20, 5, 4, 4)
    assert report.data_sources == {"math_dapo": 20}
    assert report.sha256 == sha256_file(tmp_path / "t.parquet")


def test_missing_ground_truth_is_reported_with_row_and_column(tmp_path):
    rows = duplicated(4, 3)
    rows[7] = row(7, reward_model={"ground_truth": None, "style": "rule"})
    rows[9] = row(9, reward_model={"ground_truth": "  ", "style": "rule"})
    report = check_file(write(tmp_path / "bad.parquet", rows), batch_rows=4)  # rows 7 and 9 in two batches
    assert not report.ok
    (prob,) = report.problems
    assert (prob.row, prob.column, prob.count) == (7, "reward_model.ground_truth", 2)
    assert "row 7" in str(prob) and "reward_model.ground_truth" in str(prob) and "1 more row" in str(prob)


def test_prompt_as_plain_string_is_rejected_naming_the_column_type(tmp_path):
    rows = [row(i, prompt=TEMPLATE.format(q=str(i))) for i in range(3)]
    (prob,) = check_file(write(tmp_path / "str.parquet", rows)).problems
    assert prob.column == "prompt" and prob.row == 0
    assert "has type string" in prob.message and "role" in prob.message


def test_chat_messages_are_checked_per_row(tmp_path):
    rows = [row(i) for i in range(6)]
    rows[2] = row(2, prompt=[{"role": "bot", "content": "x"}])
    rows[4] = row(4, prompt=[{"role": "system", "content": "be brief"}, {"role": "user", "content": ""}])
    rows[5] = row(5, prompt=[])
    found = {(p.column, p.row) for p in check_file(write(tmp_path / "chat.parquet", rows)).problems}
    assert ("prompt[].role", 2) in found  # unknown role
    assert ("prompt", 2) in found  # ... and therefore no user message
    assert ("prompt[].content", 4) in found  # empty content
    assert ("prompt", 5) in found  # empty chat


def test_missing_column_and_wrong_struct_are_named(tmp_path):
    rows = [{k: v for k, v in row(i).items() if k != "ability"} for i in range(2)]
    rows = [dict(r, reward_model={"answer": "4"}) for r in rows]
    cols = {p.column: p for p in check_file(write(tmp_path / "cols.parquet", rows)).problems}
    assert "ability" in cols and "is missing" in cols["ability"].message
    assert "reward_model.ground_truth" in cols and "reward_model.style" in cols


def test_numeric_ground_truth_is_a_type_error(tmp_path):
    rows = [row(i, reward_model={"ground_truth": 2 * i, "style": "rule"}) for i in range(3)]
    (prob,) = check_file(write(tmp_path / "num.parquet", rows)).problems
    assert prob.column == "reward_model.ground_truth" and "expected string" in prob.message


def test_check_cli_exit_code_and_json(tmp_path, capsys):
    good = write(tmp_path / "good.parquet", duplicated(3, 2))
    assert data_cli.main(["check", str(good), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"] == 6 and out["unique_prompts"] == 3 and out["problems"] == []
    rows = duplicated(3, 2)
    rows[4] = row(4, reward_model={"ground_truth": "", "style": "rule"})
    assert data_cli.main(["check", str(write(tmp_path / "bad.parquet", rows))]) == 1
    assert "row 4: column 'reward_model.ground_truth'" in capsys.readouterr().out
    assert data_cli.main(["check", str(tmp_path / "absent.parquet")]) == 1


def test_conflicting_ground_truths_for_one_prompt_warn(tmp_path):
    rows = duplicated(3, 2)
    rows[4] = row(1, reward_model={"ground_truth": "999", "style": "rule"})
    report = check_file(write(tmp_path / "conflict.parquet", rows))
    assert report.ok and report.conflicting_ground_truths == 1 and report.warnings


# ---------------------------------------------------------------------------------------------------- dedup, load


def test_dedup_keeps_first_occurrence_of_each_prompt_in_file_order(tmp_path):
    order = [3, 1, 3, 0, 1, 2, 2, 0, 3]
    rows = [row(i, extra_info={"index": pos}) for pos, i in enumerate(order)]
    src = write(tmp_path / "dup.parquet", rows)
    n = dedup_file(src, tmp_path / "dedup.parquet", batch_rows=2)
    got = pq.read_table(tmp_path / "dedup.parquet").to_pylist()
    seen, expected = set(), []
    for pos, i in enumerate(order):  # the first time each problem shows up
        if i not in seen:
            seen.add(i)
            expected.append(pos)
    assert n == 4 and [r["extra_info"]["index"] for r in got] == expected


def test_write_rows_validates_before_writing_anything(tmp_path):
    target = tmp_path / "out.parquet"
    with pytest.raises(DataError, match="reward_model.ground_truth"):
        write_rows([row(0), row(1, reward_model={"ground_truth": "", "style": "rule"})], target)
    assert not target.exists() and list(tmp_path.iterdir()) == []
    write_rows(duplicated(2, 1), target)
    assert check_file(target).ok


# ---------------------------------------------------------------------------------------------------- AIME


def test_shared_aime_file_is_30_problems_times_32_in_the_dapo_prompt_format(aime_parquet):
    report = check_file(aime_parquet, aime=True)
    assert report.ok, report.summary()
    assert (report.rows, report.unique_prompts, report.min_repeats, report.max_repeats) == (960, 30, 32, 32)
    rows = rows_of(aime_parquet)
    for r in rows:
        (msg,) = r["prompt"]
        assert msg["role"] == "user"
        assert msg["content"].startswith("Solve the following math problem step by step.")
        assert msg["content"].rstrip().endswith('Remember to put your answer on its own line after "Answer:".')
        assert r["reward_model"]["ground_truth"].isdigit() and 0 <= int(r["reward_model"]["ground_truth"]) <= 999


def test_aime_layout_check_rejects_a_file_with_the_wrong_repeats(tmp_path):
    report = check_file(write(tmp_path / "aime.parquet", duplicated(30, 31)), aime=True)
    assert not report.ok
    assert any("960" in p.message for p in report.problems)
    assert any("repeated 31-31x" in p.message for p in report.problems)


# ---------------------------------------------------------------------------------------------------- prepare


def aime25_raw(n: int = 30) -> list[dict]:
    """math-ai/aime25 test.jsonl records: problem, answer (a string), id."""
    return [{"problem": f"Find the number of integers $k$ with $k^2 < {i + 10}$.", "answer": f"{i:03d}",
             "id": str(i)} for i in range(n)]


def math500_raw(n: int = 500) -> list[dict]:
    """HuggingFaceH4/MATH-500 test.jsonl records: problem, solution, answer (LaTeX), subject, level (int), unique_id."""
    return [{"problem": f"Simplify $\\frac{{{i}}}{{{i + 1}}} \\cdot 2$.",
             "solution": f"It is $\\boxed{{\\frac{{2\\cdot{i}}}{{{i + 1}}}}}$.",
             "answer": f"\\frac{{{2 * i}}}{{{i + 1}}}", "subject": ("Algebra", "Precalculus")[i % 2],
             "level": 1 + i % 5, "unique_id": f"test/algebra/{i}.json"} for i in range(n)]


def write_jsonl(path: Path, recs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


@pytest.fixture
def mirror(tmp_path) -> Path:
    """A local mirror laid out like the hub: <owner>/<name>/data/<file> (and the benchmarks' raw jsonl files)."""
    root = tmp_path / "mirror"
    train = root / data.TRAIN_REPO / data.TRAIN_PATH_IN_REPO
    val = root / data.VAL_REPO / data.VAL_PATH_IN_REPO
    train.parent.mkdir(parents=True)
    val.parent.mkdir(parents=True)
    write(train, duplicated(7, 5))
    write(val, duplicated(30, 32))
    write_jsonl(root / "math-ai" / "aime25" / "test.jsonl", aime25_raw())
    write_jsonl(root / "HuggingFaceH4" / "MATH-500" / "test.jsonl", math500_raw())
    return root


def test_prepare_from_a_local_mirror_writes_files_manifest_and_dedup(tmp_path, mirror):
    out = tmp_path / "out"
    res = data.prepare(out, dedup=True, source_dir=str(mirror), log=lambda _: None)
    assert (res.train.rows, res.train.unique_prompts, res.val.rows, res.dedup.rows) == (35, 7, 960, 7)
    manifest = json.loads((out / data.MANIFEST).read_text())
    for name in (data.TRAIN_FILE, data.VAL_FILE, data.DEDUP_FILE):
        assert manifest["files"][name]["sha256"] == sha256_file(out / name)
    assert manifest["files"][data.DEDUP_FILE]["derived_from_sha256"] == manifest["files"][data.TRAIN_FILE]["sha256"]
    assert no_temp_files(out)
    assert oct((out / data.TRAIN_FILE).stat().st_mode & 0o044) == oct(0o044)  # readable by other pods' users


def test_prepare_accepts_file_url_repo_roots(tmp_path, mirror):
    out = tmp_path / "out"
    res = data.prepare(out, train_repo=f"file://{mirror / data.TRAIN_REPO}",
                       val_repo=str(mirror / data.VAL_REPO / data.VAL_PATH_IN_REPO), log=lambda _: None,
                       benchmarks=())
    assert res.train.rows == 35 and res.val.rows == 960


def test_prepare_is_idempotent_and_refetches_a_file_whose_checksum_changed(tmp_path, mirror):
    out = tmp_path / "out"
    data.prepare(out, dedup=True, source_dir=str(mirror), log=lambda _: None)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    logs: list[str] = []
    data.prepare(out, dedup=True, source_dir=str(mirror), log=logs.append)
    assert sum("skipped" in line for line in logs) == 5  # train, val, dedup, aime25, math500
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    good = sha256_file(out / data.VAL_FILE)
    with open(out / data.VAL_FILE, "ab") as f:  # a truncated / modified copy on the shared volume
        f.write(b"garbage")
    logs.clear()
    data.prepare(out, source_dir=str(mirror), log=logs.append)
    assert any("differs from the manifest" in line for line in logs)
    assert sha256_file(out / data.VAL_FILE) == good


def test_prepare_rejects_an_invalid_download_and_keeps_the_existing_file(tmp_path, mirror):
    out = tmp_path / "out"
    data.prepare(out, source_dir=str(mirror), log=lambda _: None)
    good = sha256_file(out / data.TRAIN_FILE)
    rows = duplicated(7, 5)
    rows[12] = row(5, reward_model={"ground_truth": None, "style": "rule"})
    write(mirror / data.TRAIN_REPO / data.TRAIN_PATH_IN_REPO, rows)
    with pytest.raises(DataError, match=r"row 12: column 'reward_model.ground_truth'"):
        data.prepare(out, source_dir=str(mirror), force=True, log=lambda _: None)
    assert sha256_file(out / data.TRAIN_FILE) == good
    assert (out / f".{data.TRAIN_FILE}.rejected").exists() and no_temp_files(out)


def test_prepare_interrupted_mid_download_leaves_no_partial_parquet(tmp_path, monkeypatch, mirror):
    out = tmp_path / "out"

    def broken(spec, path_in_repo, **kw):
        def fetch(dest: Path) -> None:
            dest.write_bytes(b"PAR1 half a file")
            raise KeyboardInterrupt

        return data.Source("flaky", fetch)

    monkeypatch.setattr(data, "resolve_source", broken)
    with pytest.raises(KeyboardInterrupt):
        data.prepare(out, log=lambda _: None)
    assert not (out / data.TRAIN_FILE).exists() and no_temp_files(out)


def test_hub_download_asks_for_the_dataset_repo_with_hf_token(tmp_path, monkeypatch, aime_parquet):
    import huggingface_hub

    calls = []

    def fake_download(**kw):
        calls.append(kw)
        target = Path(kw["local_dir"]) / kw["filename"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(aime_parquet.read_bytes())
        return str(target)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    res = data.prepare(tmp_path / "out", revision="abc123", log=lambda _: None, benchmarks=())
    assert res.val.rows == 960
    assert [(c["repo_id"], c["filename"], c["repo_type"], c["token"], c["revision"]) for c in calls] == [
        (data.TRAIN_REPO, data.TRAIN_PATH_IN_REPO, "dataset", "hf_test_token", "abc123"),
        (data.VAL_REPO, data.VAL_PATH_IN_REPO, "dataset", "hf_test_token", "abc123"),
    ]
    assert no_temp_files(tmp_path / "out")


def test_hub_failure_says_how_to_use_a_local_copy(tmp_path, monkeypatch):
    import huggingface_hub

    def offline(**kw):
        raise ConnectionError("no route to huggingface.co")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(DataError, match="--source DIR") as exc:
        data.prepare(tmp_path / "out", log=lambda _: None)
    assert "hf://datasets/BytedTsinghua-SIA/DAPO-Math-17k" in str(exc.value)
    assert no_temp_files(tmp_path / "out")


def test_prepare_cli_prints_epochs_and_steps_per_preset(tmp_path, mirror, capsys):
    assert data_cli.main(["prepare", "--out", str(tmp_path / "out"), "--source", str(mirror), "--dedup"]) == 0
    out = capsys.readouterr().out
    assert "unique prompts: 7 (each repeated 5x)" in out
    lines = {tuple(line.split()[:2]): line.split() for line in out.splitlines() if line.startswith(("early", "full"))}
    # 35 rows: early (batches of 512) and full (1536) get no full generation batch -> 0 steps, said plainly
    assert lines[("early", data.TRAIN_FILE)][2:6] == ["35", "0", "0", "0"]
    assert set(lines) == {("early", data.TRAIN_FILE), ("early", data.DEDUP_FILE), ("full", data.TRAIN_FILE),
                          ("full", data.DEDUP_FILE)}
    assert os.path.exists(tmp_path / "out" / data.DEDUP_FILE)


# ---------------------------------------------------------------------------------------------------- benchmarks


def test_prepare_builds_aime25_and_math500_in_the_aime2024_prompt_template(tmp_path, mirror, aime_parquet):
    out = tmp_path / "out"
    res = data.prepare(out, source_dir=str(mirror), log=lambda _: None)
    real = rows_of(aime_parquet)[0]
    real_prompt = real["prompt"][0]["content"].replace(real["extra_info"]["raw_problem"], "{problem}")
    assert real_prompt == benchmarks.PROMPT_TEMPLATE, "the same template as the release's AIME-2024 file"
    for name, (problems, copies) in {"aime25": (30, 32), "math500": (500, 4)}.items():
        bench = benchmarks.get(name)
        rep = res.benchmarks[name]
        assert (rep.rows, rep.unique_prompts, rep.min_repeats, rep.max_repeats) == (problems * copies, problems,
                                                                                    copies, copies)
        assert check_file(out / bench.file, layout=(problems, copies)).ok
        rows = rows_of(out / bench.file)
        # same schema (columns, nested field types) as the release's file, apart from extra_info's own fields
        assert {k: type(v) for k, v in rows[0].items()} == {k: type(v) for k, v in real.items()}
        assert rows[0]["reward_model"]["style"] == real["reward_model"]["style"]
        assert rows[0]["ability"] == real["ability"] and rows[0]["data_source"] == bench.data_source
        manifest = json.loads((out / data.MANIFEST).read_text())["files"][bench.file]
        assert manifest["sha256"] == sha256_file(out / bench.file) and manifest["layout"] == f"{problems}x{copies}"
    aime = rows_of(out / "aime-2025.parquet")
    assert aime[0]["reward_model"]["ground_truth"] == "0" and aime[32 * 7]["reward_model"]["ground_truth"] == "7"
    assert aime[0]["prompt"][0]["content"] == benchmarks.PROMPT_TEMPLATE.format(problem=aime25_raw()[0]["problem"])
    math = rows_of(out / "math-500.parquet")
    assert math[4 * 3]["reward_model"]["ground_truth"] == "\\frac{6}{4}"
    assert math[4 * 3]["extra_info"]["subject"] == "Precalculus" and math[4 * 3]["extra_info"]["level"] == "4"
    assert math[4 * 3]["extra_info"]["source_id"] == "test/algebra/3.json"
    assert no_temp_files(out)


def test_opencompass_aime2025_two_files_with_question_column_are_one_benchmark(tmp_path):
    src = tmp_path / "oc"
    raw = [{"question": r["problem"], "answer": r["answer"]} for r in aime25_raw()]
    write_jsonl(src / "aime2025-I.jsonl", raw[:15])
    write_jsonl(src / "aime2025-II.jsonl", raw[15:])
    rep = data._fetch_benchmark(tmp_path, benchmarks.get("aime25"), str(src), {"files": {}}, source_dir=None,
                                revision=None, force=False, log=lambda _: None)
    assert (rep.rows, rep.unique_prompts) == (960, 30)
    assert rows_of(tmp_path / "aime-2025.parquet")[32 * 15]["extra_info"]["raw_problem"] == raw[15]["question"]


@pytest.mark.parametrize("bad, message", [
    (lambda r: r[:29], "29 problems, AIME-2025 has 30"),
    (lambda r: [*r[:4], {**r[4], "answer": "12.5"}, *r[5:]], r"row 4 column 'answer': AIME answers are integers"),
    (lambda r: [*r[:2], {"answer": "1", "id": "x"}, *r[3:]], r"row 2: no problem \(or question\) column"),
    (lambda r: [*r[:3], {**r[0], "id": "dup"}, *r[4:]], "row 3: the same problem as row 0"),
])  # fmt: skip
def test_a_bad_raw_benchmark_file_is_refused_naming_the_row_and_nothing_is_written(tmp_path, mirror, bad, message):
    write_jsonl(mirror / "math-ai" / "aime25" / "test.jsonl", bad(aime25_raw()))
    out = tmp_path / "out"
    with pytest.raises(DataError, match=message):
        data.prepare(out, source_dir=str(mirror), log=lambda _: None, benchmarks=["aime25"])
    assert not (out / "aime-2025.parquet").exists() and no_temp_files(out)


def test_check_cli_generalises_the_aime_layout_to_n_problems_times_k(tmp_path, capsys):
    f = write(tmp_path / "m.parquet", duplicated(500, 4))
    assert data_cli.main(["check", str(f), "--benchmark", "math500"]) == 0
    assert data_cli.main(["check", str(f), "--layout", "500x4"]) == 0
    assert data_cli.main(["check", str(f), "--benchmark", "aime25"]) == 1
    out = capsys.readouterr().out
    assert "file has 2000 rows; AIME-2025 for avg@32 has 960 (30 problems x 32)" in out
    assert data_cli.main(["check", str(f), "--layout", "30x"]) == 1
    assert "layout must be PROBLEMSxCOPIES" in capsys.readouterr().err


def test_hub_download_of_the_benchmarks_asks_for_their_dataset_files(tmp_path, monkeypatch):
    import huggingface_hub

    calls = []

    def fake_download(**kw):
        calls.append((kw["repo_id"], kw["filename"], kw["repo_type"]))
        target = Path(kw["local_dir"]) / kw["filename"]
        recs = aime25_raw() if kw["repo_id"] == "math-ai/aime25" else math500_raw()
        write_jsonl(target, recs)
        return str(target)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    out = tmp_path / "out"
    out.mkdir()
    for name in ("aime25", "math500"):
        b = benchmarks.get(name)
        data._fetch_benchmark(out, b, b.repo, {"files": {}}, source_dir=None, revision=None, force=False,
                              log=lambda _: None)
    assert calls == [("math-ai/aime25", "test.jsonl", "dataset"), ("HuggingFaceH4/MATH-500", "test.jsonl", "dataset")]
    assert no_temp_files(out)


def test_a_benchmark_is_rebuilt_when_its_source_changes(tmp_path, mirror):
    out = tmp_path / "out"
    data.prepare(out, source_dir=str(mirror), log=lambda _: None, benchmarks=["aime25"])
    other = [{"question": f"Other problem {i}", "answer": str(i)} for i in range(30)]
    src = write_jsonl(tmp_path / "oc" / "aime2025-I.jsonl", other[:15])
    write_jsonl(src.parent / "aime2025-II.jsonl", other[15:])
    logs: list[str] = []
    data.prepare(out, source_dir=str(mirror), log=logs.append, benchmarks=["aime25"],
                 benchmark_repos={"aime25": str(src.parent)})
    assert any("building again" in line for line in logs)
    assert rows_of(out / "aime-2025.parquet")[0]["extra_info"]["raw_problem"] == "Other problem 0"

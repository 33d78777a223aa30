"""Where the loop runs and what the volume holds (dapo.plan.memory): `dapo plan` reports both and fails when they do not
fit; the chart and scripts/render.py refuse a volume smaller than the run needs, with the same message, from one
source (dapo.plan.memory, written by dapo.plan.cli -> charts/dapo/files/requirements.yaml, checked fresh here)."""

from __future__ import annotations

import re

import pytest
import yaml

from dapo.plan import memory as sizing
from dapo.plan.cli import requirements_text
from dapo.config import load_preset
from dapo.k8s import ValuesError
from dapo.k8s.presets import runnable_presets
from k8s_support import CHART_DIR, VALUES_DIR, chart, chart_objects, render_script, set_files, user_values

REQUIREMENTS = CHART_DIR / "files" / "requirements.yaml"


def test_chart_requirements_file_is_fresh():
    assert REQUIREMENTS.read_text() == requirements_text(), (
        "charts/dapo/files/requirements.yaml is stale: run "
        "`dapo plan --requirements-file charts/dapo/files/requirements.yaml`")
    assert sorted(yaml.safe_load(REQUIREMENTS.read_text())["presets"]) == runnable_presets()


@pytest.mark.parametrize("text, expected", [("500Gi", 500 * 2**30), ("8Ti", 8 * 2**40), ("1.5T", 1.5e12),
                                            ("1000", 1000.0), ("2k", 2000.0), ("3Mi", 3 * 2**20)])
def test_quantities_parse_like_kubernetes(text, expected):
    assert sizing.parse_quantity(text) == expected


def _gib_below_and_at(name: str) -> tuple[str, str]:
    need = sizing.storage(load_preset(name))["bytes"]
    assert need is not None and need % 2**30 == 0
    return f"{int(need // 2**30) - 1}Gi", f"{int(need // 2**30)}Gi"


@pytest.mark.parametrize("name", ["full", "early", "7b", "smoke", "one-gpu", "tiny"])
def test_a_volume_one_gib_short_is_refused_naming_the_need(name):
    files, release = set_files(name)
    short, exact = _gib_below_and_at(name)
    with pytest.raises(ValuesError) as refused:
        chart_objects(files, release=release, extra={"storage": {"size": short}})
    message = str(refused.value)
    assert message.startswith(f"storage.size: {short} is smaller than what preset {name} needs: ")
    assert "max_ckpt_to_keep" in message and f"dapo plan --preset {name}" in message
    # exactly the requirement is enough
    chart().render(user_values(files, {"storage": {"size": exact}}), name=release, namespace="ml")


def test_an_existing_claim_is_not_sized_by_the_chart():
    files, release = set_files("full")
    extra = {"storage": {"size": "1Gi", "existingClaim": "team-volume"}}
    chart().render(user_values(files, extra), name=release, namespace="ml")


@pytest.mark.parametrize("name", ["full", "early"])
def test_the_shipped_values_of_the_32b_runs_hold_the_loop_and_the_checkpoints(name, capsys):
    from dapo.plan.cli import main

    rc = main(["--preset", name, "--values", str(VALUES_DIR / f"{name}.yaml")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "ERROR" not in out
    assert "loop peak host memory" in out and f"(max_ckpt_to_keep {load_preset(name).recipe.trainer.max_ckpt_to_keep}"\
        " + 1 + the best) checkpoints" in out


def test_plan_fails_naming_the_values_key_when_the_loop_does_not_fit_its_worker(tmp_path, capsys):
    """The full recipe's loop (~72 GiB: a 27.8 GiB padded generation batch held twice plus kept rows) does not fit
    a pod of the old head's size; the plan says which value to change."""
    from dapo.plan.cli import main

    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump({"worker": {"resources": {"limits": {"memory": "200Gi"}}, "shmSize": "64Gi"}}))
    rc = main(["--preset", "full", "--values", str(VALUES_DIR / "full.yaml"), "--values", str(small)])
    out = capsys.readouterr().out
    assert rc == 1
    (line,) = [ln for ln in out.splitlines() if "ERROR worker.resources.limits.memory" in ln]
    assert "preset full: the loop needs ~59.0 GiB" in line and "200Gi" in line


def test_plan_fails_on_a_too_small_volume_with_the_chart_message(tmp_path, capsys):
    from dapo.plan.cli import main

    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump({"storage": {"size": "1Ti"}}))
    rc = main(["--preset", "full", "--values", str(VALUES_DIR / "full.yaml"), "--values", str(small)])
    out = capsys.readouterr().out
    assert rc == 1
    need = sizing.storage(load_preset("full"))
    assert f"ERROR storage.size: {sizing.storage_message('full', '1Ti', need['summary'])}" in out


def test_local_preset_plan_reports_the_worker_and_the_volume(capsys):
    from dapo.plan.cli import main

    assert main(["--preset", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "local backend" in out and "for the loop" in out and "storage.size 10Gi" in out


def test_loop_memory_is_dominated_by_the_padded_generation_batch_held_twice():
    full = sizing.loop_memory(load_preset("full"), 1_791_700)
    # 1,536 prompts x 16 responses, each padded to 2,048 + 20,480 tokens
    assert full["generation_batch"] == 1536 * 16 * sizing.row_bytes(2048, 20480)
    assert round(full["generation_batch"] / 2**30, 1) == 22.1
    assert full["during_generation"] == 2 * full["generation_batch"] + 512 * 16 * sizing.row_bytes(2048, 20480)
    early = sizing.loop_memory(load_preset("early"), 1_791_700)
    assert early["during_generation"] == 2 * early["generation_batch"]  # no dynamic sampling: nothing held


def test_storage_counts_keep_plus_one_checkpoints_and_the_best_one():
    preset = load_preset("full")
    s = sizing.storage(preset)
    keep = preset.recipe.trainer.max_ckpt_to_keep
    assert s["checkpoints"] == keep + 2  # the newest keep, the one being written, the best-scoring one
    raw = (keep + 2) * s["per_checkpoint"] + s["model_cache"] + s["data"]
    assert raw * 1.1 <= s["bytes"] < raw * 1.1 + 2**30
    assert re.match(r"^\d+\.\d (GiB|TiB) = \(max_ckpt_to_keep 3 \+ 1 \+ the best\) checkpoints x ", s["summary"])
    no_val = sizing.storage(load_preset("full", ["recipe.trainer.test_freq=0"]))
    assert no_val["checkpoints"] == keep + 1  # no validation, no best to keep

"""The chart's preset merge (``charts/dapo/templates/_presets.tpl``) equals the one Python implementation
(:mod:`dapo.config.chain`): every preset, and a table of override spellings, rendered through Helm's own engine.

The chart's defines run in a probe chart that holds the chart's ``_presets.tpl`` itself, the preset files and one
template printing ``dapo.preset``, ``dapo.effectivePreset`` and ``dapo.trainerPath`` as JSON; the same inputs go
through :mod:`dapo.config.chain`. Each case either gives the same three results or is refused by both with the same
message. The one reading that differs is Helm's for mapping keys (go-yaml reads the key ``n`` as the boolean false):
Python keeps keys as written, so the files' keys are compared as Helm reads them, and the chart never reads those keys.
"""

from __future__ import annotations

import json
import re
import shutil
from typing import Any

import pytest

from conftest import ROOT
from dapo.config import ConfigError, apply_overrides, list_presets, resolve_trainer_refs, split_overrides
from dapo.config.chain import PRESET_DIR, PRESET_ROOTS, _NotExact, _plain_scalar, merged_preset, read_yaml
from dapo.util.gofmt import go_string
from k8s_support import CHART_DIR, helm

PROBE = """\
{{- $p := include "dapo.effectivePreset" . | fromJson -}}
{{- $t := ($p.recipe | default dict).trainer | default dict -}}
{{- $run := "" -}}
{{- if hasKey $t "default_local_dir" -}}
{{- $run = include "dapo.trainerPath" (dict "path" $t.default_local_dir "trainer" $t) -}}
{{- end -}}
{{ toJson (dict "preset" (include "dapo.preset" . | fromJson) "effective" $p "runDir" $run) }}
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """A chart of the chart's own preset defines, the preset files and the probe template."""
    root = tmp_path_factory.mktemp("probe")
    (root / "templates").mkdir()
    (root / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (root / "values.yaml").write_text("preset: full\noverrides: []\n")
    shutil.copy(CHART_DIR / "templates" / "_presets.tpl", root / "templates" / "_presets.tpl")
    shutil.copytree(PRESET_DIR, root / "presets")
    (root / "templates" / "probe.yaml").write_text(PROBE)
    return helm().Chart.load(str(root))


def helm_view(probe, preset: str, overrides: list[str]) -> dict[str, Any] | str:
    """The chart's three results, or its refusal (the message of its ``fail``)."""
    try:
        out = probe.render({"preset": preset, "overrides": overrides}, name="probe", namespace="ns")
    except helm().HelmRenderError as exc:
        return "refused: " + str(exc).split("): ", 1)[-1]
    return json.loads(out["probe/templates/probe.yaml"])


def helm_keys(tree: Any) -> Any:
    """A file's mapping as Helm reads its keys: go-yaml resolves a plain key like a value (``n``: false) and the JSON
    step writes it back as a string."""
    if isinstance(tree, list):
        return [helm_keys(v) for v in tree]
    if not isinstance(tree, dict):
        return tree
    out = {}
    for key, value in tree.items():
        try:
            read = _plain_scalar(key)
        except _NotExact:
            read = key
        out[go_string(read) if isinstance(read, (bool, int, float)) else key] = helm_keys(value)
    return out


def python_view(preset: str, overrides: list[str]) -> dict[str, Any] | str:
    """The same three results from :mod:`dapo.config.chain` (the files' keys as Helm reads them), or its refusal."""
    try:
        merged = helm_keys(merged_preset(preset, files=False))
        effective = apply_overrides(merged, split_overrides(overrides)[0])
        trainer = (effective.get("recipe") or {}).get("trainer") or {}
        run = resolve_trainer_refs(trainer["default_local_dir"], trainer) if "default_local_dir" in trainer else ""
    except ConfigError as exc:
        return f"refused: {exc}"
    # what toJson writes: numbers as JSON numbers (Helm holds every number as a float64)
    return json.loads(json.dumps({"preset": merged, "effective": effective, "runDir": run}))


@pytest.mark.parametrize("preset", list_presets())
def test_the_chart_merges_every_preset_as_python_does(probe, preset):
    helm_out, python_out = helm_view(probe, preset, []), python_view(preset, [])
    assert isinstance(python_out, dict), python_out
    assert helm_out == python_out
    # and the values themselves as Python reads them, Helm's keys apart
    assert json.loads(json.dumps(merged_preset(preset))) == json.loads(json.dumps(python_out["preset"]).replace(
        '"false":', '"n":'))


def test_the_only_keys_helm_reads_differently_are_rollout_n_which_no_template_reads():
    renamed = set()

    def walk(tree, path):
        for key, value in tree.items():
            if helm_keys({key: None}) != {key: None}:
                renamed.add(f"{path}{key}")
            if isinstance(value, dict):
                walk(value, f"{path}{key}.")

    for name in list_presets():
        walk(merged_preset(name), "")
    assert renamed == {"recipe.rollout.n", "recipe.rollout.val.n"}
    templates = "".join(p.read_text() for p in (CHART_DIR / "templates").rglob("*") if p.is_file())
    assert not re.search(r"\.n\b|\"n\"", templates), "a template reads a key Helm reads as \"false\""


# The spellings of one override value: YAML's number forms, null, booleans, quotes, dates, the values Helm cannot hold.
SPELLINGS = [
    "1e-6", "1E-6", "1.0e-6", "1e6", "1e+6", "1.5e3", "1.e3", ".5", "-.5", "+.5", "0.", "5", "5.0", "+1", "-0",
    "1_000", "1_000.5", "1__0", "1_", "_1", "010", "08", "00", "0o10", "0x1F", "0x_1", "0b101", "0e0",
    "1234567.5", "0.00001", "1e21", "1e400", "12345678901234567890", "9007199254740993", "9007199254740992",
    "~", "null", "Null", "NULL", "", " ", "''", '""', "'1e-6'", '"1e-6"', "'5'", '"5"', "'true'",
    "true", "True", "TRUE", "false", "yes", "no", "y", "n", "on", "off", "Y",
    ".inf", "-.Inf", "+.INF", ".nan", "+.nan",
    "2024-01-01", "2024-01-01T10:00:00Z", "1:30", "a b", "run-2", "5 # note", "[1, 2]", "{a: 1}", "a: b", "[",
]
KEYS = ["recipe.actor.optim.lr", "recipe.trainer.experiment_name"]


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_the_chart_reads_each_override_spelling_as_python_does(probe, key, spelling):
    overrides = [f"{key}={spelling}"]
    assert helm_view(probe, "full", overrides) == python_view("full", overrides)


@pytest.mark.parametrize("override", [
    *(f"{root}.probe=1" for root in PRESET_ROOTS),  # each root of the Python schema is a preset key in the chart too
    "recipe.rollout.n=8",  # a key Helm reads as "false" in the files: set as written on both sides
    "trainer.total_epochs=3", "actor_rollout_ref.rollout.n=2", "+trainer.x=1",  # verl keys: the preset is left alone
    "+recipe.trainer.x=1", "~recipe.x=1", "recipe..x=1", "recipe.trainer.project_name.x=1", "recipe.trainer",
])
def test_the_chart_sorts_and_refuses_override_keys_as_python_does(probe, override):
    assert helm_view(probe, "full", [override]) == python_view("full", [override])


def test_a_later_override_wins_and_paths_follow_the_overrides(probe):
    overrides = ["recipe.trainer.experiment_name=a", "recipe.trainer.project_name=p", "recipe.trainer.experiment_name=b"]
    helm_out = helm_view(probe, "full", overrides)
    assert helm_out == python_view("full", overrides)
    assert helm_out["runDir"].endswith("/p/b")


def test_the_probe_sees_a_changed_chart(tmp_path):
    # the comparison can fail: a chart that reads override values as strings differs from Python at once
    text = (CHART_DIR / "templates" / "_presets.tpl").read_text()
    broken = text.replace('{{- $val = $doc.v -}}', '{{- $val = $raw -}}')
    assert broken != text
    shutil.copytree(PRESET_DIR, tmp_path / "presets")
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "_presets.tpl").write_text(broken)
    (tmp_path / "templates" / "probe.yaml").write_text(PROBE)
    (tmp_path / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    broken_chart = helm().Chart.load(str(tmp_path))
    overrides = ["recipe.actor.optim.lr=1e-6"]
    assert helm_view(broken_chart, "full", overrides) != python_view("full", overrides)


def test_python_reads_yaml_as_helm_does_where_pyyaml_would_not():
    v = lambda text: read_yaml(f"v: {text}", "test")["v"]  # noqa: E731
    assert v("1e-6") == 1e-6 and v("-.5") == -0.5 and v("0o10") == 8 and v("08") == 8.0 and v("y") is True
    assert v("1:30") == "1:30" and v("2024-01-01") == "2024-01-01" and v("1_000") == 1000
    assert read_yaml("n: 16", "test") == {"n": 16}  # keys as written
    for text in (".inf", ".nan", "9007199254740993"):
        with pytest.raises(ConfigError, match=re.escape(f"test: {text} is ")):
            v(text)


def test_the_chart_file_is_the_one_the_probe_tests():
    # the probe copies the chart's own file: nothing else of the chart merges presets
    defines = re.findall(r'define "(dapo\.[A-Za-z]+)"', (CHART_DIR / "templates" / "_presets.tpl").read_text())
    assert {"dapo.preset", "dapo.effectivePreset", "dapo.setOverride", "dapo.trainerPath"} <= set(defines)
    others = [p for p in (CHART_DIR / "templates").rglob("*") if p.is_file() and p.name != "_presets.tpl"]
    for p in others:
        text = p.read_text()
        assert "fromYaml (printf \"v: " not in text and "${trainer." not in text, p
    assert (ROOT / "charts" / "dapo" / "presets").resolve() == PRESET_DIR

"""`scripts/render.py` reads `-f` / `--set` / `--set-string` / `--set-json` / `--set-file` exactly as Helm does.

The property: random user inputs of the kind users type -- a documented values file (or `--preset`), a cloud and a
queue layer, up to three value items drawn from values.yaml's own leaves, with the type slips people make (`yes` for
a boolean, `0.5` for a CPU quantity, `1e-6` for a name, a list for a map) -- render to the same objects through Helm
and through render.py, or are refused by both.

The Helm side is composed here from Helm's own parts, independently of dapo.k8s.helm: each file read by Helm's
values reader and merged with Helm's MergeMaps (transcribed below from Helm v4.2.3 pkg/chart/v2/loader/load.go), each
item parsed alone by Helm's strvals parser (the SDK) and put where ``strvals.ParseInto`` puts it (its key path
walked through the values so far: a map step into a value that is not a map is Helm's "interface conversion" refusal,
an index step into a value that is not a list likewise), then the chart rendered by Helm's engine. The refusals of
both sides are counted by cause.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT
from k8s_support import CHART_DIR, VALUES_DIR, render_script
from dapo.k8s import ValuesError, helm
from test_setup_torch import pypi  # noqa: F401  (the fixture: PyPI reachable, or skip; CI fails)

CASES = 450
VALUE_CASES = 1500
SEED = 45
# Helm's manifest separator (pkg/release/v1/util/manifest.go, SplitManifests)
SEPARATOR = re.compile(r"(?:^|\s*\n)---\s*")


def helm_merge_maps(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = helm_merge_maps(out[k], v)
            continue
        out[k] = v
    return out


class Refused(Exception):
    pass


def _leaves(data: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    if isinstance(data, dict) and data:
        return [leaf for k, v in data.items() for leaf in _leaves(v, path + (k,))]
    return [(path, data)]


def values_leaves() -> list[tuple[tuple[str, ...], Any]]:
    return _leaves(helm.helm().values_from_yaml((CHART_DIR / "values.yaml").read_text()))


# -- the inputs --------------------------------------------------------------------------------------------------

WORDS = ["x", "dapo", "gpu", "a-b", "ml.team", "Always", "efa", "ib", "kueue"]
NUMERIC_TEXT = ["0.5", "1e-6", "1e3", "010", "0", "-1", "12", "1_000", "2.0", ".5", "0x10", "1:20"]
BOOL_TEXT = ["true", "false", "yes", "no", "on", "True", "FALSE", "1", "0"]
QUANTITY_TEXT = ["500m", "2", "0.5", "8Gi", "1.5Gi", "1e3", "64Mi", "100k"]


def slip(rng: random.Random, default: Any, key: str) -> str:
    """A value typed for this leaf, or one of the slips a person makes for it."""
    pool = WORDS + NUMERIC_TEXT + BOOL_TEXT + ["null", "", "a,b", "a\\,b", "{a,b}", "{}", "\"quoted\""]
    if isinstance(default, bool):
        pool = BOOL_TEXT * 3 + pool
    elif isinstance(default, (int, float)) or default is None:
        pool = [str(rng.randint(0, 5000)), str(rng.randint(1, 64))] * 3 + NUMERIC_TEXT * 2 + pool
    elif key in ("cpu", "memory", "shmSize", "size") or "Gi" in str(default):
        pool = QUANTITY_TEXT * 4 + pool
    elif isinstance(default, list):
        pool = ["{a,b}", "{x}", "{}", "null", "x"] * 3 + pool
    elif isinstance(default, str):
        pool = WORDS * 2 + pool
    return rng.choice(pool)


def random_item(rng: random.Random, leaves, tmp: Path) -> tuple[str, tuple[Any, ...], str, str]:
    """(kind, key path, the item's text, its value text) with key paths from values.yaml's leaves; sometimes a key
    below a leaf (a map set by a person who thought it a scalar, or the reverse) or a list index."""
    path, default = rng.choice(leaves)
    path = tuple(path)
    value = slip(rng, default, path[-1])
    roll = rng.random()
    if roll < 0.08:
        path = path + (rng.choice(["sub", "key"]),)
    elif roll < 0.14 and isinstance(default, list):
        path = path[:-1] + (f"{path[-1]}[{rng.randint(0, 2)}]",)
    key = ".".join(p.replace(".", "\\.") if "[" not in p else p for p in path)
    kind = rng.choices(["set", "set_string", "set_json", "set_file"], [70, 12, 12, 6])[0]
    if kind == "set_json":
        value = rng.choice([json.dumps(value), value, json.dumps(_typed(value)), "[1,2]", "{\"a\": 1}", "null"])
    if kind == "set_file":
        f = tmp / f"file-{rng.randint(0, 10**9)}.txt"
        f.write_text(value + rng.choice(["", "\n"]))
        value = str(f)
    return kind, path, f"{key}={value}", value


def _typed(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


CLOUDS = ["eks-p5.yaml", "gke-a3-high.yaml", "gke-a3-mega.yaml", "gke-a3-ultra.yaml"]


def random_case(rng: random.Random, leaves, tmp: Path) -> dict[str, Any]:
    sets = render_script().RENDER_SETS
    name = rng.choice(sorted(sets))
    files, release = sets[name]
    sugar = rng.random() < 0.3 and len(files) == 1
    files = list(files)
    if rng.random() < 0.35:
        files.append(rng.choice(CLOUDS))
    if rng.random() < 0.25:
        files.append("kueue.yaml")
    cluster = list(render_script().RENDER_CLUSTER) if rng.random() < 0.9 else []
    if rng.random() < 0.8:
        cluster.append("fabric.expect=ib")
    items = [random_item(rng, leaves, tmp) for _ in range(rng.randint(0, 3))]
    return {"name": name, "files": files, "release": release, "sugar": sugar,
            "cluster": cluster, "items": items}


def argv_of(case: dict[str, Any]) -> list[str]:
    """render.py's command line for a case: the items in the order drawn (Helm applies them by kind, whatever their
    order on the line; the Helm side below does)."""
    files = case["files"]
    argv = ["--preset", case["name"]] + [a for f in files[1:] for a in ("-f", str(VALUES_DIR / f))] \
        if case["sugar"] else [a for f in files for a in ("-f", str(VALUES_DIR / f))]
    argv += [a for s in case["cluster"] for a in ("--set", s)]
    for kind, _path, text, _value in case["items"]:
        argv += [{"set": "--set", "set_string": "--set-string", "set_json": "--set-json",
                  "set_file": "--set-file"}[kind], text]
    return argv + ["--release", case["release"], "-n", "dapo"]


# -- the Helm side -----------------------------------------------------------------------------------------------

def helm_parse(kind: str, text: str) -> dict[str, Any]:
    h = helm.helm()
    parser = {"set": h.parse_set_string, "set_string": h.parse_set_string_values, "set_json": h.parse_set_json,
              "set_file": h.parse_set_file}[kind]
    try:
        return parser(text)
    except h.HelmError as exc:
        raise Refused(f"parser: {exc}") from exc


def _step(part: str) -> tuple[str, int | None]:
    if part.endswith("]") and "[" in part:
        key, index = part[:-1].split("[")
        return key, int(index)
    return part, None


def helm_place(base: dict[str, Any], kind: str, path: tuple[str, ...], text: str) -> dict[str, Any]:
    """``strvals.ParseInto(text, base)`` for an item ``a.b.c=v`` or ``a.b[i]=v``: the value as Helm's parser reads
    the item alone, put at its key path in a copy of base."""
    parsed = helm_parse(kind, text)
    out = json.loads(json.dumps(base))
    node, fresh = out, parsed
    for depth, part in enumerate(path):
        key, index = _step(part)
        last = depth == len(path) - 1
        fresh = fresh[key]
        if index is not None:
            existing = node.get(key, [])
            if not isinstance(existing, list):
                raise Refused("parser: index into a value that is not a list")
            existing = existing + [None] * (index + 1 - len(existing))
            existing[index] = fresh[index]
            node[key] = existing
            return out
        if last:
            node[key] = fresh
            return out
        if key in node and not isinstance(node[key], dict):
            raise Refused("parser: interface conversion (a key below a value that is not a map)")
        node = node.setdefault(key, {})
    return out


def helm_user_values(case: dict[str, Any]) -> dict[str, Any]:
    h = helm.helm()
    base: dict[str, Any] = {}
    for f in case["files"]:
        base = helm_merge_maps(base, h.values_from_yaml((VALUES_DIR / f).read_text()))
    for kind in ("set_json", "set", "set_string", "set_file"):
        sets = [(kind, tuple(s.split("=", 1)[0].split(".")), s, "") for s in case["cluster"]] if kind == "set" else []
        for k, path, text, _value in sets + [i for i in case["items"] if i[0] == kind]:
            base = helm_place(base, k, path, text)
    return base


def helm_objects(case: dict[str, Any]) -> list[str]:
    h = helm.helm()
    values = helm_user_values(case)
    try:
        rendered = helm.load_chart(str(CHART_DIR)).render(values, name=case["release"], namespace="dapo")
    except h.HelmValuesError as exc:
        raise Refused(f"schema: {exc}") from exc
    except h.HelmRenderError as exc:
        raise Refused(f"chart: {exc}") from exc
    out = []
    for path, text in rendered.items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in SEPARATOR.split(text):
            obj = h.values_from_yaml(doc) if doc.strip() else {}
            if obj and (obj["metadata"].get("annotations") or {}).get("helm.sh/hook") != "test":
                out.append(json.dumps(obj, sort_keys=True))
    return sorted(out)


def render_py_objects(case: dict[str, Any]) -> list[str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = render_script().main(argv_of(case))
    if code:
        raise Refused(err.getvalue())
    h = helm.helm()
    # read as kubectl reads a stream (Kubernetes' YAMLReader: a line `---` ends a document)
    docs = re.split(r"^---[ \t]*\n", out.getvalue(), flags=re.M)
    objs = [h.values_from_yaml(doc) for doc in docs if doc.strip()]
    return sorted(json.dumps(o, sort_keys=True) for o in objs if o)


class MemoChart:
    """Helm's render is a pure function of (values, release, namespace): both sides share one memo of it, so a case
    whose two value sets agree renders once."""

    def __init__(self, chart):
        self.chart, self.memo = chart, {}

    def render(self, values, *, name, namespace, **_install_flags):
        key = json.dumps([values, name, namespace], sort_keys=True)
        if key not in self.memo:
            try:
                self.memo[key] = ("ok", self.chart.render(values, name=name, namespace=namespace))
            except Exception as exc:  # noqa: BLE001 -- replayed below as raised
                self.memo[key] = ("err", exc)
        kind, result = self.memo[key]
        if kind == "err":
            raise result
        return result

    def __getattr__(self, name):
        return getattr(self.chart, name)


def test_random_user_inputs_render_identically_through_helm_and_render_py_or_are_refused_by_both(tmp_path,
                                                                                                 monkeypatch):
    chart = MemoChart(helm.load_chart(str(CHART_DIR)))
    monkeypatch.setattr(helm, "load_chart", lambda _dir: chart)
    rng = random.Random(SEED)
    leaves = values_leaves()
    tally: Counter = Counter()
    diverging = []
    for i in range(CASES):
        case = random_case(rng, leaves, tmp_path)
        try:
            ours, ours_refused = render_py_objects(case), None
        except Refused as exc:
            ours, ours_refused = None, str(exc)
        try:
            theirs, theirs_refused = helm_objects(case), None
        except Refused as exc:
            theirs, theirs_refused = None, str(exc)
        if ours_refused and theirs_refused:
            tally["refused by both: " + theirs_refused.split(":")[0]] += 1
        elif ours is not None and theirs is not None and ours == theirs:
            tally["identical"] += 1
        else:
            diverging.append((i, argv_of(case), ours_refused, theirs_refused))
    print(f"\n{CASES} cases:", dict(sorted(tally.items())), "diverging:", len(diverging))
    assert not diverging, diverging[:5]
    # the inputs reach both outcomes and every refusal of Helm's
    assert tally["identical"] >= CASES // 4, tally
    assert {"refused by both: schema", "refused by both: chart", "refused by both: parser"} <= set(tally), tally


def render_py_values(case: dict[str, Any]) -> dict[str, Any]:
    """The user values render.py composes for a case's command line."""
    script = render_script()
    args = script._parser().parse_args(argv_of(case))
    opts, _release = script.preset_options(args)
    try:
        return helm.user_values(opts)
    except ValuesError as exc:
        raise Refused(str(exc)) from exc


def test_random_user_inputs_give_the_values_helm_composes(tmp_path):
    """Many more cases than the render test, on the values alone (what the chart is handed): equal, or refused by
    both parsers."""
    rng = random.Random(SEED + 1)
    leaves = values_leaves()
    tally: Counter = Counter()
    for i in range(VALUE_CASES):
        case = random_case(rng, leaves, tmp_path)
        try:
            ours = render_py_values(case)
        except Refused:
            ours = None
        try:
            theirs = helm_user_values(case)
        except Refused:
            theirs = None
        assert json.dumps(ours, sort_keys=True) == json.dumps(theirs, sort_keys=True), (i, argv_of(case))
        tally["equal" if ours is not None else "refused by both"] += 1
    print(f"\n{VALUE_CASES} cases:", dict(tally))
    assert tally["refused by both"] >= VALUE_CASES // 40, tally


# -- Helm's own rules, case by case ----------------------------------------------------------------------------

def into(base: dict[str, Any], *items: str, kind: str = "set") -> dict[str, Any]:
    for item in items:
        base = helm.parse_into(kind, item, base)
    return base


def test_set_items_land_into_the_values_so_far_as_helm_parse_into_puts_them():
    """The cases of Helm v4.2.3's TestParseInto (pkg/strvals/parser_test.go): maps merge key by key, an index
    changes one element of an existing list, nested lists and maps of lists are reached in place."""
    assert into({"outer": {"inner1": "overwrite", "inner2": "value2"}},
                "outer.inner1=value1,outer.inner3=value3,outer.inner4=4") == \
        {"outer": {"inner1": "value1", "inner2": "value2", "inner3": "value3", "inner4": 4}}
    assert into({}, "listOuter[0][0].type=listValue", "listOuter[0][0].status=alive") == \
        {"listOuter": [[{"type": "listValue", "status": "alive"}]]}
    assert into({}, "listOuter[0][0].type=listValue", "listOuter[1][0].status=alive") == \
        {"listOuter": [[{"type": "listValue"}], [{"status": "alive"}]]}
    assert into({"listOuter": [[[{"exited": "old"}]]]}, "listOuter[0][1][0].type=listValue",
                "listOuter[0][0][1].status=alive") == \
        {"listOuter": [[[{"exited": "old"}, {"status": "alive"}], [{"type": "listValue"}]]]}
    # an index into a list from a values file keeps its other elements (a fresh parse merged would replace it)
    tolerations = [{"key": "a"}, {"key": "b"}]
    assert into({"worker": {"tolerations": tolerations}}, "worker.tolerations[1].effect=NoSchedule") == \
        {"worker": {"tolerations": [{"key": "a"}, {"key": "b", "effect": "NoSchedule"}]}}


def test_values_so_far_keep_their_types_empty_maps_lists_and_odd_keys():
    base = {"m": {}, "l": [], "n": None, "f": 2.5, "b": True, "s": "010", "": {"q": 1}, "k.e=y": [None, 1]}
    assert into(base, "z=1") == {**base, "z": 1}
    assert into(base, "z=1", kind="set_string") == {**base, "z": "1"}
    assert into(base, "m.x=1", "l[0][1]=q", "k\\.e\\=y[0].a=b") == {
        **base, "m": {"x": 1}, "l": [[None, "q"]], "k.e=y": [{"a": "b"}, 1]}
    assert into(base, 'l=[1,{"a":null}]', kind="set_json")["l"] == [1, {"a": None}]
    assert into(base, '{"m": {"y": 2}, "f": null}', kind="set_json") == {**base, "m": {"y": 2}, "f": None}


@pytest.mark.parametrize("base,item", [({"s": "text"}, "s.x=1"), ({"n": None}, "n.x=1"), ({"m": {}}, "m[0]=1"),
                                       ({}, "a.b"), ({}, "a[x]=1"), ({}, "a=b,c")])
def test_an_item_helm_refuses_is_refused_naming_the_item(base, item):
    with pytest.raises(ValuesError, match=re.escape(f"--set {item}: Helm refuses it")):
        into(base, item)


def test_the_flags_apply_in_helms_order_whatever_their_order_on_the_command_line(tmp_path):
    f = tmp_path / "v.yaml"
    f.write_text("a: from-file\nlist: [1, 2, 3]\n---\nb: second-document\n")
    content = tmp_path / "c.txt"
    content.write_text("from a file\n")
    script = render_script()
    args = script._parser().parse_args(["--set-file", f"d={content}", "--set-string", "a=7", "--set", "a=8",
                                        "--set-json", 'a="json"', "--set", "c=1", "-f", str(f),
                                        "--set", "list[1]=x"])
    opts, _ = script.preset_options(args)
    assert helm.user_values(opts) == {"a": "7", "b": "second-document", "c": 1, "d": "from a file\n",
                                      "list": [1, "x", 3]}


def render_py(capsys, *argv: str) -> tuple[int, list[dict[str, Any]], str]:
    code = render_script().main(list(argv))
    out, err = capsys.readouterr()
    docs = re.split(r"^---[ \t]*\n", out, flags=re.M)
    return code, [helm.helm().values_from_yaml(d) for d in docs if d.strip()], err


STAND_IN_SETS = ("--set", "image.published=true", "--set", "storage.storageClassName=rwx")


def test_the_slips_users_make_are_read_as_helm_reads_them(capsys):
    code, _, err = render_py(capsys, "--preset", "smoke", *STAND_IN_SETS, "--set", "train.enabled=yes")
    assert code == 2 and "at '/train/enabled': got string, want boolean" in err
    code, objs, _ = render_py(capsys, "--preset", "smoke", *STAND_IN_SETS, "--set", "eval.enabled=true",
                              "--set", "eval.image.tag=0.5", "--set", "preflight.resources.requests.cpu=0.5",
                              "--set", "queue.scheduler=kueue", "--set", "queue.name=1e-6")
    assert code == 0
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    evaluation = by_name[("RayJob", "dapo-smoke-eval")]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    assert evaluation["spec"]["containers"][0]["image"].endswith(":0.5")
    preflight = by_name[("Job", "dapo-smoke-preflight")]["spec"]["template"]["spec"]["containers"][0]
    assert preflight["resources"]["requests"]["cpu"] == "0.5"
    assert by_name[("RayJob", "dapo-smoke-train")]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "1e-6"


# -- the SDK itself --------------------------------------------------------------------------------------------

def test_the_sdk_is_the_helm_release_the_docs_name():
    doc = (ROOT / "docs" / "development.md").read_text()
    h = helm.helm()
    assert f"helm-python-sdk](https://pypi.org/project/helm-python-sdk/) {h.__version__}, Helm {h.helm_sdk_version()}'s" \
        in doc


# (pip platform tags, whether helm-python-sdk publishes a wheel for them): the platforms docs/development.md names
WHEEL_PLATFORMS = [
    (["manylinux_2_28_x86_64"], True), (["manylinux_2_28_aarch64"], True), (["macosx_11_0_arm64"], True),
    (["macosx_15_0_x86_64"], True), (["win_amd64"], True),
    (["macosx_14_0_x86_64", "macosx_11_0_x86_64"], False), (["musllinux_1_2_x86_64"], False),
    (["manylinux_2_17_x86_64", "manylinux2014_x86_64"], False),
]


@pytest.mark.network
@pytest.mark.parametrize("tags,published", WHEEL_PLATFORMS, ids=lambda x: str(x[0]) if isinstance(x, list) else "")
def test_the_sdk_publishes_wheels_for_the_platforms_the_docs_name(tags, published, tmp_path, pypi):
    import subprocess

    version = helm.helm().__version__
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-deps", "--ignore-installed",
         "--only-binary=:all:", "--python-version", "3.11", "--target", str(tmp_path / "t"),
         "--report", str(tmp_path / "r.json"), *[a for t in tags for a in ("--platform", t)],
         f"helm-python-sdk=={version}"], capture_output=True, text=True, timeout=120)
    assert (proc.returncode == 0) == published, proc.stderr[-2000:]

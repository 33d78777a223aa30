"""Every command README.md and docs/*.md give is valid: each `helm`, `kubectl`, `dapo`, `python -m dapo.*` and
`scripts/render.py` command is extracted from the fenced code blocks and from the inline code spans that start with
one of those programs, and checked without a cluster:

- `helm install|upgrade|template` of charts/dapo: the `-f` files exist, every `--set` path exists in
  values.schema.json, and the chart renders with exactly those values (real Helm, helm_python) -- a value the chart
  refuses fails here as it would at install time;
- other `helm` commands (the KubeRay operator's chart from its repository, `test`, `status`, `uninstall`, `repo`)
  need a live cluster or a remote chart: counted as such, their local `-f` files checked;
- `dapo ...` / `python -m dapo.train ...`, `scripts/render.py ...`: parsed by the command's own argument parser;
- `kubectl`: a known verb; `-f` files exist (or were written by an earlier command of the same document); every
  object named by kind and name (`job/dapo-train-logs`, `rayjob dapo-train`, `svc/...-head-svc`, `pvc dapo-shared`)
  is one the chart renders for a documented release (or KubeRay creates from it).

Placeholders are filled in (the variables of DOC_VARIABLES with what a user puts there -- a command with `$CLOUD` is
checked once per cloud file --, any other `$VAR` and `$(...)` with a dummy word, `<release>` with one that skips the
name check, `[optional args]` dropped, an argument abbreviated as `...` with a dummy word); a bare name in prose
(`dapo eval`, `dapo report RUN`) is a mention, not a command. A documented install renders as written: no stand-in
cluster (tests/k8s_support.STAND_IN) sets image.published, a storage class or a fabric behind the document's back."""

from __future__ import annotations

import argparse
import functools
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from k8s_support import CHART_DIR, VALUES_DIR, chart, chart_objects, render_script, set_files, user_values

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ("helm ", "kubectl ", "dapo ", "python -m dapo", "python scripts/render.py", "scripts/render.py ",
            ".venv-vllm/bin/dapo ", ".venv/bin/dapo ", "--set ", "-f ")
CLUSTER_HELM = {"test", "status", "uninstall", "repo", "list", "rollback", "get", "history"}
KUBECTL_VERBS = {"get", "logs", "describe", "exec", "port-forward", "create", "apply", "delete", "wait", "rollout",
                 "drain", "cordon", "uncordon", "label", "annotate", "patch", "top", "cp", "edit", "explain"}
# what the docs' variables stand for (README: $REGISTRY, $RWX_CLASS, $CLOUD), as a user fills them in
DOC_VARIABLES = {"REGISTRY": ("registry.example.com/ml",), "RWX_CLASS": ("rwx-class",),
                 "CLOUD": ("eks-p5", "gke-a3-mega", "gke-a3-high", "gke-a3-ultra")}
KINDS = {"job": "Job", "jobs": "Job", "rayjob": "RayJob", "rayjobs": "RayJob", "pvc": "PersistentVolumeClaim",
         "svc": "Service", "service": "Service", "configmap": "ConfigMap", "cm": "ConfigMap"}


# --- extraction ------------------------------------------------------------------------------------------------------

def _commands_of(text: str) -> list[str]:
    """Commands of one document: fenced code block lines (continuations joined) and inline code spans."""
    out = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            out.append(line)
    prose = re.sub(r"^```[a-z]*\n.*?^```", "", text, flags=re.S | re.M)
    # an inline span is a command when it has an option or a file (`dapo plan --preset full`, `helm install x
    # charts/dapo`); a bare name (`dapo eval`, `dapo report RUN`) is a mention of the command, not one to run
    spans = [" ".join(m.split()) for m in re.findall(r"`([^`]+)`", prose)]
    out += [c for c in spans if re.search(r"(^|\s)(-\S|charts/|values/)", c)]
    return [c for c in out if c.startswith(PROGRAMS)]


def _split(command: str) -> list[list[str]]:
    """One shell line -> the argv of each simple command (`&&`, `|`, `;`, `>` split; comments and redirects
    dropped; `$VAR` and `$(...)` replaced by a dummy word)."""
    command = re.sub(r"<[A-Za-z][^<>]*>", "PLACEHOLDER", command)  # <release>, <any train pod>
    command = re.sub(r"\s\[-{0,2}[A-Za-z][^\]]*\]", "", command)  # [extraArgs], [--run RUN]: optional arguments
    command = re.sub(r"\$\((?:[^()]|\([^()]*\))*\)", "SUBST", command)
    command = re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", "x-value", command)
    lex = shlex.shlex(command, posix=True, punctuation_chars="|&;<>")
    lex.whitespace_split, lex.commenters = True, "#"
    try:
        tokens = list(lex)
    except ValueError as exc:  # an unbalanced quote: report it as the command's problem
        return [["UNPARSABLE", command, str(exc)]]
    argvs, cur, redirect = [], [], False
    for tok in tokens:
        if tok in ("|", "||", "&&", ";", "&"):
            argvs.append(cur)
            cur, redirect = [], False
        elif tok in (">", ">>", "<", "2>", "2>&1"):
            redirect = True
        elif redirect:
            cur.append(f">{tok}")
            redirect = False
        else:
            cur.append(tok)
    argvs.append(cur)
    return [a for a in argvs if a]


def _variants(command: str) -> list[str]:
    """The command once per combination of the DOC_VARIABLES it uses, each filled in."""
    out = [command]
    for name, values in DOC_VARIABLES.items():
        pattern = re.compile(r"\$\{?" + name + r"\}?(?![A-Za-z0-9_])")
        if pattern.search(command):
            out = [pattern.sub(value, c) for c in out for value in values]
    return out


def _all_commands() -> list[tuple[str, list[str]]]:
    out = []
    for doc in DOCS:
        for command in _commands_of(doc.read_text()):
            for variant in _variants(command):
                for argv in _split(variant):
                    out.append((doc.relative_to(ROOT).as_posix(), argv))
    return out


COMMANDS = _all_commands()


# --- helm ------------------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _schema() -> dict:
    return json.loads((CHART_DIR / "values.schema.json").read_text())


def _schema_has(path: str) -> bool:
    node = _schema()
    for part in path.split("."):
        m = re.fullmatch(r"([^\[\]]+)((?:\[\d+\])*)", part)
        if not m:
            return False
        props = node.get("properties") or {}
        if m.group(1) in props:
            node = props[m.group(1)]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        elif node.get("additionalProperties") is False or not props and node.get("type") != "object":
            return False
        for _ in re.findall(r"\[\d+\]", m.group(2)):
            if "items" not in node:
                return False
            node = node["items"]
    return True


def _set_value(values: dict, path: str, raw: str, string: bool) -> None:
    """Helm's --set for the paths the docs use: dotted keys, list indexes, scalars typed like Helm's strvals."""
    if raw.startswith("{") and raw.endswith("}"):  # Helm's list syntax: --set 'key={a,b}'
        value = [x if string else yaml.safe_load(x) for x in raw[1:-1].split(",")]
    else:
        value = raw if string else (None if raw == "null" else yaml.safe_load(raw) if raw else "")
    keys = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    node = values
    for i, key in enumerate(keys):
        last = i == len(keys) - 1
        nxt = None if last else keys[i + 1]
        if key.startswith("["):
            idx = int(key[1:-1])
            while len(node) <= idx:
                node.append(None)
            if last:
                node[idx] = value
            else:
                node[idx] = node[idx] or ([] if nxt.startswith("[") else {})
                node = node[idx]
        else:
            if last:
                node[key] = value
            else:
                node = node.setdefault(key, [] if nxt.startswith("[") else {})


def _helm_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="helm", exit_on_error=False, add_help=False)
    ap.add_argument("sub")
    ap.add_argument("args", nargs="*")
    ap.add_argument("-f", "--values", action="append", default=[])
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--set-string", action="append", default=[])
    ap.add_argument("-n", "--namespace", default="default")
    for flag in ("--version", "--repo", "--filter", "--timeout"):
        ap.add_argument(flag)
    for flag in ("--install", "--create-namespace", "--dry-run", "--wait", "--atomic", "--debug", "--reuse-values"):
        ap.add_argument(flag, action="store_true")
    return ap


# Files a documented step writes for the commands after it: `make images` writes build/images/values.yaml (the
# pushed images' repositories, tags and digests; tests/test_docker.py runs it with a recording docker). A command
# reading one is checked with such a file.
GENERATED = {"build/images/values.yaml": {
    "image": {"repository": "registry.example/ml/dapo", "tag": "0.1.0-verl0.9.1", "digest": "sha256:" + "a" * 64},
    "eval": {"image": {"repository": "registry.example/ml/dapo-eval", "tag": "0.1.0-ray2.60.0",
                       "digest": "sha256:" + "b" * 64}}}}


@functools.lru_cache(maxsize=None)
def _generated(name: str) -> Path:
    import atexit
    import shutil
    import tempfile

    directory = tempfile.mkdtemp(prefix="dapo-docs-")
    atexit.register(shutil.rmtree, directory, True)
    path = Path(directory) / Path(name).name
    path.write_text(yaml.safe_dump(GENERATED[name]))
    return path


def _values_file(name: str) -> Path:
    return _generated(name) if name in GENERATED else ROOT / name


def _check_helm(argv: list[str]) -> str:
    """'' when valid, else the problem; `cluster` for commands that need a cluster or a remote chart."""
    try:
        a = _helm_parser().parse_intermixed_args(argv[1:])
    except (argparse.ArgumentError, SystemExit) as exc:
        return f"helm arguments do not parse: {exc}"
    missing = [f for f in a.values if not _values_file(f).is_file()]
    if missing:
        return f"-f files do not exist: {missing}"
    if a.sub not in ("install", "upgrade", "template") or "charts/dapo" not in a.args:
        return "cluster" if a.sub in CLUSTER_HELM or a.sub in ("install", "upgrade") else f"unknown helm {a.sub}"
    release = next((x for x in a.args if x != "charts/dapo"), "dapo")
    values = user_values([_values_file(f) for f in a.values], stand_in=False)
    for item, string in [(s, False) for s in a.set] + [(s, True) for s in a.set_string]:
        path, _, raw = item.partition("=")
        if not _schema_has(path):
            return f"--set {path}: not a value of the chart (values.schema.json)"
        _set_value(values, path, raw, string)
    try:
        chart().render(values, name=release, namespace=a.namespace)
    except Exception as exc:  # HelmRenderError / HelmValuesError: what `helm install` would print
        return f"the chart refuses it: {str(exc).splitlines()[-1][:300]}"
    return ""


def _check_fragment(argv: list[str]) -> str:
    """`--set a.b=c` / `-f values/x.yaml` quoted on their own in the prose: the path is the chart's, the file exists."""
    for flag, arg in zip(argv[::2], argv[1::2]):
        if flag == "--set" and arg.partition("=")[0].lower() == "key":  # `--set key=value`: the syntax itself
            continue
        if flag == "--set" and not _schema_has(arg.partition("=")[0]):
            return f"--set {arg.partition('=')[0]}: not a value of the chart (values.schema.json)"
        if flag == "-f" and not _values_file(arg).is_file():
            return f"-f {arg}: no such file"
    return ""


# --- dapo, render.py ------------------------------------------------------------------------------------------------

class _Parsed(Exception):
    pass


def _parse_only(monkeypatch, fn, argv: list[str]) -> str:
    """Run a command-line function only up to its argument parsing: '' when the arguments parse."""
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed()

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", parse_args)
        try:
            fn(argv)
        except _Parsed:
            return ""
        except SystemExit as exc:
            return f"exit {exc.code}: the arguments do not parse"
    return "the command ran past its argument parsing"


def _check_dapo(argv: list[str], monkeypatch) -> str:
    from dapo.cli import main as dapo_main
    from dapo.train.cli import main as train_main

    if argv[0].endswith("dapo"):
        if len(argv) > 1 and argv[1].isupper():  # `dapo COMMAND --help`: a placeholder for any command
            return ""
        if argv[1:] in (["--version"], ["-V"]):  # answered by the dispatcher itself, before any parser
            return "" if dapo_main(argv[1:]) == 0 else "dapo --version failed"
        return _parse_only(monkeypatch, dapo_main, argv[1:])
    if argv[:3] == ["python", "-m", "dapo.train"]:
        return _parse_only(monkeypatch, train_main, argv[3:])
    if argv[:2] == ["python", "-m"] and argv[2].startswith("dapo."):
        import importlib.util
        import runpy

        if importlib.util.find_spec(argv[2]) is None:
            return f"no module {argv[2]}"
        if len(argv) == 3:  # `python -m dapo.train.follow`: the module named, not a command line to run
            return ""

        def run_module(args):  # what `python -m MODULE args` runs, stopped after its argument parsing
            with monkeypatch.context() as m:
                m.setattr("sys.argv", [argv[2], *args])
                runpy.run_module(argv[2], run_name="__main__", alter_sys=False)

        return _parse_only(monkeypatch, run_module, argv[3:])
    script = argv[1:] if argv[0] == "python" else argv
    missing = [x.split("=", 1)[-1] for x in script if x.startswith("values/") or x.startswith("--values=")]
    missing = [f for f in missing if not _values_file(f).is_file()]
    if missing:
        return f"values files do not exist: {missing}"
    return _parse_only(monkeypatch, render_script().main, script[1:])


# --- kubectl ---------------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _known_objects() -> set[tuple[str, str]]:
    """(kind, name) of every documented release's objects, and what KubeRay creates from its RayJobs."""
    known = {("Deployment", "kuberay-operator")}
    for name in render_script().RENDER_SETS:
        files, release = set_files(name)
        for o in chart_objects(files, release=release, namespace="dapo"):
            known.add((o["kind"], o["metadata"]["name"]))
            if o["kind"] == "RayJob":
                n = o["metadata"]["name"]
                known |= {("Service", f"{n}-head-svc"), ("Job", n)}  # head service; K8sJobMode's submitter
    return known


def _check_kubectl(argv: list[str], written: set[str]) -> str:
    words = [w for w in argv[1:] if not w.startswith(">")]
    verbs = [w for w in words if w in KUBECTL_VERBS]
    if not verbs:
        return f"no kubectl verb in {words}"
    for i, w in enumerate(words):
        if w in ("-f", "--filename") and verbs[0] in ("apply", "create", "delete", "replace") and i + 1 < len(words):
            f = words[i + 1]
            if f != "-" and not (ROOT / f).is_file() and f not in written:
                return f"-f {f}: no such file"
    after = words[words.index(verbs[0]) + 1:]
    refs = [tuple(w.split("/", 1)) for w in after if "/" in w and w.split("/", 1)[0] in KINDS]
    if verbs[0] in ("get", "describe", "delete", "wait") and after and after[0] in KINDS and len(after) > 1 \
            and not after[1].startswith("-"):
        refs.append((after[0], after[1]))
    for kind, name in refs:
        for n in name.split(","):
            if "<" in n or n in ("SUBST", "x-value") or not re.fullmatch(r"[a-z0-9-]+", n):
                continue
            if (KINDS[kind], n) not in _known_objects():
                return f"{kind}/{n}: no documented release renders it"
    return ""


# --- the test --------------------------------------------------------------------------------------------------------

def test_every_documented_command_is_valid(monkeypatch, capsys):
    problems, counts = [], {"rendered": 0, "cluster": 0, "parsed": 0, "kubectl": 0}
    written: dict[str, set[str]] = {}
    for doc, argv in COMMANDS:
        where = f"{doc}: {shlex.join(argv)[:160]}"
        written.setdefault(doc, set()).update(w[1:] for w in argv if w.startswith(">"))
        argv = [w for w in argv if not w.startswith(">")]
        if argv[0] == "UNPARSABLE":
            problems.append(f"{doc}: {argv[1]}: {argv[2]}")
            continue
        argv = ["x-value" if w == "..." else w for w in argv]  # an abbreviated argument
        if argv[0] in ("--set", "-f"):  # a fragment of a helm command: its value path, its file
            why = _check_fragment(argv)
            counts["fragments"] = counts.get("fragments", 0) + 1
        elif argv[0] == "helm":
            why = _check_helm(argv)
            counts["cluster" if why == "cluster" else "rendered"] += 1
            why = "" if why == "cluster" else why
        elif argv[0] == "kubectl":
            why = _check_kubectl(argv, written[doc])
            counts["kubectl"] += 1
        else:
            why = _check_dapo(argv, monkeypatch)
            counts["parsed"] += 1
        if why:
            problems.append(f"{where}\n    -> {why}")
    with capsys.disabled():
        print(f"\ndocumented commands: {counts['rendered']} helm rendered against the chart, {counts['cluster']} helm "
              f"needing a cluster or a remote chart, {counts['parsed']} dapo/render.py parsed, {counts['kubectl']} "
              f"kubectl checked, {counts.get('fragments', 0)} --set / -f fragments checked")
    assert counts["rendered"] >= 10 and counts["parsed"] >= 20 and counts["kubectl"] >= 20, counts
    assert not problems, "invalid documented commands:\n" + "\n".join(problems)


@pytest.mark.parametrize("command, problem", [
    ("helm install dapo charts/dapo -f values/full.yaml --set recipe.trainer.total_training_steps=320",
     "--set recipe.trainer.total_training_steps: not a value of the chart"),
    ("helm install dapo charts/dapo -f values/nope.yaml", "-f files do not exist"),
    ("--set recipe.trainer.total_training_steps=320", "not a value of the chart"),
    ("helm install dapo charts/dapo -f values/full.yaml --set storage.size=1Gi", "the chart refuses it"),
    ("dapo plan --presett full", "the arguments do not parse"),
    ("python scripts/render.py --preset full --nonsense", "the arguments do not parse"),
    ("kubectl -n dapo logs -f job/dapo-training-logs", "job/dapo-training-logs: no documented release"),
    ("kubectl -n dapo frobnicate rayjob dapo-train", "no kubectl verb"),
])
def test_the_checker_catches_a_wrong_command(command, problem, monkeypatch):
    argv = _split(command)[0]
    if argv[0] == "helm":
        why = _check_helm(argv)
    elif argv[0] == "--set":
        why = _check_fragment(argv)
    elif argv[0] == "kubectl":
        why = _check_kubectl(argv, set())
    else:
        why = _check_dapo(argv, monkeypatch)
    assert problem in why, why


def test_the_troubleshooting_fix_for_the_run_length_renders_into_the_entrypoint():
    values = user_values([VALUES_DIR / "early.yaml"])
    _set_value(values, "overrides[0]", "recipe.trainer.total_training_steps=320", False)
    rendered = chart().render(values, name="dapo", namespace="dapo")
    job = next(t for p, t in rendered.items() if p.endswith("rayjob-train.yaml"))
    assert "recipe.trainer.total_training_steps=320" in job

"""The chart through Helm's own code, in-process: values read from ``-f`` / ``--set`` as ``helm template`` reads them,
and the objects rendered by Helm's Go engine (the Helm SDK, ``helm_python``: no ``helm`` binary).

``scripts/render.py`` and ``dapo doctor`` render with this module, so they give the same objects as
``helm template``/``helm upgrade --install`` with the same arguments, or refuse what Helm refuses, by construction:
there is no second renderer. What stays in Python is Helm's composition of its inputs, ``MergeValues`` of Helm
v4.2.3's ``pkg/cli/values/options.go``, each step done by Helm's own functions through the SDK:

1. ``-f`` files in order: each YAML document of a file read by Helm's values reader (``values_from_yaml``, YAML
   1.1 as Go reads it: ``yes`` is true, ``1e-6`` a number), a file's documents and then the files merged by
   :func:`merge_maps` (maps merge, anything else is replaced);
2. ``--set-json``, then ``--set``, then ``--set-string``, then ``--set-file``, each item parsed INTO the values so
   far by Helm's strvals parser (``a[1]=x`` changes the second element of an existing list, ``a.b=x`` through a
   value that is not a map is refused), as :func:`parse_into` arranges with the SDK's parsers;
3. the chart's defaults coalesced under them, the schema checked and the templates rendered, by the SDK.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from dapo.k8s.presets import ValuesError

# The kinds of value flags in the order Helm applies them (after every -f file).
SET_KINDS = ("set_json", "set", "set_string", "set_file")
FLAGS = {"set_json": "--set-json", "set": "--set", "set_string": "--set-string", "set_file": "--set-file"}


def helm():
    try:
        import helm_python
    except ImportError as exc:  # pragma: no cover - part of the k8s extra
        raise ValuesError("rendering the chart needs the Helm SDK: pip install 'dapo-k8s[k8s]' (helm-python-sdk; "
                          "wheels for Linux x86_64/aarch64 glibc >= 2.28, macOS arm64 >= 11 and x86_64 >= 15, "
                          "Windows x86_64)") from exc
    helm_python.disable_logging()
    return helm_python


@dataclass
class ValueOptions:
    """The value flags of ``helm template`` / ``helm upgrade --install``, each list in command-line order."""

    files: list[str] = field(default_factory=list)
    set_json: list[str] = field(default_factory=list)
    set: list[str] = field(default_factory=list)
    set_string: list[str] = field(default_factory=list)
    set_file: list[str] = field(default_factory=list)

    def args(self) -> list[str]:
        """The same options as command-line arguments (``-f A --set-json B ...``), in Helm's order."""
        out = [a for f in self.files for a in ("-f", str(f))]
        return out + [a for kind in SET_KINDS for item in getattr(self, kind) for a in (FLAGS[kind], item)]


def add_value_flags(ap: Any) -> None:
    """``-f``/``--values``, ``--set``, ``--set-string``, ``--set-json``, ``--set-file`` on an argparse parser, with
    Helm's meaning (each repeatable; Helm applies the files first, then the kinds in the order of :data:`SET_KINDS`,
    whatever their order on the command line)."""
    ap.add_argument("-f", "--values", action="append", default=[], metavar="FILE",
                    help="values file, as helm -f (repeatable; '-' reads standard input)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="as helm --set: integers and true/false/null typed, anything else a string (repeatable)")
    ap.add_argument("--set-string", action="append", default=[], metavar="KEY=VALUE",
                    help="as helm --set-string: the value is a string (repeatable)")
    ap.add_argument("--set-json", action="append", default=[], metavar="KEY=JSON",
                    help="as helm --set-json: the value is JSON, or the whole item a JSON object (repeatable)")
    ap.add_argument("--set-file", action="append", default=[], metavar="KEY=PATH",
                    help="as helm --set-file: the value is the file's content (repeatable)")


def options_from(args: Any) -> ValueOptions:
    return ValueOptions(files=[str(f) for f in args.values], set_json=list(args.set_json), set=list(args.set),
                        set_string=list(args.set_string), set_file=list(args.set_file))


# -- step 1: the files ------------------------------------------------------------------------------------------

def merge_maps(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Helm's ``loader.MergeMaps``: a copy of ``a`` with ``b`` over it; a map over a map merges, anything else over
    anything replaces it."""
    out = dict(a)
    for key, value in b.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_maps(out[key], value)
        else:
            out[key] = value
    return out


def documents(text: str) -> list[str]:
    """The documents of a values file as Kubernetes' YAMLReader splits them (k8s.io/apimachinery util/yaml, which
    Helm's ``LoadValues`` reads with): a line that starts with ``---`` followed by white space only ends one."""
    docs, lines = [], []
    for line in text.splitlines(keepends=True):
        if line.startswith("---") and not line[3:].strip():
            if lines:
                docs.append("".join(lines))
            lines = []
        else:
            lines.append(line)
    if lines:
        docs.append("".join(lines))
    return docs


def read_input(path: str) -> str:
    """A ``-f`` or ``--set-file`` path: ``-`` is standard input; URLs are not fetched."""
    if path.strip() == "-":
        return sys.stdin.read()
    if re.match(r"^[a-z][a-z0-9+.-]*://", path):
        raise ValuesError(f"{path}: only local files are read here (Helm would download it); download it first")
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ValuesError(f"{path}: cannot read it ({exc.strerror})") from exc


def load_file(path: str) -> dict[str, Any]:
    """Helm's ``LoadValues`` of one ``-f`` file: its documents read by Helm's values reader and merged in order."""
    h = helm()
    out: dict[str, Any] = {}
    for doc in documents(read_input(path)):
        try:
            out = merge_maps(out, h.values_from_yaml(doc))
        except h.HelmError as exc:
            raise ValuesError(f"{path}: failed to parse it as Helm does: {exc}") from exc
    return out


# -- step 2: --set and its kin, parsed into the values so far --------------------------------------------------

class _Encoding:
    """The values so far written as strvals items that Helm's parser rebuilds exactly, so that the user's item,
    parsed after them in the same call, lands INTO them as ``strvals.ParseInto`` puts it: every scalar becomes a
    placeholder token (a plain string to every parser), restored afterwards; an empty map gets a placeholder key,
    removed afterwards; an empty list and a null list element are ``null`` (with the typed parser) or a placeholder;
    the empty key "" (which no item can address) a placeholder key, renamed back. Keys are escaped with ``\\``."""

    def __init__(self, base: dict[str, Any], typed: bool):
        self.nonce = secrets.token_hex(6)
        self.typed = typed
        self.scalars: dict[str, Any] = {}
        self.empty_lists: list[tuple[Any, ...]] = []
        self.items: list[str] = []
        self._walk(base, "", ())

    def token(self, what: str) -> str:
        return f"dapo{self.nonce}{what}{len(self.scalars)}"

    @property
    def empty_map_key(self) -> str:
        return f"dapo{self.nonce}emptymap"

    @property
    def empty_key(self) -> str:
        return f"dapo{self.nonce}emptykey"

    def key(self, k: str) -> str:
        return self.empty_key if k == "" else re.sub(r"([^A-Za-z0-9_-])", r"\\\1", k)

    def _walk(self, value: Any, path: str, where: tuple[Any, ...]) -> None:
        if isinstance(value, dict):
            if not value and path:
                self.items.append(f"{path}.{self.empty_map_key}={self._scalar(None)}")
            for k, v in value.items():
                self._walk(v, f"{path}.{self.key(k)}" if path else self.key(k), where + (k,))
        elif isinstance(value, list):
            if not value:
                self.empty_lists.append(where)
                self.items.append(f"{path}[0]={self._scalar(None)}")
            for i, v in enumerate(value):
                self._walk(v, f"{path}[{i}]", where + (i,))
        else:
            self.items.append(f"{path}={self._scalar(value)}")

    def _scalar(self, value: Any) -> str:
        if value is None and self.typed:
            return "null"
        tok = self.token("v")
        self.scalars[tok] = value
        return tok

    def restore(self, data: Any) -> Any:
        if isinstance(data, dict):
            return {("" if k == self.empty_key else k): self.restore(v) for k, v in data.items()
                    if k != self.empty_map_key}
        if isinstance(data, list):
            return [self.restore(v) for v in data]
        if isinstance(data, str) and data in self.scalars:
            return self.scalars[data]
        return data


def _at(data: Any, where: tuple[Any, ...]) -> tuple[bool, Any]:
    for step in where:
        if isinstance(step, int) and isinstance(data, list) and step < len(data):
            data = data[step]
        elif isinstance(step, str) and isinstance(data, dict) and step in data:
            data = data[step]
        else:
            return False, None
    return True, data


def _user_leaves(data: Any, enc: _Encoding, where: tuple[Any, ...] = ()) -> Iterable[tuple[Any, ...]]:
    """Where the parsed result holds a value of the user's item (a string that is no placeholder)."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _user_leaves(v, enc, where + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _user_leaves(v, enc, where + (i,))
    elif not (isinstance(data, str) and data in enc.scalars):
        yield where


def _put(data: Any, where: tuple[Any, ...], value: Any) -> None:
    for step in where[:-1]:
        data = data[step]
    data[where[-1]] = value


def parse_into(kind: str, item: str, base: dict[str, Any]) -> dict[str, Any]:
    """``base`` with one ``--set``-like item parsed into it as Helm v4.2.3 does (``strvals.ParseInto``,
    ``ParseIntoString``, ``ParseJSON`` or ``ParseIntoFile``, and a ``--set-json`` item that is a whole JSON object
    merged by :func:`merge_maps`); refused with Helm's message when Helm refuses it."""
    h = helm()
    if kind == "set_json" and item.strip().startswith("{"):
        return merge_maps(base, _json_object(item))
    if kind == "set_json":
        # the JSON parser reads the values so far exactly from their JSON, key by key
        enc = _Encoding({}, True)
        prefix = [f"{enc.key(k)}={json.dumps(v)}" for k, v in base.items()]
        parsed = _parse(h.parse_set_json, ",".join(prefix + [item]), item, kind)
        return {("" if k == enc.empty_key else k): v for k, v in parsed.items()}
    typed = kind == "set"
    enc = _Encoding(base, typed)
    parser = {"set": h.parse_set_string, "set_string": h.parse_set_string_values,
              "set_file": h.parse_set_string_values}[kind]
    parsed = _parse(parser, ",".join(enc.items + [item]), item, kind)
    fresh = _parse(h.parse_set_string if typed else h.parse_set_string_values, item, item, kind)
    if kind == "set_file":
        # positions from the string parser over the values so far, contents from Helm's own file parser
        contents = _parse(h.parse_set_file, item, item, kind)
        for where in list(_user_leaves(parsed, enc)):
            _put(parsed, where, _at(contents, where)[1])
    out = enc.restore(parsed)
    for where in enc.empty_lists:
        found, value = _at(out, where)
        if found and value == [None] and not _at(fresh, where)[0]:
            _put(out, where, [])
    return out


def _parse(parser: Callable[[str], dict[str, Any]], text: str, item: str, kind: str) -> dict[str, Any]:
    h = helm()
    try:
        return parser(text)
    except h.HelmError as exc:
        raise ValuesError(f"{FLAGS[kind]} {item}: Helm refuses it: {exc}") from exc


def _json_object(item: str) -> dict[str, Any]:
    """A ``--set-json`` item that is a whole JSON object, read as Go's ``json.Unmarshal`` reads it (no NaN or
    Infinity, no number out of float64's range, nothing after the object)."""

    def refuse(text: str) -> Any:
        raise ValueError(f"{text} is not JSON")

    def number(text: str) -> float:
        value = float(text)
        if math.isinf(value):
            raise ValueError(f"number {text} overflows float64")
        return value

    try:
        value = json.loads(item.strip(), parse_constant=refuse, parse_float=number)
    except ValueError as exc:
        raise ValuesError(f"--set-json {item}: failed parsing --set-json data JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise ValuesError(f"--set-json {item}: failed parsing --set-json data JSON (not an object)")
    return value


def user_values(opts: ValueOptions) -> dict[str, Any]:
    """What Helm's ``MergeValues`` makes of these flags: the user-supplied values, before the chart's defaults."""
    base: dict[str, Any] = {}
    for path in opts.files:
        base = merge_maps(base, load_file(path))
    for kind in SET_KINDS:
        for item in getattr(opts, kind):
            base = parse_into(kind, item, base)
    return base


# -- step 3: the chart -------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=8)
def load_chart(chart_dir: str) -> Any:
    """The chart, loaded once. Helm's loader logs to the process's standard error (Go's default logger, which the
    SDK does not route) that the chart's presets/ is a link it follows; that line says nothing to a user, so the
    load runs with file descriptor 2 on /dev/null."""
    h = helm()
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            return h.Chart.load(chart_dir)
    except h.HelmError as exc:
        raise ValuesError(f"{chart_dir}: Helm cannot load the chart: {exc}") from exc
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def coalesced(chart_dir: Path, values: dict[str, Any]) -> dict[str, Any]:
    """The chart's defaults with these user values over them, as the templates see ``.Values`` (Helm's coalescing:
    a null removes the key), checked against values.schema.json."""
    h = helm()
    chart = load_chart(str(chart_dir))
    try:
        merged = chart.merge_values(values)
        chart.validate_schema(merged)
        return merged
    except h.HelmError as exc:
        raise ValuesError(_message(exc)) from exc


@dataclass
class Manifest:
    """One object of the rendered chart: its template, its text as Helm rendered it, and the object as Kubernetes'
    Go YAML reads that text."""

    source: str
    text: str
    obj: dict[str, Any]

    @property
    def hooks(self) -> list[str]:
        hook = (self.obj.get("metadata", {}).get("annotations") or {}).get("helm.sh/hook") or ""
        return [h.strip() for h in hook.split(",") if h.strip()]


# Helm's manifest separator (pkg/release/v1/util SplitManifests)
_DOC_SEP = re.compile(r"(?:^|\s*\n)---\s*")


def render(chart_dir: Path, values: dict[str, Any], *, release: str, namespace: str,
           is_upgrade: Optional[bool] = None) -> list[Manifest]:
    """Every object ``helm template <release> <chart> -n <namespace>`` renders from these user values (NOTES.txt
    left out), in template order. Refusals (schema, the chart's rules) raise :class:`ValuesError` with Helm's
    message."""
    return render_release(chart_dir, values, release=release, namespace=namespace, is_upgrade=is_upgrade)[0]


def render_release(chart_dir: Path, values: dict[str, Any], *, release: str, namespace: str,
                   is_upgrade: Optional[bool] = None) -> tuple[list[Manifest], str]:
    """:func:`render`'s objects and the NOTES Helm prints after the install, from one render."""
    h = helm()
    chart = load_chart(str(chart_dir))
    try:
        rendered = chart.render(values, name=release, namespace=namespace, is_upgrade=is_upgrade,
                                is_install=None if is_upgrade is None else not is_upgrade)
    except h.HelmError as exc:
        raise ValuesError(_message(exc)) from exc
    out, notes = [], ""
    for source in sorted(rendered):
        if source.endswith("NOTES.txt"):
            notes = rendered[source]
            continue
        # Helm's SplitManifests: a document's leading white space goes, its trailing white space stays
        for text in _DOC_SEP.split(rendered[source].lstrip()):
            if not text.strip():
                continue
            obj = h.values_from_yaml(text.lstrip())
            if obj:
                out.append(Manifest(source, text.lstrip(), obj))
    return out, notes


def _message(exc: Exception) -> str:
    """Helm's error without the template position it prefixes to a `fail` (the message names the key)."""
    text = str(exc).strip()
    return re.sub(r"^execution error at \([^)]*\): ", "", text)

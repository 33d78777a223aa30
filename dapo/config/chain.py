"""The preset chain, once for every reader: the files a preset ``extends:``, their deep merge, ``key.path=value``
overrides, and the ``${trainer.<key>}`` references of its paths.

``dapo train`` (through :func:`dapo.config.load_preset`), ``dapo eval``, the verl backend, ``dapo plan`` and
``dapo doctor`` (through :mod:`dapo.k8s`) read presets with these functions; the chart does the same in Go templates
(``charts/dapo/templates/_presets.tpl``: Helm users merge presets there), and tests/test_preset_chain.py renders the
chart's merge through Helm for every preset and a table of override spellings and compares it with this module.

Reading: a preset file and an override value are read as Helm reads YAML (go-yaml, then JSON), because the chart
reads the same files and the same override strings and cannot read them any other way. For a plain scalar that means
(:func:`_plain_scalar`): ``y``/``n``/``yes``/``no``/``on``/``off`` and ``true``/``false`` in any of YAML's cases are
booleans; ``~``, ``null`` and the empty value are null; integers in Go's syntax (``1_000``, ``010`` octal, ``0o10``,
``0x1F``, ``0b101``); floats by YAML 1.2's rule (``1e-6``, ``.5``, ``-.5``, ``1.``); dates and ``1:30`` stay
strings. Where Helm would change a number -- an infinity or NaN (JSON has none: Helm reads null) or an integer
beyond 2^53 (Helm holds numbers as 64-bit floats) -- the value is refused, naming it.

Overrides: ``a.b.c=VALUE`` sets one key of the merged preset, VALUE read as the YAML of ``v: VALUE`` (what the
chart's ``fromYaml`` sees), creating mappings on the way. Only keys under the preset's roots (:data:`PRESET_ROOTS`,
the fields of :class:`~dapo.config.schema.Preset`) address the preset; any other goes to verl
(:func:`split_overrides`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from pathlib import Path
from typing import Any, Optional

import yaml

from dapo.config.schema import ConfigError, Preset
from dapo.util.gofmt import go_string, q

PRESET_DIR = Path(__file__).resolve().parents[1] / "presets"
# the top-level keys of a preset: an override under one of them addresses the preset, any other goes to verl
PRESET_ROOTS = tuple(f.name for f in dataclasses.fields(Preset))
PRESET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
MAX_CHAIN = 16
# the largest integer a 64-bit float (Helm's number) holds exactly
EXACT_INT = 2 ** 53

# -- reading YAML as Helm does -----------------------------------------------------------------------------------------

_TRUE = {"y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"}
_FALSE = {"n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"}
_NULL = {"", "~", "null", "Null", "NULL"}
_NOT_FINITE = {".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF"}
_GO_INT = re.compile(r"([-+]?)(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)")
_YAML_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_DECIMAL = re.compile(r"[-+]?[1-9][0-9]*")
_DOT_FLOAT = re.compile(r"\.[0-9]+([eE][-+]?[0-9]+)?")
_GO_BASES = {"x": 16, "o": 8, "b": 2}


class _NotExact(ValueError):
    """A number Helm would read differently (not finite, or an integer it cannot hold exactly)."""


def _go_int(text: str) -> Optional[int]:
    """Go's ``strconv.ParseInt(text, 0, 64)`` (then ``ParseUint``): sign, base prefix or a leading 0 for octal."""
    m = _GO_INT.fullmatch(text)
    if not m:
        return None
    sign, digits = m.groups()
    if len(digits) > 1 and digits[0] == "0":
        base = _GO_BASES.get(digits[1].lower(), 8)
        value = int(digits[2:] if base != 8 or digits[1] in "oO" else digits[1:] or "0", base)
    else:
        value = int(digits)
    value = -value if sign == "-" else value
    return value if -(2 ** 63) <= value < 2 ** 64 and not (sign and value >= 2 ** 63) else None


def _plain_scalar(text: str) -> Any:
    """An unquoted YAML scalar as go-yaml v2 resolves it into Helm's values (``resolve.go``): booleans and nulls by
    name, then by the first character -- digits and signs an int (underscores dropped) or a YAML float, a leading dot
    a float -- else the string itself (timestamps included: Helm keeps them as strings)."""
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    if text in _NULL:
        return None
    if text in _NOT_FINITE:
        raise _NotExact(f"{text} is not a finite number (Helm reads it as null)")
    first = text[0]
    if first == "." and _DOT_FLOAT.fullmatch(text):
        return float(text)
    if first in "+-0123456789":
        plain = text.replace("_", "")
        if _DECIMAL.fullmatch(plain) and abs(int(plain)) > EXACT_INT:
            raise _NotExact(f"{text} is beyond 2^53, where Helm's 64-bit float numbers are no longer exact")
        value = _go_int(plain)
        if value is not None:
            if abs(value) > EXACT_INT:
                raise _NotExact(f"{text} is beyond 2^53, where Helm's 64-bit float numbers are no longer exact")
            return value
        if _YAML_FLOAT.fullmatch(plain):
            number = float(plain)
            if math.isfinite(number):
                return number
    return text


_PLAIN = "tag:dapo,helm:plain"


class _HelmLoader(yaml.SafeLoader):
    """PyYAML's safe loader with plain scalar values resolved as Helm resolves them (:func:`_plain_scalar`) and
    mapping keys read as written (Helm would read the key ``n`` -- ``rollout.n`` -- as "false")."""

    def resolve(self, kind, value, implicit):  # noqa: ANN001 -- PyYAML's hook
        if kind is yaml.ScalarNode and implicit[0] and value != "<<":  # "<<": YAML's merge key, as in go-yaml
            return _PLAIN
        return super().resolve(kind, value, implicit)

    def construct_mapping(self, node, deep=False):  # noqa: ANN001 -- PyYAML's hook
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag == _PLAIN:
                key.tag = "tag:yaml.org,2002:str"
        return super().construct_mapping(node, deep=deep)


_HelmLoader.add_constructor(_PLAIN, lambda loader, node: _plain_scalar(node.value))


def read_yaml(text: str, where: str, detail: bool = True) -> Any:
    """``text`` read as Helm reads YAML; a :class:`ConfigError` names ``where`` (a file, an override) and, with
    ``detail``, PyYAML's reason."""
    try:
        return yaml.load(text, Loader=_HelmLoader)  # noqa: S506 -- a SafeLoader subclass
    except _NotExact as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        if not detail:
            raise ConfigError(f"{where}: the value is not valid YAML") from None
        raise ConfigError(f"{where} is not valid YAML: {' '.join(str(exc).split())}") from None


# -- the chain --------------------------------------------------------------------------------------------------------


def list_presets(preset_dir: Path = PRESET_DIR) -> list[str]:
    """The runnable presets (``_`` files are shared bases)."""
    return sorted(p.stem for p in preset_dir.glob("*.yaml") if not p.stem.startswith("_"))


def preset_path(name: str, files: bool = True) -> Path:
    """The file of a preset name (``full``: ``presets/full.yaml``), or with ``files`` ``name`` itself when it is a YAML
    file (``dapo train --preset mine.yaml``; the chart knows names only)."""
    p = Path(name)
    if files and p.suffix in (".yaml", ".yml") and p.is_file():
        return p
    if not PRESET_NAME.fullmatch(name) or name.startswith("_"):
        raise ConfigError(f"preset: {q(name)} is not a preset name (a file of presets/ without .yaml; _files are "
                          "shared bases)")
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"preset: unknown preset {q(name)}; available: {', '.join(list_presets())}")
    return path


def chain_docs(name: str, files: bool = True) -> list[tuple[Path, dict[str, Any]]]:
    """``(file, mapping without extends)`` of the preset (:func:`preset_path`) and each file it ``extends:`` (same
    directory), the preset first."""
    path = preset_path(name, files)
    where = "presets/" if path.parent == PRESET_DIR else f"{path.parent}/"
    docs: list[tuple[Path, dict[str, Any]]] = []
    names: list[str] = []
    for _ in range(MAX_CHAIN):
        doc = read_yaml(path.read_text(), f"preset: {path}") or {}
        if not isinstance(doc, dict):
            raise ConfigError(f"preset: {path} holds no mapping at the top level")
        names.append(path.stem)
        parent = doc.pop("extends", None)
        docs.append((path, doc))
        if parent is None:
            return docs
        if not isinstance(parent, str):
            raise ConfigError(f"preset: {q(path.stem)} extends {q(parent)}, which is not a file name")
        if parent in names:
            raise ConfigError(f"preset: circular extends chain {' -> '.join(names)} -> {parent}")
        path = path.parent / f"{parent}.yaml"
        if not path.is_file():
            raise ConfigError(f"preset: {q(names[-1])} extends {q(parent)}, which is not a file of {where}")
    raise ConfigError(f"preset: extends chain of {q(name)} is longer than {MAX_CHAIN} files")


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Recursive merge: mappings merge, everything else (lists and nulls included) is replaced by ``over``."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def merge_docs(docs: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
    """The chain's mappings merged, the root first and the preset last."""
    merged: dict[str, Any] = {}
    for _, doc in reversed(docs):
        merged = deep_merge(merged, doc)
    return merged


def merged_preset(name: str, files: bool = True) -> dict[str, Any]:
    """The preset mapping with ``extends:`` resolved, before overrides and validation (the chart's ``dapo.preset``)."""
    return merge_docs(chain_docs(name, files))


# -- overrides --------------------------------------------------------------------------------------------------------


def override_root(text: str) -> str:
    """The first key of an override, Hydra's ``+``/``~`` prefixes dropped."""
    return text.split("=", 1)[0].strip().lstrip("+~").split(".", 1)[0]


def split_overrides(items: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Split ``key=value`` items into (preset overrides, verl Hydra overrides)."""
    ours, verl = [], []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"overrides: {q(item)} is not of the form key=value")
        (ours if override_root(item) in PRESET_ROOTS else verl).append(item)
    return ours, verl


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=VALUE`` -> (["a", "b", "c"], VALUE as the YAML of ``v: VALUE`` reads it; "" when VALUE is blank)."""
    if "=" not in text:
        raise ConfigError(f"overrides: {q(text)} is not of the form key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if key[:1] in ("+", "~"):
        raise ConfigError(f"overrides: {q(text)}: a preset key takes no Hydra prefix (+, ~)")
    if not key or "" in key.split("."):
        raise ConfigError(f"overrides: {q(text)}: empty key")
    # no PyYAML detail: the chart says the same (Helm's own reason differs)
    value = read_yaml(f"v: {raw}", f"overrides: {q(text)}", detail=False)["v"] if raw.strip() else ""
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``data`` with each override applied in order (preset keys: :func:`split_overrides` sorts them out first)."""
    out = copy.deepcopy(data)
    for text in overrides:
        parts, value = parse_override(text)
        node = out
        for part in parts[:-1]:
            if node.get(part) is None:
                node[part] = {}
            if not isinstance(node[part], dict):
                raise ConfigError(f"overrides: {q(text)}: {q(part)} is not a mapping in the preset")
            node = node[part]
        node[parts[-1]] = value
    return out


# -- ${trainer.<key>} -------------------------------------------------------------------------------------------------


def resolve_trainer_refs(path: str, trainer: dict[str, Any]) -> str:
    """``path`` with each ``${trainer.<key>}`` replaced by that scalar of ``trainer`` (strings as they are, numbers as
    Helm prints them, :func:`dapo.util.gofmt.go_string`), keys in sorted order, as the chart's ``dapo.trainerPath``
    does; the only interpolation the presets use, so anything else left is refused."""
    out = path
    for key in sorted(trainer):
        value = trainer[key]
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            out = out.replace(f"${{trainer.{key}}}", go_string(value))
    if "${" in out:
        raise ConfigError(f"preset: cannot resolve {q(path)} (only ${{trainer.<key>}} references are supported)")
    return out


def run_dir(preset: Preset) -> str:
    """Where a run keeps its checkpoints and logs: ``recipe.trainer.default_local_dir`` with its references resolved."""
    trainer = dataclasses.asdict(preset.recipe.trainer)
    return resolve_trainer_refs(trainer["default_local_dir"], trainer)

"""Loading a preset: YAML files that ``extends:`` one another, a deep merge, ``key.path=value`` overrides, and strict
validation into the :mod:`dapo.config.schema` dataclasses.

A preset is a YAML file (``dapo/presets/NAME.yaml``) that may ``extends:`` another one (a file name without
extension, resolved in the same directory; underscore-prefixed files are shared bases, not runnable presets).

Strictness: every mapping is checked against the dataclass it fills -- by pydantic in strict mode, the dataclasses
staying plain ``dataclasses`` -- and an unknown key is a :class:`~dapo.config.schema.ConfigError` that names the full
dotted path and the file it came from, with a close-match suggestion. Types are checked too (``int`` where an
``int`` is expected, no silent string -> number conversion; ``--set`` overrides are parsed as YAML scalars, and
YAML 1.2 floats such as ``1e-6`` are numbers). ``extends:``, the deep merge and the overrides stay here: a few dozen
lines on plain mappings (OmegaConf would also do them, but it cannot hold ``Literal`` fields and would resolve the
``${...}`` placeholders that are meant for verl).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import re
import types
import typing
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import yaml

from dapo.config.rules import validate
from dapo.config.schema import ConfigError, PlacementConfig, Preset

PRESET_DIR = Path(__file__).resolve().parents[1] / "presets"

# --------------------------------------------------------------------------------------------------------------------
# Strict dataclass loading: pydantic validates (types, unknown keys); this module words the errors
# --------------------------------------------------------------------------------------------------------------------


class _YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 floats: ``1e-6`` is a number (YAML 1.1 reads exponents without a dot as
    strings; Helm's YAML reader and OmegaConf read them as numbers)."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 -- a SafeLoader subclass


def _set_strict(schema: Any, strict: bool) -> None:
    """Let dataclasses be filled from mappings while every scalar stays strict (pydantic's strict mode would also
    require dataclass *instances*)."""
    if isinstance(schema, dict):
        if schema.get("type") == "dataclass":
            schema["strict"] = strict
        for value in schema.values():
            _set_strict(value, strict)
    elif isinstance(schema, list):
        for value in schema:
            _set_strict(value, strict)


@functools.lru_cache(maxsize=None)
def _validator(cls: type) -> Any:
    """A strict pydantic validator for the dataclass ``cls``: no string -> number, number -> bool or number -> string
    conversion, ints accepted as floats. (The config sits on a ``list[cls]`` wrapper: pydantic takes a plain
    dataclass's config from the type that holds it.)"""
    import pydantic  # on first use: building the schema costs ~0.2 s once per process, importing it ~0.05 s
    import pydantic_core

    adapter = pydantic.TypeAdapter(list[cls], config=pydantic.ConfigDict(strict=True, extra="forbid"))
    schema = copy.deepcopy(adapter.core_schema)
    _set_strict(schema, False)
    return pydantic_core.SchemaValidator(schema)


def _type_at(cls: type, loc: tuple[Any, ...]) -> Any:
    """The annotation at ``loc`` (a pydantic error location) inside dataclass ``cls``; None where unknown."""
    tp: Any = cls
    for part in loc:
        while typing.get_origin(tp) in (Union, types.UnionType):  # Optional[X] -> X
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            tp = args[0] if len(args) == 1 else None
        if dataclasses.is_dataclass(tp) and isinstance(part, str):
            tp = typing.get_type_hints(tp).get(part)
        elif typing.get_origin(tp) is list and isinstance(part, int):
            tp = (typing.get_args(tp) or (Any,))[0]
        elif typing.get_origin(tp) is dict:
            tp = (typing.get_args(tp) or (Any, Any))[1]
        else:
            return None
    return tp


def _loc_path(loc: tuple[Any, ...], prefix: str) -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "bool_type": "true/false", "bool_parsing": "true/false",
    "float_type": "a number", "float_parsing": "a number",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping", "dataclass_type": "a mapping", "dataclass_args_type": "a mapping",
}


def _error_message(cls: type, err: Any, prefix: str, where: str) -> str:
    """One pydantic error, worded like the rest of the bundle: the dotted key, the file, and what was expected."""
    loc, kind, value = tuple(err["loc"][1:]), err["type"], err.get("input")
    path = _loc_path(loc, prefix)
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        parent = _type_at(cls, loc[:-1])
        names = sorted(f.name for f in dataclasses.fields(parent)) if dataclasses.is_dataclass(parent) else []
        close = difflib.get_close_matches(str(loc[-1]), names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else f" (known keys: {', '.join(names)})"
        return f"unknown key '{path}'{where}{hint}"
    if kind == "literal_error":
        allowed = list(typing.get_args(_type_at(cls, loc))) or err.get("ctx", {}).get("expected")
        return f"'{path}'{where}: {value!r} is not one of {allowed}"
    if kind in ("list_type", "dict_type", "dataclass_type", "dataclass_args_type"):
        return f"'{path}'{where}: expected {_EXPECTED[kind]}, got {type(value).__name__} {value!r}"
    if kind in _EXPECTED:
        return f"'{path}'{where}: expected {_EXPECTED[kind]}, got {value!r}"
    return f"'{path}'{where}: {err['msg']}, got {value!r}"


def _stringify_env(data: dict[str, Any], cls: type) -> dict[str, Any]:
    """``placement.env`` values are often written unquoted in YAML (``1``, ``true``): read scalars as strings."""
    placement = data.get("placement") if cls is Preset else data if cls is PlacementConfig else None
    env = placement.get("env") if isinstance(placement, dict) else None
    if not isinstance(env, dict):
        return data
    env = {k: (str(v).lower() if isinstance(v, bool) else str(v)) if isinstance(v, (int, float)) else v
           for k, v in env.items()}
    if cls is Preset:
        return {**data, "placement": {**placement, "env": env}}
    return {**data, "env": env}


def from_dict(cls: type, data: dict[str, Any], *, source: str | Callable[[tuple], str] = "", path: str = "") -> Any:
    """Build dataclass ``cls`` from a plain mapping, rejecting unknown keys and wrong types (validated by pydantic in
    strict mode). The :class:`ConfigError` names the dotted key path, the file (``source``, or ``source(loc)``: where
    the key at that location was written), and the closest known key; when several keys are wrong, one line each
    (unknown keys first)."""
    origin = source if callable(source) else (lambda loc: source)
    if not isinstance(data, dict):
        raise ConfigError(f"{origin(()) or 'config'}: expected a mapping at the top level, got {type(data).__name__}")
    import pydantic_core

    try:
        return _validator(cls).validate_python([_stringify_env(data, cls)])[0]
    except pydantic_core.ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda e: e["type"] not in ("unexpected_keyword_argument", "extra_forbidden"))
        lines = []
        for e in errors:
            where = origin(tuple(e["loc"][1:]))
            lines.append(_error_message(cls, e, path, f" in {where}" if where else ""))
        raise ConfigError("\n".join(lines)) from None


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Recursive merge: mappings merge, everything else (lists included) is replaced by ``over``."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=VALUE`` -> (["a","b","c"], yaml-parsed VALUE)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"override {text!r}: empty key")
    try:
        value = _yaml_load(raw) if raw.strip() != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({exc})") from exc
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides to a raw preset mapping (validated later by :func:`from_dict`)."""
    out = copy.deepcopy(data)
    for text in overrides:
        parts, value = parse_override(text)
        node = out
        for part in parts[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {text!r}: '{part}' is not a mapping")
            node = nxt
        node[parts[-1]] = value
    return out


# the top-level keys of a preset: an override under one of them addresses the preset, any other goes to verl
PRESET_ROOTS = ("recipe", "placement", "local", "name", "description", "target_aime")


def split_overrides(items: list[str]) -> tuple[list[str], list[str]]:
    """Split positional ``key=value`` items into (preset overrides, verl Hydra overrides)."""
    ours, verl = [], []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        root = item.split("=", 1)[0].lstrip("+~").split(".", 1)[0]
        (ours if root in PRESET_ROOTS else verl).append(item)
    return ours, verl


def preset_path(name: str) -> Path:
    """Resolve a preset name (``full``) or a path to a YAML file."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    candidate = PRESET_DIR / f"{name}.yaml"
    if candidate.exists() and not name.startswith("_"):
        return candidate
    raise ConfigError(f"unknown preset {name!r}; available: {', '.join(list_presets())} (or a path to a YAML file)")


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml") if not p.stem.startswith("_"))


def _load_raw(path: Path, seen: tuple[Path, ...] = (), docs: Optional[list] = None) -> dict[str, Any]:
    """The merged mapping of ``path`` and what it ``extends``; ``docs`` (when given) receives ``(file, mapping)`` of
    each file, the preset first."""
    if path in seen:
        raise ConfigError(f"{path}: circular 'extends' chain {' -> '.join(str(s) for s in seen + (path,))}")
    try:
        data = _yaml_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    parent = data.pop("extends", None)
    if docs is not None:
        docs.append((path, copy.deepcopy(data)))
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: 'extends' must be a preset file name, got {parent!r}")
    parent_path = path.parent / f"{parent}.yaml"
    if not parent_path.exists():
        raise ConfigError(f"{path}: 'extends: {parent}' names no file {parent_path}")
    # the shared base must itself be a valid (strict) preset fragment
    return deep_merge(_load_raw(parent_path, seen + (path,), docs), data)


def load_raw_preset(name: str) -> dict[str, Any]:
    """The merged (``extends`` resolved) mapping of a preset, before validation."""
    path = preset_path(name)
    data = _load_raw(path)
    data.setdefault("name", path.stem)
    return data


def load_preset(name: str, overrides: list[str] | tuple[str, ...] = ()) -> Preset:
    """Load, merge, override and validate a preset. Raises :class:`ConfigError` naming the offending key."""
    path = preset_path(name)
    docs: list[tuple[Path, dict[str, Any]]] = []
    raw = _load_raw(path, docs=docs)
    raw.setdefault("name", path.stem)
    raw = apply_overrides(raw, overrides)
    preset = from_dict(Preset, raw, source=lambda loc: _origin(loc, path, docs, overrides))
    validate(preset)
    return preset


def _origin(loc: tuple, path: Path, docs: list[tuple[Path, dict[str, Any]]], overrides: Sequence[str]) -> str:
    """Where the key at ``loc`` was written: the last override that sets it (or a mapping above it), else the first
    file of the ``extends`` chain that holds it (the preset first), else the preset."""
    keys = []
    for part in loc:
        if not isinstance(part, str):
            break
        keys.append(part)
    for text in reversed(overrides):
        parts = text.split("=", 1)[0].strip().split(".")
        n = min(len(parts), len(keys))
        if parts[:n] == keys[:n]:
            return f"{path} + override {text!r}"
    for file, doc in docs:
        node: Any = doc
        for key in keys:
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            return str(file) if file == path else f"{file} (extended by {path.name})"
    return str(path)

"""Loading a preset strictly: the merged chain and its overrides (:mod:`dapo.config.chain`) validated into the
:mod:`dapo.config.schema` dataclasses, each error naming the key and the file that wrote it.

Strictness: every mapping is checked against the dataclass it fills -- by pydantic in strict mode, the dataclasses
staying plain ``dataclasses`` -- and an unknown key is a :class:`~dapo.config.schema.ConfigError` that names the full
dotted path and the file it came from (the preset, a file it extends, or an override), with a close-match
suggestion. Types are checked too (``int`` where an ``int`` is expected, no silent string -> number conversion).
The merge stays on plain mappings (OmegaConf would also do it, but it cannot hold ``Literal`` fields and would resolve
the ``${...}`` placeholders that are meant for verl).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import types
import typing
from pathlib import Path
from typing import Any, Callable, Sequence, Union

from dapo.config.chain import (
    apply_overrides,
    chain_docs,
    merge_docs,
    merged_preset,
    preset_path,
)
from dapo.config.rules import validate
from dapo.config.schema import ConfigError, PlacementConfig, Preset

# --------------------------------------------------------------------------------------------------------------------
# Strict dataclass loading: pydantic validates (types, unknown keys); this module words the errors
# --------------------------------------------------------------------------------------------------------------------


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


def load_raw_preset(name: str) -> dict[str, Any]:
    """The merged (``extends`` resolved) mapping of a preset, before validation, named after its file by default."""
    data = merged_preset(name)
    data.setdefault("name", preset_path(name).stem)
    return data


def load_preset(name: str, overrides: list[str] | tuple[str, ...] = ()) -> Preset:
    """Load, merge, override and validate a preset. Raises :class:`ConfigError` naming the offending key."""
    path = preset_path(name)
    docs = chain_docs(name)
    raw = merge_docs(docs)
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

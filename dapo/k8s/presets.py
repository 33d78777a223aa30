"""What the chart reads from the preset files: the chain :mod:`dapo.config.chain` resolves for every reader, with the
chart's error type.

The chart mounts ``presets/`` (a link to ``dapo/presets``) and merges a preset in its own templates
(``charts/dapo/templates/_presets.tpl``; tests/test_preset_chain.py proves it equal to :mod:`dapo.config.chain`).
``scripts/render.py`` renders from these functions; the preset is also validated strictly with
:func:`dapo.config.load_preset`, which Helm cannot do.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator

from dapo.config import ConfigError, apply_overrides, list_presets, resolve_trainer_refs, split_overrides
from dapo.config.chain import chain_docs
from dapo.config.chain import merged_preset as _merged
from dapo.util.gofmt import go_string

HUB_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


class ValuesError(ValueError):
    """Bad chart values or an impossible combination; the message starts with the offending key."""


@contextlib.contextmanager
def _as_values_error() -> Iterator[None]:
    try:
        yield
    except ConfigError as exc:
        raise ValuesError(str(exc)) from None


def runnable_presets() -> list[str]:
    return list_presets()


def preset_chain(name: str) -> list[str]:
    """File names (without .yaml) of the preset and the files it ``extends:``, the preset first."""
    with _as_values_error():
        return [path.stem for path, _ in chain_docs(name, files=False)]


def preset_files(name: str) -> dict[str, str]:
    """``{"full.yaml": <text>, "_base.yaml": <text>}``: the ConfigMap data, verbatim."""
    with _as_values_error():
        return {path.name: path.read_text() for path, _ in chain_docs(name, files=False)}


def merged_preset(name: str) -> dict[str, Any]:
    """The chart's ``dapo.preset``: the preset mapping with ``extends:`` resolved, before validation."""
    with _as_values_error():
        return _merged(name, files=False)


def effective_preset(preset: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """The chart's ``dapo.effectivePreset``: the merged preset after the ``overrides`` that are preset keys."""
    with _as_values_error():
        return apply_overrides(preset, split_overrides(list(overrides))[0])


def model_repo(preset: dict[str, Any]) -> str:
    """The chart's ``dapo.modelRepo``: the Hugging Face repo id of the preset's model, "" for built-in / local."""
    path = go_string(((preset.get("recipe") or {}).get("model") or {}).get("path") or "")
    return path if HUB_REPO.fullmatch(path) else ""


def trainer_path(path: str, trainer: dict[str, Any]) -> str:
    """The chart's ``dapo.trainerPath``: ``${trainer.<key>}`` references of a preset path resolved."""
    with _as_values_error():
        return resolve_trainer_refs(path, trainer)

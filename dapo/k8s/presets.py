"""The preset chain (:mod:`dapo.config.chain`) with the chart's error type, for the readers in this package (``dapo
plan`` lists the presets; ``dapo doctor`` loads the one the rendered entrypoint names).

The chart mounts ``presets/`` (a link to ``dapo/presets``) and merges a preset in its own templates
(``charts/dapo/templates/_presets.tpl``; tests/test_preset_chain.py proves it equal to :mod:`dapo.config.chain`).
"""

from __future__ import annotations

from typing import Any

from dapo.config import ConfigError, list_presets
from dapo.config.chain import merged_preset as _merged


class ValuesError(ValueError):
    """Bad chart values or an impossible combination; the message starts with the offending key."""


def runnable_presets() -> list[str]:
    return list_presets()


def merged_preset(name: str) -> dict[str, Any]:
    """The chart's ``dapo.preset``: the preset mapping with ``extends:`` resolved, before validation."""
    try:
        return _merged(name, files=False)
    except ConfigError as exc:
        raise ValuesError(str(exc)) from None

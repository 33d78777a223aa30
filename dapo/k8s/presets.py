"""What the chart reads from the preset files, computed the way the chart's templates compute it.

The chart mounts ``presets/`` (a link to ``dapo/presets``) and resolves a preset's ``extends:`` chain itself
(``dapo.presetFiles`` / ``dapo.preset`` in ``charts/dapo/templates/_presets.tpl``). These functions do the same in
Python so ``scripts/render.py`` produces the same objects; the preset is also validated strictly with
:func:`dapo.config.load_preset`, which Helm cannot do.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from dapo.config import PRESET_DIR, PRESET_ROOTS, deep_merge
from dapo.util.gofmt import go_string, q

PRESET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
MAX_CHAIN = 16


class ValuesError(ValueError):
    """Bad chart values or an impossible combination; the message starts with the offending key."""


def runnable_presets(preset_dir: Path = PRESET_DIR) -> list[str]:
    return sorted(p.stem for p in preset_dir.glob("*.yaml") if not p.stem.startswith("_"))


def preset_chain(name: str, preset_dir: Path = PRESET_DIR) -> list[str]:
    """File names (without .yaml) of the preset and the files it ``extends:``, the preset first."""
    if not PRESET_NAME.fullmatch(name) or name.startswith("_"):
        raise ValuesError(
            f"preset: {q(name)} is not a preset name (a file of presets/ without .yaml; _files are shared bases)"
        )
    files: list[str] = []
    current = name
    for _ in range(MAX_CHAIN):
        path = preset_dir / f"{current}.yaml"
        if not path.is_file():
            if current == name:
                raise ValuesError(
                    f"preset: unknown preset {q(name)}; available: {', '.join(runnable_presets(preset_dir))}"
                )
            raise ValuesError(f"preset: {q(files[-1])} extends {q(current)}, which is not a file of presets/")
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ValuesError(f"preset: {path} is not valid YAML: {exc}") from exc
        files.append(current)
        if "extends" not in doc:
            return files
        parent = doc["extends"]
        if parent in files:
            raise ValuesError(f"preset: circular extends chain {' -> '.join(files)} -> {parent}")
        current = str(parent)
    raise ValuesError(f"preset: extends chain of {q(name)} is longer than {MAX_CHAIN} files")


def preset_files(name: str, preset_dir: Path = PRESET_DIR) -> dict[str, str]:
    """``{"full.yaml": <text>, "_base.yaml": <text>}``: the ConfigMap data, verbatim."""
    return {f"{f}.yaml": (preset_dir / f"{f}.yaml").read_text() for f in preset_chain(name, preset_dir)}


def merged_preset(name: str, preset_dir: Path = PRESET_DIR) -> dict[str, Any]:
    """The preset mapping with ``extends:`` resolved (root first, deep merge), before validation."""
    merged: dict[str, Any] = {}
    for f in reversed(preset_chain(name, preset_dir)):
        doc = yaml.safe_load((preset_dir / f"{f}.yaml").read_text()) or {}
        doc.pop("extends", None)
        merged = deep_merge(merged, doc)
    return merged


HUB_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def effective_preset(preset: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """The chart's ``dapo.effectivePreset``: the merged preset after the ``overrides`` that are preset keys, applied
    like :func:`dapo.config.apply_overrides` (each ``a.b.c=VALUE`` sets the key, VALUE read as YAML)."""
    out = copy.deepcopy(preset)
    for o in overrides:
        key, raw = (o.split("=", 1) + [""])[:2]
        key = key.strip()
        if key.lstrip("+~").split(".", 1)[0] not in PRESET_ROOTS:
            continue
        value = yaml.safe_load(raw) if raw.strip() else ""
        parts = key.split(".")
        node = out
        for part in parts[:-1]:
            if node.get(part) is None:
                node[part] = {}
            if not isinstance(node[part], dict):
                raise ValuesError(f"overrides: {q(o)}: {q(part)} is not a mapping in the preset")
            node = node[part]
        node[parts[-1]] = value
    return out


def model_repo(preset: dict[str, Any]) -> str:
    """The chart's ``dapo.modelRepo``: the Hugging Face repo id of the preset's model, "" for built-in / local."""
    path = go_string(((preset.get("recipe") or {}).get("model") or {}).get("path") or "")
    return path if HUB_REPO.fullmatch(path) else ""


def trainer_path(path: str, trainer: dict[str, Any]) -> str:
    """Substitute ``${trainer.<key>}`` in a preset path (the only interpolation the presets use)."""
    out = path
    for key in sorted(trainer):
        value = trainer[key]
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            out = out.replace(f"${{trainer.{key}}}", go_string(value))
    if "${" in out:
        raise ValuesError(f"preset: cannot resolve {q(path)} (only ${{trainer.<key>}} references are supported)")
    return out

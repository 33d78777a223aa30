"""The reference command line around :func:`dapo.reference.translate.translate`: Hydra overrides in 4f80e46's key
names (checked, then replacing generated arguments in place), the RayJob entrypoint that runs the recipe under
:mod:`dapo.reference.attempt_log`, and ``python -m dapo.reference`` (:func:`main`) printing the command of a preset.

The chart's ``_reference.tpl`` builds the same command (tests/test_reference.py holds them equal).
"""

from __future__ import annotations

from typing import Optional

from dapo.config import ConfigError
from dapo.reference.translate import MODULE, REFERENCE_COMMIT, ReferenceError, runtime_env, translate

# The first words of a preset key (`dapo train` syntax), which the reference recipe does not understand.
PRESET_ROOTS = ("recipe", "placement", "local")


def override_key(text: str) -> str:
    return text.split("=", 1)[0]


def check_override(text: str) -> None:
    """Overrides of the reference command are Hydra overrides in 4f80e46's key names, not preset keys."""
    from dapo.util.gofmt import q

    root = override_key(text).lstrip("+~").split(".", 1)[0]
    if root in PRESET_ROOTS:
        raise ReferenceError(
            f"overrides: {q(text)} is a preset key; with train.runner reference the overrides are Hydra overrides "
            f"of the reference recipe in verl {REFERENCE_COMMIT[:7]}'s key names (e.g. trainer.total_training_steps=5)"
        )


def apply_overrides(args: list[str], overrides: list[str]) -> list[str]:
    """Replace each argument whose key an override names (the last override of a key wins) in place; append the
    overrides of other keys in the order they first appear."""
    last = {override_key(o): o for o in overrides}
    out, used = [], set()
    for arg in args:
        k = override_key(arg)
        if k in last:
            out.append(last[k])
            used.add(k)
        else:
            out.append(arg)
    for o in overrides:
        k = override_key(o)
        if k not in used:
            out.append(last[k])
            used.add(k)
    return out


def log_dir(args: list[str]) -> str:
    """``<trainer.default_local_dir>/logs``: where the driver log of each attempt goes (on the shared volume)."""
    for arg in args:
        if override_key(arg) == "trainer.default_local_dir":
            path = arg.split("=", 1)[1]
            return (path[:-1] if path.endswith("/") else path) + "/logs"
    raise ReferenceError("trainer.default_local_dir: missing from the reference command")


def entrypoint(args: list[str]) -> str:
    """The RayJob entrypoint: the recipe under :mod:`dapo.reference.attempt_log` (driver log on the shared volume)."""
    return " ".join(["python3", "-m", "dapo.reference.attempt_log", "--log-dir", log_dir(args), "--", "python3", "-m", MODULE]
                    + args)


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m dapo.reference --preset full [overrides]``: the reference command of a preset, to run by hand
    (e.g. ``ray job submit --runtime-env-json ... -- <command>`` from /opt/verl of the reproduction image)."""
    import argparse
    import json
    import sys

    from dapo.config import load_preset

    ap = argparse.ArgumentParser(prog="python -m dapo.reference", description=main.__doc__.splitlines()[0])
    ap.add_argument("--preset", required=True, help="preset name or YAML path")
    ap.add_argument("overrides", nargs="*", help="preset overrides (recipe.*, placement.*), e.g. placement.nodes=4")
    ap.add_argument("--notes", action="store_true", help="also list the preset keys that are not passed, and why")
    args = ap.parse_args(argv)
    try:
        preset = load_preset(args.preset, args.overrides)
        t = translate(preset)
    except ConfigError as exc:
        print(f"dapo.reference.translate: {exc}", file=sys.stderr)
        return 2
    print(f"# verl {REFERENCE_COMMIT}, preset {preset.name}; runtime env: "
          + json.dumps({"env_vars": runtime_env(preset)}))
    print(" \\\n    ".join(["python3 -m " + MODULE] + t.texts()))
    if args.notes:
        for key, value, why in t.not_passed:
            print(f"# not passed: {key}={value!r}: {why}")
    return 0


__all__ = ["apply_overrides", "check_override", "entrypoint", "log_dir", "main", "override_key"]


if __name__ == "__main__":
    raise SystemExit(main())

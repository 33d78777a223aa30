"""The ``dapo`` command: a thin dispatcher; each subcommand's module owns its own argument parser."""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, function, one-line help). Modules are imported lazily so `dapo --help` stays fast.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "train": ("dapo.train.cli", "main", "train with a preset (local CPU/GPU or verl on Ray): dapo train --preset tiny"),
    "report": ("dapo.train.report", "main", "regenerate the DAPO health plots of a run from its metrics.jsonl"),
    "presets": ("dapo.train.cli", "list_main", "list the presets"),
    "data": ("dapo.data.cli", "main", "prepare and validate the training / evaluation parquet files"),
    "plan": ("dapo.plan.cli", "main", "memory, tokens, time and GPU-hours of a preset before GPUs are booked"),
    "doctor": ("dapo.k8s.doctor_cli", "main", "can this cluster run these values? before the install: dapo doctor "
               "-n dapo -f values/full.yaml"),
    "eval": ("dapo.eval.cli", "main", "AIME-2024 avg@32 against an OpenAI-compatible endpoint (Ray Serve LLM)"),
    "wandb": ("dapo.train.dashboard_cli", "main", "the run's saved wandb dashboard: dapo wandb dashboard --entity E "
              "--project P"),
    "bench": ("dapo.bench.cli", "main", "benchmarks (ablation ladder, step-time breakdown)"),
}


def _usage() -> str:
    width = max(len(k) for k in COMMANDS)
    lines = ["usage: dapo COMMAND [options]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "`dapo COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from dapo import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"dapo: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    fn = getattr(importlib.import_module(module), func)
    rc = fn(rest)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())

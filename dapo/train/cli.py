"""Training entrypoint: ``dapo train --preset NAME [key=value ...]`` == ``python -m dapo.train --preset NAME ...``.

This is also the RayJob entrypoint on a cluster. It loads the preset (strict), applies overrides, and hands over to
the backend the preset's placement names:

- ``placement.backend: local`` -> :mod:`dapo.backends.local.run` (HF transformers in this process, CPU or one GPU)
- ``placement.backend: verl``  -> :mod:`dapo.backends.verl.run` (verl worker groups on Ray)

Every attempt (not ``--dry-run``) tees its stdout and stderr into ``<run dir>/logs/attempt-<N>.log`` (N = the
next free number; :mod:`dapo.train.runlog`), so the driver log of a failed attempt outlives the Ray head that ran it.
The run dir is ``--run-dir`` or ``recipe.trainer.default_local_dir`` (on a cluster: the shared volume).

Overrides: ``recipe.…``, ``placement.…``, ``local.…`` keys address the preset (validated strictly). Any other
``key=value`` is passed verbatim to verl's Hydra config (verl backend only; Hydra rejects unknown keys, a key
the preset owns -- e.g. ``trainer.nnodes`` -- is rejected with the preset key to use, here ``placement.nodes``, and a
key only verl's own ``RayPPOTrainer.fit()`` reads -- e.g. ``trainer.esi_redundant_time`` -- is rejected with the
reason: see :data:`dapo.backends.verl.passthrough.PASSTHROUGH_REFUSED`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dapo.config import ConfigError, list_presets, load_preset, run_dir, split_overrides
from dapo.train.fabric import EXIT_FABRIC, FABRICS, PLACEMENT_TIMEOUT_S

def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0 seconds, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dapo train",
        description="Train with a DAPO preset. Overrides: recipe.actor.optim.lr=1e-5 (preset keys) or "
        "verl Hydra keys the preset does not own that verl's workers read (verl backend), e.g. "
        "actor_rollout_ref.rollout.max_num_seqs=512 (keys only verl's own trainer loop reads are refused). "
        "--dry-run on a verl preset prints the resolved, validated verl config without starting Ray.",
    )
    p.add_argument("--preset", default="tiny", help=f"preset name ({', '.join(list_presets())}) or a YAML path")
    p.add_argument("overrides", nargs="*", help="key=value overrides")
    p.add_argument("--dry-run", action="store_true", help="print the resolved configuration and exit")
    p.add_argument("--run-dir", default=None, help="local backend: run directory (default trainer.default_local_dir)")
    p.add_argument("--device", default=None, help="local backend: cpu, cuda, cuda:N or auto (overrides the preset)")
    p.add_argument(
        "--resume", choices=["auto", "disable"], default=None, help="resume from the latest checkpoint (default: preset)"
    )
    p.add_argument("--fabric-check", metavar="FABRIC", choices=sorted(FABRICS), default=None,
                   help="verl backend: before training, all-reduce across every GPU of the run, read the network NCCL "
                   f"chose from its log and fail (exit {EXIT_FABRIC}) unless it is FABRIC ({', '.join(sorted(FABRICS))})"
                   " and the bus bandwidth reaches the fabric's floor (dapo.train.fabric)")
    p.add_argument("--fabric-min-busbw", type=float, metavar="GBPS", default=None,
                   help="with --fabric-check: the busbw floor (GB/s) of the largest message instead of the fabric's")
    p.add_argument("--fabric-recheck", metavar="TOKEN", default=None,
                   help="with --fabric-check: a failed check is not run again by later attempts of the same run "
                   "(<run dir>/fabric-check.json); a new TOKEN runs it again (the chart's fabric.recheck)")
    p.add_argument("--fabric-placement-timeout", type=_positive_seconds, metavar="SECONDS",
                   default=PLACEMENT_TIMEOUT_S,
                   help="with --fabric-check: how long the check waits for the nodes of its ranks before it ends the "
                   f"attempt (exit {EXIT_FABRIC}) naming the nodes missing; not recorded, a retry checks again "
                   f"(default {PLACEMENT_TIMEOUT_S:.0f})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
    p.add_argument("--no-attempt-log", action="store_true",
                   help="do not write <run dir>/logs/attempt-N.log (stdout + stderr of this attempt)")
    return p


def run_dir_of(preset, args: argparse.Namespace) -> Path:
    """Where the run keeps checkpoints and logs: ``--run-dir`` (local backend) or ``trainer.default_local_dir`` with
    its ``${trainer.<key>}`` references resolved (:func:`dapo.config.run_dir`)."""
    if getattr(args, "run_dir", None):
        return Path(args.run_dir)
    return Path(run_dir(preset))


def _attempt(preset, args: argparse.Namespace, run_dir: Path):
    """This attempt's ends and watchdog (:mod:`dapo.train.ending`, :mod:`dapo.train.watchdog`), the watchdog started
    on the start-up's budget; (None, None) for ``--dry-run``."""
    if args.dry_run:
        return None, None
    from dapo.train import attempts, runlog
    from dapo.train.ending import AttemptEnd
    from dapo.train.watchdog import Watchdog

    log = runlog.active()
    ending = AttemptEnd(run_dir, log.number if log else None, attempts.preset_key(preset.to_dict()))
    watchdog = Watchdog(preset.recipe.trainer.watchdog, run_dir, attempt=ending.attempt, on_stall=ending.stall)
    watchdog.enter("startup")
    return ending, watchdog.start()


def _run(preset, args: argparse.Namespace, verl_overrides: list[str], run_dir: Path) -> int:
    ending, watchdog = _attempt(preset, args, run_dir)
    try:
        if ending is not None and (code := ending.refuse_on_verdict()) is not None:
            return code  # an earlier attempt stopped the run for good: nothing is built
        args.attempt_end, args.watchdog = ending, watchdog  # the backend hands both to the loop
        if preset.placement.backend == "local":
            from dapo.backends.local.run import run as run_backend

            return int(run_backend(preset, args, run_dir) or 0)
        from dapo.backends.verl.run import run as run_backend

        return int(run_backend(preset, args, verl_overrides, str(run_dir)) or 0)
    except ConfigError as exc:
        print(f"dapo train: configuration error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a crash: recorded (with the nodes it names) for the follower, then the traceback
        if ending is not None:
            ending.crashed(exc)
        raise
    finally:
        if watchdog is not None:
            watchdog.stop()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        ours, verl_overrides = split_overrides(args.overrides)
        if args.device:
            ours.append(f"placement.device={args.device}")
        if args.resume:
            ours.append(f"recipe.trainer.resume_mode={args.resume}")
        preset = load_preset(args.preset, ours)
        if preset.placement.backend == "local" and args.fabric_check:
            raise ConfigError(f"--fabric-check measures the network between a verl run's GPUs; preset "
                              f"{preset.name!r} runs on the local backend (one process)")
        if preset.placement.backend == "local" and verl_overrides:
            raise ConfigError(
                f"overrides {verl_overrides} are not preset keys (recipe./placement./local.) and the "
                f"preset {preset.name!r} runs on the local backend, which has no verl config"
            )
        run_dir = run_dir_of(preset, args)  # worked out once: the backend runs there, the attempt logs go there
    except ConfigError as exc:
        print(f"dapo train: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run or args.no_attempt_log:
        return _run(preset, args, verl_overrides, run_dir)
    from dapo.train.runlog import run_logged

    return run_logged(run_dir / "logs", lambda: _run(preset, args, verl_overrides, run_dir), prog="dapo train",
                      header=f"dapo train --preset {args.preset} {' '.join(args.overrides)}".rstrip())


def list_main(argv: list[str] | None = None) -> int:
    for name in list_presets():
        preset = load_preset(name)
        print(f"{name:8s} {preset.placement.backend:5s} {preset.description}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

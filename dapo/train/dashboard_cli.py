"""``dapo wandb dashboard``: save the DAPO run dashboard (:mod:`dapo.train.dashboard`) as a wandb workspace view.

``dapo wandb dashboard --entity E --project P [--run NAME] [--name VIEW]`` saves a new view of the project's
workspace (it needs a wandb login: ``WANDB_API_KEY`` or ``wandb login``) and prints its URL; ``--spec-out FILE``
writes the view's JSON instead (no server, no login): the spec the tests check.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from dapo.train.dashboard import spec, workspace


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dapo wandb", description="wandb helpers for DAPO runs")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dashboard", help="save the DAPO run dashboard as a view of the project's wandb workspace")
    d.add_argument("--entity", required=True, help="wandb entity (user or team)")
    d.add_argument("--project", required=True, help="wandb project (the preset's recipe.trainer.project_name)")
    d.add_argument("--name", default="DAPO run", help="the view's name")
    d.add_argument("--run", default=None, help="show only runs whose name matches (e.g. the experiment_name)")
    d.add_argument("--spec-out", default=None, help="write the view's JSON here instead of saving it (offline)")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.spec_out:
        Path(args.spec_out).write_text(json.dumps(spec(args.entity, args.project, args.name, args.run), indent=1))
        print(f"wrote the dashboard spec to {args.spec_out}")
        return 0
    view = workspace(args.entity, args.project, args.name, args.run)
    try:
        view.save_as_new_view()
    except Exception as exc:  # no login, no such entity/project, no network: say which, no traceback
        print(f"dapo wandb dashboard: saving the view to {args.entity}/{args.project} failed "
              f"({type(exc).__name__}: {exc}); log in with `wandb login` or set WANDB_API_KEY", file=sys.stderr)
        return 1
    print(view.url)
    return 0


if __name__ == "__main__":
    sys.exit(main())

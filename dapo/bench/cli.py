"""``dapo bench``: benchmarks of the DAPO loop on the tiny task (not tests: they print measurements). This module
only dispatches to the subcommands:

- ``dapo bench ablation`` (:mod:`dapo.bench.ablation`): the paper's ablation ladder (Table 1), several seeds.
- ``dapo bench mechanisms`` (:mod:`dapo.bench.mechanisms`): each of DAPO's four mechanisms with / without, on a
  task where its precondition holds, several seeds.
- ``dapo bench sampler`` (:mod:`dapo.bench.sampler`): the reference vs the carry sampler, simulated (no model).
- ``dapo bench timing`` (:mod:`dapo.bench.timing`): the share of the step time per phase.
- ``dapo bench peers`` (:mod:`dapo.bench.peers`): TRL's GRPOTrainer side by side with ``dapo train``.
- ``dapo bench verl-fit`` (:mod:`dapo.bench.verl_fit`): the loop on verl's workers vs verl's own ``fit()``.
"""

from __future__ import annotations

import sys
from typing import Optional

from dapo.bench.ablation import cmd_ablation
from dapo.bench.mechanisms import cmd_mechanisms
from dapo.bench.peers import cmd_peers
from dapo.bench.sampler import cmd_sampler
from dapo.bench.timing import cmd_timing
from dapo.bench.verl_fit import cmd_verl_fit


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmds = {"ablation": cmd_ablation, "timing": cmd_timing, "sampler": cmd_sampler, "peers": cmd_peers,
            "verl-fit": cmd_verl_fit, "mechanisms": cmd_mechanisms}
    if not argv or argv[0] not in cmds:
        print("usage: dapo bench {ablation,mechanisms,timing,sampler,peers,verl-fit} [options]  (dapo bench ablation --help)",
              file=sys.stderr)
        return 2
    return cmds[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())

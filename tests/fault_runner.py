"""``dapo train`` with one fault injected from outside the product: the test's stand-in for what goes wrong on a real
cluster (a generation that never returns, a NaN in the weights, a volume that is full). The product's code is run
unchanged; only the named call is wrapped here, in this process.

    python tests/fault_runner.py '{"kind": "hang_generate", "call": 4}' -- --preset tiny ...

Faults (``kind``):
- ``hang_generate``: the ``call``-th training generation (validation excluded) never returns;
- ``nan_weights``: right after the update of step ``step``, one weight becomes NaN;
- ``disk_free``: the volume reports ``bytes`` free (``shutil.disk_usage``), from step ``step`` on.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections import namedtuple


def _hang_generate(spec: dict) -> None:
    from dapo.backends.local.backend import LocalBackend

    original, calls = LocalBackend.generate, [0]

    def generate(self, prompts, sampling, group_ids=None):
        if not sampling.validation:
            calls[0] += 1
            if calls[0] == int(spec["call"]):
                print(f"fault_runner: hung at {time.time():.3f}: training generation {calls[0]} never returns", flush=True)
                threading.Event().wait()  # like a wedged engine: the call blocks, the process lives on
        return original(self, prompts, sampling, group_ids)

    LocalBackend.generate = generate


def _nan_weights(spec: dict) -> None:
    import torch

    from dapo.train.loop import DAPOLoop

    original = DAPOLoop.train_step

    def train_step(self, step):
        metrics = original(self, step)
        if step == int(spec["step"]):
            with torch.no_grad():
                next(self.backend.model.parameters()).view(-1)[0] = float("nan")
            print(f"fault_runner: a NaN written into the weights after the update of step {step}", flush=True)
        return metrics

    DAPOLoop.train_step = train_step


def _disk_free(spec: dict) -> None:
    from dapo.train.loop import DAPOLoop

    usage, real, state = namedtuple("usage", "total used free"), shutil.disk_usage, {"step": 0}
    original = DAPOLoop.train_step

    def train_step(self, step):
        state["step"] = step
        return original(self, step)

    def disk_usage(path):
        if state["step"] >= int(spec.get("step", 0)):
            total = real(path).total
            return usage(total, total - int(spec["bytes"]), int(spec["bytes"]))
        return real(path)

    DAPOLoop.train_step = train_step
    shutil.disk_usage = disk_usage


FAULTS = {"hang_generate": _hang_generate, "nan_weights": _nan_weights, "disk_free": _disk_free}

if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    if sys.argv[2] != "--":
        raise SystemExit("usage: fault_runner.py SPEC -- <dapo train arguments>")
    FAULTS[spec["kind"]](spec)
    from dapo.cli import main

    sys.exit(main(["train", *sys.argv[3:]]))

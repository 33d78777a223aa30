"""The order of verl's calls in a run -- generate, sleep, update_weights, log-probs, update, save, validate --
recorded on the ``RayPPOTrainer`` both trainers drive, so the DAPO loop's order can be compared with ``fit()``'s.

:class:`CallRecorder` wraps (never replaces) the calls on one built trainer: its checkpoint manager's
``update_weights`` / ``sleep_replicas`` / ``wake_up_replicas``, the agent loop's ``generate_sequences`` (``validate``
when the batch says so), ``_compute_old_log_prob`` / ``_compute_ref_log_prob`` / ``_update_actor``, and the worker
group's ``save_checkpoint`` / ``load_checkpoint``. The DAPO loop (:class:`dapo.backends.verl.workers.RayWorkers`) and
``fit()`` reach verl through exactly these, so one recorder serves both. It also keeps the replicas' state as the
calls imply it (asleep after ``init_workers`` and after a sleep, awake after ``update_weights``, which wakes and
syncs in verl 0.9.1) and notes every violation of the order that protects GPU memory: a generation while asleep, a
sync while awake, an actor pass while awake. On CPU sleep mode is off (vLLM CPU has none), so the state is the one a
GPU run would have -- which is what the order is for.

:func:`canonical` drops sleeps of replicas already asleep (no-ops) and merges back-to-back generations (dynamic
sampling's extra generation batches on the same awake replicas); :func:`split_steps` cuts the result into the
start-up and one list per training step (a step starts at its first generation). ``dapo bench verl-fit
--record-calls FILE`` writes fit()'s recording (tests/fixtures/verl_fit_calls.json); the CPU e2e compares its own
with it.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

__all__ = ["CallRecorder", "order_violations", "canonical", "split_steps", "load_calls"]

TRAIN_GEN, VAL_GEN = "generate", "validate"


class CallRecorder:
    """Records verl's calls on ``trainer`` (see the module doc) into ``events`` and, with ``sink``, one JSON-able dict
    per call (``{"call": name, "awake": state before the call, "seconds": its wall time}``) to ``sink`` when it
    returns."""

    def __init__(self, trainer: Any, sink: Optional[Callable[[dict], None]] = None):
        self.trainer, self.sink = trainer, sink
        self.events: list[dict] = []
        self.awake = False  # RayPPOTrainer.init_workers ends with the replicas asleep
        self._paused = 0
        cm, wg = trainer.checkpoint_manager, trainer.actor_rollout_wg
        self._wrap(cm, "update_weights", "update_weights")
        self._wrap(cm, "sleep_replicas", "sleep")
        self._wrap(cm, "wake_up_replicas", "wake")
        self._wrap(trainer.async_rollout_manager, "generate_sequences", None)
        self._wrap(trainer, "_compute_old_log_prob", "old_log_prob")
        self._wrap(trainer, "_compute_ref_log_prob", "ref_log_prob")
        self._wrap(trainer, "_update_actor", "update")
        self._wrap(wg, "save_checkpoint", "save")
        self._wrap(wg, "load_checkpoint", "load")

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Calls made inside are not the run's (a test's own probe); the replica state is restored after."""
        awake = self.awake
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1
            self.awake = awake

    def _wrap(self, obj: Any, attr: str, name: Optional[str]) -> None:
        inner = getattr(obj, attr)

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._paused:
                return inner(*args, **kwargs)
            which = name or (VAL_GEN if _meta(args, kwargs).get("validate") else TRAIN_GEN)
            event = {"call": which, "awake": self.awake}
            self.awake = _after(which, self.awake)
            self.events.append(event)
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                event["seconds"] = time.perf_counter() - t0  # the call's wall time, its Ray transfers included
                if self.sink is not None:
                    self.sink(event)

        setattr(obj, attr, call)

    @property
    def violations(self) -> list[str]:
        return order_violations(self.events)


def _after(call: str, awake: bool) -> bool:
    """The replicas' state after ``call``: update_weights wakes and syncs them (verl 0.9.1), a sleep frees them."""
    return True if call in ("update_weights", "wake") else False if call == "sleep" else awake


def order_violations(events: list[dict], awake: bool = False) -> list[str]:
    """Breaks of the order that protects GPU memory, replayed from the call names (replicas asleep at first, as
    ``init_workers`` leaves them): generation while asleep, a sync while awake, an actor pass while awake."""
    out = []
    for n, e in enumerate(events):
        which = e["call"]
        if which in (TRAIN_GEN, VAL_GEN) and not awake:
            out.append(f"call {n}: {which} while the replicas are asleep")
        if which == "update_weights" and awake:
            out.append(f"call {n}: update_weights while the replicas are awake")
        if which in ("old_log_prob", "ref_log_prob", "update", "save", "load") and awake:
            out.append(f"call {n}: {which} while the replicas are awake (they hold the GPU memory)")
        awake = _after(which, awake)
    return out


def _meta(args: tuple, kwargs: dict) -> dict:
    batch = args[0] if args else kwargs.get("prompts", kwargs.get("batch"))
    return dict(getattr(batch, "meta_info", None) or {})


def canonical(events: list[dict]) -> list[str]:
    """Call names with no-op sleeps (of replicas already asleep) dropped and back-to-back generations merged."""
    out: list[str] = []
    for e in events:
        name = e["call"]
        if name == "sleep" and not e["awake"]:
            continue
        if name in (TRAIN_GEN, VAL_GEN) and out and out[-1] == name:
            continue
        out.append(name)
    return out


def split_steps(calls: list[str]) -> tuple[list[str], list[list[str]]]:
    """(start-up calls, one list per training step); a step starts at its first training generation."""
    starts = [i for i, c in enumerate(calls) if c == TRAIN_GEN]
    if not starts:
        return list(calls), []
    bounds = starts + [len(calls)]
    return list(calls[: starts[0]]), [list(calls[a:b]) for a, b in zip(bounds, bounds[1:])]


def load_calls(path: str | Path) -> dict:
    """A recording written by ``dapo bench verl-fit --record-calls``."""
    data = json.loads(Path(path).read_text())
    for key in ("cadence", "events", "canonical"):
        if key not in data:
            raise ValueError(f"{path}: no '{key}' (not a recording of dapo bench verl-fit --record-calls)")
    return data

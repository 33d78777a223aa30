"""Dynamic sampling (DAPO paper arXiv 2503.14476, eq. 11 and Algorithm 1), backend-independent.

DAPO over-samples and keeps only prompt groups whose outcomes vary, so every kept group has a non-zero advantage::

    0 < |{o_i | is_equivalent(a, o_i)}| < G                                   (eq. 11)

i.e. the group's filter metric (``acc``, ``score``, ``seq_reward`` ...) is not the same for all ``G`` responses.
Generation batches are added until ``train_batch_size`` groups are kept; the surplus is cut (the reference keeps the
first ``train_batch_size * n`` kept responses, i.e. the first ``train_batch_size`` kept groups in generation order).
If ``max_num_gen_batches`` (> 0) batches did not yield enough groups, the step fails with
:class:`DynamicSamplingError`. A group of a single response is kept (like the reference; its std is 0 but nothing
can vary).

Usage by a training loop (any backend; ``batch=`` is an opaque object the sampler hands back, e.g. a Rollout)::

    sampler = DynamicSampler(train_batch_size=512, n=16, enable=True, metric="acc", max_num_gen_batches=10)
    while not sampler.is_full():
        size = sampler.suggested_gen_batch_size()
        rollout = generate(next_prompts(size))
        sampler.add(rollout.group_ids, metrics["acc"], batch=rollout, take=select)  # may raise DynamicSamplingError
        del rollout                          # the sampler holds only the rows it may still use (below)
    parts = sampler.selection()              # [Selection(batch_index, batch, indices)], whole groups, in order
    train = concat([select(p.batch, p.indices) for p in parts])      # exactly train_batch_size * n responses
    stats = sampler.finish_step()            # num_gen_batches, kept/total groups, surplus, kept ratio ...

With ``enable=False`` the sampler is a pass-through: the first batch added is the whole training batch.

Memory: with ``take=select`` (``select(batch, indices) -> the rows at indices``), :meth:`add` keeps only
``select(batch, rows)`` where ``rows`` are the responses of the groups this step may still train on -- the kept
groups, and in ``reference`` mode only those up to ``train_batch_size`` (the surplus is counted, never used) --
and never a reference to the whole generation batch. When every response is kept the batch is held as is (no
copy); when none is, nothing is held. Without ``take`` the whole batch object is held (the caller's choice).

Modes:

- ``"reference"`` (default, the paper): the surplus kept groups of a step are discarded.
- ``"carry"`` (off-paper): the surplus is carried into the next step (used first there, then dropped if still unused
  after ``carry_max_age`` steps), and :meth:`suggested_gen_batch_size` adapts the over-sampling to the observed keep
  rate (an exponential moving average). Carried responses were sampled by the previous policy: their importance
  ratio is still correct because pi_old is recomputed for the whole batch, but they are one step off-policy. The
  carry buffer is part of :meth:`DynamicSampler.state_dict`, so it survives a checkpoint and resume.

Why this module is over 400 lines: it is one state machine, :class:`DynamicSampler` (a step's kept groups, the
carry buffer, the keep-rate estimate and their checkpoint state all change together), and a third of it is the
docstrings that state the paper's rule; cutting the class in two would split one invariant across files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

__all__ = ["DynamicSampler", "DynamicSamplingError", "Selection", "FILTER_METRICS"]

# the metric names verl's DAPO recipe accepts for ``algorithm.filter_groups.metric``
FILTER_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")


class DynamicSamplingError(RuntimeError):
    """Too few prompt groups with a varying metric after ``max_num_gen_batches`` generation batches.

    Attributes: ``kept_per_batch``, ``total_per_batch`` (groups per generation batch of the step),
    ``carried_in``, ``train_batch_size``, ``max_num_gen_batches``.
    """

    def __init__(self, message: str, *, kept_per_batch: list[int], total_per_batch: list[int], carried_in: int,
                 train_batch_size: int, max_num_gen_batches: int) -> None:  # fmt: skip
        super().__init__(message)
        self.kept_per_batch = kept_per_batch
        self.total_per_batch = total_per_batch
        self.carried_in = carried_in
        self.train_batch_size = train_batch_size
        self.max_num_gen_batches = max_num_gen_batches


@dataclass
class Selection:
    """Responses of one generation batch that belong to the training batch."""

    batch_index: int  # 0-based count of add() calls over the sampler's lifetime
    batch: Any  # the object passed as add(..., batch=...), or None
    indices: np.ndarray  # response indices inside that batch; whole groups, each group's responses contiguous


@dataclass
class _Group:
    batch_index: int
    batch: Any
    indices: np.ndarray
    age: int = 0  # steps this group has been carried


@dataclass
class _Step:
    kept: list[_Group] = field(default_factory=list)  # carried-in groups first, then new ones in generation order
    carried_in: int = 0
    dropped_stale: int = 0
    kept_per_batch: list[int] = field(default_factory=list)
    total_per_batch: list[int] = field(default_factory=list)
    responses_per_batch: list[int] = field(default_factory=list)
    seen_ids: set = field(default_factory=set)
    failed: bool = False


def _groups_of(group_ids: Any) -> tuple[list[Any], list[np.ndarray]]:
    """Group ids in order of first appearance and the response indices of each."""
    if hasattr(group_ids, "detach"):  # torch tensor
        group_ids = group_ids.detach().cpu().numpy()
    ids = group_ids.tolist() if isinstance(group_ids, np.ndarray) else list(group_ids)
    members: dict[Any, list[int]] = {}
    for i, g in enumerate(ids):
        try:
            members.setdefault(g, []).append(i)
        except TypeError as exc:
            raise TypeError(f"group id at position {i} ({g!r}) is not hashable") from exc
    return list(members), [np.asarray(v, dtype=np.int64) for v in members.values()]


class DynamicSampler:
    """Keeps prompt groups whose filter metric varies until ``train_batch_size`` groups are collected (module doc).

    Args:
        train_batch_size: prompt groups per training step.
        n: responses per prompt (every group must have exactly ``n``; ``None`` skips the check).
        enable: False -> pass-through (the first batch added is the training batch, nothing filtered).
        metric: the name of the per-response metric the loop passes (only for messages and stats).
        max_num_gen_batches: generation batches per step before :class:`DynamicSamplingError`; <= 0: unlimited.
        mode: ``"reference"`` (discard surplus) or ``"carry"`` (carry surplus, adapt the generation batch size).
        gen_batch_size: prompts per generation batch the loop uses (default ``train_batch_size``); what
            :meth:`suggested_gen_batch_size` returns in reference mode and its starting point in carry mode.
        max_gen_batch_size: upper bound of the carry-mode suggestion (default ``4 * gen_batch_size``).
        carry_max_age: carry mode: steps a surplus group may wait before it is dropped.
        keep_rate_momentum: carry mode: EMA momentum of the keep rate (0: last batch only).
        oversample_margin: carry mode: relative safety margin on top of ``needed / keep_rate``.
    """

    def __init__(
        self,
        train_batch_size: int,
        n: Optional[int],
        *,
        enable: bool = True,
        metric: str = "acc",
        max_num_gen_batches: int = 10,
        mode: str = "reference",
        gen_batch_size: Optional[int] = None,
        max_gen_batch_size: Optional[int] = None,
        carry_max_age: int = 1,
        keep_rate_momentum: float = 0.5,
        oversample_margin: float = 0.1,
    ) -> None:
        if not isinstance(train_batch_size, int) or train_batch_size < 1:
            raise ValueError(f"train_batch_size must be a positive integer (prompt groups), got {train_batch_size!r}")
        if n is not None and (not isinstance(n, int) or n < 1):
            raise ValueError(f"n (responses per prompt) must be a positive integer, got {n!r}")
        if mode not in ("reference", "carry"):
            raise ValueError(f"mode must be 'reference' or 'carry', got {mode!r}")
        if gen_batch_size is not None and gen_batch_size < 1:
            raise ValueError(f"gen_batch_size must be >= 1, got {gen_batch_size}")
        if not 0.0 <= keep_rate_momentum < 1.0:
            raise ValueError(f"keep_rate_momentum must be in [0, 1), got {keep_rate_momentum}")
        if carry_max_age < 0:
            raise ValueError(f"carry_max_age must be >= 0, got {carry_max_age}")
        self.train_batch_size = train_batch_size
        self.n = n
        self.enable = bool(enable)
        self.metric = metric
        self.max_num_gen_batches = int(max_num_gen_batches)
        self.mode = mode
        self.gen_batch_size = int(gen_batch_size or train_batch_size)
        self.max_gen_batch_size = int(max_gen_batch_size or 4 * self.gen_batch_size)
        if self.max_gen_batch_size < self.gen_batch_size:
            raise ValueError(f"max_gen_batch_size ({self.max_gen_batch_size}) < gen_batch_size ({self.gen_batch_size})")
        self.carry_max_age = int(carry_max_age)
        self.keep_rate_momentum = float(keep_rate_momentum)
        self.oversample_margin = float(oversample_margin)
        # persistent state (state_dict)
        self.keep_rate_ema: Optional[float] = None
        self.steps = 0
        self.batches_added = 0
        self.totals = {"gen_batches": 0, "groups_total": 0, "groups_kept": 0, "groups_surplus": 0}
        # per-step state
        self._carry: list[_Group] = []
        self._step = _Step()
        self._begin_step()

    # ---------------------------------------------------------------------------------------------------------------
    def _begin_step(self) -> None:
        step = _Step()
        fresh = [g for g in self._carry if g.age <= self.carry_max_age]
        step.dropped_stale = len(self._carry) - len(fresh)
        step.kept = fresh
        step.carried_in = len(fresh)
        self._carry = []
        self._step = step

    @property
    def num_gen_batches(self) -> int:
        """Generation batches added in the current step."""
        return len(self._step.total_per_batch)

    @property
    def num_kept_groups(self) -> int:
        """Kept groups available to the current step (carried-in included)."""
        return len(self._step.kept)

    def is_full(self) -> bool:
        """True once the current step has its training batch (pass-through: after the first batch)."""
        if not self.enable:
            return self.num_gen_batches > 0
        return len(self._step.kept) >= self.train_batch_size

    def add(self, group_ids: Any, metric_values: Any = None, *, batch: Any = None,
            take: Optional[Callable[[Any, np.ndarray], Any]] = None) -> np.ndarray:
        """Add one generation batch; returns the indices (into this batch) of responses in kept groups.

        ``group_ids``: ``[N]`` group id per response (unique per prompt across the step, e.g. uuids);
        ``metric_values``: ``[N]`` filter metric per response (required when enabled); ``batch``: opaque, handed
        back in :meth:`selection`; ``take(batch, indices)``: the rows at ``indices`` of ``batch`` -- given, only
        the rows the step may still use are held (module doc, Memory). Raises :class:`DynamicSamplingError` when
        this batch is the ``max_num_gen_batches``-th of the step and the step is still short of
        ``train_batch_size`` groups.
        """
        step = self._step
        if step.failed:
            raise RuntimeError("this step already failed (DynamicSamplingError); call finish_step() to start anew")
        if self.is_full():
            raise RuntimeError("the training batch is already full; call selection() and finish_step() first")
        ids, members = _groups_of(group_ids)
        num_responses = sum(len(m) for m in members)
        if self.n is not None:
            for gid, m in zip(ids, members):
                if len(m) != self.n:
                    raise ValueError(f"group {gid!r} has {len(m)} responses, expected n={self.n}")
        for gid in ids:
            if gid in step.seen_ids:
                raise ValueError(
                    f"group id {gid!r} was already used by an earlier generation batch of this step; group ids must be "
                    "unique per prompt across a step (advantages are computed per group id on the joined batch)"
                )
        if self.enable:
            if metric_values is None:
                raise ValueError(f"dynamic sampling is enabled: metric_values ('{self.metric}') are required")
            if hasattr(metric_values, "detach"):
                metric_values = metric_values.detach().cpu().numpy()
            values = np.asarray(metric_values, dtype=np.float64).reshape(-1)
            if values.shape[0] != num_responses:
                raise ValueError(f"{num_responses} group ids but {values.shape[0]} '{self.metric}' values")
            keep_mask = []
            for gid, m in zip(ids, members):
                v = values[m]
                if not np.all(np.isfinite(v)):
                    raise ValueError(f"group {gid!r}: metric '{self.metric}' has a non-finite value {v.tolist()}")
                # std > 0 exactly: not all equal (np.std can report ~1e-17 for identical floats)
                keep_mask.append(len(m) == 1 or bool(v.max() > v.min()))
        else:
            keep_mask = [True] * len(ids)

        index = self.batches_added
        self.batches_added += 1
        step.seen_ids.update(ids)
        new = [_Group(index, batch, m) for m, k in zip(members, keep_mask) if k]
        kept_idx = np.concatenate([g.indices for g in new]) if new else np.zeros(0, dtype=np.int64)
        if take is not None and batch is not None:
            self._compact(new, batch, num_responses, take)
        step.kept.extend(new)
        step.kept_per_batch.append(len(new))
        step.total_per_batch.append(len(ids))
        step.responses_per_batch.append(num_responses)
        if self.enable and ids:
            rate = len(new) / len(ids)
            m = self.keep_rate_momentum
            self.keep_rate_ema = rate if self.keep_rate_ema is None else m * self.keep_rate_ema + (1 - m) * rate

        if self.enable and not self.is_full() and 0 < self.max_num_gen_batches <= self.num_gen_batches:
            step.failed = True
            raise DynamicSamplingError(self._exhausted_message(), kept_per_batch=list(step.kept_per_batch),
                                       total_per_batch=list(step.total_per_batch), carried_in=step.carried_in,
                                       train_batch_size=self.train_batch_size,
                                       max_num_gen_batches=self.max_num_gen_batches)  # fmt: skip
        return kept_idx

    def _compact(self, new: list[_Group], batch: Any, num_responses: int,
                 take: Callable[[Any, np.ndarray], Any]) -> None:
        """Point ``new``'s usable groups at ``take(batch, their rows)`` (positions renumbered), the rest at None."""
        usable = len(new)
        if self.enable and self.mode == "reference":  # surplus beyond train_batch_size is never selected
            usable = max(0, min(usable, self.train_batch_size - len(self._step.kept)))
        rows = np.concatenate([g.indices for g in new[:usable]]) if usable else np.zeros(0, dtype=np.int64)
        if np.array_equal(rows, np.arange(num_responses)):
            return  # every response kept, in order: hold the batch itself, no copy
        held = take(batch, rows) if usable else None
        offset = 0
        for i, g in enumerate(new):
            if i < usable:
                g.indices = np.arange(offset, offset + len(g.indices), dtype=np.int64)
                offset += len(g.indices)
                g.batch = held
            else:
                g.batch = None

    def _exhausted_message(self) -> str:
        s = self._step
        kept, total = sum(s.kept_per_batch), sum(s.total_per_batch)
        carried = f" plus {s.carried_in} carried in" if s.carried_in else ""
        return (
            f"dynamic sampling: only {kept + s.carried_in} of train_batch_size={self.train_batch_size} prompt groups "
            f"had a varying '{self.metric}' after max_num_gen_batches={self.max_num_gen_batches} generation batches "
            f"({kept} of {total} groups kept{carried}; kept per batch {s.kept_per_batch} of {s.total_per_batch}). "
            "Raise data.gen_batch_size (prompts per generation batch), raise filter_groups.max_num_gen_batches "
            "(<= 0: unlimited), or use an easier dataset (most groups are all-correct or all-wrong)."
        )

    def selection(self) -> list[Selection]:
        """The training batch: whole groups, ``train_batch_size`` of them (pass-through: everything added).

        Consecutive groups of one generation batch are merged into one :class:`Selection`; order = carried-in groups,
        then generation order. Call once :meth:`is_full` is True.
        """
        if not self.is_full():
            raise RuntimeError(
                f"the training batch is not full yet ({len(self._step.kept)} of {self.train_batch_size} groups)"
            )
        chosen = self._step.kept if not self.enable else self._step.kept[: self.train_batch_size]
        out: list[Selection] = []
        for g in chosen:
            if out and out[-1].batch_index == g.batch_index:
                out[-1].indices = np.concatenate([out[-1].indices, g.indices])
            else:
                out.append(Selection(g.batch_index, g.batch, g.indices.copy()))
        return out

    def step_stats(self) -> dict[str, float]:
        """Statistics of the current step (what :meth:`finish_step` returns, without ending the step)."""
        s = self._step
        total, kept = sum(s.total_per_batch), sum(s.kept_per_batch)
        available = len(s.kept)
        surplus = max(available - self.train_batch_size, 0) if self.enable else 0
        selected = (available if not self.enable else min(available, self.train_batch_size))
        return {
            "num_gen_batches": float(self.num_gen_batches),
            "num_groups_total": float(total),
            "num_groups_kept": float(kept),
            "num_groups_filtered": float(total - kept),
            "kept_ratio": float(kept / total) if total else 0.0,
            "num_groups_carried_in": float(s.carried_in),
            "num_groups_dropped_stale": float(s.dropped_stale),
            "num_groups_surplus": float(surplus),
            "num_groups_selected": float(selected),
            "num_responses_generated": float(sum(s.responses_per_batch)),
            "keep_rate_ema": float(self.keep_rate_ema) if self.keep_rate_ema is not None else 1.0,
        }

    def finish_step(self) -> dict[str, float]:
        """End the step: return its stats, discard (reference) or carry (carry mode) the surplus, start a new step.

        Also callable after a :class:`DynamicSamplingError` (the partial step is dropped).
        """
        stats = self.step_stats()
        s = self._step
        surplus: list[_Group] = []
        if self.enable and not s.failed and len(s.kept) > self.train_batch_size:
            surplus = s.kept[self.train_batch_size :]
        if self.mode == "carry" and self.enable:
            for g in surplus:
                g.age += 1
            self._carry = surplus
        stats["num_groups_carried_out"] = float(len(self._carry))
        self.steps += 1
        self.totals["gen_batches"] += self.num_gen_batches
        self.totals["groups_total"] += int(stats["num_groups_total"])
        self.totals["groups_kept"] += int(stats["num_groups_kept"])
        self.totals["groups_surplus"] += int(stats["num_groups_surplus"])
        self._begin_step()
        stats["suggested_gen_batch_size"] = float(self.suggested_gen_batch_size())
        return stats

    def suggested_gen_batch_size(self) -> int:
        """Prompts for the next generation batch.

        Reference mode / disabled: ``gen_batch_size``. Carry mode:
        ``ceil(needed / max(keep_rate_ema, 1/max_factor) * (1 + margin))`` bounded to ``[1, max_gen_batch_size]``,
        where ``needed`` = groups still missing in this step (``gen_batch_size * needed / train_batch_size`` before any
        keep rate was observed); 0 when the step is full.
        """
        if self.mode != "carry" or not self.enable:
            return self.gen_batch_size
        needed = self.train_batch_size - len(self._step.kept)
        if needed <= 0:
            return 0
        if self.keep_rate_ema is None:
            return max(1, math.ceil(self.gen_batch_size * needed / self.train_batch_size))
        floor_rate = needed / self.max_gen_batch_size
        rate = max(self.keep_rate_ema, floor_rate, 1e-9)
        size = math.ceil(needed / rate * (1.0 + self.oversample_margin))
        return int(min(max(size, 1), self.max_gen_batch_size))

    # ---------------------------------------------------------------------------------------------------------------
    def state_dict(
        self, compact: Optional[Callable[[Any, np.ndarray], tuple[Any, np.ndarray]]] = None
    ) -> dict[str, Any]:
        """Resumable state, taken between steps (before the next step's first :meth:`add`).

        The carry buffer (carry mode: the groups carried into the next step, with their ages and the step's count of
        stale groups dropped) is part of it, so a resumed run trains on the same carried groups as an uninterrupted
        one. Carried groups hold their generation batch (the opaque ``batch=`` object); ``compact(batch, indices)``,
        when given, is called once per generation batch with the indices of all its carried responses and returns
        ``(smaller_batch, new_indices)`` -- the loop passes one that keeps only the carried responses, so a
        checkpoint stores those, not whole generation batches. The state is JSON-serialisable when the carried
        batch objects are (the loop's are not: it saves the state with ``torch.save``).
        """
        s = self._step
        if s.total_per_batch:
            raise RuntimeError("state_dict() in mid-step: checkpoints are taken between steps (after finish_step())")
        carry: list[dict[str, Any]] = []
        by_batch: dict[int, list[_Group]] = {}
        for g in s.kept:
            by_batch.setdefault(g.batch_index, []).append(g)
        remapped: dict[int, tuple[Any, list[np.ndarray]]] = {}
        for bi, groups in by_batch.items():
            if compact is None:
                remapped[bi] = (groups[0].batch, [g.indices for g in groups])
                continue
            sizes = [len(g.indices) for g in groups]
            small, new_idx = compact(groups[0].batch, np.concatenate([g.indices for g in groups]))
            new_idx = np.asarray(new_idx, dtype=np.int64)
            if new_idx.shape[0] != sum(sizes):
                raise ValueError(f"compact() returned {new_idx.shape[0]} indices for {sum(sizes)} carried responses")
            remapped[bi] = (small, np.split(new_idx, np.cumsum(sizes)[:-1]))
        taken: dict[int, int] = {}
        for g in s.kept:
            batch, parts = remapped[g.batch_index]
            k = taken.get(g.batch_index, 0)
            taken[g.batch_index] = k + 1
            carry.append({"batch_index": g.batch_index, "indices": [int(i) for i in parts[k]], "age": g.age,
                          "batch": batch})  # fmt: skip
        return {
            "version": 1,
            "mode": self.mode,
            "keep_rate_ema": self.keep_rate_ema,
            "steps": self.steps,
            "batches_added": self.batches_added,
            "totals": dict(self.totals),
            "carry": carry,
            "dropped_stale": s.dropped_stale,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output: a fresh step that starts with the saved carried groups (a state saved
        before the carry buffer was checkpointed has none)."""
        if not isinstance(state, dict) or state.get("version") != 1:
            raise ValueError(f"not a DynamicSampler state (version 1): {state!r:.200}")
        missing = {"keep_rate_ema", "steps", "batches_added", "totals"} - set(state)
        if missing:
            raise ValueError(f"DynamicSampler state lacks {sorted(missing)}")
        carry = state.get("carry", [])
        if carry and (state.get("mode") != "carry" or self.mode != "carry"):
            raise ValueError(
                f"the saved sampler state carries {len(carry)} groups (mode {state.get('mode')!r}) but this sampler's "
                f"mode is {self.mode!r}; resume with the same recipe.filter_groups.mode"
            )
        groups = []
        for i, c in enumerate(carry):
            lacking = {"batch_index", "indices", "age", "batch"} - set(c)
            if lacking:
                raise ValueError(f"DynamicSampler state: carried group {i} lacks {sorted(lacking)}")
            groups.append(_Group(int(c["batch_index"]), c["batch"], np.asarray(c["indices"], dtype=np.int64),
                                 int(c["age"])))  # fmt: skip
        ema = state["keep_rate_ema"]
        self.keep_rate_ema = None if ema is None else float(ema)
        self.steps = int(state["steps"])
        self.batches_added = int(state["batches_added"])
        self.totals = {k: int(state["totals"].get(k, 0)) for k in self.totals}
        self._carry = []
        self._begin_step()
        self._step.kept = groups
        self._step.carried_in = len(groups)
        self._step.dropped_stale = int(state.get("dropped_stale", 0))

"""Planning a run before it starts: step semantics, generation and update time, GPU memory
(:mod:`dapo.plan.estimate`), the loop's host memory and the storage a run needs (:mod:`dapo.plan.memory`).
``dapo plan`` / ``python -m dapo.plan`` prints the plan and exits 1 when something does not fit."""

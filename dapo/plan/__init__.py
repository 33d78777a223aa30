"""Planning a run before it starts. From the bottom up: model architectures and accelerators
(:mod:`dapo.plan.models`), the stated assumptions (:mod:`dapo.plan.assumptions`), step semantics
(:mod:`dapo.plan.steps`), the run on its placement and its shape checks (:mod:`dapo.plan.shape`), the estimate of
GPU memory, generation and update time (:mod:`dapo.plan.estimate`), what faults cost (:mod:`dapo.plan.faults`), the
published runs it is calibrated on (:mod:`dapo.plan.calibration`), its text and docs tables (:mod:`dapo.plan.report`), the loop's host memory and the
storage a run needs (:mod:`dapo.plan.memory`); on top, the command (:mod:`dapo.plan.cli`): ``dapo plan`` /
``python -m dapo.plan`` prints the plan and exits 1 when something does not fit."""

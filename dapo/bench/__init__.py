"""Benchmarks of the recipe on the tiny task, one module per ``dapo bench`` command: the DAPO ablation ladder
(:mod:`dapo.bench.ablation`), DAPO's four mechanisms one at a time on a task where each acts
(:mod:`~dapo.bench.mechanisms`, with its warm-start precondition probe :mod:`~dapo.bench.precondition`, its
steps-to-target measure :mod:`~dapo.bench.target` and its report :mod:`~dapo.bench.mech_report`), the dynamic sampler's cost (:mod:`~dapo.bench.sampler`), step timing
(:mod:`~dapo.bench.timing`), TRL's GRPOTrainer side by side (:mod:`~dapo.bench.peers`; its TRL half,
:mod:`~dapo.bench.peers_trl`, runs inside TRL's own venv), the loop on verl's workers vs verl's own ``fit()``
(:mod:`~dapo.bench.verl_fit`, which also records the order of fit()'s verl calls with :mod:`~dapo.bench.verl_calls`,
the recorder the CPU e2e shares); :mod:`~dapo.bench.runs` trains one configuration for all
of them, and :mod:`dapo.bench.cli` dispatches. Imports everything below it (the local backend, the loop, the
planner)."""

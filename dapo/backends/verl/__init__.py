"""The verl backend: the DAPO loop driving verl 0.9.1's worker groups on Ray.

Preset -> verl config:

- :mod:`dapo.backends.verl.settings`: the preset -> verl key table and its Hydra overrides (``LOSS_MODULE``).
- :mod:`dapo.backends.verl.passthrough`: which verl keys outside the preset a user may pass, and why others are refused.
- :mod:`dapo.backends.verl.placement`: placement and budget checks of a composed config (model head counts, context).
- :mod:`dapo.backends.verl.config`: composes verl's own ``ppo_trainer`` config, checks it, runs verl's validation.

The backend:

- :mod:`dapo.backends.verl.loss`: the DAPO policy loss registered in verl's loss registry (``loss_mode=dapo``).
- :mod:`dapo.backends.verl.batch`: ``DataProto`` helpers (reward placement, verl's balanced batch order).
- :mod:`dapo.backends.verl.workers`: the GPU side -- the ``VerlWorkers`` seam and ``RayWorkers``, verl's worker groups.
- :mod:`dapo.backends.verl.backend`: ``VerlBackend``, verl's trainer methods and data path under our loop.
- :mod:`dapo.backends.verl.fit_metrics`: the metrics verl's ``fit()`` logs, by verl's own functions on our batch.
- :mod:`dapo.backends.verl.worker_hooks`: what every Ray worker does for the run's reliability (the process-group
  timeout from verl's key, stacks on request, the compute probe, the flight recorder); :mod:`dapo.backends.verl.ranks`
  the driver's side of it (per-rank metrics, slow ranks, silent ranks on a stall).
- :mod:`dapo.backends.verl.run`: the ``dapo train`` entrypoint for ``placement.backend: verl``.
- :mod:`dapo.backends.verl.fabric`: ``--fabric-check`` on the run's Ray cluster (one actor per GPU, before verl's
  workers start).
"""

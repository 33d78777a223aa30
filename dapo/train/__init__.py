"""The DAPO training loop and what it owns:

- the loop over either backend (:mod:`dapo.train.loop`), the run around its step (:mod:`~dapo.train.fit`), its
  validation passes (:mod:`~dapo.train.validation`), resumable state (:mod:`~dapo.train.resume`) and prompt stream
  (:mod:`~dapo.train.stream`);
- checkpoints and their retention (:mod:`~dapo.train.checkpoint`), health guards (:mod:`~dapo.train.health`), metrics
  -- their names and meanings (:mod:`~dapo.train.metric_names`), a step's values (:mod:`~dapo.train.step_metrics`),
  the sinks (:mod:`~dapo.train.metrics`) and the saved wandb dashboard (:mod:`~dapo.train.dashboard`, ``dapo wandb
  dashboard``: :mod:`~dapo.train.dashboard_cli`) --, generation dumps (:mod:`~dapo.train.generations`) and
  per-attempt driver logs (:mod:`~dapo.train.runlog`; their follower lives with the other programs of the pods
  around the run, in :mod:`dapo.cluster`);
- the reports drawn from them (:mod:`~dapo.train.report`), with verl's console metrics for the reference runner
  (:mod:`~dapo.train.verl_log`);
- ``python -m dapo.train`` (= ``dapo train``), the entrypoint of every training run, the chart's RayJob included
  (:mod:`dapo.train.cli`);
- the fabric check before training (:mod:`~dapo.train.fabric`: the all-reduce bus bandwidth, the network NCCL chose
  read from its log, the verdict against the declared fabric; ``dapo train --fabric-check``), and the failed verdict
  the run's retries read first instead of checking again (:mod:`~dapo.train.fabric_verdict`);
- what an attempt leaves for the next one and for the log follower -- its progress, its end record, the run's final
  verdict, and ``dapo train``'s exit codes (:mod:`~dapo.train.attempts`) --, the watchdog of its phases
  (:mod:`~dapo.train.watchdog`) and the ways it ends on purpose: stalled, non-finite, a full volume, a final verdict
  (:mod:`~dapo.train.ending`).

It may import the core, ``dapo.util``, ``dapo.config``, ``dapo.data`` and ``dapo.eval`` (a report draws evaluation
results beside the training curves); the loop sees a backend only through :mod:`dapo.backends.base`, and only the
command line (:mod:`dapo.train.cli`) picks one. Importing the package imports nothing.
"""

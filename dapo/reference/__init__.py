"""The reference run: the upstream DAPO recipe of verl (commit 4f80e46) on the reproduction image, driven by the
same preset and chart. :mod:`dapo.reference.translate` turns a preset into the recipe's arguments;
:mod:`~dapo.reference.command` adds the overrides and the entrypoint (``python -m dapo.reference``);
:mod:`~dapo.reference.attempt_log` keeps the driver's output per attempt on the shared volume (``dapo report`` reads
verl's console metrics back from there with :mod:`dapo.train.verl_log`). Imports ``dapo.config`` and the run logs of
``dapo.train``."""

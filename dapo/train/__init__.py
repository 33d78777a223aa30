"""The DAPO training loop and what it owns: one loop over two backends (:mod:`dapo.train.loop`; its validation
passes, resumable state and prompt stream in :mod:`~dapo.train.validation`, :mod:`~dapo.train.resume`,
:mod:`~dapo.train.stream`), checkpoints and their retention (:mod:`~dapo.train.checkpoint`), health guards, metrics,
generation dumps, attempt logs, and the reports drawn from them (:mod:`~dapo.train.report`; verl's console metrics
for the reference runner: :mod:`~dapo.train.verl_log`). ``python -m dapo.train`` (= ``dapo train``) is the
entrypoint of every training run, the chart's RayJob included (:mod:`dapo.train.cli`); ``python -m
dapo.train.gpu_check`` is the GPU pods' driver check.

Imports the core, ``dapo.util``, ``dapo.config``, ``dapo.data`` and ``dapo.eval`` (a report draws evaluation
results beside the training curves); the loop sees a backend only through :mod:`dapo.backends.base`, and only the
command line (:mod:`dapo.train.cli`) picks one. Importing the package imports nothing.
"""

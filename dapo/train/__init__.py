"""The DAPO training loop and what it owns: one loop over two backends (:mod:`dapo.train.loop`), checkpoints and
their retention (:mod:`~dapo.train.checkpoint`), health guards, metrics, generation dumps, attempt logs and the
reports drawn from them. ``python -m dapo.train`` (= ``dapo train``) is the entrypoint of every training run, the
chart's RayJob included (:mod:`dapo.train.cli`); ``python -m dapo.train.gpu_check`` is the GPU pods' driver check.

Imports the core, ``dapo.config`` and ``dapo.util``; the backends are chosen by name in the CLI, and the loop sees
them only through :mod:`dapo.backends.base`. Kept light: importing the package imports nothing.
"""

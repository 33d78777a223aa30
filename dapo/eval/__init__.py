"""Evaluation of checkpoints: export a verl FSDP checkpoint to HF weights (:mod:`dapo.eval.export`, with the shard
merge in :mod:`~dapo.eval.fsdp_merge`), serve it with Ray Serve LLM + vLLM (:mod:`~dapo.eval.serve`), sample and
score it with DAPO's verifier (:mod:`~dapo.eval.client`, :mod:`~dapo.eval.metrics`), and gather the results over
steps (:mod:`~dapo.eval.results`). ``dapo eval`` / ``python -m dapo.eval`` is :mod:`dapo.eval.cli`. Imports the
core, ``dapo.util``, ``dapo.config`` and ``dapo.data``."""

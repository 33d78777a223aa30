"""Evaluation of checkpoints, from the bottom up:

- export a verl FSDP checkpoint to HF weights: the shard merge (:mod:`dapo.eval.fsdp_merge`), step resolution and
  the atomic export (:mod:`~dapo.eval.export`);
- serve it with Ray Serve LLM + vLLM (:mod:`~dapo.eval.serve`; its flags: :mod:`~dapo.eval.serve_cli`);
- sample it through the OpenAI-compatible endpoint and score it with DAPO's verifier: the resumable response log
  (:mod:`~dapo.eval.records`), the requests with retries (:mod:`~dapo.eval.endpoint`), avg@k / pass@k / cons@k
  (:mod:`~dapo.eval.metrics`), scores and summaries (:mod:`~dapo.eval.scoring`), one benchmark end to end
  (:mod:`~dapo.eval.client`);
- the checkpoints x benchmarks of ``dapo eval run`` (:mod:`~dapo.eval.tasks`) and the results over steps
  (:mod:`~dapo.eval.results`).

``dapo eval`` / ``python -m dapo.eval`` is :mod:`dapo.eval.cli` (``dapo eval run``: :mod:`~dapo.eval.run_cli`).
It may import the core, ``dapo.util``, ``dapo.config`` and ``dapo.data``: training reports read its results,
so it sits below ``dapo.train``.
"""

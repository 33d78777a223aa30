"""DAPO-compatible evaluation scripts: ``eval/eval_aime24.py`` (client) and ``eval/serve.py`` (Ray Serve LLM app).

The logic lives in the ``dapo`` package (``dapo.eval.client``, ``dapo.eval.serve`` / ``dapo.eval.serve_cli``,
``dapo.eval.metrics``); these files keep the DAPO repository's entry points: ``python eval/eval_aime24.py
--temperature 1.0 --top_p 0.7 ...`` and ``serve run eval.serve:build_app model=... tensor-parallel-size=8``.
"""

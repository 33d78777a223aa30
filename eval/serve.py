"""Ray Serve LLM app for evaluation (see :mod:`dapo.eval.serve`; the flags: :mod:`dapo.eval.serve_cli`).

    python eval/serve.py --model /ckpt/hf --model-id dapo-step400 --tensor-parallel-size 8
    serve run eval.serve:build_app model=/ckpt/hf model-id=dapo-step400 tensor-parallel-size=8
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from dapo.eval.serve import ServeConfig, build_app, build_application, llm_config_dict, start, stop
    from dapo.eval.serve_cli import main
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dapo.eval.serve import ServeConfig, build_app, build_application, llm_config_dict, start, stop
    from dapo.eval.serve_cli import main

__all__ = ["ServeConfig", "build_app", "build_application", "llm_config_dict", "main", "start", "stop"]

if __name__ == "__main__":  # vLLM spawns workers: the guard is required
    sys.exit(main())

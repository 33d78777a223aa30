"""AIME-2024 avg@32 client, flag-compatible with the DAPO repository's ``eval/eval_aime24.py``
(see :mod:`dapo.eval.client`):

    python eval/eval_aime24.py --temperature 1.0 --top_p 0.7 --max_tokens 20480 \\
        --model dapo-step400 --test_file aime-2024.parquet --base-url http://127.0.0.1:8000/v1 --output out/
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    from dapo.eval.client import add_client_args, client_main
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dapo.eval.client import add_client_args, client_main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="AIME-2024 avg@32 against an OpenAI-compatible endpoint (resumable).")
    add_client_args(p)
    return client_main(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

"""The tiny preset's local assets, no downloads: a Qwen2-architecture model built from scratch
(:mod:`dapo.tiny.model`), a tokenizer trained locally (:mod:`~dapo.tiny.tokenizer`), a synthetic math task in the
DAPO-Math-17k parquet schema (:mod:`~dapo.tiny.task`), and a supervised warm start (:mod:`~dapo.tiny.warmstart`).

:func:`dapo.tiny.assets.prepare` builds (or reuses from its cache directory) everything the local backend needs.
It may import ``dapo.util`` and ``dapo.config``, never a backend: the backends build on these assets.
"""

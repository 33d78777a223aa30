"""The tiny preset's local assets: a Qwen2-architecture model built from scratch, a tokenizer trained locally, a
synthetic math task in the DAPO-Math-17k parquet schema, and a supervised warm start -- no downloads.

:func:`dapo.tiny.assets.prepare` builds (or reuses from its cache directory) everything the local backend needs.
"""

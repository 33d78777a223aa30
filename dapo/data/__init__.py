"""Datasets: the DAPO parquet schema and its checks, preparation of DAPO-Math-17k and AIME-2024 (and the extra
benchmarks AIME-2025, MATH-500) into one directory with a manifest. ``dapo data`` is its command line. Imports the
core, ``dapo.config`` and ``dapo.util``; never the planner or the trainer."""

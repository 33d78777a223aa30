"""Datasets: the DAPO parquet schema and its checks, preparation of DAPO-Math-17k and AIME-2024 (and the extra
benchmarks AIME-2025, MATH-500) into one directory with a manifest. ``dapo data`` is its command line.

Modules, lowest first (each imports only those before it): ``parquet`` (row counts, ``DataError``), ``schema`` (the
row schema, validation, layout checks), ``files`` (read, check, de-duplicate, write), ``benchmarks`` (the evaluation
benchmarks as data), ``prepare`` (sources, manifest, ``prepare``), ``cli`` (``dapo data``). Imports ``dapo.util``;
only ``cli`` reaches ``dapo.config`` and the planner (lazily, for the epochs table); never the trainer."""

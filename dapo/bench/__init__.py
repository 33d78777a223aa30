"""Benchmarks of the recipe on the tiny task: the DAPO ablation ladder, the dynamic sampler's cost, step timing,
and TRL's GRPOTrainer side by side (:mod:`dapo.bench.peers_trl` runs inside TRL's own venv). ``dapo bench``."""

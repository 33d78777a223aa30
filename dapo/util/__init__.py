"""Helpers with no DAPO knowledge, shared by the packages above them: crash-safe file writes
(:mod:`dapo.util.fsutil`), the left-padded causal-LM forward pass that both the tiny warm start and the local backend
run (:mod:`dapo.util.lm_forward`), and values printed the way Go/Helm prints them (:mod:`dapo.util.gofmt`).
Imports nothing of the project."""

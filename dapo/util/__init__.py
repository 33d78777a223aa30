"""Helpers with no DAPO knowledge, shared by the packages above them: crash-safe file writes
(:mod:`dapo.util.fsutil`) and the left-padded causal-LM forward pass (:mod:`dapo.util.lm_forward`) that both the tiny
warm start and the local backend run. Imports nothing of the project."""

"""Helpers with no DAPO knowledge, shared by the packages above them: crash-safe file writes
(:mod:`dapo.util.fsutil`), the left-padded causal-LM forward pass that both the tiny warm start and the local backend
run (:mod:`dapo.util.lm_forward`), values printed the way Go/Helm prints them (:mod:`dapo.util.gofmt`), and the
accelerator peaks and model FLOPs of an MFU (:mod:`dapo.util.flops`). Imports nothing of the project."""

"""The local backend: the DAPO loop on HF transformers in one process (CPU or one GPU).

- :mod:`dapo.backends.local.backend`: ``LocalBackend`` -- model, tokenizer, optimizer, prompts, checkpoints.
- :mod:`dapo.backends.local.generate`: its generation, with a preallocated KV cache.
- :mod:`dapo.backends.local.update`: its log-probs and policy update.
- :mod:`dapo.backends.local.run`: ``build`` / ``run``, which wire it to a preset (``dapo train``).
"""

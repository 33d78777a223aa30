"""The local backend: the DAPO loop on HF transformers in one process (CPU or one GPU) -- generation with a
preallocated KV cache, log-probs, the policy update; and ``build``/``run`` that wire it to a preset."""

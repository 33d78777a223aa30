"""The loop's two backends behind one interface (:mod:`dapo.backends.base`): :mod:`dapo.backends.local` (HF
transformers in one process, CPU or one GPU) and :mod:`dapo.backends.verl` (verl 0.9.1 worker groups on Ray).
A backend imports the core, ``dapo.config``, ``dapo.util`` and the loop's interface; nothing imports a backend but
the CLIs that pick one."""

"""The verl backend: the DAPO loop driving verl 0.9.1's worker groups on Ray.

- :mod:`dapo.backends.verl.config`: a preset -> verl's own ``ppo_trainer`` config (Hydra overrides, checked by verl).
- :mod:`dapo.backends.verl.loss`: the DAPO policy loss registered in verl's loss registry (``loss_mode=dapo``).
- :mod:`dapo.backends.verl.backend`: the backend itself, verl's trainer methods and data path under our loop.
"""

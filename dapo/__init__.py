"""DAPO (Decoupled Clip and Dynamic sAmpling Policy Optimization, arXiv 2503.14476) on Kubernetes.

Layers (each depends only on the ones above it):
  dapo.loss / advantage / reward / sampler     the algorithm core: torch/numpy only, proven equal to verl
  dapo.config + dapo/presets/*.yaml           typed strict presets (recipe + placement), one source of truth
  dapo.loop                                   the one DAPO training loop, driving a backend interface
  dapo.backends.local / dapo.backends.verl    HF in one process (CPU / one GPU) | verl worker groups on Ray
  dapo.k8s                                    pure manifest builders (scripts/render.py; parity with charts/dapo)
"""

__version__ = "0.1.0"

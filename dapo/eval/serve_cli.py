"""``dapo eval serve`` (and ``python eval/serve.py``): the serving flags, a :class:`~dapo.eval.serve.ServeConfig`
from them (``dapo eval run`` builds its serving from the same flags), and the blocking serve that deploys the app,
prints the endpoint and removes it on SIGTERM / Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from dataclasses import asdict
from typing import Optional, Union

from dapo.eval.serve import ServeConfig, ServeError, init_ray, start, stop


def _int_or_auto(value: str) -> Union[int, str]:
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        import argparse

        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {value!r}") from None


def add_serve_args(p, *, model_required: bool = True) -> None:
    if model_required:
        p.add_argument("--model", required=True, help="HF-format model directory (or hub id)")
        p.add_argument("--model-id", required=True, help="the model name clients send (listed by /v1/models)")
    p.add_argument("--device", choices=["auto", "gpu", "cpu"], default="auto")
    p.add_argument("--tensor-parallel-size", "--tensor_parallel_size", dest="tensor_parallel_size", type=_int_or_auto,
                   default=1, help="vLLM TP per replica, or 'auto' (smallest power of two that fits the weights)")
    p.add_argument("--max-model-len", "--max_model_len", dest="max_model_len", type=int, default=None,
                   help="engine context length (prompt + answer); DAPO: 2048 + 20480 = 22528")
    p.add_argument("--gpu-memory-utilization", dest="gpu_memory_utilization", type=float, default=0.9)
    p.add_argument("--replicas", default="auto", help="engine replicas, or 'auto' (cluster GPUs // TP)")
    p.add_argument("--accelerator-type", default=None, help="Ray accelerator type, e.g. H100")
    p.add_argument("--engine-kwargs", default="{}", help="extra vLLM engine arguments as JSON")
    p.add_argument("--cpu-kvcache-gib", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1",
                   help="Serve HTTP host: a loopback address (Serve authenticates no one; kubectl port-forward)")
    p.add_argument("--port", type=int, default=8000, help="Serve HTTP port")
    p.add_argument("--proxy-location", choices=["HeadOnly", "EveryNode"], default="HeadOnly",
                   help="where Serve runs its HTTP proxies")
    p.add_argument("--address", default=None, help="Ray cluster address (default: $RAY_ADDRESS or a local cluster)")
    p.add_argument("--num-cpus", type=int, default=None, help="local cluster only: CPUs to give Ray")
    p.add_argument("--ray-temp-dir", default=None, help="local cluster only: Ray temp dir")


def config_from_args(args, model: Optional[str] = None, model_id: Optional[str] = None) -> ServeConfig:
    try:
        extra = json.loads(args.engine_kwargs)
    except ValueError as exc:
        raise ServeError(f"--engine-kwargs is not JSON: {exc}") from None
    if not isinstance(extra, dict):
        raise ServeError("--engine-kwargs must be a JSON object")
    replicas: Union[int, str] = args.replicas
    if replicas != "auto":
        try:
            replicas = int(replicas)
        except ValueError:
            raise ServeError(f"--replicas must be an integer or 'auto', got {args.replicas!r}") from None
    return ServeConfig(
        model=model or args.model,
        model_id=model_id or args.model_id,
        device=args.device,
        tensor_parallel_size=args.tensor_parallel_size,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        replicas=replicas,  # type: ignore[arg-type]
        accelerator_type=args.accelerator_type,
        cpu_kvcache_gib=args.cpu_kvcache_gib,
        engine_kwargs=extra,
        host=args.host,
        port=args.port,
        proxy_location=args.proxy_location,
    )


def serve_main(args) -> int:
    """``dapo eval serve``: deploy, print the endpoint, block until SIGTERM/SIGINT, then clean up."""
    try:
        cfg = config_from_args(args)
        cfg.validate()
    except ServeError as exc:
        print(f"serve: error: {exc}", file=sys.stderr)
        return 2
    stop_event = threading.Event()

    def _on_signal(signum, frame):  # noqa: ARG001
        stop_event.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    init_ray(args.address, args.num_cpus, args.ray_temp_dir)
    try:
        url = start(cfg)
        print(f"[serve] {cfg.model_id!r} from {cfg.model} at {url} ({json.dumps(asdict(cfg))})", flush=True)
        print(f"[serve] READY {url}", flush=True)
        while not stop_event.is_set():
            stop_event.wait(1.0)
    except ServeError as exc:
        print(f"serve: error: {exc}", file=sys.stderr)
        return 2
    finally:
        print("[serve] shutting down", flush=True)
        stop(shutdown_ray=not (args.address or os.environ.get("RAY_ADDRESS")))
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="serve", description="Serve an HF checkpoint with Ray Serve LLM + vLLM.")
    add_serve_args(p)
    return serve_main(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

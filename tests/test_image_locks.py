"""The lock files of the images (docker/locks/, written by `make lock`) against their inputs.

Offline: each lock was written from the current inputs (the SHA-256 in its header), every pin of a constraints file
is in its lock at that version, each file is a valid hash-checking requirements file, the build and source subsets
are parts of the same resolution, and the resolver settings of scripts/lock_images.py agree with the Dockerfiles
(Python, glibc of the base image, lock name). The lock's agreement with the chart's rayVersion, pyproject's extras
and the image tags is checked in tests/test_docker.py.

Registry (`network`): resolving each image's inputs again, its committed pins preferred, reproduces its committed
lock -- on drift the test prints the packages that moved and the diff, on an unsatisfiable set uv's explanation,
which names the conflict -- and the facts behind "one image or two" (docs/images.md) hold for the resolver.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from packaging.utils import canonicalize_name

from docker_stack import (
    LOCK_DIR,
    REFERENCE_VERL_COMMIT,
    ROOT,
    STACKS,
    StackError,
    lock_paths,
    read_args_file,
    read_constraints,
    read_lock,
    resolved,
    stack_dockerfile,
    REPRO_ARGS,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _script():
    spec = importlib.util.spec_from_file_location("lock_images", ROOT / "scripts" / "lock_images.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["lock_images"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


lock_images = _script()
IMAGES = lock_images.IMAGES
# lock name -> stack name of tests/docker_stack.py (the Dockerfile with its build arguments)
STACK_OF = {lock: stack for stack, (_, _, _, lock) in STACKS.items()}
# glibc of the base images' Ubuntu releases (the manylinux tag their wheels must fit)
UBUNTU_GLIBC = {"ubuntu24.04": "2.39", "ubuntu22.04": "2.35"}


def test_the_script_locks_exactly_the_stacks_the_dockerfiles_build():
    assert set(IMAGES) == set(STACK_OF), (sorted(IMAGES), sorted(STACK_OF))


# --------------------------------------------------------------------------------------------------------------
# offline: the committed locks and their inputs


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_each_lock_was_written_from_the_current_inputs(name):
    image = IMAGES[name]
    want = lock_images.inputs_digest(image)
    files = lock_images.lock_files(image)
    for kind, path in files.items():
        assert (ROOT / path).exists(), f"{path} missing: run `make lock`"
        text = (ROOT / path).read_text()
        assert lock_images.header_digest(text) == want, (
            f"{path} is stale: its inputs ({image.requirements}, {image.constraints}, {lock_images.SETTINGS}, "
            "pyproject.toml dependencies/extras, the uv pin) changed since it was written -- run `make lock`")
        assert f"# command: uv {' '.join(lock_images.compile_args(image))}" in text
    # nothing else of this image lies in docker/locks/ (a file the Dockerfile could still COPY)
    present = {str(p.relative_to(ROOT)) for p in LOCK_DIR.glob(f"{name}*.txt")
               if re.fullmatch(rf"{name}(-\w+)?\.txt", p.name)}
    assert present == set(files.values()), f"stray lock files: {sorted(present - set(files.values()))}"


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_every_constraint_pin_is_in_its_lock_at_that_version(name):
    image = IMAGES[name]
    pins = read_constraints(ROOT / image.constraints)
    locked = resolved(STACK_OF[name])
    missing = [f"{p.name}=={p.version}" for p in pins.values() if p.name not in locked]
    assert not missing, f"{image.constraints} pins packages the image does not install (drop them): {missing}"
    moved = [f"{p.name}: {p.version} pinned, {locked[p.name].version} locked" for p in pins.values()
             if locked[p.name].version != p.version]
    assert not moved, f"{image.constraints} and its lock disagree (run `make lock`): {moved}"


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_lock_files_are_one_resolution_split_by_stage(name):
    image, paths = IMAGES[name], lock_paths(STACK_OF[name])
    runtime, build = read_lock(paths["runtime"]), read_lock(paths["build"])
    source = read_lock(paths["source"]) if "source" in paths else {}
    assert set(source) == {canonicalize_name(s) for s in image.source_builds}, (
        f"{name}: the sdists compiled in the builder are {sorted(source)}, the script says {image.source_builds}")
    assert not set(source) & set(runtime), "a source build is also installed from the registry"
    # the builder installs a part of the runtime's resolution (same versions, same hashes): what it compiles
    # against is what the image runs
    assert {k: runtime.get(k) for k in build} == build, f"{name}-build.txt is not a subset of {name}.txt"
    assert {canonicalize_name(r) for r in image.build_roots} <= set(build), image.build_roots
    # a source build has exactly one file to download: its sdist (one hash)
    assert all(len(e.hashes) == 1 for e in source.values()), {k: len(e.hashes) for k, e in source.items()}


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_lock_settings_agree_with_the_dockerfile(name):
    image = IMAGES[name]
    df = stack_dockerfile(STACK_OF[name])
    for stage in df.stages:
        args = df.arg_values[stage]
        python = args.get("PYTHON_VERSION")
        assert python == image.python, f"{df.path.name} {stage}: Python {python}, the lock is for {image.python}"
        distro = re.search(r"ubuntu\d+\.\d+", df.base_images[stage]).group(0)
        assert UBUNTU_GLIBC[distro] == image.glibc, (
            f"{name}: locked for glibc {image.glibc}, {df.base_images[stage]} has {UBUNTU_GLIBC[distro]}")
        if "LOCK" in args:
            assert args["LOCK"] == name, f"{df.path.name} {stage}: LOCK={args['LOCK']}, expected {name}"
    assert ROOT / image.dockerfile == df.path


def test_repro_lock_holds_verl_commit_requirements_not_verl():
    text = (ROOT / IMAGES["repro"].requirements).read_text()
    assert REFERENCE_VERL_COMMIT in text, "the requirements file must name the verl commit whose setup.py it copies"
    assert read_args_file(REPRO_ARGS)["VERL_COMMIT"] == REFERENCE_VERL_COMMIT
    locked = resolved("train-repro")
    assert "verl" not in locked
    # verl 4f80e46's setup.py install_requires (verbatim in the requirements file) are all in the lock
    for name in ("accelerate", "codetiming", "datasets", "dill", "hydra-core", "numpy", "pandas", "peft", "pyarrow",
                 "pybind11", "pylatexenc", "ray", "tensordict", "torchdata", "transformers", "wandb"):
        assert name in locked, name


def test_uv_is_pinned_once_and_the_image_workflow_uses_that_pin():
    pin = lock_images.uv_pin()
    workflow = (ROOT / ".github" / "workflows" / "image.yml").read_text()
    assert f"uv=={pin}" in workflow, f"the image workflow must install uv=={pin} (pyproject's `dev` extra)"
    assert re.findall(r"uv==([\w.]+)", workflow) == [pin] * len(re.findall(r"uv==([\w.]+)", workflow))


def test_lock_reader_takes_hashed_pins_only(tmp_path, monkeypatch):
    import docker_stack

    monkeypatch.setattr(docker_stack, "ROOT", tmp_path)
    good = "a==1 \\\n    --hash=sha256:" + "0" * 64 + "\n    # via b\nB-c==2.0 --hash=sha256:" + "1" * 64 + "\n"
    path = tmp_path / "l.txt"
    path.write_text(good)
    assert {k: v.version for k, v in read_lock(path).items()} == {"a": "1", "b-c": "2.0"}
    for text, fragment in [("a==1\n", "no --hash"), ("a>=1 --hash=sha256:00\n", "exact pin"),
                           ("--index-url https://x\n", "only `name==version"),
                           ("a==1 --hash=sha256:0\nA==2 --hash=sha256:1\n", "locked twice"),
                           ("a==1 --hash=sha256:0 --no-binary\n", "only `name==version")]:
        path.write_text(text)
        with pytest.raises(StackError, match=re.escape(fragment)):
            read_lock(path)


UV_OUTPUT = """\
a==1.0 \\
    --hash=sha256:aa
    # via
    #   -r docker/requirements.in
    #   c
b==2.0 \\
    --hash=sha256:bb
    # via a
c==3.0 \\
    --hash=sha256:cc
    # via dapo-k8s (pyproject.toml)
Torch_X==4.0 \\
    --hash=sha256:dd
    # via
    #   -c docker/constraints.txt
    #   c
"""


def test_build_subset_follows_the_resolution_from_its_roots():
    entries = lock_images.parse(UV_OUTPUT)
    assert [(e.name, e.version) for e in entries] == [("a", "1.0"), ("b", "2.0"), ("c", "3.0"), ("torch-x", "4.0")]
    assert lock_images.closure(entries, ("a",)) == {"a", "b"}
    assert lock_images.closure(entries, ("c",)) == {"a", "b", "c", "torch-x"}
    with pytest.raises(lock_images.LockError, match="not in the resolution"):
        lock_images.closure(entries, ("ninja",))
    with pytest.raises(lock_images.LockError, match="unexpected line"):
        lock_images.parse("--index-url https://x\n" + UV_OUTPUT)


# --------------------------------------------------------------------------------------------------------------
# registry: resolve again


def _index_url() -> str:
    import os

    settings = tomllib.loads((ROOT / lock_images.SETTINGS).read_text())
    return os.environ.get(lock_images.INDEX_ENV) or settings["index-url"]


def registry_or_skip(url: str, ci: bool) -> None:
    """Reach the registry; unreachable: skip on a developer's machine, fail under CI (the environment variable CI
    set, as every CI service does), where a skip would leave the run green without ever re-resolving a lock."""
    try:
        urllib.request.urlopen(f"{url.rstrip('/')}/pip/", timeout=15).close()
    except (urllib.error.URLError, OSError) as exc:
        why = (f"package registry {url} unreachable ({exc}); re-resolving the locks needs it "
               f"(set {lock_images.INDEX_ENV} for a mirror)")
        if ci:
            pytest.fail(f"CI is set: {why}", pytrace=False)
        pytest.skip(why)


@pytest.fixture(scope="module")
def registry():
    import os

    registry_or_skip(_index_url(), bool(os.environ.get("CI")))
    return lock_images.uv_binary()


def test_an_unreachable_registry_fails_under_ci_and_skips_elsewhere():
    dead = "http://127.0.0.1:9/simple"  # the discard port: nothing listens
    with pytest.raises(pytest.fail.Exception, match="CI is set: package registry .* unreachable"):
        registry_or_skip(dead, ci=True)
    with pytest.raises(pytest.skip.Exception, match="unreachable"):
        registry_or_skip(dead, ci=False)


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(IMAGES))
def test_committed_lock_is_what_its_inputs_resolve_to(name, registry):
    try:
        problems = lock_images.check([name])
    except lock_images.LockError as exc:
        pytest.fail(f"{name}: the image's inputs are unsatisfiable or could not be resolved:\n{exc}")
    assert not problems, "\n\n".join(problems)


@pytest.mark.network
@pytest.mark.slow
def test_the_check_keeps_a_pin_the_registry_has_since_shown_a_newer_release_of(registry, tmp_path, monkeypatch):
    # a registry mirror that lagged: when the lock was written it did not yet show the newest filelock uploaded before
    # exclude-newer's date (CI met exactly this); the check must keep the committed pin, not call the lock stale
    image = IMAGES["train"]
    entries = lock_images.parse(lock_images.committed_resolution(image))
    current = {e.name: e.version for e in entries}
    request = tmp_path / "older.in"
    request.write_text(f"filelock<{current['filelock']}\n")
    older = subprocess.run(
        [registry, "pip", "compile", str(request), "--no-config", "--config-file", str(ROOT / lock_images.SETTINGS),
         "--python-version", image.python, "--no-header", "--quiet"],
        capture_output=True, text=True, check=True).stdout
    (previous,) = re.findall(r"^filelock==(\S+)$", older, re.M)
    lagged = "".join(f"filelock=={previous}\n" if e.name == "filelock" else e.text for e in entries)
    kept = lock_images.versions(lock_images.resolve(image, registry, prefer=lagged))
    assert kept == {**current, "filelock": previous}
    # the check itself prefers what is committed: committed one release behind, it resolves to that release
    monkeypatch.setattr(lock_images, "committed_resolution", lambda img: lagged)
    problems = lock_images.check(["train"])
    assert problems, "the check resolved fresh: it did not keep the committed filelock pin"
    assert f"filelock: {current['filelock']} committed, {previous} resolved" in problems[0]
    assert not [line for line in problems[0].splitlines() if " committed, " in line and "filelock" not in line]


@pytest.mark.network
@pytest.mark.slow
def test_one_environment_cannot_hold_verl_vllm_and_ray_llm_so_eval_has_its_own_image(registry, tmp_path):
    # docs/images.md, "One image or two": verl 0.9.1's vllm extra and Ray 2.60.0's llm extra pin different vLLM
    # releases; the resolver must find no set that holds both, and say so through vllm
    train, evaluation = resolved("train"), resolved("eval")
    both = tmp_path / "both.in"
    both.write_text(f"verl[vllm]=={train['verl'].version}\nray[llm]=={evaluation['ray'].version}\n")
    image = IMAGES["train"]
    proc = subprocess.run(
        [registry, "pip", "compile", str(both), "--no-config", "--config-file", lock_images.SETTINGS,
         "--python-version", image.python, "--python-platform", image.platform, "--only-binary", ":all:",
         "--python", sys.executable, "--no-header"],
        cwd=ROOT, env=lock_images._env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, f"verl[vllm] and ray[llm] resolved together:\n{proc.stdout[:2000]}"
    # verl's own pin (its wheel metadata, installed here): the training image overrides it (docker/overrides.txt)
    from importlib.metadata import requires, version

    assert version("verl") == train["verl"].version
    (verl_vllm,) = [r.split(";")[0].strip() for r in requires("verl") if r.startswith("vllm==") and '"vllm"' in r]
    assert "No solution found" in proc.stderr and verl_vllm in proc.stderr, proc.stderr
    assert f"vllm=={evaluation['vllm'].version}" in proc.stderr or "vllm[audio]" in proc.stderr, proc.stderr

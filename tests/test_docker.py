"""Offline checks of the container images (docker/): every pip install from the stack's lock (hash-checked, no
resolution) or a wheel built in the builder, apt installs by policy, base images pinned, no `curl | sh`, a non-root
user, OCI labels, and the locked versions agreeing with pyproject.toml, the Helm chart and the Makefile.

Nothing here builds an image (no Docker engine needed); tests/test_image_locks.py checks the locks against their
inputs (offline) and against a fresh resolution on the registry.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from docker_stack import (
    DOCKER,
    EFA_ARGS,
    EVAL,
    REFERENCE_VERL_COMMIT,
    REPRO_ARGS,
    STACKS,
    TRAIN,
    VALUES,
    pyproject,
    stack_dockerfile,
    LOCK_DIR,
    ROOT,
    StackError,
    apt_installs,
    assert_pinned_image,
    dockerignored,
    copied_from,
    fake_digest,
    is_local_artifact,
    parse_dockerfile,
    pip_commands,
    read_args_file,
    read_constraints,
    read_lock,
    recording_docker,
    resolved,
)


def _containers_of(obj):
    """Every container (init containers included) of an object's pods, RayJob pod templates included."""
    if obj["kind"] == "RayJob":
        from k8s_support import pod_templates

        specs = [t["spec"] for _, t in pod_templates(obj)]
    elif obj["kind"] == "Job":
        specs = [obj["spec"]["template"]["spec"]]
    elif obj["kind"] == "Pod":
        specs = [obj["spec"]]
    else:
        specs = []
    return [c for spec in specs for c in spec.get("initContainers", []) + spec.get("containers", [])]

# apt policy: packages of the base image's own Ubuntu release are NOT version-pinned. Ubuntu's archive keeps only
# the current version of a package in -updates/-security, so `pkg=version` pins break the build at the next
# security update; their versions are fixed by the pinned base image tag and recorded in /opt/dapo/dpkg.txt of each
# image. Only these names may be installed that way; anything else needs `pkg=version`.
APT_UNPINNED_BY_POLICY = {"ca-certificates", "git", "wget",
                          # rdma-core userspace for NCCL over InfiniBand / RoCE; gnupg to verify the AWS EFA installer
                          "ibverbs-providers", "ibverbs-utils", "libibverbs1", "librdmacm1", "gnupg"}
APT_PYTHON = re.compile(r"^python3\.\d+(-dev|-venv)?$")


def makefile_var(name: str) -> str:
    for line in (ROOT / "Makefile").read_text().splitlines():
        m = re.match(rf"^{name}\s*\?=\s*(.*)$", line)
        if m:
            return m.group(1).strip()
    raise AssertionError(f"Makefile: no `{name} ?= ...` line (the image targets define it)")


def default_image_tag() -> str:
    # IMAGE_TAG ?= $(if $(filter repro,$(IMAGE_STACK)),<repro tag>,<current tag>)
    value = makefile_var("IMAGE_TAG")
    m = re.fullmatch(r"\$\(if \$\(filter repro,\$\(IMAGE_STACK\)\),([^,]+),([^)]+)\)", value)
    assert m, f"Makefile: IMAGE_TAG ?= {value!r} is not the expected repro/current choice"
    return m.group(2)


def repro_image_tag() -> str:
    value = makefile_var("IMAGE_TAG")
    return re.fullmatch(r"\$\(if \$\(filter repro,\$\(IMAGE_STACK\)\),([^,]+),([^)]+)\)", value).group(1)


# --------------------------------------------------------------------------------------------------------------
# every install pinned


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_every_pip_install_is_from_the_lock_hash_checked_or_a_wheel_built_in_the_builder(stack):
    # No resolution at build time: a pip command either installs (or compiles) the stack's lock files with
    # --require-hashes --no-deps, or installs local artifacts (the builder's wheels, our source tree) with --no-deps.
    df = stack_dockerfile(stack)
    lock = STACKS[stack][3]
    commands = pip_commands(df)
    assert commands, f"{df.path}: no pip install found (parser out of date?)"
    assert any(c.requirement_files for c in commands if c.stage == df.final_stage), f"{df.path}: no lock in the runtime"
    for cmd in commands:
        assert not cmd.constraints, f"{cmd.where}: -c: versions come from the lock, not from a constraints file"
        assert not {"-i", "--index-url", "--extra-index-url", "-e", "--editable", "-f", "--find-links", "--upgrade",
                    "-U"} & set(cmd.options), f"{cmd.where}: extra indexes, find-links, editable or upgrades"
        assert "--no-deps" in cmd.options, f"{cmd.where}: pip {cmd.subcommand} without --no-deps resolves at build time"
        if cmd.requirement_files:
            assert not cmd.requirements, f"{cmd.where}: a lock install names packages too: {cmd.requirements}"
            assert "--require-hashes" in cmd.options, f"{cmd.where}: -r without --require-hashes"
            for f in cmd.requirement_files:
                source = copied_from(df, cmd.stage, f)
                assert source.parent == LOCK_DIR and re.fullmatch(rf"{lock}(-build|-source)?\.txt", source.name), (
                    f"{cmd.where}: -r {f} is {source.relative_to(ROOT)}, not one of docker/locks/{lock}*.txt")
                assert source.exists(), f"{cmd.where}: {source.relative_to(ROOT)} missing (run `make lock`)"
                kind = "source" if source.name.endswith("-source.txt") else "binary"
                binary = "--only-binary=:all:" in cmd.options
                assert (kind == "binary") == binary and (kind == "source") == ("--no-binary=:all:" in cmd.options), (
                    f"{cmd.where}: {source.name} must be installed with --only-binary :all: (wheels) or, the "
                    "source builds, compiled with --no-binary :all:")
            continue
        for token in cmd.requirements:
            assert is_local_artifact(token), f"{cmd.where}: `{token}` names a package outside the lock"
            assert token == "." or token.startswith(("/wheels/", "/src/")), f"{cmd.where}: unexpected path {token}"
        assert "--require-hashes" not in cmd.options, f"{cmd.where}: local wheels have no hash in the lock"


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_every_apt_install_is_pinned_or_covered_by_the_documented_policy(stack):
    df = stack_dockerfile(stack)
    installs = apt_installs(df)
    assert installs, f"{df.path}: no apt-get install found (parser out of date?)"
    for ins, packages, options in installs:
        assert "--no-install-recommends" in options, f"{df.where(ins)}: apt-get install without --no-install-recommends"
        assert "rm -rf /var/lib/apt/lists/*" in ins.value, f"{df.where(ins)}: apt lists not removed in the same layer"
        for pkg in packages:
            if "=" in pkg:
                name, version = pkg.split("=", 1)
                assert name and version, f"{df.where(ins)}: malformed apt pin {pkg}"
                continue
            assert pkg in APT_UNPINNED_BY_POLICY or APT_PYTHON.match(pkg), (
                f"{df.where(ins)}: apt package {pkg!r} is neither pinned (pkg=version) nor in the documented policy "
                f"set {sorted(APT_UNPINNED_BY_POLICY)} + the distribution's python3.X packages")


def test_apt_policy_is_documented_where_users_read_it():
    doc = (ROOT / "docs" / "images.md").read_text()
    assert "apt" in doc and all(pkg in doc for pkg in APT_UNPINNED_BY_POLICY), (
        "docs/images.md must state the apt pinning policy and name the unpinned packages")


@pytest.mark.parametrize("path", [TRAIN, EVAL, DOCKER / "build.sh"])
def test_no_download_is_piped_into_a_shell(path):
    text = path.read_text()
    joined = re.sub(r"\\\n", " ", text)
    piped = re.findall(r"(?:curl|wget)[^\n|;&]*\|\s*(?:sudo\s+)?(?:ba|z|da)?sh\b|(?:curl|wget)[^\n|;&]*\|\s*python", joined)
    assert not piped, f"{path}: downloads piped into an interpreter: {piped}"
    assert not re.search(r"^\s*ADD\s+https?://", text, re.M), f"{path}: ADD of a remote URL (unverified download)"


# --------------------------------------------------------------------------------------------------------------
# base images, user, labels

@pytest.mark.parametrize("stack", sorted(STACKS))
def test_base_images_are_pinned_to_exact_tags(stack):
    df = stack_dockerfile(stack)
    for name, base in df.base_images.items():
        if base in df.stages:
            continue
        assert "$" not in base, f"{df.path}: stage {name}: unresolved base image {base}"
        assert_pinned_image(base, f"{df.path.relative_to(ROOT)} stage {name}")


def test_builder_and_runtime_share_the_cuda_release_of_their_stack():
    # the runtime runs what the builder compiled (flash-attn against the base image's nvcc): same CUDA release
    for stack in ("train", "train-repro", "eval"):
        df = stack_dockerfile(stack)
        images = {b for s, b in df.base_images.items() if b not in df.stages}
        cuda = {re.search(r"cuda:(\d+\.\d+)", b).group(1) for b in images}
        assert len(cuda) == 1, f"{stack}: stages use different CUDA releases {sorted(images)}"


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_runtime_stage_runs_as_numeric_non_root_user(stack):
    df = stack_dockerfile(stack)
    users = [ins for ins in df.instructions if ins.stage == df.final_stage and ins.kind == "USER"]
    assert users, f"{df.path}: the runtime stage never sets USER (it would run as root)"
    user = users[-1].value.split(":")[0]
    # numeric, so Kubernetes can verify runAsNonRoot without reading /etc/passwd
    assert user.isdigit() and int(user) != 0, f"{df.where(users[-1])}: USER {users[-1].value} must be a numeric non-root uid"
    created = [ins for ins in df.instructions if ins.stage == df.final_stage and ins.kind == "RUN" and "useradd" in ins.value]
    assert created and f"--uid {user}" in created[0].value, f"{df.path}: uid {user} is not created in the runtime stage"


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_runtime_stage_carries_oci_labels_source_version_revision(stack):
    df = stack_dockerfile(stack)
    labels = " ".join(ins.raw for ins in df.instructions if ins.stage == df.final_stage and ins.kind == "LABEL")
    for key in ("source", "version", "revision"):
        assert f"org.opencontainers.image.{key}=" in labels, f"{df.path}: no org.opencontainers.image.{key} label"
    args = df.arg_values[df.final_stage]
    assert args.get("VERSION") == pyproject()["project"]["version"], (
        f"{df.path}: ARG VERSION default {args.get('VERSION')!r} != pyproject version")


def test_runtime_stage_has_no_build_toolchain_it_does_not_need():
    # git and the flash-attn build stay in the builder; the runtime only receives wheels through a bind mount
    for stack in ("train", "train-repro", "eval"):
        df = stack_dockerfile(stack)
        runtime_apt = [p for ins, pkgs, _ in apt_installs(df) if ins.stage == df.final_stage for p in pkgs]
        assert "git" not in runtime_apt and not any(p.startswith(("cmake", "build-essential")) for p in runtime_apt), (
            f"{stack}: runtime installs build tools {runtime_apt}")
        runtime_wheel_builds = [c for c in pip_commands(df) if c.stage == df.final_stage and c.subcommand == "wheel"]
        assert not runtime_wheel_builds, f"{stack}: the runtime stage compiles wheels: {runtime_wheel_builds[0].where}"
        copies = [ins.value for ins in df.instructions if ins.stage == df.final_stage and ins.kind == "COPY"]
        assert not any("--from=builder" in c for c in copies), f"{stack}: runtime COPYs from the builder (use bind mounts)"


@pytest.mark.parametrize("stack", ["train", "train-repro"])
def test_builder_compiles_the_lock_source_builds_with_nvcc_env(stack):
    # the wheels the runtime installs without a hash are exactly the lock's source distributions, downloaded
    # hash-checked and compiled here: the same versions (and bytes) the resolution chose
    df = stack_dockerfile(stack)
    lock = STACKS[stack][3]
    builds = [c for c in pip_commands(df) if c.subcommand == "wheel" and c.requirement_files]
    assert len(builds) == 1 and builds[0].stage == "builder", [c.where for c in builds]
    assert [copied_from(df, "builder", f).name for f in builds[0].requirement_files] == [f"{lock}-source.txt"]
    options = set(builds[0].options)
    assert {"--require-hashes", "--no-binary=:all:", "--no-build-isolation"} <= options, builds[0].options
    source = read_lock(LOCK_DIR / f"{lock}-source.txt")
    assert "flash-attn" in source, f"{lock}-source.txt: flash-attn is compiled in the builder"
    run = next(ins for ins in df.instructions if ins.kind == "RUN" and "lock-source.txt" in ins.value)
    assert "FLASH_ATTENTION_FORCE_BUILD=TRUE" in run.value, "flash-attn must compile here, not fetch a prebuilt wheel"
    # Hopper (the GPU presets' H100) always; the training stack builds only it by default (about an hour's build)
    archs = re.search(r"FLASH_ATTN_CUDA_ARCHS=\"?([0-9;]+)", run.value).group(1).split(";")
    assert "90" in archs and (stack != "train" or archs == ["90"]), run.value
    # the builder compiles against the lock's torch: its build subset holds the same torch as the runtime lock
    build, runtime = read_lock(LOCK_DIR / f"{lock}-build.txt"), read_lock(LOCK_DIR / f"{lock}.txt")
    assert build["torch"] == runtime["torch"], "the builder's torch is not the runtime's"
    # and the runtime installs every wheel the builder made, without resolution
    final = [c for c in pip_commands(df) if c.stage == df.final_stage and not c.requirement_files]
    assert any("/wheels/*.whl" in c.requirements for c in final), [c.requirements for c in final]


def test_eval_runtime_installs_our_wheel_by_its_distribution_name():
    # PyPI's `dapo` is another project: our distribution has its own name, and the wheel file follows it (PEP 427
    # normalises dapo-k8s to dapo_k8s-<version>-py3-none-any.whl)
    name = pyproject()["project"]["name"]
    assert canonicalize_name(name) != "dapo", "pyproject.toml: `dapo` on PyPI is an unrelated project"
    df = stack_dockerfile("eval")
    tokens = [t for c in pip_commands(df) if c.stage == df.final_stage for t in c.requirements]
    assert f"/wheels/{re.sub(r'[-_.]+', '_', name).lower()}-*.whl" in tokens, tokens


# --------------------------------------------------------------------------------------------------------------
# the pins agree with pyproject.toml, the Makefile and the chart


def test_constraints_files_hold_only_exact_unique_pins():
    for path in sorted(DOCKER.glob("constraints*.txt")):
        pins = read_constraints(path)
        assert len(pins) >= 10, f"{path}: suspiciously few pins ({len(pins)})"


def test_constraints_reader_rejects_ranges_duplicates_and_urls(tmp_path, monkeypatch):
    import docker_stack

    monkeypatch.setattr(docker_stack, "ROOT", tmp_path)
    for text, fragment in [("torch>=2.6\n", "exact pin"), ("a==1\nA==2\n", "pinned twice"),
                           ("x @ https://h/x.whl\n", "no URL"), ("ray[default]==2.60.0\n", "no URL, extras")]:
        path = tmp_path / "c.txt"
        path.write_text(text)
        with pytest.raises(StackError, match=re.escape(fragment)):
            read_constraints(path)


def test_training_verl_pin_matches_pyproject_verl_extra():
    pins, locked = read_constraints(DOCKER / "constraints.txt"), resolved("train")
    extra = [Requirement(r) for r in pyproject()["project"]["optional-dependencies"]["verl"]]
    verl = [r for r in extra if canonicalize_name(r.name) == "verl"]
    assert verl, "pyproject.toml: the `verl` extra no longer names verl"
    assert str(verl[0].specifier) == f"=={pins['verl'].version}" == f"=={locked['verl'].version}", (
        f"pyproject's `verl` extra says {verl[0]}, docker/constraints.txt pins verl=={pins['verl'].version}, "
        f"docker/locks/train.txt has {locked['verl'].version}: the three must be the same exact verl")


# which extras of our package each image holds (the lock resolves pyproject.toml with them)
IMAGE_EXTRAS = {"train": {"verl"}, "train-efa": {"verl"}, "eval": {"eval"}, "train-repro": set()}


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_our_package_dependencies_and_extras_are_satisfied_by_each_lock(stack):
    project = pyproject()["project"]
    locked = resolved(stack)
    deps = [Requirement(r) for r in project["dependencies"]]
    for extra in IMAGE_EXTRAS[stack]:
        deps += [Requirement(r) for r in project["optional-dependencies"][extra]]
    for req in deps:
        name = canonicalize_name(req.name)
        assert name in locked, f"{stack}: our dependency {req} is not in its lock"
        assert req.specifier.contains(locked[name].version, prereleases=True), (
            f"{stack}: the lock has {name}=={locked[name].version}, pyproject says {req}")
    assert project["name"] not in locked and "dapo" not in locked, f"{stack}: the lock holds our own package"


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_stack_python_satisfies_pyproject_requires_python(stack):
    df = stack_dockerfile(stack)
    python = df.arg_values[df.final_stage]["PYTHON_VERSION"]
    spec = SpecifierSet(pyproject()["project"]["requires-python"])
    assert spec.contains(f"{python}.0"), f"{stack}: Python {python} outside requires-python {spec}"
    base = df.base_images[df.final_stage]
    distro_python = {"ubuntu24.04": "3.12", "ubuntu22.04": "3.10"}
    distro = re.search(r"ubuntu\d+\.\d+", base).group(0)
    assert distro_python[distro] == python, f"{stack}: {base} ships Python {distro_python[distro]}, not {python}"


def test_eval_and_training_images_run_the_same_ray():
    train, evaluation = resolved("train"), resolved("eval")
    assert train["ray"].version == evaluation["ray"].version, "both images join KubeRay clusters of one rayVersion"


def test_image_tags_derive_from_the_locked_versions_and_are_never_latest():
    version = pyproject()["project"]["version"]
    verl = resolved("train")["verl"].version
    ray = resolved("eval")["ray"].version
    assert makefile_var("IMAGE") == "ghcr.io/dapo-k8s/dapo"
    assert default_image_tag() == f"{version}-verl{verl}"
    assert makefile_var("EVAL_IMAGE") == "ghcr.io/dapo-k8s/dapo-eval"
    assert makefile_var("EVAL_IMAGE_TAG") == f"{version}-ray{ray}"
    assert repro_image_tag() == f"{version}-repro-verl{REFERENCE_VERL_COMMIT[:7]}"
    for path in [ROOT / "Makefile", TRAIN, EVAL, ROOT / ".github" / "workflows" / "image.yml", ROOT / "docs" / "images.md"]:
        text = path.read_text()
        assert not re.search(r"[\w/.-]+:latest\b", text), f"{path}: refers to a `latest` tag"


def _find(tree, key, path=()):
    """Yield (path, value) for every mapping entry named `key` anywhere in a YAML tree."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            if k == key:
                yield path + (k,), v
            yield from _find(v, key, path + (k,))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _find(v, key, path + (i,))


def _images(tree, path=()):
    if isinstance(tree, dict):
        if "repository" in tree and "tag" in tree:
            yield path, str(tree["repository"]), str(tree["tag"])
        for k, v in tree.items():
            yield from _images(v, path + (k,))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _images(v, path + (i,))


def chart_values() -> dict:
    assert VALUES.exists(), (
        f"{VALUES.relative_to(ROOT)} does not exist: the chart must declare rayVersion and the default image so the "
        "images and the chart can be checked against each other")
    return yaml.safe_load(VALUES.read_text())


def test_chart_ray_version_equals_the_images_locked_ray():
    values = chart_values()
    found = list(_find(values, "rayVersion"))
    assert found, f"{VALUES.relative_to(ROOT)}: no rayVersion key"
    ray = resolved("train")["ray"].version
    repro_ray = resolved("train-repro")["ray"].version
    for path, value in found:
        # train.reference: the reproduction image of the reference runner
        want = repro_ray if path[:2] == ("train", "reference") else ray
        assert str(value) == want, f"values.yaml {'.'.join(map(str, path))}={value!r}, its image runs ray=={want}"


def test_chart_default_image_is_the_training_image_tag():
    images = list(_images(chart_values()))
    repo, tag = makefile_var("IMAGE"), default_image_tag()
    train = [(p, t) for p, r, t in images if r == repo]
    assert train, f"{VALUES.relative_to(ROOT)}: no image with repository {repo} (found {[(r, t) for _, r, t in images]})"
    for path, t in train:
        want = repro_image_tag() if path[:2] == ("train", "reference") else tag  # the reference runner's image
        assert t == want, f"values.yaml {'.'.join(map(str, path))}.tag={t!r}, `make image` builds {repo}:{want}"
    for path, r, t in images:
        if r == makefile_var("EVAL_IMAGE"):
            assert t == makefile_var("EVAL_IMAGE_TAG"), f"values.yaml {'.'.join(map(str, path))}.tag={t!r}"


# --------------------------------------------------------------------------------------------------------------
# the reproduction stack


def test_repro_args_select_the_reference_stack():
    args = read_args_file(REPRO_ARGS)
    assert args["VERL_COMMIT"] == REFERENCE_VERL_COMMIT
    assert re.search(r"cuda:12\.6\.\d+-devel-ubuntu22\.04$", args["BASE_IMAGE"]), args["BASE_IMAGE"]
    assert args["PYTHON_VERSION"] == "3.10"
    assert args["LOCK"] == STACKS["train-repro"][3]
    locked = resolved("train-repro")
    assert (locked["vllm"].version, locked["torch"].version) == ("0.8.3", "2.6.0")
    assert "verl" not in locked, "verl comes from VERL_COMMIT in this stack, not from PyPI"
    assert IMAGE_EXTRAS["train-repro"] == set(), "our `verl` extra pins verl 0.9.1, which this stack replaces"
    df = parse_dockerfile(TRAIN)
    declared = set(df.global_args).union(*(df.arg_values[stage] for stage in df.stages))
    unknown = set(args) - declared
    assert not unknown, f"docker/repro.args sets build arguments the Dockerfile does not declare: {sorted(unknown)}"


def test_repro_stack_installs_verl_from_the_commit_and_keeps_its_recipe_tree():
    df = stack_dockerfile("train-repro")
    verl_build = next(ins for ins in df.instructions if ins.stage == "builder" and ins.kind == "RUN"
                      and "git rev-parse HEAD" in ins.value)
    assert f'test "$(git rev-parse HEAD)" = "{REFERENCE_VERL_COMMIT}"' in verl_build.value, "the checkout must be verified"
    assert "pip wheel --no-deps --no-build-isolation --wheel-dir /wheels ." in verl_build.value, (
        "the verified checkout must be built into /wheels, which the runtime installs (/wheels/*.whl)")
    runtime = " ".join(ins.value for ins in df.instructions if ins.stage == df.final_stage and ins.kind == "RUN")
    assert "cp -a /src/verl /opt/verl" in runtime
    # the wheel's own requirements are in the lock: the runtime installs it without resolution, then `pip check`
    assert "python -m pip install --no-deps /wheels/*.whl" in runtime and "pip check" in runtime


# --------------------------------------------------------------------------------------------------------------
# build context and build script


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_build_context_keeps_every_file_the_dockerfile_copies(stack):
    df = stack_dockerfile(stack)
    ignore = Path(str(df.path) + ".dockerignore")
    patterns = [ln.strip() for ln in ignore.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert dockerignored(".venv/bin/python", patterns), f"{ignore}: the venv would be sent to the builder"
    for ins in df.instructions:
        if ins.kind != "COPY" or "--from" in ins.value:
            continue
        for source in ins.value.split()[:-1]:
            assert (ROOT / source).exists(), f"{df.where(ins)}: COPY source {source} missing"
            files = [source] if (ROOT / source).is_file() else [
                str(p.relative_to(ROOT)) for p in (ROOT / source).rglob("*.py")]
            for f in files:
                assert not dockerignored(f, patterns), f"{ignore} excludes {f}, which {df.where(ins)} copies"


@pytest.fixture
def fake_docker(tmp_path):
    """A `docker` on PATH that records its argv, one per line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "argv"
    script = bin_dir / "docker"
    script.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > {log}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return env, log


def test_build_script_passes_each_args_line_as_one_build_arg(fake_docker):
    env, log = fake_docker
    tag = "ghcr.io/dapo-k8s/dapo:0.1.0-repro-verl4f80e46"
    subprocess.run([str(DOCKER / "build.sh"), "--file", "docker/Dockerfile", "--tag", tag, "--args", "docker/repro.args",
                    "--push"], env=env, check=True, capture_output=True, cwd=ROOT)
    argv = log.read_text().splitlines()
    assert argv[:2] == ["buildx", "build"] and "--push" in argv and argv[argv.index("--tag") + 1] == tag
    passed = [argv[i + 1] for i, a in enumerate(argv) if a == "--build-arg"]
    for key, value in read_args_file(REPRO_ARGS).items():
        assert f"{key}={value}" in passed, f"{key}={value} not passed intact (values with spaces must stay one arg)"
    assert f"VERSION={pyproject()['project']['version']}" in passed
    assert any(p.startswith("REVISION=") and p != "REVISION=" for p in passed)


@pytest.mark.parametrize("tag", ["ghcr.io/dapo-k8s/dapo:latest", "ghcr.io/dapo-k8s/dapo"])
def test_build_script_refuses_latest_or_missing_tags(fake_docker, tag):
    env, log = fake_docker
    proc = subprocess.run([str(DOCKER / "build.sh"), "--file", "docker/Dockerfile", "--tag", tag],
                          env=env, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and not log.exists(), proc.stderr
    assert "tag" in proc.stderr


def test_make_image_targets_call_the_build_script_with_the_pinned_tags(fake_docker):
    env, log = fake_docker
    for target, expected in [("image", f"{makefile_var('IMAGE')}:{default_image_tag()}"),
                             ("image-eval", f"{makefile_var('EVAL_IMAGE')}:{makefile_var('EVAL_IMAGE_TAG')}")]:
        out = subprocess.run(["make", "-n", target], env=env, capture_output=True, text=True, cwd=ROOT, check=True).stdout
        assert "docker/build.sh" in out and f"--tag {expected}" in out, out
    out = subprocess.run(["make", "-n", "image", "IMAGE_STACK=repro", "IMAGE_PUSH=1"], env=env, capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    assert f"--tag {makefile_var('IMAGE')}:{repro_image_tag()}" in out and "--args docker/repro.args" in out
    assert "--push" in out


def test_make_images_builds_and_pushes_the_images_to_the_registry_and_prints_the_values_pinned_by_digest(tmp_path):
    """The README's first step, run as processes: make -> docker/build.sh -> a docker that records its argv and
    writes buildx's build metadata: each pushed image's digest is recorded and the printed --set pins it, and the
    chart renders exactly that digest."""
    bin_dir, log, digests = tmp_path / "bin", tmp_path / "argv", tmp_path / "digests"
    recording_docker(bin_dir, log)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = subprocess.run(["make", "--no-print-directory", "images", "REGISTRY=reg.example.com/ml", 'CUDA_ARCHS=80;90',
                          f"IMAGE_DIGESTS={digests}"], env=env, capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout
    calls = [c.strip("\n").splitlines() for c in log.read_text().split("END\n") if c.strip()]
    assert len(calls) == 3
    train, ev, follow = calls
    train_tag, eval_tag = f"reg.example.com/ml/dapo:{default_image_tag()}", \
        f"reg.example.com/ml/dapo-eval:{makefile_var('EVAL_IMAGE_TAG')}"
    assert train[train.index("--tag") + 1] == train_tag and "--push" in train and "--metadata-file" in train
    assert train[train.index("--file") + 1].endswith("docker/Dockerfile")
    assert "FLASH_ATTN_CUDA_ARCHS=80;90" in train  # other architectures by argument
    assert ev[ev.index("--tag") + 1] == eval_tag and "--push" in ev and "--metadata-file" in ev
    assert (digests / "dapo.digest").read_text().strip() == fake_digest(train_tag)
    assert (digests / "dapo-eval.digest").read_text().strip() == fake_digest(eval_tag)
    follow_tag = f"reg.example.com/ml/dapo-follow:{makefile_var('FOLLOW_IMAGE_TAG')}"
    assert follow[follow.index("--tag") + 1] == follow_tag and "--push" in follow
    assert (digests / "dapo-follow.digest").read_text().strip() == fake_digest(follow_tag)
    (line,) = [x for x in out.splitlines() if "--set image.repository=" in x]
    sets = dict(a.split("=", 1) for a in line.split("--set ")[1:] for a in [a.strip()])
    assert sets == {"image.repository": "reg.example.com/ml/dapo", "image.digest": fake_digest(train_tag),
                    "eval.image.repository": "reg.example.com/ml/dapo-eval", "eval.image.digest": fake_digest(eval_tag),
                    "logs.image.repository": "reg.example.com/ml/dapo-follow",
                    "logs.image.tag": makefile_var("FOLLOW_IMAGE_TAG"), "logs.image.digest": fake_digest(follow_tag)}
    # the same values as a file (the README's `-f build/images/values.yaml`), tags beside the digests
    written = yaml.safe_load((digests / "values.yaml").read_text())
    assert written == {"image": {"repository": sets["image.repository"], "tag": default_image_tag(),
                                 "digest": sets["image.digest"]},
                       "eval": {"image": {"repository": sets["eval.image.repository"],
                                          "tag": makefile_var("EVAL_IMAGE_TAG"), "digest": sets["eval.image.digest"]}},
                       "logs": {"image": {"repository": sets["logs.image.repository"],
                                          "tag": sets["logs.image.tag"], "digest": sets["logs.image.digest"]}}}
    # those values, as `helm install --set` hands them over: every pod runs the pushed images by digest
    from k8s_support import RWX, helm_notes, helm_objects, merge, parse_sets

    for values in (merge({**RWX, "eval": {"enabled": True}}, parse_sets(sets)),
                   merge({**RWX, "eval": {"enabled": True}}, written)):
        images = {c["image"] for o in helm_objects(values) for c in _containers_of(o)}
        assert images == {f"reg.example.com/ml/dapo@{fake_digest(train_tag)}",
                          f"reg.example.com/ml/dapo-eval@{fake_digest(eval_tag)}",
                          f"reg.example.com/ml/dapo-follow@{fake_digest(follow_tag)}"}, images
        assert "pinned by tag only" not in helm_notes(values)
    # without a registry: the reason, and nothing built
    log.unlink()
    proc = subprocess.run(["make", "images"], env=env, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode != 0 and "set REGISTRY=" in proc.stderr and not log.exists()


def test_ci_workflow_builds_both_images_and_says_it_does_not_run_here():
    path = ROOT / ".github" / "workflows" / "image.yml"
    text = path.read_text()
    assert "not run" in text.lower(), f"{path}: must say plainly that it is not run by this repository's CI"
    workflow = yaml.safe_load(text)
    steps = [s for job in workflow["jobs"].values() for s in job["steps"]]
    runs = " ".join(s.get("run", "") for s in steps)
    targets = {entry["target"] for job in workflow["jobs"].values()
               for entry in job.get("strategy", {}).get("matrix", {}).get("include", [])}
    assert {"image", "image-eval"} <= targets and "make ${{ matrix.target }}" in runs, (targets, runs)
    assert "IMAGE_PUSH=1" in runs
    # the build runs where its header says it must: not a standard hosted runner, and it checks the numbers it names
    need = re.search(r"needs >= (\d+) cores, >= (\d+) GB RAM and >= (\d+) GB of free disk", text).groups()
    build = workflow["jobs"]["build"]
    assert not re.fullmatch(r"(ubuntu|windows|macos)-(latest|[\d.]+)", build["runs-on"]), build["runs-on"]
    check = build["steps"][0]["run"]
    cores, mem, disk = re.search(r'"\$cores" -lt (\d+).*"\$mem_gb" -lt (\d+).*"\$disk_gb" -lt (\d+)', check).groups()
    assert (cores, disk) == (need[0], need[2]) and int(need[1]) * 0.9 <= int(mem) <= int(need[1]), (need, check)
    for step in steps:
        if "uses" in step:
            assert re.search(r"@(v\d+(\.\d+)*|[0-9a-f]{40})$", step["uses"]), f"{path}: unpinned action {step['uses']}"


# --------------------------------------------------------------------------------------------------------------
# network fabrics: InfiniBand userspace in the image, the EFA variant checksum-verified


def test_training_runtime_ships_the_rdma_userspace_nccl_dlopens():
    for stack in ("train", "train-repro"):
        df = stack_dockerfile(stack)
        runtime_apt = {p for ins, pkgs, _ in apt_installs(df) if ins.stage == df.final_stage for p in pkgs}
        assert {"libibverbs1", "ibverbs-providers", "librdmacm1"} <= runtime_apt, stack


def test_efa_args_name_runtime_build_arguments_and_the_bundled_plugin_path():
    """The EFA variant: the AWS EFA installer alone (it bundles aws-ofi-nccl), verified by its GPG signature; no
    separate plugin build, no empty checksum; NCCL finds the bundled plugin through LD_LIBRARY_PATH."""
    args = read_args_file(EFA_ARGS)
    assert set(args) == {"EFA_INSTALLER_VERSION", "EFA_INSTALLER_GPG_FINGERPRINT"}, sorted(args)
    assert all(args.values()), "docker/efa.args: an empty value"
    assert re.fullmatch(r"[0-9A-F]{40}", args["EFA_INSTALLER_GPG_FINGERPRINT"])
    df = stack_dockerfile("train-efa")
    runtime = df.arg_values[df.final_stage]
    for key in (*args, "EFA_INSTALLER_SHA256"):
        assert key in runtime, f"docker/Dockerfile's runtime stage does not declare ARG {key}"
    assert not any("EFA" in k for k in df.arg_values["builder"]), "the builder stage builds no EFA part any more"
    text = TRAIN.read_text()
    assert "AWS_OFI_NCCL" not in text and "/opt/aws-ofi-nccl" not in text
    run = next(ins for ins in df.instructions if ins.kind == "RUN" and "install-efa.sh" in ins.value)
    # the build arguments reach the script (the verification cannot be skipped by an argument that does not arrive)
    want = f'install-efa.sh "{args["EFA_INSTALLER_VERSION"]}" "{args["EFA_INSTALLER_GPG_FINGERPRINT"]}"'
    assert want in run.value and run.stage == df.final_stage, run.value
    ld = re.findall(r"^ENV LD_LIBRARY_PATH=(\S+)", text, re.M)[-1].split(":")
    assert {"/opt/amazon/efa/lib", "/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu"} <= set(ld)


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    """A throwaway OpenPGP key pair (AWS's stand-in), a second one, a fake installer tarball and the first key's
    detached signature of it: what the build downloads, made here."""
    if not shutil.which("gpg"):
        pytest.skip("gpg is not installed on this machine")
    d = tmp_path_factory.mktemp("efa")
    out = {}
    for name in ("aws", "other"):
        home = d / f"gnupg-{name}"
        home.mkdir(mode=0o700)
        run = lambda *a, h=home: subprocess.run(["gpg", "--homedir", str(h), "--batch", *a], check=True,
                                                capture_output=True, text=True)
        run("--passphrase", "", "--quick-gen-key", f"{name} <{name}@example.com>", "rsa2048", "sign", "never")
        fpr = next(ln.split(":")[9] for ln in run("--with-colons", "--fingerprint").stdout.splitlines()
                   if ln.startswith("fpr:"))
        (d / f"{name}.key").write_text(run("--armor", "--export").stdout)
        out[name] = (home, fpr, run)
    tarball = d / "aws-efa-installer-9.9.9.tar.gz"
    tarball.write_bytes(b"not really an installer\n" * 100)
    out["aws"][2]("--output", str(d / "good.sig"), "--detach-sign", str(tarball))
    out["other"][2]("--output", str(d / "other.sig"), "--detach-sign", str(tarball))
    return d, tarball, out["aws"][1], out["other"][1]


def _verify(*argv):
    return subprocess.run(["/bin/sh", str(DOCKER / "install-efa.sh"), "--verify", *map(str, argv)],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})


def test_efa_installer_verification_passes_only_for_aws_key_and_signature_and_fails_closed_otherwise(signed, tmp_path):
    """The script's own verification step on a fake tarball: it passes for the published key's good signature (and
    a matching SHA-256), and exits 2 -- nothing installed -- on a wrong fingerprint, another key's signature, a
    changed tarball, a wrong SHA-256, a missing signature or a key file that is no key."""
    d, tarball, fpr, other = signed
    sha = hashlib.sha256(tarball.read_bytes()).hexdigest()
    ok = _verify(tarball, d / "good.sig", d / "aws.key", fpr)
    assert ok.returncode == 0 and "verified (GPG signature by" in ok.stdout, ok.stderr
    spaced = " ".join(fpr[i:i + 4] for i in range(0, 40, 4)).lower()  # as the user guide prints it
    assert _verify(tarball, d / "good.sig", d / "aws.key", spaced, sha).returncode == 0
    changed = tmp_path / tarball.name
    changed.write_bytes(tarball.read_bytes() + b"x")
    for argv, message in [
        ((tarball, d / "good.sig", d / "aws.key", other), "is not the one AWS publishes"),
        ((tarball, d / "other.sig", d / "aws.key", fpr), "is not a good signature"),
        ((tarball, d / "good.sig", d / "other.key", fpr), "is not the one AWS publishes"),
        ((changed, d / "good.sig", d / "aws.key", fpr), "is not a good signature"),
        ((tarball, d / "good.sig", d / "aws.key", fpr, "0" * 64), "SHA-256 of"),
        ((tarball, tmp_path / "missing.sig", d / "aws.key", fpr), "missing.sig is missing or empty"),
        ((tarball, d / "good.sig", tarball, fpr), "is not an OpenPGP public key"),
        ((tarball, d / "good.sig", d / "aws.key", ""), "no GPG fingerprint given"),
    ]:
        out = _verify(*argv)
        assert out.returncode == 2 and message in out.stderr, (argv, out.stdout, out.stderr)


def test_efa_install_downloads_verify_before_anything_is_installed(signed, tmp_path):
    """The whole install step as the Dockerfile runs it, with stand-ins for the network and apt (a `wget` that serves
    the fake files, an `apt-get` and installer that record being run): with a tampered download it stops at the
    verification, exit 2, and neither apt nor the installer ran."""
    d, tarball, fpr, _ = signed
    bin_dir, log = tmp_path / "bin", tmp_path / "ran"
    bin_dir.mkdir()
    served = tmp_path / "served"
    served.mkdir()
    (served / "aws-efa-installer-9.9.9.tar.gz").write_bytes(tarball.read_bytes() + b"tampered")
    (served / "aws-efa-installer-9.9.9.tar.gz.sig").write_bytes((d / "good.sig").read_bytes())
    (served / "aws-efa-installer.key").write_bytes((d / "aws.key").read_bytes())
    (bin_dir / "wget").write_text(f'#!/bin/sh\necho "wget $*" >> {log}\ncp "{served}/$(basename "$4")" "$3"\n')
    (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "apt-get $*" >> {log}\n')
    for f in ("wget", "apt-get"):
        (bin_dir / f).chmod(0o755)
    out = subprocess.run(["/bin/sh", str(DOCKER / "install-efa.sh"), "9.9.9", fpr], capture_output=True, text=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert out.returncode == 2 and "is not a good signature" in out.stderr, out.stderr
    ran = log.read_text()
    assert "https://efa-installer.amazonaws.com/aws-efa-installer-9.9.9.tar.gz.sig" in ran
    assert "https://efa-installer.amazonaws.com/aws-efa-installer.key" in ran and "apt-get" not in ran
    no_fpr = subprocess.run(["/bin/sh", str(DOCKER / "install-efa.sh"), "9.9.9", ""], capture_output=True, text=True,
                            env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert no_fpr.returncode == 2 and "not installed unverified" in no_fpr.stderr


def test_make_images_efa_builds_and_pushes_the_efa_variant_under_the_tag_eks_values_run(tmp_path):
    """`make images REGISTRY=... EFA=1` (the recording docker of the README's step): the EFA training image from the
    same Dockerfile and lock with docker/efa.args, tagged as values/eks-p5.yaml's image.tag, and the evaluation
    image; IMAGE_STACK=repro with EFA=1 is refused."""
    bin_dir, log = tmp_path / "bin", tmp_path / "argv"
    recording_docker(bin_dir, log)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = subprocess.run(["make", "--no-print-directory", "images", "REGISTRY=reg.example.com/ml", "EFA=1",
                          f"IMAGE_DIGESTS={tmp_path / 'digests'}"],
                         env=env, capture_output=True, text=True, cwd=ROOT, check=True).stdout
    train, ev, _follow = [c.strip("\n").splitlines() for c in log.read_text().split("END\n") if c.strip()]
    eks_tag = yaml.safe_load((ROOT / "values" / "eks-p5.yaml").read_text())["image"]["tag"]
    assert eks_tag == f"{default_image_tag()}-efa"
    assert train[train.index("--tag") + 1] == f"reg.example.com/ml/dapo:{eks_tag}" and "--push" in train
    passed = [train[i + 1] for i, a in enumerate(train) if a == "--build-arg"]
    for key, value in read_args_file(EFA_ARGS).items():
        assert f"{key}={value}" in passed
    assert not any(p.startswith("LOCK=") for p in passed), "the same lock as the plain training image"
    assert ev[ev.index("--tag") + 1] == f"reg.example.com/ml/dapo-eval:{makefile_var('EVAL_IMAGE_TAG')}"
    assert f"-f values/eks-p5.yaml (its image.tag is {eks_tag})" in out
    assert f"--set image.digest={fake_digest(f'reg.example.com/ml/dapo:{eks_tag}')}" in out
    refused = subprocess.run(["make", "image", "IMAGE_STACK=repro", "EFA=1"], env=env, capture_output=True,
                             text=True, cwd=ROOT)
    assert refused.returncode == 2 and "EFA=1 builds the current stack" in refused.stderr

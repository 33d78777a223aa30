#!/usr/bin/env python3
"""The lock files of the container images: one full resolution per image, every package pinned and hashed.

    python scripts/lock_images.py                  # write docker/locks/ from the inputs (`make lock`)
    python scripts/lock_images.py --check          # resolve again keeping the committed pins; exit 1 if one moves
    python scripts/lock_images.py --image eval     # one image only (also with --check)

Inputs of an image's lock: the names it installs (docker/requirements*.in), its constraints file (the pins, each with
its reason), its overrides file if it has one (docker/overrides.txt: where the image departs from an exact pin of a
package it installs, each with its reason), our package's dependencies (pyproject.toml: [project].dependencies and the image's extra), and the
resolver settings in docker/uv-lock.toml (registry, newest upload date, metadata of the CUDA source packages). uv
(`uv pip compile`, the version pinned in pyproject's `dev` extra) resolves them for the image's Python and platform --
manylinux at the glibc of the base image's Ubuntu release -- allowing source distributions only for the packages the
builder stage compiles; everything else must be a wheel for that platform.

One resolution gives up to three files, so that each Docker stage installs exactly what it needs, hash-checked and
with no resolution at build time (`pip install --require-hashes --no-deps`):

    docker/locks/<image>.txt         every package the runtime stage installs from the registry (wheels)
    docker/locks/<image>-source.txt  the source distributions the builder stage compiles into wheels (if any)
    docker/locks/<image>-build.txt   what the builder installs before compiling: the build tools and torch, with
                                     everything they depend on in the resolution (a subset of <image>.txt; kept
                                     small so that a pin change elsewhere does not invalidate the compile's cache)

Each file starts with a header naming the command, the inputs and their SHA-256, so a stale lock is seen offline
(tests/test_image_locks.py) and by re-resolving (--check: the registry test, and the image workflow before any
compile). Exit status: 0 up to date / written, 1 a lock differs from its re-resolution, 2 unsatisfiable or an error
(uv's message names the conflicting requirements).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
LOCK_DIR = "docker/locks"
SETTINGS = "docker/uv-lock.toml"
# Set to use a mirror of the registry (same files, same hashes); it is not part of the locks or their headers.
INDEX_ENV = "DAPO_LOCK_INDEX_URL"
# uv environment variables that may stay (where uv caches, how it talks to the network); every other UV_* is
# dropped because it could change the resolution (UV_INDEX_URL, UV_CONSTRAINT, UV_EXCLUDE_NEWER, UV_PRERELEASE, ...).
UV_ENV_KEPT = {"UV_CACHE_DIR", "UV_NATIVE_TLS", "UV_HTTP_TIMEOUT", "UV_CONCURRENT_DOWNLOADS"}
# Build tools every builder stage installs before it builds a wheel (ours, verl's, the CUDA sources).
BUILD_TOOLS = ("pip", "setuptools", "wheel", "packaging")


@dataclass(frozen=True)
class Image:
    name: str  # docker/locks/<name>.txt
    title: str
    dockerfile: str
    requirements: str  # the names the image installs
    constraints: str  # the pins, each with its reason
    extras: tuple[str, ...]  # extras of our package whose dependencies the image holds
    python: str  # the base image's Python (Dockerfile PYTHON_VERSION)
    glibc: str  # the base image's glibc: the manylinux tag wheels must fit
    source_builds: tuple[str, ...] = ()  # sdist-only on PyPI: compiled in the builder stage
    # requirements that replace every other requirement on the same package (uv --override): where the image
    # departs from an exact pin of a package it installs (each line of the file says why)
    overrides: str | None = None
    build_roots: tuple[str, ...] = BUILD_TOOLS  # what the builder installs (with its dependencies) before compiling

    @property
    def platform(self) -> str:
        return f"x86_64-manylinux_{self.glibc.replace('.', '_')}"


IMAGES: dict[str, Image] = {
    "train": Image(
        "train", "training image", "docker/Dockerfile", "docker/requirements.in", "docker/constraints.txt",
        extras=("verl",), python="3.12", glibc="2.39", overrides="docker/overrides.txt",
        # flash-attn: CUDA sources only; antlr4-python3-runtime 4.9.3 (hydra-core's pin): a pure-Python sdist
        source_builds=("flash-attn", "antlr4-python3-runtime"),
        build_roots=BUILD_TOOLS + ("ninja", "psutil", "einops", "torch")),
    "eval": Image(
        "eval", "evaluation image", "docker/Dockerfile.eval", "docker/requirements-eval.in",
        "docker/constraints-eval.txt", extras=("eval",), python="3.12", glibc="2.39"),
    "repro": Image(
        "repro", "reproduction stack (docker/repro.args)", "docker/Dockerfile", "docker/requirements-repro.in",
        "docker/constraints-repro.txt", extras=(), python="3.10", glibc="2.35",
        source_builds=("flash-attn", "flashinfer-python", "antlr4-python3-runtime"),
        build_roots=BUILD_TOOLS + ("ninja", "psutil", "einops", "torch")),
}


class LockError(RuntimeError):
    """The resolution could not be made (unsatisfiable, registry unreachable, uv missing); the message says why."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ----------------------------------------------------------------------------------------------------------------
# uv


def uv_pin() -> str:
    """The uv version pyproject.toml's `dev` extra pins (`uv==X`): the one that wrote the committed locks."""
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    pins = [m.group(1) for r in dev if (m := re.fullmatch(r"\s*uv\s*==\s*([\w.]+)\s*", r))]
    if len(pins) != 1:
        raise LockError("pyproject.toml: the `dev` extra must pin uv exactly once (uv==X): the locks depend on it")
    return pins[0]


def uv_binary() -> str:
    try:
        from uv import find_uv_bin
    except ImportError as exc:
        raise LockError(f"uv is not installed in {sys.executable}: run `make setup` (pyproject's `dev` extra pins "
                        f"uv=={uv_pin()})") from exc
    binary = find_uv_bin()
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout.split()
    if out[1] != uv_pin():
        raise LockError(f"uv {out[1]} found, the locks are made with uv=={uv_pin()} (pyproject's `dev` extra): "
                        "run `make setup`")
    return binary


def compile_args(image: Image) -> list[str]:
    """`uv pip compile` arguments for one image, relative to the repository root (as written in the lock header)."""
    args = ["pip", "compile", image.requirements, "pyproject.toml"]
    for extra in image.extras:
        args += ["--extra", extra]
    args += ["-c", image.constraints]
    if image.overrides:
        args += ["--override", image.overrides]
    args += ["--no-config", "--config-file", SETTINGS,
             "--python-version", image.python, "--python-platform", image.platform,
             "--only-binary", ":all:"]
    for name in image.source_builds:
        args += ["--no-binary", name]
    return args + ["--generate-hashes", "--no-header"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k in UV_ENV_KEPT}


def resolve(image: Image, uv: str, prefer: str = "") -> str:
    """uv's lock for `image` (no header). Raises LockError with uv's own explanation when it fails. `prefer`: a lock
    whose pins uv keeps wherever the inputs still admit them (uv reads the existing `--output-file` as preferences,
    as pip-compile does), so the result is that lock unless the inputs or the registry's files rule a pin out."""
    extra = ["--index-url", os.environ[INDEX_ENV]] if os.environ.get(INDEX_ENV) else []
    # the interpreter uv builds pure-Python sdists with to read their metadata (the target Python is not installed)
    extra += ["--python", sys.executable]
    with tempfile.TemporaryDirectory() as tmp:
        if prefer:
            (Path(tmp) / "prefer.txt").write_text(prefer)
            extra += ["--output-file", str(Path(tmp) / "prefer.txt")]  # a copy: uv overwrites it
        proc = subprocess.run([uv, *compile_args(image), *extra], cwd=ROOT, env=_env(), capture_output=True,
                              text=True)
    if proc.returncode != 0:
        message = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("warning:")).strip()
        raise LockError(f"{image.name}: the inputs do not resolve ({image.requirements}, {image.constraints}, "
                        f"pyproject.toml, {SETTINGS}; Python {image.python}, {image.platform}):\n{message}")
    return proc.stdout


# ----------------------------------------------------------------------------------------------------------------
# the lock text


@dataclass
class Entry:
    name: str  # canonical
    version: str
    text: str  # the entry as uv wrote it: pin, hashes, `# via` annotation
    via: tuple[str, ...]  # who requires it: canonical package names, `-r file`, `-c file`, `project (pyproject.toml)`


def parse(text: str) -> list[Entry]:
    """uv's `--generate-hashes` output -> entries in file order. Lines outside an entry other than comments are an
    error (the format changed: the pinned uv must be the one in pyproject's `dev` extra)."""
    entries: list[Entry] = []
    lines: list[str] = []

    def close() -> None:
        if not lines:
            return
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)( \\)?$", lines[0])
        if not m:
            raise LockError(f"unexpected line in uv's output: {lines[0]!r}")
        via: list[str] = []
        for line in lines[1:]:
            s = line.strip()
            if s.startswith("# via"):
                via += [s[len("# via"):].strip()] if s != "# via" else []
            elif s.startswith("#   "):
                via.append(s[4:].strip())
        names = tuple(canonical(v) if re.fullmatch(r"[A-Za-z0-9._-]+", v) else v for v in via)
        entries.append(Entry(canonical(m.group(1)), m.group(2), "\n".join(lines) + "\n", names))
        lines.clear()

    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace() and not line.startswith("#"):
            close()
            lines.append(line)
        elif lines:
            lines.append(line)
        elif not line.startswith("#"):
            raise LockError(f"unexpected line in uv's output: {line!r}")
    close()
    return entries


def closure(entries: list[Entry], roots: tuple[str, ...]) -> set[str]:
    """The roots and everything they depend on within the resolution (from uv's `# via` annotations: Q's via names
    every package of the resolution that requires Q)."""
    children: dict[str, set[str]] = {}
    for e in entries:
        for parent in e.via:
            children.setdefault(parent, set()).add(e.name)
    names = {e.name for e in entries}
    missing = [r for r in roots if canonical(r) not in names]
    if missing:
        raise LockError(f"build roots {missing} are not in the resolution: add them to the requirements file")
    todo, seen = [canonical(r) for r in roots], set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += sorted(children.get(name, ()))
    return seen


def inputs_digest(image: Image) -> str:
    """SHA-256 over everything the resolution depends on: the input files, the part of pyproject.toml it reads, the
    uv version and the command line. A lock whose header carries another digest is stale."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ours = {"name": project["name"], "requires-python": project.get("requires-python"),
            "dependencies": project.get("dependencies", []),
            "extras": {e: project["optional-dependencies"][e] for e in image.extras}}
    h = hashlib.sha256()
    for part in (image.requirements, image.constraints, *([image.overrides] if image.overrides else []), SETTINGS):
        h.update(part.encode() + b"\0" + (ROOT / part).read_bytes() + b"\0")
    h.update(json.dumps(ours, sort_keys=True).encode() + b"\0")
    h.update(f"uv {uv_pin()} {shlex.join(compile_args(image))}".encode())
    return h.hexdigest()


def lock_files(image: Image) -> dict[str, str]:
    """{kind: path relative to the root} of the files one image's resolution is written to."""
    files = {"runtime": f"{LOCK_DIR}/{image.name}.txt", "build": f"{LOCK_DIR}/{image.name}-build.txt"}
    if image.source_builds:
        files["source"] = f"{LOCK_DIR}/{image.name}-source.txt"
    return files


def render(image: Image, uv_output: str) -> dict[str, str]:
    """{path: text} of the lock files of one image from uv's output."""
    entries = parse(uv_output)
    sources = {canonical(s) for s in image.source_builds}
    absent = sorted(sources - {e.name for e in entries})
    if absent:
        raise LockError(f"{image.name}: source builds {absent} are not in the resolution (drop them from the table)")
    build = closure(entries, image.build_roots)
    files = lock_files(image)
    parts = {
        "runtime": ([e for e in entries if e.name not in sources],
                    "every package the runtime stage installs from the registry: binary wheels, hash-checked, no "
                    "resolution (pip install --require-hashes --no-deps --only-binary :all: -r)"),
        "build": ([e for e in entries if e.name in build and e.name not in sources],
                  f"what the builder stage installs before it compiles: {', '.join(image.build_roots)} and what they "
                  f"depend on (a subset of {files['runtime']})"),
    }
    if sources:
        parts["source"] = ([e for e in entries if e.name in sources],
                           "the source distributions the builder stage compiles into wheels (pip wheel "
                           "--require-hashes --no-deps --no-binary :all:); the runtime installs those wheels")
    inputs = [image.requirements, image.constraints, *([image.overrides] if image.overrides else []), SETTINGS,
              "pyproject.toml ([project] dependencies" + "".join(f", extra `{e}`" for e in image.extras) + ")"]
    out = {}
    for kind, (chosen, what) in parts.items():
        header = [
            f"# {files[kind]}: lock of the {image.title} ({image.dockerfile}), GENERATED by `make lock`",
            "# (scripts/lock_images.py); do not edit: change the inputs and run it again",
            "# (docs/images.md, \"Change a pin\").",
            *textwrap.wrap(f"This file: {what}.", 114, initial_indent="# ", subsequent_indent="# "),
            f"# {len(chosen)} of the {len(entries)} packages of one resolution for Python {image.python} on "
            f"{image.platform} (the base image's glibc).",
            f"# inputs: {', '.join(inputs)}",
            f"# inputs sha256: {inputs_digest(image)}",
            f"# command: uv {shlex.join(compile_args(image))}   (uv {uv_pin()})",
            "",
        ]
        out[files[kind]] = "\n".join(header) + "".join(e.text for e in chosen)
    return out


def header_digest(text: str) -> str | None:
    m = re.search(r"^# inputs sha256: ([0-9a-f]{64})$", text, re.M)
    return m.group(1) if m else None


# ----------------------------------------------------------------------------------------------------------------
# make lock / --check


def committed_resolution(image: Image) -> str:
    """The committed lock of `image` as one resolution (runtime and source files; the build file is a subset)."""
    files = lock_files(image)
    paths = [ROOT / files[kind] for kind in ("runtime", "source") if kind in files]
    return "".join(p.read_text() for p in paths if p.exists())


def generate(names: list[str], keep_committed: bool = False) -> dict[str, str]:
    """{path: text} of the locks of `names`: a fresh resolution, or (`keep_committed`) one that keeps each committed
    pin the inputs and the registry still admit."""
    uv = uv_binary()
    prefer = {n: committed_resolution(IMAGES[n]) if keep_committed else "" for n in names}
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        outputs = list(pool.map(lambda n: resolve(IMAGES[n], uv, prefer[n]), names))
    files: dict[str, str] = {}
    for name, output in zip(names, outputs):
        files.update(render(IMAGES[name], output))
    return files


def versions(text: str) -> dict[str, str]:
    pins = re.finditer(r"^([A-Za-z0-9][\w.-]*)==(\S+?)(?: \\)?$", text, re.M)
    return {canonical(m.group(1)): m.group(2) for m in pins}


def describe_drift(path: str, committed: str, fresh: str) -> str:
    """What differs between a committed lock and its re-resolution: package versions first, then the text."""
    old, new = versions(committed), versions(fresh)
    lines = [f"{path} is stale (run `make lock`):"]
    for name in sorted(old.keys() | new.keys()):
        if old.get(name) != new.get(name):
            lines.append(f"  {name}: {old.get(name, '(absent)')} committed, {new.get(name, '(absent)')} resolved")
    if header_digest(committed) != header_digest(fresh):
        lines.append("  inputs changed since the lock was written (inputs sha256 differs)")
    def text(s: str) -> list[str]:  # the hashes follow the versions; leaving them out keeps the diff readable
        return [line for line in s.splitlines() if not line.lstrip().startswith("--hash=")]

    diff = list(difflib.unified_diff(text(committed), text(fresh), f"{path} (committed)", f"{path} (resolved now)",
                                     n=1, lineterm=""))
    lines += diff[:120] + ([f"  ... {len(diff) - 120} more diff lines"] if len(diff) > 120 else [])
    return "\n".join(lines)


def check(names: list[str]) -> list[str]:
    """Problems (one text each) of the committed locks of `names`; [] when current. The inputs are resolved again with
    the committed pins preferred: a lock is stale when that resolution moves a pin or a hash (an input changed, a
    pinned file left the registry), not because the registry shows a release it did not show when the lock was
    written (a mirror that lagged behind `exclude-newer`'s date; `make lock` takes such releases)."""
    problems = []
    fresh = generate(names, keep_committed=True)
    for path, text in fresh.items():
        committed = (ROOT / path).read_text() if (ROOT / path).exists() else ""
        if committed != text:
            problems.append(describe_drift(path, committed, text) if committed else f"{path} is missing (make lock)")
    expected = set(fresh)
    for name in names:
        for stray in sorted((ROOT / LOCK_DIR).glob(f"{name}*.txt")):
            rel = str(stray.relative_to(ROOT))
            if rel not in expected and re.fullmatch(rf"{re.escape(name)}(-\w+)?\.txt", stray.name):
                problems.append(f"{rel}: not written by `make lock` any more; delete it")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", action="append", choices=sorted(IMAGES), help="only this image (repeatable)")
    parser.add_argument("--check", action="store_true", help="resolve again and compare; write nothing")
    args = parser.parse_args(argv)
    names = args.image or list(IMAGES)
    try:
        if args.check:
            problems = check(names)
            for p in problems:
                print(p, file=sys.stderr)
            if not problems:
                print(f"locks up to date: {', '.join(names)}")
            return 1 if problems else 0
        files = generate(names)
    except LockError as exc:
        print(f"lock_images: {exc}", file=sys.stderr)
        return 2
    (ROOT / LOCK_DIR).mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        (ROOT / path).write_text(text)
        print(f"wrote {path} ({len(versions(text))} packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

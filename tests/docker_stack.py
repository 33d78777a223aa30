"""Read the image definitions (docker/) the way the tests need them: constraints files, lock files, build-argument
files, and the `pip install` / `apt-get install` commands of each Dockerfile with its build arguments substituted.

Shared by tests/test_docker.py (the Dockerfiles) and tests/test_image_locks.py (the locks and their inputs).
"""

from __future__ import annotations

import fnmatch
import io
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dockerfile_parse import DockerfileParser
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"

TRAIN = DOCKER / "Dockerfile"
EVAL = DOCKER / "Dockerfile.eval"
REPRO_ARGS = DOCKER / "repro.args"
VALUES = ROOT / "charts" / "dapo" / "values.yaml"
REFERENCE_VERL_COMMIT = "4f80e465c2ec79ab9c3c30ec74b9745de61d0490"

EFA_ARGS = DOCKER / "efa.args"
# stack -> (Dockerfile, build arguments (None: read docker/repro.args; a path: read that file), constraints file, lock)
STACKS = {
    "train": (TRAIN, {}, DOCKER / "constraints.txt", "train"),
    "train-repro": (TRAIN, None, DOCKER / "constraints-repro.txt", "repro"),  # build args from docker/repro.args
    "train-efa": (TRAIN, EFA_ARGS, DOCKER / "constraints.txt", "train"),  # the EFA variant: the same lock
    "eval": (EVAL, {}, DOCKER / "constraints-eval.txt", "eval"),
}
LOCK_DIR = DOCKER / "locks"


class StackError(ValueError):
    """A docker/ file that does not follow the rules; the message names the file and line."""


# --------------------------------------------------------------------------------------------------------------
# constraints files


@dataclass(frozen=True)
class Pin:
    name: str  # canonical name
    version: str
    line: int


def read_constraints(path: Path) -> dict[str, Pin]:
    """`name==version` lines (comments allowed) -> {canonical name: Pin}. Anything else is an error: a constraints
    file that is the single list of versions must not hold ranges, URLs, extras or duplicates."""
    pins: dict[str, Pin] = {}
    for lineno, raw in enumerate(path.read_text().splitlines(), start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        where = f"{path.relative_to(ROOT)}:{lineno}"
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise StackError(f"{where}: not a requirement: {text!r} ({exc})") from exc
        if req.url or req.extras or req.marker:
            raise StackError(f"{where}: {text!r}: constraints carry only name==version (no URL, extras, markers)")
        specs = list(req.specifier)
        if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
            raise StackError(f"{where}: {text!r} is not an exact pin (name==version)")
        name = canonicalize_name(req.name)
        if name in pins:
            raise StackError(f"{where}: {req.name} pinned twice (first on line {pins[name].line})")
        pins[name] = Pin(name, specs[0].version, lineno)
    return pins


@dataclass(frozen=True)
class Locked:
    name: str  # canonical name
    version: str
    hashes: tuple[str, ...]  # sha256 hex digests
    line: int = field(compare=False)


def read_lock(path: Path) -> dict[str, Locked]:
    """A hash-checking requirements file (what `pip install --require-hashes -r` reads) -> {canonical name: Locked}.
    Every requirement must be `name==version` with at least one `--hash=sha256:...`, as pip's hash-checking mode
    demands; anything else (a range, an unhashed line, a URL, an option line, a duplicate) is an error."""
    text = path.read_text()
    entries: dict[str, Locked] = {}
    logical, start = "", 0
    for lineno, raw in enumerate(text.splitlines() + [""], start=1):
        line = raw.split(" #", 1)[0] if not raw.lstrip().startswith("#") else ""
        if not logical:
            start = lineno
        if line.rstrip().endswith("\\"):
            logical += line.rstrip()[:-1] + " "
            continue
        logical += line
        words, logical = logical.split(), ""
        if not words:
            continue
        where = f"{path.relative_to(ROOT)}:{start}"
        hashes = tuple(w.split(":", 1)[1] for w in words[1:] if w.startswith("--hash=sha256:"))
        if words[0].startswith("-") or len(hashes) != len(words) - 1:
            raise StackError(f"{where}: {' '.join(words)[:80]!r}: only `name==version --hash=sha256:...` lines")
        try:
            req = Requirement(words[0])
        except InvalidRequirement as exc:
            raise StackError(f"{where}: not a requirement: {words[0]!r} ({exc})") from exc
        specs = list(req.specifier)
        if req.url or req.marker or len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
            raise StackError(f"{where}: {words[0]!r} is not an exact pin (name==version)")
        if not hashes:
            raise StackError(f"{where}: {words[0]} has no --hash (pip --require-hashes refuses it)")
        name = canonicalize_name(req.name)
        if name in entries:
            raise StackError(f"{where}: {req.name} locked twice (first on line {entries[name].line})")
        entries[name] = Locked(name, specs[0].version, hashes, start)
    return entries


def lock_paths(stack: str) -> dict[str, Path]:
    """{kind: path} of a stack's lock files that exist: runtime (<lock>.txt), build, source."""
    name = STACKS[stack][3]
    paths = {"runtime": LOCK_DIR / f"{name}.txt", "build": LOCK_DIR / f"{name}-build.txt",
             "source": LOCK_DIR / f"{name}-source.txt"}
    return {kind: path for kind, path in paths.items() if path.exists()}


def resolved(stack: str) -> dict[str, Locked]:
    """The whole resolution of a stack: its runtime lock and the source distributions its builder compiles."""
    paths = lock_paths(stack)
    out = dict(read_lock(paths["runtime"]))
    if "source" in paths:
        out.update(read_lock(paths["source"]))
    return out


def read_args_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a build-argument file (docker/build.sh --args), comments and blank lines skipped."""
    args: dict[str, str] = {}
    for lineno, raw in enumerate(path.read_text().splitlines(), start=1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        if "=" not in raw:
            raise StackError(f"{path.relative_to(ROOT)}:{lineno}: {raw!r} is not KEY=VALUE")
        key, value = raw.split("=", 1)
        args[key.strip()] = value
    return args


# --------------------------------------------------------------------------------------------------------------
# Dockerfiles

_VAR = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:[-+])?(?P<word>[^{}]*(?:\{[^{}]*\}[^{}]*)*)\}"
                  r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")


def expand(text: str, variables: dict[str, str], *, keep_unknown: bool = True) -> str:
    """Substitute ${V}, $V, ${V:-word}, ${V:+word} (nested once) the way Docker and the shell do for build args."""

    def sub(match: re.Match) -> str:
        name = match.group("braced") or match.group("plain")
        if name not in variables:
            if match.group("op") == ":-":
                return expand(match.group("word"), variables, keep_unknown=keep_unknown)
            if match.group("op") == ":+":
                return ""
            return match.group(0) if keep_unknown else ""
        value = variables[name]
        if match.group("op") == ":-":
            return value if value else expand(match.group("word"), variables, keep_unknown=keep_unknown)
        if match.group("op") == ":+":
            return expand(match.group("word"), variables, keep_unknown=keep_unknown) if value else ""
        return value

    previous = None
    while previous != text:
        previous, text = text, _VAR.sub(sub, text)
    return text


def _arg_default(value: str) -> tuple[str, str | None]:
    if "=" not in value:
        return value.strip(), None
    key, default = value.split("=", 1)
    default = default.strip()
    if len(default) >= 2 and default[0] == default[-1] and default[0] in "'\"":
        default = default[1:-1]
    return key.strip(), default


@dataclass
class Instruction:
    stage: str
    kind: str  # RUN, COPY, FROM, LABEL, USER, ...
    raw: str  # the instruction's value as written
    value: str  # with build arguments substituted
    line: int  # 1-based


@dataclass
class Dockerfile:
    path: Path
    build_args: dict[str, str] = field(default_factory=dict)
    instructions: list[Instruction] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)  # stage names in order ("" for unnamed)
    base_images: dict[str, str] = field(default_factory=dict)  # stage -> base (image reference or earlier stage)
    arg_values: dict[str, dict[str, str]] = field(default_factory=dict)  # stage -> effective ARG values
    global_args: dict[str, str] = field(default_factory=dict)  # ARGs before the first FROM

    @property
    def final_stage(self) -> str:
        return self.stages[-1]

    def where(self, ins: Instruction) -> str:
        return f"{self.path.relative_to(ROOT)}:{ins.line}"


def parse_dockerfile(path: Path, build_args: dict[str, str] | None = None) -> Dockerfile:
    """Parse with dockerfile-parse, then apply Docker's ARG scoping: global ARGs (before the first FROM) are visible
    in FROM lines; inside a stage an ARG must be (re)declared, and takes the build argument if given, else its
    default (a bare redeclaration inherits the global default)."""
    build_args = dict(build_args or {})
    parser = DockerfileParser(fileobj=io.BytesIO(path.read_bytes()), env_replace=False)
    df = Dockerfile(path=path, build_args=build_args)
    global_args = df.global_args
    stage = None
    scope: dict[str, str] = {}
    for item in parser.structure:
        kind, raw, line = item["instruction"], item["value"], item["startline"] + 1
        if kind == "COMMENT":
            continue
        if kind == "ARG":
            key, default = _arg_default(raw)
            if stage is None:
                value = build_args.get(key, expand(default or "", global_args))
                global_args[key] = value
            else:
                value = build_args.get(key, expand(default, scope) if default is not None else global_args.get(key, ""))
                scope[key] = value
            continue
        if kind == "FROM":
            value = expand(raw, global_args)
            parts = value.split()
            image = parts[0]
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else f"stage{len(df.stages)}"
            stage = name
            df.stages.append(name)
            df.base_images[name] = image
            scope = {}
            df.instructions.append(Instruction(name, kind, raw, value, line))
            df.arg_values[name] = scope
            continue
        if stage is None:
            raise StackError(f"{path.relative_to(ROOT)}:{line}: {kind} before the first FROM")
        df.instructions.append(Instruction(stage, kind, raw, expand(raw, scope), line))
    return df


# --------------------------------------------------------------------------------------------------------------
# shell commands inside RUN

_SEPARATORS = {"&&", "||", ";", "|", "&", "then", "do", "else", "fi", "done"}
_PIP_OPTS_WITH_VALUE = {
    "-c", "--constraint", "-r", "--requirement", "-f", "--find-links", "-w", "--wheel-dir", "--only-binary",
    "--no-binary", "--target", "-t", "-i", "--index-url", "--extra-index-url", "--platform", "--python-version",
    "--report", "--prefix", "--root", "-e", "--editable",
}


def run_commands(ins: Instruction) -> list[list[str]]:
    """The simple commands of a RUN instruction as word lists: split like the shell on && || ; | & (quotes respected,
    so `FLASH_ATTN_CUDA_ARCHS="80;90"` stays one word) and on the keywords then/do/else; mount flags dropped."""
    text = re.sub(r"^(--[a-z]+=\S+\s+)+", "", ins.value.strip())
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError as exc:
        raise StackError(f"line {ins.line}: cannot split {text!r}: {exc}") from exc
    commands, current = [], []
    for tok in tokens:
        if tok in _SEPARATORS:
            if current:
                commands.append(current)
            current = []
        else:
            current.append(tok)
    if current:
        commands.append(current)
    return commands


@dataclass
class PipInstall:
    where: str
    stage: str
    subcommand: str  # install | wheel
    constraints: list[str]  # the -c arguments
    requirements: list[str]  # requirement tokens (names or local paths)
    options: list[str]
    requirement_files: list[str] = field(default_factory=list)  # the -r arguments


def pip_commands(df: Dockerfile) -> list[PipInstall]:
    found = []
    for ins in df.instructions:
        if ins.kind != "RUN":
            continue
        for words in run_commands(ins):
            # `pip install`, `python -m pip install`, `/opt/venv/bin/python -m pip wheel` ...
            for i, word in enumerate(words):
                if (word == "pip" or word.endswith("/pip")) and i + 1 < len(words) and words[i + 1] in ("install", "wheel"):
                    rest, sub = words[i + 2:], words[i + 1]
                    break
                if word == "-m" and i + 2 < len(words) and words[i + 1] == "pip" and words[i + 2] in ("install", "wheel"):
                    rest, sub = words[i + 3:], words[i + 2]
                    break
            else:
                continue
            constraints, requirements, options, files = [], [], [], []
            j = 0
            while j < len(rest):
                tok = rest[j]
                if tok.startswith("-"):
                    key = tok.split("=", 1)[0]
                    if key in _PIP_OPTS_WITH_VALUE and "=" not in tok:
                        value = rest[j + 1] if j + 1 < len(rest) else ""
                        j += 1
                    else:
                        value = tok.split("=", 1)[1] if "=" in tok else ""
                    if key in ("-c", "--constraint"):
                        constraints.append(value)
                    if key in ("-r", "--requirement"):
                        files.append(value)
                    options.append(key)
                    if value and key in ("--only-binary", "--no-binary"):
                        options.append(f"{key}={value}")
                else:
                    requirements.append(tok)
                j += 1
            found.append(PipInstall(df.where(ins), ins.stage, sub, constraints, requirements, options, files))
    return found


def is_local_artifact(token: str) -> bool:
    """A wheel or source tree produced inside the build (builder stage) rather than a registry requirement."""
    return token.startswith(("/", ".", "$(ls /wheels/"))


def copied_from(df: Dockerfile, stage: str, image_path: str) -> Path:
    """The build-context file a stage COPYs to `image_path` (e.g. the lock pip receives with -r)."""
    for ins in df.instructions:
        if ins.stage == stage and ins.kind == "COPY":
            parts = ins.value.split()
            if parts and parts[-1] == image_path and len(parts) == 2:
                return ROOT / parts[0]
    raise StackError(f"{df.path.relative_to(ROOT)}: stage {stage!r} reads {image_path} but never COPYs a file there")


def apt_installs(df: Dockerfile) -> list[tuple[Instruction, list[str], list[str]]]:
    """(instruction, packages, options) of every `apt-get install` / `apt install`."""
    found = []
    for ins in df.instructions:
        if ins.kind != "RUN":
            continue
        for words in run_commands(ins):
            for i, word in enumerate(words):
                if word in ("apt-get", "apt") and i + 1 < len(words) and words[i + 1] == "install":
                    rest = words[i + 2:]
                    found.append((ins, [w for w in rest if not w.startswith("-")], [w for w in rest if w.startswith("-")]))
                    break
    return found


# --------------------------------------------------------------------------------------------------------------
# the three stacks


def stack_args(stack: str) -> dict[str, str]:
    args = STACKS[stack][1]
    if isinstance(args, Path):
        return read_args_file(args)
    return read_args_file(REPRO_ARGS) if args is None else args


def stack_dockerfile(stack: str) -> "Dockerfile":
    return parse_dockerfile(STACKS[stack][0], stack_args(stack))


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


# --------------------------------------------------------------------------------------------------------------
# a recording `docker` for the build commands (make images -> docker/build.sh -> docker buildx build)


def fake_digest(tag: str) -> str:
    """The digest the stand-in registry gives the image pushed under `tag` (a real one hashes the manifest)."""
    import hashlib

    return "sha256:" + hashlib.sha256(tag.encode()).hexdigest()


def recording_docker(bin_dir: Path, log: Path) -> Path:
    """A `docker` on PATH that appends its argv to `log` (one argument a line, "END" after each call) and models what
    `docker buildx build --push --metadata-file FILE` leaves behind: FILE holds the build result's metadata as buildx
    writes it (docs/reference/buildx_build.md, --metadata-file), with containerimage.digest the pushed image's digest."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "docker"
    script.write_text(f'''#!{sys.executable}
import json, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from docker_stack import fake_digest
argv = sys.argv[1:]
with open({str(log)!r}, "a") as f:
    f.write("".join(a + "\\n" for a in argv) + "END\\n")
if argv[:2] == ["buildx", "build"] and "--metadata-file" in argv:
    tag = argv[argv.index("--tag") + 1]
    digest = fake_digest(tag) if "--push" in argv else None
    meta = {{"buildx.build.ref": "builder/builder0/x", "containerimage.config.digest": "sha256:" + "c" * 64}}
    if digest:
        meta["containerimage.descriptor"] = {{"digest": digest, "mediaType": "application/vnd.oci.image.index.v1+json"}}
        meta["containerimage.digest"] = digest
    with open(argv[argv.index("--metadata-file") + 1], "w") as f:
        json.dump(meta, f, indent=2)
''')
    script.chmod(0o755)
    return script


# --------------------------------------------------------------------------------------------------------------
# base images and build contexts

_PINNED_IMAGE = re.compile(
    r"^(?P<repo>[a-z0-9]+(?:[._/-][a-z0-9]+)*)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@sha256:(?P<digest>[0-9a-f]{64}))?$")


def assert_pinned_image(ref: str, where: str) -> None:
    """A base image named by an exact release tag (x.y.z) or a digest, never `latest`."""
    m = _PINNED_IMAGE.match(ref)
    assert m, f"{where}: {ref!r} is not an image reference"
    assert m.group("tag") or m.group("digest"), f"{where}: {ref} has neither tag nor digest"
    tag = m.group("tag") or ""
    assert tag != "latest" and "latest" not in tag.split("-"), f"{where}: {ref} uses a moving `latest` tag"
    if not m.group("digest"):
        # without a digest the tag must at least name an exact release (x.y.z), not a moving major/minor tag
        assert re.search(r"\d+\.\d+\.\d+", tag), f"{where}: {ref}: tag {tag!r} is not an exact version"


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether a .dockerignore's patterns (in order, `!` re-includes) leave `path` out of the build context."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        hit = fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(path, pat.replace("**/", "")) or any(
            fnmatch.fnmatch("/".join(path.split("/")[:i]), pat) for i in range(1, path.count("/") + 1))
        if hit:
            ignored = not negate
    return ignored

"""The log follower's small image (docker/Dockerfile.follow, ``make image-follow``, ``logs.image``): the follower and
the start guard start without the ~25 GB training image, because they need only the standard library -- proven by
running exactly the files the Dockerfile copies with a Python that sees no site-packages.

Nothing here builds the image (no Docker engine); the build's own RUN line repeats the import check.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from docker_stack import (
    DOCKER,
    ROOT,
    apt_installs,
    assert_pinned_image,
    dockerignored,
    fake_digest,
    parse_dockerfile,
    pip_commands,
    pyproject,
    recording_docker,
)

FOLLOW = DOCKER / "Dockerfile.follow"
PROGRAMS = ("dapo.cluster.follow", "dapo.cluster.start_guard")  # what the follower Job and the start guard run


def _copies(df) -> list[tuple[list[str], str]]:
    return [(ins.value.split()[:-1], ins.value.split()[-1]) for ins in df.instructions
            if ins.kind == "COPY" and "--from" not in ins.value]


def image_tree(df, dest: Path) -> Path:
    """The image's /opt/dapo as the Dockerfile's COPY lines build it (docker's rules: a file into a directory ending
    in /, a directory's contents into the target), under `dest`; the PYTHONPATH it sets."""
    for sources, target in _copies(df):
        for source in sources:
            src = ROOT / source
            to = dest / target.lstrip("/")
            if src.is_dir():
                for f in src.rglob("*.py"):
                    (to / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
                    (to / f.relative_to(src)).write_bytes(f.read_bytes())
            else:
                out = to / src.name if target.endswith("/") else to
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(src.read_bytes())
    (env_line,) = [ins.value for ins in df.instructions if ins.kind == "ENV" and "PYTHONPATH=" in ins.value]
    pythonpath = env_line.split("PYTHONPATH=")[1].split()[0]
    return dest / pythonpath.lstrip("/")


def test_the_copied_files_run_the_follower_and_the_start_guard_with_the_standard_library_alone(tmp_path):
    """`python -S` (no site-packages: no torch, no yaml, no kubernetes client) on the copied tree: both programs
    import and print their usage. A module of theirs that imports a third-party package, or one the Dockerfile does
    not copy, fails here."""
    path = image_tree(parse_dockerfile(FOLLOW), tmp_path)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(path), "PYTHONDONTWRITEBYTECODE": "1"}
    for program in PROGRAMS:
        proc = subprocess.run([sys.executable, "-S", "-m", program, "--help"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "usage:" in proc.stdout, f"{program}:\n{proc.stderr}"
    # the check can fail: the same run without the train package's runlog module (the attempt-log format)
    (path / "dapo" / "train" / "runlog.py").unlink()
    proc = subprocess.run([sys.executable, "-S", "-m", PROGRAMS[0], "--help"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "runlog" in proc.stderr


def test_the_image_is_a_pinned_base_a_distribution_python_and_a_non_root_user():
    df = parse_dockerfile(FOLLOW)
    bases = [b for b in df.base_images.values() if b not in df.stages]
    assert bases and all("-base-" in b for b in bases), f"{FOLLOW}: not CUDA's base image: {bases}"
    for base in bases:
        assert_pinned_image(base, str(FOLLOW.relative_to(ROOT)))
    # the base image's CUDA release is the training image's (its devel image's bottom layers are the same)
    train = parse_dockerfile(DOCKER / "Dockerfile")
    train_cuda = {b.split(":")[1].split("-")[0] for b in train.base_images.values() if b not in train.stages}
    assert {b.split(":")[1].split("-")[0] for b in bases} == train_cuda
    assert not pip_commands(df), f"{FOLLOW}: pip in an image that needs the standard library only"
    (install,) = apt_installs(df)
    ins, packages, options = install
    assert packages == [f"python{df.arg_values[df.final_stage]['PYTHON_VERSION']}"] and \
        "--no-install-recommends" in options and "rm -rf /var/lib/apt/lists/*" in ins.value
    users = [ins.value for ins in df.instructions if ins.stage == df.final_stage and ins.kind == "USER"]
    assert users and users[-1] == "1000:100", users  # the chart's follower securityContext runs uid 1000 gid 100
    labels = " ".join(ins.raw for ins in df.instructions if ins.kind == "LABEL")
    for key in ("source", "version", "revision"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert df.arg_values[df.final_stage]["VERSION"] == pyproject()["project"]["version"]
    # the RUN line that checks both programs at build time
    assert all(f"python -m {p} --help" in " ".join(i.value for i in df.instructions if i.kind == "RUN")
               for p in PROGRAMS)


def test_the_build_context_holds_what_the_dockerfile_copies_and_nothing_else():
    df = parse_dockerfile(FOLLOW)
    ignore = Path(str(FOLLOW) + ".dockerignore")
    patterns = [ln.strip() for ln in ignore.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    copied = {s for sources, _ in _copies(df) for s in sources}
    for source in copied:
        files = [source] if (ROOT / source).is_file() else [
            str(p.relative_to(ROOT)) for p in (ROOT / source).rglob("*.py")]
        for f in files:
            assert not dockerignored(f, patterns), f"{ignore} excludes {f}, which {FOLLOW.name} copies"
    for other in ("dapo/backends/verl.py", "dapo/loss.py", "pyproject.toml", ".venv/bin/python", "docker/locks/train.txt"):
        assert dockerignored(other, patterns), f"{ignore}: {other} would be sent to the builder"


def test_make_image_follow_builds_the_follower_image_under_its_tag(tmp_path):
    bin_dir, log = tmp_path / "bin", tmp_path / "argv"
    recording_docker(bin_dir, log)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    subprocess.run(["make", "--no-print-directory", "image-follow", "FOLLOW_IMAGE=reg.example.com/ml/dapo-follow"],
                   env=env, capture_output=True, text=True, cwd=ROOT, check=True)
    (call,) = [c.strip("\n").splitlines() for c in log.read_text().split("END\n") if c.strip()]
    assert call[call.index("--file") + 1].endswith("docker/Dockerfile.follow")
    tag = call[call.index("--tag") + 1]
    assert tag == f"reg.example.com/ml/dapo-follow:{pyproject()['project']['version']}" and "--push" not in call


def test_make_images_pins_the_follower_by_digest_and_every_follower_and_start_guard_pod_runs_it(tmp_path):
    """The README's first step writes logs.image beside the two others; with those values the log follower and the
    start guard run the small image by digest while the Ray pods run the training image."""
    bin_dir, log, digests = tmp_path / "bin", tmp_path / "argv", tmp_path / "digests"
    recording_docker(bin_dir, log)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    subprocess.run(["make", "--no-print-directory", "images", "REGISTRY=reg.example.com/ml", f"IMAGE_DIGESTS={digests}"],
                   env=env, capture_output=True, text=True, cwd=ROOT, check=True)
    tag = f"reg.example.com/ml/dapo-follow:{pyproject()['project']['version']}"
    written = yaml.safe_load((digests / "values.yaml").read_text())
    assert written["logs"]["image"] == {"repository": "reg.example.com/ml/dapo-follow",
                                        "tag": pyproject()["project"]["version"], "digest": fake_digest(tag)}
    from k8s_support import VALUES_DIR, helm_objects, user_values

    # `full` (16 GPU nodes: a follower and, without a queue, the start guard), the images as make images wrote them
    files = [VALUES_DIR / "full.yaml", digests / "values.yaml"]
    objects = helm_objects(user_values(files))
    check(objects, f"reg.example.com/ml/dapo-follow@{fake_digest(tag)}")


def check(objects: list[dict], small: str) -> None:
    """The log follower and the start guard run `small`; the Ray pods do not."""
    jobs = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Job"}
    followers = [jobs[n] for n in ("dapo-train-logs", "dapo-train-start")]
    for job in followers:
        spec = job["spec"]["template"]["spec"]
        images = {c["image"] for c in spec.get("initContainers", []) + spec["containers"]}
        assert images == {small}, (job["metadata"]["name"], images)
    ray = {c["image"] for o in objects if o["kind"] == "RayJob"
           for t in [o["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]] for c in t["spec"]["containers"]}
    assert ray and small not in ray and all("/dapo@sha256:" in i for i in ray), ray

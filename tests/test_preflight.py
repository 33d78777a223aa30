"""The preflight's checks (python -m dapo.cluster.preflight) run as processes against temporary directories, as the
chart's preflight pod runs them: the throughput check passes with a floor below this disk's speed and fails, naming
the measured rate, the checkpoint, the floor and faster storage classes, with a floor above it; a claim root the
image's user cannot write fails with the fix, checked as that user (a root run drops to it, as CI runs as root); a
read-only claim root fails the writability check; the driver check reads the kernel module's version file. The
storage floor's units: tests/test_preflight_floor.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import ROOT

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
GIB = 1 << 30


def preflight(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dapo.cluster.preflight", *map(str, args)], env=ENV,
                          capture_output=True, text=True, timeout=120)


def storage(directory, floor: float) -> subprocess.CompletedProcess:
    return preflight("storage", "--dir", directory, "--uid", os.getuid(), "--gid", os.getgid(), "--write-bytes",
                     64 << 20, "--min-bytes-per-second", floor, "--checkpoint-bytes", 488 * GIB,
                     "--seconds-between-saves", 4846)


def test_the_throughput_check_passes_below_this_disks_speed_and_fails_above_it_naming_the_numbers(tmp_path):
    ok = storage(tmp_path, 1e5)  # 0.1 MB/s: any disk
    assert ok.returncode == 0, ok.stderr
    assert f"preflight: storage: {tmp_path} is writable by uid {os.getuid()}" in ok.stdout
    assert "MB/s >= 0 MB/s" in ok.stdout
    slow = storage(tmp_path, 1e13)  # 10 TB/s: no disk
    assert slow.returncode == 1
    msg = slow.stderr
    assert msg.startswith("preflight: storage: measured ") and "MB/s of sequential write" in msg
    for needle in ("checkpoint of 488.0 GiB every 81 min (dapo plan)", "needs at least 10000000 MB/s",
                   "at most 10% of the run's wall time", "FSx for Lustre", "GKE Managed Lustre", "standard-rwx",
                   "preflight.storage.throughput=false"):
        assert needle in msg, (needle, msg)
    assert list(tmp_path.iterdir()) == []  # the test file is removed either way


IMAGE_USER = (1000, 100)  # the chart's storage.fixOwnership uid / gid: the training image's user


def as_image_user(argv: list[str]) -> tuple[int, str]:
    """``dapo.cluster.preflight``'s ``main(argv)`` in a forked child that runs as IMAGE_USER when this test runs as
    root (CI does: root writes into any directory) and as this user otherwise; (exit code, stdout + stderr). A fork,
    not a new interpreter: the venv's python may live where only root can reach it (a pyenv under root's home)."""
    from dapo.cluster import preflight as pf

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root, run the real check, report through the pipe
        code = 2
        try:
            os.close(read)
            if os.getuid() == 0:
                os.setgroups([])
                os.setgid(IMAGE_USER[1])
                os.setuid(IMAGE_USER[0])
            os.dup2(write, 1)
            os.dup2(write, 2)
            sys.stdout = sys.stderr = os.fdopen(write, "w", closefd=False)
            code = pf.main(argv)
            sys.stdout.flush()
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), out


@pytest.fixture
def claim():
    """A claim root every user can reach (pytest's own temporary directories are private to this user)."""
    path = Path(tempfile.mkdtemp(prefix="dapo-claim-"))
    path.chmod(0o755)  # owned by this test's user: the image's user reaches it and cannot write it
    yield path
    path.chmod(0o755)
    shutil.rmtree(path)


def test_a_claim_root_the_image_user_cannot_write_fails_with_the_fix(claim):
    """As the image's user (root drops to it: CI runs as root), on a claim root another user owns; the same root made
    the image user's own passes."""
    uid, gid = IMAGE_USER if os.getuid() == 0 else (os.getuid(), os.getgid())
    if os.getuid() != 0:
        claim.chmod(0o555)
    argv = ["storage", "--dir", str(claim), "--uid", str(uid), "--gid", str(gid), "--write-bytes", "0"]
    code, out = as_image_user(argv)
    assert code == 1, out
    assert f"preflight: storage: the claim's root {claim} is not writable by uid {uid} gid {gid}: " in out, out
    assert "Permission denied" in out
    for fix in ("A root-owned NFS-like export: storage.fixOwnership.enabled=true",
                f"EFS access points, which refuse chown: give the access point the owner {uid}:{gid} instead",
                f"a block or most CSI volumes: podSecurityContext.fsGroup: {gid}"):
        assert fix in out, (fix, out)
    if os.getuid() == 0:
        os.chown(claim, uid, gid)  # the fix: the claim's root owned by the image's user
        code, out = as_image_user(argv)
        assert code == 0 and f"preflight: storage: {claim} is writable by uid {uid} gid {gid}" in out, out


def test_a_read_only_mount_fails_the_writability_check(tmp_path):
    """As root too: a directory on a read-only mount (a claim mounted readOnly, an export without write access)."""
    ro = "/proc/self"  # procfs refuses file creation to everyone
    out = storage(ro, 1e5)
    assert out.returncode == 1, out.stdout
    assert f"the claim's root {ro} is not writable by uid {os.getuid()}" in out.stderr


@pytest.mark.parametrize("text, code, needle", [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:29 UTC 2025\n", 0,
     "NVIDIA driver 580.65.06 (>= 580) on this node"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build\n", 1,
     "NVIDIA driver 550.54.15 is too old: this image's CUDA 13 needs driver >= 580"),
])
def test_the_driver_check_reads_the_kernel_modules_version_without_a_gpu(tmp_path, text, code, needle):
    version = tmp_path / "version"
    version.write_text(text)
    out = preflight("driver", "--min-driver", 580, "--proc-version", version)
    assert out.returncode == code and needle in (out.stdout + out.stderr)
    missing = preflight("driver", "--proc-version", tmp_path / "absent")
    assert missing.returncode == 1 and "no NVIDIA driver is loaded on this node" in missing.stderr

"""The preflight's checks (python -m dapo.cluster.preflight) run as processes against temporary directories, as the
chart's preflight pod runs them: the throughput check passes with a floor below this disk's speed and fails, naming
the measured rate, the checkpoint, the floor and faster storage classes, with a floor above it; a read-only claim
root fails the writability check; the driver check reads the kernel module's version file."""

from __future__ import annotations

import os
import subprocess
import sys

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


@pytest.mark.skipif(os.getuid() == 0, reason="root writes into a read-only directory")
def test_a_claim_root_the_image_user_cannot_write_fails_with_the_fix(tmp_path):
    tmp_path.chmod(0o555)
    try:
        out = storage(tmp_path, 1e5)
    finally:
        tmp_path.chmod(0o755)
    assert out.returncode == 1
    assert f"the claim's root {tmp_path} is not writable by uid {os.getuid()}" in out.stderr
    assert "storage.fixOwnership.enabled=true" in out.stderr and "EFS access points" in out.stderr


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

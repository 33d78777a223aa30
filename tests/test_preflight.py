"""The preflight's checks (python -m dapo.cluster.preflight) run as processes against temporary directories, as the
chart's preflight pod runs them: the throughput check writes with as many parallel writers as the save has ranks and
passes with a floor below this disk's speed and fails, naming the measured aggregate rate, the writers, the
checkpoint, the floor, faster storage classes and the next step, with a floor above it; on a stand-in volume whose
writers are each capped the aggregate grows with the writers and the floor is pinned within a factor of two of the
measured rate; the claim's access modes come from a stand-in API; a claim root the
image's user cannot write fails with the fix, checked as that user (a root run drops to it, as CI runs as root); a
read-only claim root fails the writability check; the driver check reads the kernel module's version file. The
storage floor's units: tests/test_preflight_floor.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import ROOT

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
GIB = 1 << 30


def preflight(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dapo.cluster.preflight", *map(str, args)], env=ENV,
                          capture_output=True, text=True, timeout=120)


def storage(directory, floor: float, streams: int = 8) -> subprocess.CompletedProcess:
    return preflight("storage", "--dir", directory, "--uid", os.getuid(), "--gid", os.getgid(), "--write-bytes",
                     64 << 20, "--streams", streams, "--min-bytes-per-second", floor, "--checkpoint-bytes",
                     393166516224, "--seconds-between-saves", 4846, "--job", "dapo-preflight", "--namespace", "ml")


def test_the_throughput_check_writes_in_parallel_here_and_fails_naming_the_numbers_and_the_next_step(tmp_path):
    ok = storage(tmp_path, 1e5)  # 0.1 MB/s: any disk
    assert ok.returncode == 0, ok.stderr
    assert f"preflight: storage: {tmp_path} is writable by uid {os.getuid()}" in ok.stdout
    rate = float(re.search(r"8 parallel writer\(s\): (\d+) MB/s aggregate >= 0 MB/s", ok.stdout).group(1))
    assert rate > 0
    slow = storage(tmp_path, 1e13)  # 10 TB/s: no disk
    assert slow.returncode == 1
    msg = slow.stderr
    assert msg.startswith("preflight: storage: measured ") and "MB/s aggregate with 8 parallel writer(s)" in msg
    for needle in ("checkpoint of 366.2 GiB, written by 8 ranks at once every 81 min (dapo plan)",
                   "needs at least 10000000 MB/s", "at most 10% of the run's wall time", "FSx for Lustre",
                   "GKE Managed Lustre", "standard-rwx", "preflight.storage.throughput=false",
                   "preflight: next: fix this, then run the same `helm upgrade --install` again",
                   "kubectl -n ml logs job/dapo-preflight --all-containers"):
        assert needle in msg, (needle, msg)
    assert list(tmp_path.iterdir()) == []  # the test files are removed either way


STREAM_CAP = 10e6  # bytes/s of one writer on the stand-in volume below


@pytest.fixture
def capped_volume(monkeypatch):
    """A volume where each writer's fsync takes its file's size / STREAM_CAP (as one NFS or Lustre stream is capped
    while the volume takes many): the measured rate is set by the model, not by this machine's disk. The model's
    fsync does not also flush to the real disk: on a machine whose disk other jobs keep busy that flush took seconds
    and set the rate instead (one writer 9.8 MB/s, sixteen 71 MB/s, under a load average of 10)."""
    from dapo.cluster import preflight as pf

    def fsync(fd):
        time.sleep(os.fstat(fd).st_size / STREAM_CAP)

    monkeypatch.setattr(pf.os, "fsync", fsync)
    return pf


def test_the_writers_run_at_once_so_the_aggregate_rate_grows_with_the_saves_ranks(tmp_path, capped_volume):
    one = capped_volume.write_rate(tmp_path, 16 << 20, 1)
    sixteen = capped_volume.write_rate(tmp_path, 16 << 20, 16)
    assert 0.5 * STREAM_CAP < one <= STREAM_CAP  # one stream: its cap
    assert sixteen > 8 * one, (one, sixteen)  # in turn they would reach one stream's rate again


def test_the_floor_is_pinned_within_a_factor_of_two_of_the_measured_rate(tmp_path, capped_volume):
    import argparse

    rate = capped_volume.write_rate(tmp_path, 32 << 20, 16)

    def check(floor):
        a = argparse.Namespace(claim=None, namespace="ml", dir=tmp_path, uid=os.getuid(), gid=os.getgid(),
                               write_bytes=32 << 20, streams=16, min_bytes_per_second=floor,
                               checkpoint_bytes=393166516224, seconds_between_saves=4846)
        return capped_volume.check_storage(a)

    lines = check(rate / 2)
    assert re.fullmatch(r"16 parallel writer\(s\): \d+ MB/s aggregate >= \d+ MB/s", lines[-1]), lines
    with pytest.raises(capped_volume.PreflightError, match="MB/s aggregate with 16 parallel writer"):
        check(rate * 2)


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


def test_the_claims_access_modes_are_read_from_the_api_and_a_read_write_once_claim_fails(tmp_path, monkeypatch):
    """--claim (the chart passes storage.existingClaim): the claim's modes from the API (a stand-in server)."""
    import argparse

    from api_standin import StandInApi
    from dapo.cluster import preflight as pf
    from dapo.cluster.rayjob_api import RayJobApi

    def claim(name, modes):
        return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": "ml"},
                "spec": {"accessModes": modes, "resources": {"requests": {"storage": "8Ti"}}},
                "status": {"phase": "Bound", "accessModes": modes}}

    api = StandInApi([claim("team-rwx", ["ReadWriteMany"]), claim("team-rwo", ["ReadWriteOnce"])])
    monkeypatch.setattr(RayJobApi, "in_cluster", classmethod(lambda cls, name, ns=None: cls(api.url, ns, name)))
    try:
        def check(name):
            return pf.check_storage(argparse.Namespace(
                claim=name, namespace="ml", dir=tmp_path, uid=os.getuid(), gid=os.getgid(), write_bytes=0, streams=1,
                min_bytes_per_second=0, checkpoint_bytes=0, seconds_between_saves=0))

        assert check("team-rwx")[0] == "claim team-rwx: ReadWriteMany"
        with pytest.raises(pf.PreflightError, match="the claim team-rwo is ReadWriteOnce, not ReadWriteMany"):
            check("team-rwo")
        with pytest.raises(pf.PreflightError, match=r"the claim gone does not exist \(storage.existingClaim\)"):
            check("gone")
        api.forbid("persistentvolumeclaims")
        with pytest.raises(pf.PreflightError, match="cannot read the claim team-rwx's access modes .*HTTP 403"):
            check("team-rwx")
    finally:
        api.close()
    assert "/api/v1/namespaces/ml/persistentvolumeclaims/team-rwo" in api.requests

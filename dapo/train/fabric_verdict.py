"""A failed fabric check is not run again by the retries of the same run: its verdict stays on the shared volume.

KubeRay retries a failed RayJob attempt (``backoffLimit``) whatever the exit code: a run whose fabric is wrong would
otherwise run the check -- and, on a broken fabric, wait on NCCL's timeouts -- once per attempt. The attempt whose
check fails writes ``<run dir>/fabric-check.json`` (:func:`write`); every later attempt reads it first (:func:`read`),
before it joins Ray, and when the verdict is a failure *of the same check* it exits at once (exit 5) naming the file,
the failed attempt's time and its reasons. "The same check" is :func:`check_key`: the declared fabric, the floor, the
recheck token and the run's network environment (``NCCL_*``, ``FI_*``, ``LD_LIBRARY_PATH``); a change of any of them
-- a new cloud file, another ``nccl`` value, a new ``fabric.recheck`` token (``dapo train --fabric-recheck TOKEN``) --
runs the check again. A passing check removes the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Mapping, Optional

VERDICT_FILE = "fabric-check.json"
# the job environment that decides what network NCCL uses (the check's own NCCL_DEBUG_FILE is per process)
_ENV_PREFIXES = ("NCCL_", "FI_", "LD_LIBRARY_PATH")
_ENV_IGNORED = ("NCCL_DEBUG_FILE",)


def verdict_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / VERDICT_FILE


def check_key(expect: str, floor_gbps: Optional[float], recheck: str, environ: Mapping[str, str]) -> str:
    """What makes two attempts' checks the same check: a SHA-256 of the declared fabric, the floor, the recheck
    token and the network environment."""
    env = {k: v for k, v in sorted(environ.items()) if k.startswith(_ENV_PREFIXES) and k not in _ENV_IGNORED}
    text = json.dumps({"expect": expect, "floor_gbps": floor_gbps, "recheck": recheck, "env": env}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def read(run_dir: str | os.PathLike, key: str) -> Optional[dict[str, Any]]:
    """The failed verdict an earlier attempt of this check left, or None (none, passed, another check, unreadable)."""
    path = verdict_path(run_dir)
    try:
        verdict = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(verdict, dict) or verdict.get("passed", True) or verdict.get("key") != key:
        return None
    return verdict


def write(run_dir: str | os.PathLike, key: str, passed: bool, reasons: list[str], expect: str,
          summary: Optional[dict[str, Any]] = None) -> Optional[Path]:
    """Record this attempt's verdict: a failure as ``fabric-check.json`` (written whole, then renamed into place);
    a pass removes an earlier failure. Returns the file written, or None."""
    path = verdict_path(run_dir)
    if passed:
        path.unlink(missing_ok=True)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"passed": False, "key": key, "expect": expect, "reasons": list(reasons),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": os.uname().nodename,
            "summary": summary or {}}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def refusal(path: Path, verdict: dict[str, Any]) -> str:
    """What an attempt prints when it exits at once on an earlier failed verdict."""
    reasons = "; ".join(verdict.get("reasons") or ["(no reason recorded)"])
    return (f"fabric check: not run again: the check of {verdict.get('expect')} failed at {verdict.get('time')} on "
            f"{verdict.get('host')} ({path}): {reasons}. KubeRay's retries of this run exit here. After a fix, check "
            f"again with a new token, --set fabric.recheck=<new token> (dapo train --fabric-recheck TOKEN), or with "
            f"changed fabric settings, or delete {path}")

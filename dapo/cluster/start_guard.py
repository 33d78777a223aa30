"""A run whose pods never started is stopped, not retried blindly: the start guard of a RayJob installed without a
gang scheduler (the chart's ``<release>-train-start`` Job, a Helm post-install / post-upgrade hook).

    python -m dapo.cluster.start_guard --rayjob dapo-train --follower dapo-train-logs --release dapo

What KubeRay v1.7.0 does (``ray-operator/controllers/ray/rayjob_controller.go``): an attempt that is not Running
``preRunningDeadlineSeconds`` after its start fails with ``PreRunningDeadlineExceeded``, and
``checkBackoffLimitAndUpdateStatusIfNeeded`` retries every failure but ``DeadlineExceeded`` and
``JobStatusCheckTimeoutExceeded`` while ``status.failed < backoffLimit + 1``: it deletes the cluster and builds a
new one at once, which schedules as partially as the first. Without a gang scheduler that is up to
``preRunningDeadlineSeconds x (backoffLimit + 1)`` of the scheduled nodes' GPUs held idle (8 h in ``full`` before).

The guard watches the RayJob from the install until its first attempt is Running (then it exits 0: the run
started). If instead an attempt fails before any was Running -- ``status.failed`` goes above 0 while the guard has
never seen ``Running`` -- it deletes the RayJob (KubeRay's finalizer deletes its cluster: every GPU is freed, no
retry is built) and the log follower Job (a new run needs a new follower), prints the causes
(:mod:`dapo.cluster.waits`) and the next step, and exits 1 -- which fails ``helm upgrade --install`` with the hook's
name. Running the same command again after the fix installs the RayJob anew (and the preflight runs again). A
RayJob that has run before (failed attempts when the guard starts, or already Running, finished or suspended) is not
the guard's: it exits 0 at once. Retries after a run has started (a lost node weeks in) stay KubeRay's.

Its RBAC (the chart): ``get`` and ``delete`` on the one RayJob, ``delete`` on the one follower Job, ``list`` on pods
and events (for the causes). Standard library only; imports :mod:`dapo.cluster.rayjob_api` and
:mod:`dapo.cluster.waits`.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Optional

from dapo.cluster.rayjob_api import ApiUnavailable, RayJobApi
from dapo.cluster.waits import Waits

STARTED, STOPPED = 0, 1


def say(text: str) -> None:
    print(f"start-guard: {text}", flush=True)


class StartGuard:
    """One RayJob's start (module doc); :meth:`run` returns the exit code."""

    def __init__(self, api: RayJobApi, *, follower: Optional[str], waits: Optional[Waits], poll: float = 10.0,
                 timeout: float = 0.0):
        self.api, self.follower, self.waits, self.poll, self.timeout = api, follower, waits, poll, timeout

    def explain(self) -> None:
        if self.waits is not None:
            lines, note = self.waits.poll()
            for line in lines:
                say(f"[wait] {line}")
            if note:
                say(note)

    def stop(self, why: str) -> int:
        causes = list(self.waits.current) if self.waits is not None else []
        ns, name = self.api.namespace, self.api.name
        self.api.delete(f"/apis/ray.io/v1/namespaces/{ns}/rayjobs/{name}")
        if self.follower:
            self.api.delete(f"/apis/batch/v1/namespaces/{ns}/jobs/{self.follower}")
        say(f"STOPPED: {why}; the RayJob {name} was deleted (with its cluster: its GPUs are free) instead of KubeRay "
            "building the same partial cluster again")
        for cause in causes[:12]:
            say(f"cause: {cause}")
        say("next: fix the cause (free or add GPU nodes, the image, the claim; dapo doctor names what is missing), "
            "then run the same `helm upgrade --install` again; or queue the run with Kueue (docs/deadlines.md)")
        return STOPPED

    def run(self) -> int:
        first = None
        end = time.monotonic() + self.timeout if self.timeout else None
        while True:
            try:
                s = self.api.get()
            except OSError as exc:  # the API server restarting: look again
                say(f"cannot read the RayJob now ({exc}); retrying")
                time.sleep(self.poll)
                continue
            if s.exists:
                if first is None:
                    first = s
                    if s.failed or s.deployment in ("Running", "Complete", "Failed", "Suspended", "Suspending"):
                        say(f"RayJob {self.api.name} is {s.describe()}: it has started or run before, nothing to "
                            "guard")
                        return STARTED
                    say(f"watching RayJob {self.api.name} until its first attempt runs ({s.describe()})")
                if s.deployment == "Running":
                    say(f"the run started: RayJob {self.api.name} is {s.describe()}")
                    return STARTED
                if s.failed > 0:
                    return self.stop(f"attempt 1 failed before it ran ({s.describe()})")
            elif first is not None:
                say(f"the RayJob {self.api.name} was deleted; nothing to guard")
                return STARTED
            self.explain()
            if end is not None and time.monotonic() > end:
                say(f"no decision in {self.timeout:.0f} s; leaving the RayJob to KubeRay")
                return STARTED
            time.sleep(self.poll)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dapo.cluster.start_guard", description=__doc__.split("\n\n")[0])
    p.add_argument("--rayjob", required=True)
    p.add_argument("--follower", default=None, help="the RayJob's log follower Job, deleted with it")
    p.add_argument("--namespace", default=None, help="default: the pod's service-account namespace")
    p.add_argument("--api-server", default=None, help="API server URL (default: in-cluster)")
    p.add_argument("--release", default=None, help="the Helm release: name the causes from its pods and events")
    p.add_argument("--kind", default="train", choices=["train", "eval"])
    p.add_argument("--claim", default=None)
    p.add_argument("--poll", type=float, default=10.0, help="seconds between looks")
    p.add_argument("--timeout", type=float, default=0.0, help="give up (exit 0) after this many seconds; 0: never")
    a = p.parse_args(argv)
    try:
        api = (RayJobApi(a.api_server, a.namespace or "default", a.rayjob) if a.api_server
               else RayJobApi.in_cluster(a.rayjob, a.namespace))
        waits = Waits(api, release=a.release, kind=a.kind, claim=a.claim) if a.release else None
        return StartGuard(api, follower=a.follower, waits=waits, poll=a.poll, timeout=a.timeout).run()
    except ApiUnavailable as exc:
        say(f"{exc}; the guard cannot watch the RayJob (KubeRay's retries apply)")
        return STARTED


if __name__ == "__main__":
    sys.exit(main())

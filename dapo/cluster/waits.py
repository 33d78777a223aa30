"""Why a run is not running yet, from the Kubernetes API: what the log follower (:mod:`dapo.cluster.follow`) prints
until the current attempt's driver log exists, so that ``kubectl logs -f job/<release>-train-logs`` explains every
wait instead of staying silent.

Read, every ``every`` seconds (about 30), with the follower's read-only, namespaced identity (``list`` on pods and
events, ``get`` on the RayJob; the chart's Role ``<release>-logs``):

- the RayJob's status and attempt (``jobDeploymentStatus``, ``status.failed``; :mod:`~dapo.cluster.rayjob_api`);
- the run's pods (the chart's labels: ``app.kubernetes.io/instance=<release>`` and a component of the RayJob --
  ``train-head``, ``train-worker``, ``train-submitter``) that are not Running, and why: unschedulable (Insufficient
  ``nvidia.com/gpu``, an unbound claim: the scheduler's PodScheduled message), a container or init container waiting
  in ImagePullBackOff / ErrImagePull (the image and the registry's message), CrashLoopBackOff (the exit code and its
  last lines: the chart's init containers use ``terminationMessagePolicy: FallbackToLogsOnError``), or any other
  waiting reason;
- the Warning events of those pods, of the claim, of the RayJob and of its Kueue Workload (FailedScheduling,
  FailedMount, FailedPostStartHook -- the GPU driver check --, ProvisioningFailed, Failed pulls, Pending on quota).

Each cause is one line; a line is printed once, when it first appears (counts and ages are left out of it so that a
repeated event is not news). :meth:`Waits.current` is the latest set, which the follower names when the run fails
before its driver started. Without the permission to list pods or events it says so once and stops asking.

Standard library only; imports :mod:`dapo.cluster.rayjob_api`.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Optional

from dapo.cluster.rayjob_api import ApiUnavailable, RayJobApi

WAITING_QUIET = ("ContainerCreating", "PodInitializing")  # the normal start of a container: not a cause
MESSAGE = 400  # characters of a message kept in a line


def _short(text: str) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= MESSAGE else text[:MESSAGE] + " ..."


def pod_causes(pod: dict) -> list[str]:
    """Why one pod is not Running, one line per cause (none for a Running pod whose containers all run)."""
    meta, spec, st = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    name, phase = meta.get("name", "?"), st.get("phase") or "Pending"
    images = {c.get("name"): c.get("image") for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])}
    out = []
    for cond in st.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            out.append(f"pod {name} is not scheduled: {cond.get('reason') or 'Unschedulable'}: "
                       f"{_short(cond.get('message'))}")
    statuses = [("init container", c) for c in st.get("initContainerStatuses") or []]
    statuses += [("container", c) for c in st.get("containerStatuses") or []]
    for what, c in statuses:
        waiting = (c.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason") or ""
        if not reason or reason in WAITING_QUIET:
            continue
        line = f"pod {name}: {what} {c.get('name')} {reason}"
        if reason in ("ImagePullBackOff", "ErrImagePull", "InvalidImageName"):
            line += f": image {c.get('image') or images.get(c.get('name'))}: {_short(waiting.get('message'))}"
        elif reason == "CrashLoopBackOff":
            last = ((c.get("lastState") or {}).get("terminated")) or {}
            line += f" (exit code {last.get('exitCode', '?')}, {c.get('restartCount', 0)} restarts)"
            if last.get("message"):
                line += f"; its last lines: {_short(last['message'])}"
        elif waiting.get("message"):
            line += f": {_short(waiting['message'])}"
        out.append(line)
    if phase == "Failed":
        out.append(f"pod {name} failed: {st.get('reason') or ''} {_short(st.get('message'))}".rstrip())
    return out


def event_line(ev: dict) -> str:
    obj = ev.get("involvedObject") or {}
    return f"{obj.get('kind', '?')} {obj.get('name', '?')}: {ev.get('reason', '?')}: {_short(ev.get('message'))}"


class Waits:
    """The causes of a wait, read on demand (:meth:`poll`); see the module doc."""

    def __init__(self, api: RayJobApi, *, release: str, kind: str, claim: Optional[str] = None):
        self.api, self.kind, self.claim = api, kind, claim
        components = ",".join(f"{kind}-{c}" for c in ("head", "worker", "submitter"))
        self.selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component in ({components})"
        self.printed: set[str] = set()
        self.current: list[str] = []
        self.disabled = False

    def poll(self) -> tuple[list[str], Optional[str]]:
        """(new lines to print, a note when the API cannot be read); updates :attr:`current`."""
        if self.disabled:
            return [], None
        try:
            pods = self.api.list_json("pods", "labelSelector=" + urllib.parse.quote(self.selector))
            events = self.api.list_json("events", "fieldSelector=type%3DWarning")  # the API server filters
        except ApiUnavailable as exc:
            self.disabled = True
            return [], f"{exc}; waits are not explained, the run's logs still are"
        except OSError as exc:
            return [], f"cannot list pods or events now ({exc}); retrying"
        names = {(p.get("metadata") or {}).get("name") for p in pods}
        causes = [line for p in pods for line in pod_causes(p)]
        watched = {("Pod", n) for n in names} | {("RayJob", self.api.name)}
        if self.claim:
            watched.add(("PersistentVolumeClaim", self.claim))
        # Kueue's Workload of the RayJob, rayjob-<name>-<5 characters of a hash> (pending on quota, not admitted)
        workload = re.compile(f"rayjob-{re.escape(self.api.name)}-[0-9a-z]{{5}}")
        for ev in events:
            obj = ev.get("involvedObject") or {}
            ours = (obj.get("kind"), obj.get("name")) in watched or (
                obj.get("kind") == "Workload" and workload.fullmatch(str(obj.get("name", ""))))
            if ev.get("type") == "Warning" and ours:
                causes.append(event_line(ev))
        self.current = causes
        new = [c for c in dict.fromkeys(causes) if c not in self.printed]
        self.printed.update(new)
        return new, None

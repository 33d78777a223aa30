"""Why a run is not running yet -- and, once its driver runs, what is happening to its pods -- from the Kubernetes
API: what the log follower (:mod:`dapo.cluster.follow`) prints, so that ``kubectl logs -f job/<release>-train-logs``
names every cause instead of staying silent.

Read, every ``every`` seconds (about 30), with the follower's read-only, namespaced identity (``list`` on pods and
events, ``get`` on the RayJob; the chart's Role ``<release>-logs``):

- the run's pods (the chart's labels: ``app.kubernetes.io/instance=<release>`` and a component of the RayJob --
  ``train-head``, ``train-worker``, ``train-submitter``) and why each is not running or was disrupted: unschedulable
  (the scheduler's PodScheduled message), a container or init container waiting (ImagePullBackOff / ErrImagePull
  with the image and the registry's message, CrashLoopBackOff with the exit code and its last lines), a container
  that restarted and why it last ended (``lastState``: OOMKilled, Error and its exit code), a pod being removed
  (the ``DisruptionTarget`` condition: preemption, a lost node's taint, an eviction), a failed pod (Evicted, ...);
- the namespace's events of those pods, of the claim, of the RayJob and of its Kueue Workload: every Warning
  (FailedMount, FailedPostStartHook -- the GPU driver check --, ProvisioningFailed, Pending on quota, ...) and the
  Normal events that explain a wait or a disruption (:data:`NORMAL_REASONS`: the cluster autoscaler's
  ``TriggeredScaleUp`` / ``NotTriggerScaleUp`` / ``ScaleDown``, Karpenter's ``Nominated`` / ``Evicted`` /
  ``Disrupted``, the scheduler's ``Preempted``, the taint manager's ``TaintManagerEviction``); a pod's event that
  repeats what its status already says (FailedScheduling, a failed pull) is left out.

A status that gives the symptom keeps its cause: the kubelet's ``ImagePullBackOff`` says only ``Back-off pulling
image "<image>"``, and the registry's answer (``429 Too Many Requests``, ``401 Unauthorized``, ``not found``) is in
the pod's Warning event ``Failed`` -- ``Failed to pull image "<image>": <the runtime's error>`` -- that the last pull
left. So a Back-off line carries the latest such event's error of the same image in the place of the Back-off sentence:
``container ray-worker ImagePullBackOff: image <image>: the last pull failed: failed to pull and unpack image ... 429
Too Many Requests - Server message: toomanyrequests: ...``. The kubelet's other Warning ``Failed`` events of a pull, ``Error:
ErrImagePull`` and ``Error: ImagePullBackOff``, name only the status reason and are never taken for the cause. (The
texts: Kubernetes ``pkg/kubelet/images/image_manager.go`` ``EnsureImageExists`` -- ``Failed to pull image %q: %v``
(Warning ``Failed``), ``Back-off pulling image %q`` (Normal ``BackOff``, and the status message) --, and
``pkg/kubelet/kuberuntime/kuberuntime_container.go`` ``startContainer`` -- ``Error: %v`` of the status reason
(Warning ``Failed``).)

Concise. A message keeps its decisive part: long messages (a registry's error chain) keep their head and their end,
where Go's wrapped errors put the root cause, and an HTTP status in the middle (``429 Too Many Requests``) is kept
too; digests are shortened. One cause over many pods is one line: ``16 worker pods: not scheduled: Unschedulable:
0/18 nodes are available: 16 Insufficient nvidia.com/gpu``. A cause is printed once, when it first appears: counts
and numbers in it do not make it new (``0/18`` -> ``0/20`` nodes is the same cause). :meth:`Waits.poll` returns the
new lines and keeps the current set (:attr:`Waits.current`), which the follower names when the run fails; with
``running=True`` (a driver runs) only disruptions are news -- a lost node, an OOM-killed, evicted or preempted
worker, a restart -- and :attr:`Waits.disruptions` keeps them for the run's last line. Disruptions are an
attempt's own: :meth:`Waits.new_attempt` (a retry's driver starts, on a new RayCluster) forgets the last attempt's, so
the same cause in the next attempt is news again and an earlier attempt's cause is never named as a later one's.
Without the permission to list pods or events it says so once and stops asking.

Sources of the reason strings: cluster-autoscaler 1.36.1 ``processors/status/eventing_scale_up_processor.go`` and
``core/scaleup/orchestrator/skippedreasons.go`` (``max node group size reached``); Karpenter v1.14.1
``pkg/events/reason.go``; Kubernetes' scheduler preemption (``Preempted``) and taint-eviction controller
(``TaintManagerEviction``); the ``DisruptionTarget`` condition's reasons of Kubernetes >= 1.26.

Standard library only; imports :mod:`dapo.cluster.rayjob_api`.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from typing import Optional

from dapo.cluster.rayjob_api import ApiUnavailable, RayJobApi

WAITING_QUIET = ("ContainerCreating", "PodInitializing")  # the normal start of a container: not a cause
IMAGE_WAITING = ("ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull")
MESSAGE = 300  # characters of a message kept in a line: its head and its end
HEAD = 100
# Normal events that explain a wait or a disruption (module doc); every other Normal event is the ordinary life of a
# pod (Scheduled, Pulling, Created, Started, Killing)
NORMAL_REASONS = ("TriggeredScaleUp", "NotTriggerScaleUp", "ScaleDown", "Nominated", "Evicted", "Disrupted",
                  "Preempted", "TaintManagerEviction")
# a pod's events that repeat what its status says (the event's reason -> how the status cause begins): the
# scheduler's condition, the kubelet's pull and back-off, a removal the DisruptionTarget condition names
REPEATS_STATUS = {"FailedScheduling": "not scheduled", "Failed": ("container", "init container"),
                  "BackOff": ("container", "init container"), "Preempted": "being removed",
                  "TaintManagerEviction": "being removed", "Evicted": "being removed", "Disrupted": "being removed"}
# what disrupts a running attempt (news while its driver runs)
DISRUPTIVE_EVENTS = ("Preempted", "TaintManagerEviction", "Evicted", "Disrupted", "NodeNotReady", "ScaleDown",
                     "Killing", "FailedPostStartHook", "OOMKilling", "SystemOOM")
# the kubelet's event of a failed pull (module doc): the image as the pod spec names it, then the runtime's error
PULL_FAILED = re.compile(r'Failed to pull image "(?P<image>[^"]+)": (?P<why>.+)', re.S)
UNKNOWN_RPC = re.compile(r"^rpc error: code = Unknown desc = ")
HTTP_STATUS = re.compile(r"\b[45]\d\d(?: [A-Z][A-Za-z-]*)+")
DIGEST = re.compile(r"\b(sha256:[0-9a-f]{12})[0-9a-f]{52}\b")


def decisive(text: object, limit: int = MESSAGE) -> str:
    """A message, whitespace collapsed and digests shortened, within about ``limit`` characters: its head and its end
    (Go wraps errors as ``what: why: root cause``), and an HTTP status that the cut would drop."""
    text = DIGEST.sub(r"\1...", " ".join(str(text or "").split()))
    if len(text) <= limit:
        return text
    keep = limit - HEAD - 5
    start = len(text) - keep  # where the kept end begins
    for m in HTTP_STATUS.finditer(text):
        if m.end() > HEAD and m.start() < start:  # cut, wholly or in part
            if m.start() >= len(text) - keep - 40:  # just before the end: start the end there
                return f"{text[:HEAD]} ... {text[m.start():]}"
            return f"{text[:HEAD]} ... {m.group(0)} ... {text[-(keep - len(m.group(0)) - 5):]}"
    return f"{text[:HEAD]} ... {text[start:]}"


def shape(text: str) -> str:
    """What makes two cause lines the same cause: numbers, uids and generated names left out."""
    text = re.sub(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", "<uid>", text)
    text = re.sub(r"\b(nodeclaim|node)/\S+", r"\1/<name>", text)
    return re.sub(r"\d+", "#", text)


@dataclass(frozen=True)
class Cause:
    """One cause: of a pod (``pod`` its name, ``group`` its component, grouped with other pods of the same text), or
    of another object (``subject`` e.g. ``PersistentVolumeClaim dapo-shared``); ``disruptive``: news while a driver
    runs."""

    text: str
    pod: str = ""
    group: str = ""
    subject: str = ""
    disruptive: bool = False


def pull_failures(events: list[dict]) -> dict[tuple[str, str], str]:
    """(pod, image) -> the runtime's error of the latest failed pull of that image in that pod (module doc), from the
    kubelet's Warning events ``Failed to pull image "<image>": <error>``, latest by ``lastTimestamp`` (else
    ``eventTime``, else the list's order)."""
    out: dict[tuple[str, str], str] = {}
    for ev in sorted(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or "")):
        obj = ev.get("involvedObject") or {}
        m = PULL_FAILED.match(" ".join(str(ev.get("message") or "").split()))
        if ev.get("type") == "Warning" and obj.get("kind") == "Pod" and m:
            out[(str(obj.get("name")), m.group("image"))] = m.group("why")
    return out


def _pull_cause(waiting: dict, image: str, pulls: dict[str, str]) -> str:
    """The waiting message of a failed pull; for a Back-off that does not say why, the last pull's error instead of
    the kubelet's ``Back-off pulling image "<image>"`` (the line names the reason and the image already), less the
    gRPC wrapper ``rpc error: code = Unknown desc =`` that carries nothing."""
    message = decisive(waiting.get("message"))
    why = decisive(UNKNOWN_RPC.sub("", pulls.get(image) or ""))
    if waiting.get("reason") != "ImagePullBackOff" or not why or why in message:
        return message
    if message in ("", f'Back-off pulling image "{image}"'):
        return f"the last pull failed: {why}"
    return f"{message}; the last pull failed: {why}"


def _container_causes(pod: str, group: str, spec: dict, st: dict,
                      pulls: Optional[dict[str, str]] = None) -> list[Cause]:
    images = {c.get("name"): c.get("image") for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])}
    out = []
    statuses = [("init container", c) for c in st.get("initContainerStatuses") or []]
    statuses += [("container", c) for c in st.get("containerStatuses") or []]
    for what, c in statuses:
        state = c.get("state") or {}
        waiting = state.get("waiting") or {}
        last = (c.get("lastState") or {}).get("terminated") or {}
        reason, name = waiting.get("reason") or "", c.get("name")
        if reason in IMAGE_WAITING:
            image = images.get(name) or c.get("image") or ""  # the spec's name is the one the kubelet's events use
            out.append(Cause(f"{what} {name} {reason}: image {c.get('image') or image}: "
                             f"{_pull_cause(waiting, image, pulls or {})}", pod, group))
        elif reason == "CrashLoopBackOff":
            text = f"{what} {name} CrashLoopBackOff ({last.get('reason') or 'exit'} code {last.get('exitCode', '?')}"
            text += f", {c.get('restartCount', 0)} restarts)"
            if last.get("message"):
                text += f"; its last lines: {decisive(last['message'])}"
            out.append(Cause(text, pod, group, disruptive=True))
        elif reason and reason not in WAITING_QUIET:
            out.append(Cause(f"{what} {name} {reason}" + (f": {decisive(waiting['message'])}"
                                                          if waiting.get("message") else ""), pod, group))
        elif last and int(c.get("restartCount") or 0) > 0:  # restarted, running again or starting
            out.append(Cause(f"{what} {name} restarted ({c.get('restartCount')}x), last ended "
                             f"{last.get('reason') or 'with'} exit code {last.get('exitCode', '?')}", pod, group,
                             disruptive=True))
        term = state.get("terminated") or {}
        if term and (term.get("reason") not in (None, "Completed") or term.get("exitCode")):
            out.append(Cause(f"{what} {name} ended {term.get('reason') or 'with'} exit code "
                             f"{term.get('exitCode', '?')}", pod, group, disruptive=True))
    return out


def pod_causes(pod: dict, pulls: Optional[dict[str, str]] = None) -> list[Cause]:
    """Why one pod is not running, or what disrupted it (none for a pod whose containers all run); ``pulls``: image
    -> the error of its last failed pull in this pod (:func:`pull_failures`), the cause a Back-off does not say."""
    meta, spec, st = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    name = meta.get("name", "?")
    group = ((meta.get("labels") or {}).get("app.kubernetes.io/component") or "").rpartition("-")[2]
    out = []
    for cond in st.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            out.append(Cause(f"not scheduled: {cond.get('reason') or 'Unschedulable'}: {decisive(cond.get('message'))}",
                             name, group))
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            out.append(Cause(f"being removed: {cond.get('reason')}: {decisive(cond.get('message'))}", name, group,
                             disruptive=True))
    out += _container_causes(name, group, spec, st, pulls)
    if st.get("phase") == "Failed":
        out.append(Cause(f"failed: {st.get('reason') or ''} {decisive(st.get('message'))}".rstrip(), name, group,
                         disruptive=True))
    return out


def event_cause(ev: dict) -> Cause:
    obj = ev.get("involvedObject") or {}
    text = f"{ev.get('reason', '?')}: {decisive(ev.get('message'))}"
    disruptive = ev.get("reason") in DISRUPTIVE_EVENTS
    if obj.get("kind") == "Pod":
        return Cause(text, obj.get("name", "?"), "", disruptive=disruptive)
    return Cause(text, subject=f"{obj.get('kind', '?')} {obj.get('name', '?')}", disruptive=disruptive)


def lines_of(causes: list[Cause], groups: dict[str, str]) -> list[tuple[str, str]]:
    """(shape, line) per distinct cause, one cause over many pods in one line (module doc)."""
    by_shape: dict[str, list[Cause]] = {}
    for c in causes:
        by_shape.setdefault(shape(c.text) if c.pod else shape(f"{c.subject}: {c.text}"), []).append(c)
    out = []
    for key, same in by_shape.items():
        first = same[0]
        if not first.pod:
            out.append((key, f"{first.subject}: {first.text}"))
            continue
        pods = list(dict.fromkeys(c.pod for c in same))
        if len(pods) == 1:
            out.append((key, f"pod {pods[0]}: {first.text}"))
        else:
            kinds = {groups.get(c.pod) or c.group for c in same}
            what = f"{next(iter(kinds))} pods" if len(kinds) == 1 and "" not in kinds else "pods"
            out.append((key, f"{len(pods)} {what}: {first.text}"))
    return out


class Waits:
    """The causes of a wait, read on demand (:meth:`poll`); see the module doc."""

    def __init__(self, api: RayJobApi, *, release: str, kind: str, claim: Optional[str] = None):
        self.api, self.kind, self.claim = api, kind, claim
        components = ",".join(f"{kind}-{c}" for c in ("head", "worker", "submitter"))
        self.selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component in ({components})"
        self.printed: set[str] = set()
        self.current: list[str] = []
        self.disruptions: list[str] = []
        self.printed_running: set[str] = set()  # the shapes printed while this attempt's driver runs
        self.disabled = False
        self.last: Optional[tuple[list[dict], list[dict]]] = None  # (pods, events) of the last read

    def new_attempt(self) -> None:
        """A new attempt's driver starts: the last attempt's disruptions are forgotten (module doc)."""
        self.disruptions = []
        self.printed -= self.printed_running
        self.printed_running = set()

    def read(self) -> tuple[list[dict], list[dict]]:
        pods = self.api.list_json("pods", "labelSelector=" + urllib.parse.quote(self.selector))
        events = self.api.list_json("events")
        return pods, events

    def causes(self, pods: list[dict], events: list[dict]) -> list[Cause]:
        names = {(p.get("metadata") or {}).get("name") for p in pods}
        from_status = {}
        causes = []
        pulls = pull_failures(events)
        for p in pods:
            name = (p.get("metadata") or {}).get("name")
            found = pod_causes(p, {image: why for (pod, image), why in pulls.items() if pod == name})
            from_status[(p.get("metadata") or {}).get("name")] = found
            causes += found
        watched = {("RayJob", self.api.name)} | ({("PersistentVolumeClaim", self.claim)} if self.claim else set())
        # Kueue's Workload of the RayJob, rayjob-<name>-<5 characters of a hash> (pending on quota, not admitted)
        workload = re.compile(f"rayjob-{re.escape(self.api.name)}-[0-9a-z]{{5}}")
        for ev in sorted(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or "")):
            obj, reason = ev.get("involvedObject") or {}, ev.get("reason")
            if ev.get("type") != "Warning" and reason not in NORMAL_REASONS:
                continue
            key = (obj.get("kind"), obj.get("name"))
            if key[0] == "Pod" and key[1] in names:
                if reason in REPEATS_STATUS and any(c.text.startswith(REPEATS_STATUS[reason])
                                                    for c in from_status.get(key[1], [])):
                    continue
            elif not (key in watched or (key[0] == "Workload" and workload.fullmatch(str(key[1] or "")))):
                continue
            causes.append(event_cause(ev))
        return causes

    def poll(self, running: bool = False) -> tuple[list[str], Optional[str]]:
        """(new lines to print, a note when the API cannot be read); updates :attr:`current` (and, while a driver
        runs, :attr:`disruptions`)."""
        if self.disabled:
            return [], None
        try:
            pods, events = self.last = self.read()
        except ApiUnavailable as exc:
            self.disabled = True
            return [], f"{exc}; waits are not explained, the run's logs still are"
        except OSError as exc:
            return [], f"cannot list pods or events now ({exc}); retrying"
        groups = {(p.get("metadata") or {}).get("name"): ((p.get("metadata") or {}).get("labels") or {}).get(
            "app.kubernetes.io/component", "").rpartition("-")[2] for p in pods}
        causes = self.causes(pods, events)
        if running:
            causes = [c for c in causes if c.disruptive]
        lines = lines_of(causes, groups)
        self.current = [line for _, line in lines]
        new = [(k, line) for k, line in lines if k not in self.printed]
        self.printed.update(k for k, _ in new)
        if running:
            self.disruptions += [line for _, line in new]
            self.printed_running.update(k for k, _ in new)
        return [line for _, line in new], None

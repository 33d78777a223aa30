"""A RayJob's status read from the Kubernetes API, for the log follower (:mod:`dapo.cluster.follow`).

One request, ``GET /apis/ray.io/v1/namespaces/<ns>/rayjobs/<name>``, with the pod's service-account token: all the
RBAC it needs is ``get`` on ``rayjobs`` of that name (the chart's Role). :meth:`RayJobApi.list_json` lists the
namespace's pods and events for :mod:`dapo.cluster.waits` (``list`` on both, the same Role). :meth:`RayJobApi.patch`
and :meth:`RayJobApi.delete` act: the start guard's deletes (:mod:`dapo.cluster.start_guard`, a Role of its own), and
what the follower does between attempts (:mod:`dapo.cluster.keeper`: ``patch`` and ``delete`` on the one RayJob,
``delete`` on pods, granted only when those parts are on). Standard library only (``urllib``, ``ssl``):
the follower runs in whichever image its RayJob runs -- the training image, the evaluation image, or the
reproduction image (Python 3.10, our package without extras) -- and none of them carries the ``kubernetes`` client.
The token file is read again for every request: Kubernetes rotates projected service-account tokens (hourly),
and a run lasts weeks.

In a pod (:meth:`RayJobApi.in_cluster`): ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``, the token
and CA under ``/var/run/secrets/kubernetes.io/serviceaccount``. Outside (tests, or ``kubectl proxy`` on a laptop):
``--api-server http://127.0.0.1:8001``, no token.

What the follower needs of KubeRay v1.7's status (``ray-operator/controllers/ray/rayjob_controller.go``): a failed
attempt with retries left goes from Running straight to ``Retrying`` (``checkBackoffLimitAndUpdateStatusIfNeeded``
runs before the status is written), then ``New``; ``Failed`` and ``Complete`` are final (``Complete`` also for a
STOPPED job); ``status.failed`` counts the failed attempts.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TERMINAL = ("Complete", "Failed")


class ApiUnavailable(Exception):
    """The status cannot be read with this identity (no token, 401, 403): the follower goes on with the logs alone."""


@dataclass(frozen=True)
class RayJobStatus:
    """What the follower reads of a RayJob; ``exists`` False when the API answered 404."""

    exists: bool
    uid: str = ""
    created: Optional[datetime] = None
    deployment: str = ""  # status.jobDeploymentStatus
    job_status: str = ""  # status.jobStatus (the Ray job of the current attempt)
    failed: int = 0  # status.failed: failed attempts so far
    backoff_limit: Optional[int] = None  # spec.backoffLimit
    reason: str = ""
    message: str = ""
    cluster: str = ""  # status.rayClusterName: the current attempt's RayCluster (its pods' ray.io/cluster label)

    @property
    def terminal(self) -> bool:
        return self.deployment in TERMINAL

    @property
    def succeeded(self) -> bool:
        return self.deployment == "Complete" and self.job_status == "SUCCEEDED"

    def describe(self) -> str:
        why = f" ({self.reason}: {self.message})" if self.reason or self.message else ""
        return f"{self.deployment or 'New'}, job {self.job_status or '-'}, {self.failed} failed attempt(s){why}"

    @classmethod
    def from_object(cls, obj: dict) -> "RayJobStatus":
        meta, spec, st = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
        created = meta.get("creationTimestamp")
        return cls(
            exists=True,
            uid=str(meta.get("uid") or ""),
            created=parse_time(created) if created else None,
            deployment=str(st.get("jobDeploymentStatus") or ""),
            job_status=str(st.get("jobStatus") or ""),
            failed=int(st.get("failed") or 0),
            backoff_limit=int(spec["backoffLimit"]) if spec.get("backoffLimit") is not None else None,
            reason=str(st.get("reason") or ""),
            message=str(st.get("message") or "")[:300],
            cluster=str(st.get("rayClusterName") or ""),
        )


def parse_time(text: str) -> datetime:
    """A Kubernetes timestamp (RFC 3339, ``2025-06-01T12:00:00Z``) as an aware datetime."""
    return datetime.strptime(text.replace("Z", "+0000").replace("+00:00", "+0000"),
                             "%Y-%m-%dT%H:%M:%S%z").astimezone(timezone.utc)


class RayJobApi:
    """``get()`` the status of one RayJob."""

    def __init__(self, server: str, namespace: str, name: str, *, token_file: Optional[Path] = None,
                 ca_file: Optional[Path] = None, timeout: float = 10.0):
        self.server, self.namespace, self.name = server.rstrip("/"), namespace, name
        self.url = f"{server.rstrip('/')}/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{name}"
        self.token_file = token_file
        self.timeout = timeout
        self.context = None
        self.last_object: Optional[dict] = None  # the RayJob as the last get() read it
        if server.startswith("https://"):
            self.context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)

    @classmethod
    def in_cluster(cls, name: str, namespace: Optional[str] = None) -> "RayJobApi":
        """From the pod's environment; raises :class:`ApiUnavailable` when it has no service-account token."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        token = SA_DIR / "token"
        if not host or not token.is_file():
            raise ApiUnavailable(f"no service-account token ({token}) or KUBERNETES_SERVICE_HOST in this pod")
        if not namespace:
            namespace = (SA_DIR / "namespace").read_text().strip()
        host = f"[{host}]" if ":" in host else host  # an IPv6 service address
        return cls(f"https://{host}:{port}", namespace, name, token_file=token, ca_file=SA_DIR / "ca.crt")

    def get(self) -> RayJobStatus:
        """The status; ``exists=False`` on 404. Raises :class:`ApiUnavailable` on 401/403 and ``OSError`` (retry
        later) on anything else: a network error, a timeout, a 5xx."""
        obj = self.last_object = self.get_json(self.url, "get this RayJob")
        if obj is None:
            return RayJobStatus(exists=False)
        try:
            return RayJobStatus.from_object(obj)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not a RayJob object
            raise OSError(f"GET {self.url}: unreadable answer ({exc})") from None

    def list_json(self, resource: str, query: str = "") -> list[dict]:
        """The items of ``GET /api/v1/namespaces/<ns>/<resource>?<query>`` (pods, events of this namespace)."""
        url = f"{self.server}/api/v1/namespaces/{self.namespace}/{resource}" + (f"?{query}" if query else "")
        obj = self.get_json(url, f"list {resource} in namespace {self.namespace}")
        items = (obj or {}).get("items") if isinstance(obj, dict) else None
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    def get_json(self, url: str, what: str) -> Optional[dict]:
        """One GET with the token: the JSON answer, None on 404; :class:`ApiUnavailable` on 401/403 (``what`` names
        the permission), ``OSError`` on anything else."""
        return self._request("GET", url, what)

    def _request(self, method: str, url: str, what: str, body: Optional[dict] = None,
                 content_type: str = "application/merge-patch+json") -> Optional[dict]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={"Accept": "application/json"})
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token_file is not None:
            req.add_header("Authorization", f"Bearer {self.token_file.read_text().strip()}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as resp:
                text = resp.read()
                return json.loads(text) if text.strip() else {}
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            if exc.code in (401, 403):
                raise ApiUnavailable(f"HTTP {exc.code} for {method} {url}: the service account may not {what} "
                                     "(logs.rbac.create, docs/follow.md)") from None
            raise OSError(f"HTTP {exc.code} for {method} {url}") from None
        except ValueError as exc:  # not JSON
            raise OSError(f"{method} {url}: unreadable answer ({exc})") from None

    def patch(self, body: dict, what: str = "patch this RayJob") -> Optional[dict]:
        """A JSON merge patch (RFC 7386) of this RayJob: the object after it, None when it is gone. A body holding
        ``metadata.resourceVersion`` is refused with HTTP 409 (``OSError``) when the object changed since it was
        read, so a list replaced whole is replaced only in the version it was computed from. The field manager
        ``dapo-follower`` names the follower in the object's managedFields (and in a server-side apply's conflict)."""
        return self._request("PATCH", f"{self.url}?fieldManager=dapo-follower", what, body)

    def delete(self, path: str) -> bool:
        """``DELETE`` of ``path`` (an object of this namespace; its dependents deleted in the background); False when
        it was already gone. Raises :class:`ApiUnavailable` on 401/403 and ``OSError`` on anything else."""
        url = f"{self.server}{path}?propagationPolicy=Background"
        return self._request("DELETE", url, f"delete {path}") is not None

"""The suite's stand-in Kubernetes API server: a small HTTP server that holds real-shaped objects and answers what
the API server answers for them -- GET of one object at its path, lists with ``labelSelector`` / ``fieldSelector``,
DELETE (recorded in ``deleted``, each passed to ``on_delete`` hooks), PATCH as a JSON merge patch (RFC 7386; a
``metadata.resourceVersion`` in the body is a precondition, 409 when stale; recorded in ``patched``), 404 as a
``Status``, 403 for what the caller may not read or do (``forbid``, ``forbid_verb``) -- so that the project's own API readers (the log
follower's urllib client, ``dapo doctor``'s kubernetes client, Helm's ``lookup``) talk to it as to a cluster.

    api = StandInApi()
    api.put(node("gpu-1", gpus=8))                 # at /api/v1/nodes/gpu-1
    api.replace("Pod", [pod(...), ...], namespace="ml")
    api.forbid("pods")                              # every request for pods: 403
    kubeconfig = api.kubeconfig(tmp_path)           # a kubeconfig file whose context points at it

Built on :class:`k8s_support.JsonHandler` (first written for tests/test_follow_waits.py's follower waits). Which
resource a kind is, and under which API group, is the table ``KINDS`` (the plural names of the Kubernetes API).
"""

from __future__ import annotations

import copy
import json
import threading
import time
import urllib.parse
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterable

import yaml

from k8s_support import JsonHandler

# kind -> (API path prefix, plural, namespaced)
KINDS: dict[str, tuple[str, str, bool]] = {
    "Node": ("/api/v1", "nodes", False),
    "Namespace": ("/api/v1", "namespaces", False),
    "Pod": ("/api/v1", "pods", True),
    "Event": ("/api/v1", "events", True),
    "Secret": ("/api/v1", "secrets", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims", True),
    "StorageClass": ("/apis/storage.k8s.io/v1", "storageclasses", False),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "RayJob": ("/apis/ray.io/v1", "rayjobs", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "LocalQueue": ("/apis/kueue.x-k8s.io/v1beta2", "localqueues", True),
    "ClusterQueue": ("/apis/kueue.x-k8s.io/v1beta2", "clusterqueues", False),
    "NodePool": ("/apis/karpenter.sh/v1", "nodepools", False),
    "Network": ("/apis/networking.gke.io/v1", "networks", False),
}
PLURALS = {plural: kind for kind, (_, plural, _) in KINDS.items()}


def _field(obj: dict, path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return "" if node is None else str(node)


def matches_labels(obj: dict, selector: str) -> bool:
    """``a=b,c in (d,e),f!=g`` -- the forms the project sends."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in _split_terms(selector))):
        if " in (" in term:
            key, values = term.split(" in (", 1)
            if labels.get(key.strip()) not in {v.strip() for v in values.rstrip(")").split(",")}:
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value:
                return False
        elif labels.get(term) is None:
            return False
    return True


def _split_terms(selector: str) -> list[str]:
    """Commas between terms, not those inside ``in (...)``."""
    out, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return out + [cur]


def matches_fields(obj: dict, selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if _field(obj, key) == value:
                return False
        else:
            key, value = term.replace("==", "=").split("=", 1)
            if _field(obj, key) != value:
                return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merged key by key, ``null`` removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class StandInApi:
    """The stand-in server (module doc). ``requests`` records every path and query asked for."""

    def __init__(self, objects: Iterable[dict] = ()):
        self.store: dict[tuple[str, str, str], dict[str, dict]] = {}  # (prefix, plural, namespace) -> name -> object
        self.forbidden: set[str] = set()
        self.requests: list[str] = []
        self.deleted: list[str] = []  # the path and query of every DELETE it answered
        self.patched: list[tuple[str, dict, float]] = []  # (path, body, time.time()) of every PATCH it applied
        self.on_delete: list[Any] = []  # callables(path), called before a DELETE is answered
        self.forbidden_verbs: set[tuple[str, str]] = set()  # (method, plural)
        self.lock = threading.Lock()
        for obj in objects:
            self.put(obj)
        outer = self

        class Handler(JsonHandler):
            def do_GET(self):
                outer.requests.append(self.path)
                code, body = outer.answer(self.path)
                self.send_json(code, body)

            def do_DELETE(self):
                code, body = outer.refused("DELETE", self.path) or outer.answer(self.path)
                if code == 200:
                    for hook in outer.on_delete:
                        hook(self.path.partition("?")[0])
                    outer.deleted.append(self.path)
                    outer.drop(self.path.partition("?")[0])
                self.send_json(code, body)

            def do_PATCH(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                code, body = outer.refused("PATCH", self.path) or outer.patch(self.path, json.loads(raw or b"{}"))
                self.send_json(code, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    # -- what it holds ---------------------------------------------------------------------------------------------
    def put(self, obj: dict, namespace: str | None = None) -> dict:
        prefix, plural, namespaced = KINDS[obj["kind"]]
        meta = obj.setdefault("metadata", {})
        ns = (namespace or meta.get("namespace") or "default") if namespaced else ""
        if namespaced:
            meta["namespace"] = ns
        self.store.setdefault((prefix, plural, ns), {})[meta["name"]] = obj
        return obj

    def replace(self, kind: str, objects: Iterable[dict], namespace: str = "default") -> None:
        """Every object of ``kind`` (in ``namespace``) is now ``objects``, in one assignment: a request served
        meanwhile sees the old list or the new one, never a part of it."""
        prefix, plural, namespaced = KINDS[kind]
        staged: dict[str, dict] = {}
        for obj in objects:
            obj = {**obj, "kind": kind}
            meta = obj.setdefault("metadata", {})
            if namespaced:
                meta["namespace"] = namespace
            staged[meta["name"]] = obj
        self.store[(prefix, plural, namespace if namespaced else "")] = staged

    def remove(self, kind: str, name: str, namespace: str = "default") -> None:
        prefix, plural, namespaced = KINDS[kind]
        self.store.get((prefix, plural, namespace if namespaced else ""), {}).pop(name, None)

    def drop(self, path: str) -> None:
        """Remove the object at an API path (a DELETE)."""
        for (prefix, plural, ns), objs in self.store.items():
            where = f"{prefix}/namespaces/{ns}/{plural}/" if ns else f"{prefix}/{plural}/"
            if path.startswith(where):
                objs.pop(path[len(where):], None)

    def forbid(self, *plurals: str) -> None:
        self.forbidden.update(plurals)

    def forbid_verb(self, method: str, *plurals: str) -> None:
        self.forbidden_verbs.update((method, p) for p in plurals)

    def refused(self, method: str, raw: str) -> tuple[int, Any] | None:
        parts = raw.partition("?")[0].rstrip("/").split("/")
        plural = parts[-2] if len(parts) >= 2 else ""
        if (method, plural) in self.forbidden_verbs:
            return 403, self.status(403, "Forbidden", f'{plural} is forbidden: User "t" cannot {method.lower()} '
                                                      f'resource "{plural}"')
        return None

    def patch(self, raw: str, body: dict) -> tuple[int, Any]:
        """A JSON merge patch of the object at ``raw``; a stale ``metadata.resourceVersion`` in it: 409."""
        with self.lock:
            code, obj = self.answer(raw.partition("?")[0])
            if code != 200:
                return code, obj
            meta = obj.setdefault("metadata", {})
            want = (body.get("metadata") or {}).get("resourceVersion")
            if want is not None and str(want) != str(meta.get("resourceVersion")):
                return 409, self.status(409, "Conflict", "the object has been modified; please apply your changes "
                                                         "to the latest version and try again")
            merged = merge_patch(obj, body)
            merged["metadata"]["resourceVersion"] = str(int(meta.get("resourceVersion") or 0) + 1)
            obj.clear()
            obj.update(merged)
            self.patched.append((raw, body, time.time()))
            return 200, obj

    def bump(self, obj: dict) -> dict:
        """Record a write of ``obj`` made outside the API (a controller's): a new resourceVersion."""
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(int(meta.get("resourceVersion") or 0) + 1)
        return obj

    # -- answers ----------------------------------------------------------------------------------------------------
    def answer(self, raw: str) -> tuple[int, Any]:
        path, _, query = raw.partition("?")
        q = {k: v[0] for k, v in urllib.parse.parse_qs(query).items()}
        parts = path.rstrip("/").split("/")
        # /api/v1/... or /apis/<group>/<version>/...
        head = 3 if parts[1] == "api" else 4
        prefix, rest = "/".join(parts[:head]), parts[head:]
        ns = ""
        if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
            ns, rest = rest[1], rest[2:]
        if not rest:
            return 404, self.status(404, "NotFound", path)
        plural, name = rest[0], (rest[1] if len(rest) > 1 else None)
        if plural in self.forbidden:
            return 403, self.status(403, "Forbidden", f'{plural} is forbidden: User "t" cannot get resource '
                                                      f'"{plural}"')
        if name is not None:
            obj = self.store.get((prefix, plural, ns), {}).get(name)
            return (200, obj) if obj is not None else (404, self.status(404, "NotFound", f'{plural} "{name}" not found'))
        if ns:
            pool = list(self.store.get((prefix, plural, ns), {}).values())
        else:  # a cluster-wide list, or of a cluster-scoped kind
            pool = [o for (p, pl, _), objs in self.store.items() if (p, pl) == (prefix, plural) for o in objs.values()]
        items = [o for o in pool if matches_labels(o, q.get("labelSelector", ""))
                 and matches_fields(o, q.get("fieldSelector", ""))]
        kind = PLURALS.get(plural, "Object")
        return 200, {"kind": f"{kind}List", "apiVersion": prefix.split("/", 2)[-1], "metadata": {},
                     "items": items}

    @staticmethod
    def status(code: int, reason: str, message: str) -> dict:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
                "reason": reason, "code": code}

    def kubeconfig(self, directory: Path, namespace: str = "default") -> Path:
        path = Path(directory) / "kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "stand-in", "user": {"token": "t"}}],
            "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "stand-in",
                                                          "namespace": namespace}}],
        }))
        return path

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

"""The log followers (``logs.enabled``): one Kubernetes Job per RayJob, ``K-train-logs`` and ``K-eval-logs``, that
print every attempt's driver log as one stream (``python -m dapo.cluster.follow``), so that ``kubectl logs -f
job/K-train-logs`` follows a run from ``helm install`` to its end -- the chart's ``logs-follower.yaml``.

The pod, outside the Ray cluster, mounts the shared claim read-only, in the image of the RayJob it follows (cached
where that RayJob's head ran; ``logs.image`` overrides it), non-root with a read-only root filesystem:

- ``follow``, a restartable init container (a native sidecar: restarted in place if it dies, keeping the pod's
  emptyDir ``state`` and so what it printed), prints the stream and at the end writes its exit code to
  ``/state/result``; the pod's ``kubectl.kubernetes.io/default-container`` annotation makes it what ``kubectl
  logs`` shows;
- ``result``, the main container, waits for that file and exits with the code: 0, the run succeeded (the Job is
  Complete); 1, it failed for good (``podFailurePolicy`` FailJob: the Job is Failed at once and its pod, with the
  log, is kept). Evictions are ignored (a new pod prints the run from its beginning); other failures of the pod
  count against ``logs.backoffLimit``.

The run's end is read from the RayJob's status, and its waits are explained from the release's pods and the
namespace's events (:mod:`dapo.cluster.waits`), with the least RBAC that allows it (``logs.rbac.create``):
ServiceAccount ``K-logs``, a Role allowing ``get`` on ``rayjobs`` of exactly the followed names (their status holds
the run's end) and ``list`` on ``pods`` and ``events`` of the namespace (the follower lists the release's pods by
label and the namespace's events; RBAC cannot restrict a list to labels), nothing else, a RoleBinding. A
RoleBinding names its ServiceAccount's namespace, so without a namespace (``scripts/render.py`` without
``--namespace``) the three are left out and the follower judges the end from the attempt logs alone.

A Job's pod template cannot change, so the Job carries ``dapo-k8s.github.io/spec-sha256`` (of its spec) and an
upgrade is refused while the Job exists and its spec would change or its RayJob is gone
(:func:`dapo.k8s.upgrade.follower_refusal`, the chart's ``dapo.followerGuard``).
"""

from __future__ import annotations

import copy
from typing import Any

from dapo.k8s.rayjobs import RayJobs
from dapo.k8s.context import image_ref
from dapo.k8s.security import FOLLOWER_SKIPS, checkov_skips, tag_only
from dapo.k8s.upgrade import SPEC_HASH_ANNOTATION, spec_sha256
from dapo.util.gofmt import go_string

STATE_DIR = "/state"
# the main container: waits for the follower's exit code, exits with it
RESULT_SCRIPT = f'until [ -s {STATE_DIR}/result ]; do sleep 2; done; exit "$(cat {STATE_DIR}/result)"'
# exit codes of the main container that end the Job at once: the run failed (1), a usage error (2)
FAIL_JOB_CODES = [1, 2]


class LogFollowers(RayJobs):
    """The follower Jobs and their ServiceAccount, Role and RoleBinding."""

    @property
    def logs_name(self) -> str:
        return f"{self.fullname}-logs"

    def followed(self) -> list[str]:
        """Kinds of the RayJobs that get a follower, in the chart's order (train, eval)."""
        v = self.v
        if not v["logs"]["enabled"]:
            return []
        return [k for k in ("train", "eval") if v[k]["enabled"]]

    def follower_name(self, kind: str) -> str:
        return f"{self.fullname}-{kind}-logs"

    def follower_image(self, kind: str) -> dict[str, str]:
        """logs.image, each "" falling back to the image of the RayJob it follows (the digest too when the follower
        runs that image itself: logs.image.repository and tag both "")."""
        img = self.v["logs"]["image"]
        job = self.eval_image() if kind == "eval" else self.train_image()
        own = bool(img.get("repository") or img.get("tag"))
        return {"repository": img.get("repository") or job["repository"], "tag": img.get("tag") or job["tag"],
                "digest": img.get("digest") or ("" if own else job["digest"])}

    @property
    def follower_rbac_created(self) -> bool:
        return bool(self.v["logs"]["rbac"]["create"]) and self.namespace is not None

    def follower_objects(self) -> list[dict[str, Any]]:
        kinds = self.followed()
        if not kinds:
            return []
        out = self.follower_rbac(kinds) if self.follower_rbac_created else []
        return out + [self.follower_job(k) for k in kinds]

    def follower_act_rules(self, kinds: list[str]) -> list[dict[str, Any]]:
        """What the training follower may do between attempts (train.retries): patch the training RayJob (nodes
        left out, backoffLimit 0), delete it (the budget spent while a retry is under way), delete pods (the
        heartbeat backstop)."""
        if "train" not in kinds or not self.follower_acts:
            return []
        r = self.v["train"]["retries"]
        verbs = (["patch"] if r["leaveOutNodes"]["enabled"] or r["failureBudget"]["enabled"] else []) + \
            (["delete"] if r["failureBudget"]["enabled"] else [])
        rules = [{"apiGroups": ["ray.io"], "resources": ["rayjobs"], "resourceNames": [self.train_job_name],
                  "verbs": verbs}] if verbs else []
        if int(r["heartbeatTimeoutSeconds"]) > 0:
            rules.append({"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]})
        return rules

    def follower_rbac(self, kinds: list[str]) -> list[dict[str, Any]]:
        names = [self.train_job_name if k == "train" else self.eval_job_name for k in kinds]
        meta = lambda: self.metadata(self.logs_name, "logs")  # noqa: E731
        return [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta()},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(),
             "rules": [{"apiGroups": ["ray.io"], "resources": ["rayjobs"], "resourceNames": names, "verbs": ["get"]},
                       {"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["list"]},
                       *self.follower_act_rules(kinds)]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": self.logs_name},
             "subjects": [{"kind": "ServiceAccount", "name": self.logs_name, "namespace": self.namespace}]},
        ]

    def follower_args(self, kind: str) -> list[str]:
        job = self.v[kind]
        return ["--log-dir", self.log_dir(kind), "--rayjob", self.train_job_name if kind == "train" else
                self.eval_job_name, "--backoff-limit", str(int(job["backoffLimit"])), "--state-dir", STATE_DIR,
                "--sidecar", "--release", self.release, "--kind", kind, "--claim", self.claim_name,
                *self.follower_act_args(kind)]

    def follower_act_args(self, kind: str) -> list[str]:
        """The training follower's options for what it does between attempts (dapo.cluster.keeper)."""
        if kind != "train" or not self.follower_acts:
            return []
        # the RayJob's status every 5 s: a failure the driver could not record is acted on before most retries
        r, args = self.v["train"]["retries"], ["--status-every", "5"]
        if r["leaveOutNodes"]["enabled"]:
            args += ["--leave-out-nodes", str(int(r["leaveOutNodes"]["max"]))]
        b = r["failureBudget"]
        if b["enabled"]:
            args += ["--max-failures", str(int(b["maxFailures"])), "--failure-window-hours",
                     go_string(b["windowHours"]), "--same-cause", str(int(b["sameCauseInARow"]))]
        if int(r["heartbeatTimeoutSeconds"]) > 0:
            args += ["--heartbeat-timeout", str(int(r["heartbeatTimeoutSeconds"]))]
        return args

    def follower_job(self, kind: str) -> dict[str, Any]:
        v, lg = self.v, self.v["logs"]
        pinned = self.follower_image(kind)
        image, pull = image_ref(pinned), v["image"]["pullPolicy"]
        mount = v["storage"]["mountPath"]
        # read-only, but for the training follower that answers each attempt (train.retries: acks, failures.json)
        read_only = not (kind == "train" and self.follower_acts)
        common = {"resources": copy.deepcopy(lg["resources"])}
        if lg.get("securityContext"):
            common["securityContext"] = copy.deepcopy(lg["securityContext"])
        follow = {
            "name": "follow", "image": image, "imagePullPolicy": pull, "restartPolicy": "Always",
            "command": ["python", "-m", "dapo.cluster.follow"], "args": self.follower_args(kind),
            "env": [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
            **copy.deepcopy(common),
            "volumeMounts": [{"name": "shared", "mountPath": mount, "readOnly": read_only},
                             {"name": "state", "mountPath": STATE_DIR}],
        }
        result = {
            "name": "result", "image": image, "imagePullPolicy": pull,
            "command": ["/bin/sh", "-c", RESULT_SCRIPT], **copy.deepcopy(common),
            "volumeMounts": [{"name": "state", "mountPath": STATE_DIR, "readOnly": True}],
        }
        pod: dict[str, Any] = {"restartPolicy": "Never"}
        account = self.logs_name if self.follower_rbac_created else \
            (None if lg["rbac"]["create"] else lg.get("serviceAccountName"))
        if account:
            pod["serviceAccountName"] = account
        if v.get("imagePullSecrets"):
            pod["imagePullSecrets"] = copy.deepcopy(v["imagePullSecrets"])
        if v.get("podSecurityContext"):
            pod["securityContext"] = copy.deepcopy(v["podSecurityContext"])
        for key in ("nodeSelector", "tolerations"):
            if v["head"].get(key):
                pod[key] = copy.deepcopy(v["head"][key])
        pod["initContainers"] = [follow]
        pod["containers"] = [result]
        pod["volumes"] = [
            {"name": "shared", "persistentVolumeClaim": {"claimName": self.claim_name, "readOnly": read_only}},
            {"name": "state", "emptyDir": {"sizeLimit": "1Mi"}},
        ]
        spec: dict[str, Any] = {"backoffLimit": int(lg["backoffLimit"])}
        if lg.get("ttlSecondsAfterFinished") is not None:
            spec["ttlSecondsAfterFinished"] = int(lg["ttlSecondsAfterFinished"])
        spec["podFailurePolicy"] = {"rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "result", "operator": "In",
                                                  "values": list(FAIL_JOB_CODES)}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]}
        spec["template"] = {
            "metadata": {"labels": self.selector_labels(f"{kind}-logs"),
                         "annotations": {"kubectl.kubernetes.io/default-container": "follow"}},
            "spec": pod,
        }
        meta = self.metadata(self.follower_name(kind), f"{kind}-logs")
        meta["annotations"] = {SPEC_HASH_ANNOTATION: spec_sha256(spec), **checkov_skips(FOLLOWER_SKIPS + tag_only(pinned))}
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}

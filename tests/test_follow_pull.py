"""A pull that fails is named by its cause, not only its symptom: when a pod's status says only ``ImagePullBackOff:
Back-off pulling image "<image>"``, the follower's line carries the registry's answer (the status code, its message)
from the pod's latest failed-pull event, as the kubelet writes it.

The events are the kubelet's own sequence for a pull that a registry rate-limits (Kubernetes
``pkg/kubelet/images/image_manager.go`` ``EnsureImageExists`` and ``pkg/kubelet/kuberuntime/kuberuntime_container.go``
``startContainer``): Normal ``Pulling`` ``Pulling image "<image>"``, Warning ``Failed`` ``Failed to pull image
"<image>": <the runtime's error>``, Warning ``Failed`` ``Error: ErrImagePull``, then in back-off Normal ``BackOff``
``Back-off pulling image "<image>"`` and Warning ``Failed`` ``Error: ImagePullBackOff`` -- the latest Warning, which
names no cause. The runtime's error is containerd's (``failed to pull and unpack image``, ``unexpected status code
<url>: 429 Too Many Requests - Server message: toomanyrequests: ...``), as :data:`test_follow_waits.RATE_LIMITED`.
"""

from __future__ import annotations

from test_follow_waits import (  # noqa: F401 (api: the stand-in server fixture)
    RATE_LIMITED,
    REGISTRY,
    api,
    finish,
    lines,
    looks,
    pod,
    serve,
    start,
    write_attempt,
)

HEAD_IMAGE = f"{REGISTRY}:0.1.0-verl0.9.1"
BACK_OFF = f'Back-off pulling image "{HEAD_IMAGE}"'
UNAUTHORIZED = (f'Failed to pull image "{HEAD_IMAGE}": rpc error: code = Unknown desc = failed to pull and unpack image '
                f'"{HEAD_IMAGE}": failed to resolve reference "{HEAD_IMAGE}": unexpected status from HEAD request to '
                "https://123456789012.dkr.ecr.us-east-1.amazonaws.com/v2/ml/dapo/manifests/0.1.0-verl0.9.1: "
                "401 Unauthorized")


def kubelet_event(pod_name: str, reason: str, message: str, at: str, *, type_: str = "Warning", count: int = 1,
                  container: str = "ray-head") -> dict:
    """One event as the kubelet's recorder writes it (core/v1, the container's fieldPath, first/last timestamps)."""
    return {"metadata": {"name": f"{pod_name}.{abs(hash((reason, message, at))):x}", "namespace": "ml"},
            "type": type_, "reason": reason, "message": message, "count": count,
            "involvedObject": {"kind": "Pod", "namespace": "ml", "name": pod_name, "apiVersion": "v1",
                               "fieldPath": f"spec.containers{{{container}}}"},
            "source": {"component": "kubelet", "host": "ip-10-0-7-9.ec2.internal"},
            "firstTimestamp": at, "lastTimestamp": at, "reportingComponent": "kubelet"}


def pull_events(pod_name: str, failure: str, *, minute: int = 0, count: int = 1) -> list[dict]:
    """The kubelet's events of one failed pull and the back-off after it, ``minute`` minutes past 10:00."""
    t = [f"2026-12-01T10:{minute:02d}:{s:02d}Z" for s in (1, 3, 4, 20, 21)]
    return [kubelet_event(pod_name, "Pulling", f'Pulling image "{HEAD_IMAGE}"', t[0], type_="Normal"),
            kubelet_event(pod_name, "Failed", failure, t[1], count=count),
            kubelet_event(pod_name, "Failed", "Error: ErrImagePull", t[2], count=count),
            kubelet_event(pod_name, "BackOff", BACK_OFF, t[3], type_="Normal", count=count),
            kubelet_event(pod_name, "Failed", "Error: ImagePullBackOff", t[4], count=count)]


def backing_off_head() -> dict:
    head = pod("dapo-train-head", waiting={"reason": "ImagePullBackOff", "message": BACK_OFF})
    head["spec"]["containers"] = [{"name": "ray-head", "image": HEAD_IMAGE}]
    head["status"]["containerStatuses"][0].update(name="ray-head", image=HEAD_IMAGE)
    return head


def test_a_back_off_line_carries_the_registrys_429_from_the_pods_failed_event():
    (line,) = lines([backing_off_head()], pull_events("dapo-train-head", RATE_LIMITED))
    assert line.startswith(f"pod dapo-train-head: container ray-head ImagePullBackOff: image {HEAD_IMAGE}: "
                           "the last pull failed: failed to pull and unpack image"), line
    assert "429 Too Many Requests" in line and line.endswith("https://www.docker.com/increase-rate-limit"), line
    # the kubelet's own echo of the status ("Error: ImagePullBackOff", the latest Warning) is never the cause
    assert "Error: ImagePullBackOff" not in line and "Error: ErrImagePull" not in line


def test_the_latest_failed_pull_of_the_same_image_is_the_cause():
    head = backing_off_head()
    events = pull_events("dapo-train-head", UNAUTHORIZED, minute=0) + pull_events("dapo-train-head", RATE_LIMITED,
                                                                                minute=5, count=3)
    (line,) = lines([head], events[::-1])  # the API's order is not the events' order: their timestamps are
    assert "429 Too Many Requests" in line and "401 Unauthorized" not in line, line
    (line,) = lines([head], pull_events("dapo-train-head", RATE_LIMITED, minute=0)
                    + pull_events("dapo-train-head", UNAUTHORIZED, minute=5))
    assert line.endswith("401 Unauthorized") and "429" not in line, line


def test_another_pods_or_another_images_failed_pull_is_not_taken_for_the_cause():
    other_image = f'Failed to pull image "{REGISTRY}:0.0.9": ' + RATE_LIMITED.partition('": ')[2]
    events = pull_events("dapo-train-worker-0", RATE_LIMITED) + [
        kubelet_event("dapo-train-head", "Failed", other_image, "2026-12-01T10:00:05Z")]
    got = lines([backing_off_head()], events)
    assert got[0] == f"pod dapo-train-head: container ray-head ImagePullBackOff: image {HEAD_IMAGE}: {BACK_OFF}", got
    # an ErrImagePull status already says why: its event is not repeated, nothing is appended
    pulling = pod("dapo-train-head", waiting={"reason": "ErrImagePull", "message": RATE_LIMITED.partition('": ')[2]})
    pulling["spec"]["containers"] = [{"name": "ray-head", "image": HEAD_IMAGE}]
    (line,) = lines([pulling], pull_events("dapo-train-head", RATE_LIMITED)[:3])
    assert "the last pull failed" not in line and line.count("429 Too Many Requests") == 1, line


def test_the_follower_prints_the_429_of_a_head_pod_in_back_off(tmp_path, api):
    """`kubectl logs job/dapo-train-logs` against the stand-in API: the head pod's status says only Back-off, its
    Failed event the registry's 429; the follower's [wait] line, and the run's last line when it fails before its
    driver starts, name the 429."""
    api.status("Initializing")
    proc = start(tmp_path / "logs", api)
    looks(api)
    serve(api, [backing_off_head()], pull_events("dapo-train-head", RATE_LIMITED, count=4))
    looks(api)
    api.status("Failed", job="", failed=1)  # preRunningDeadlineSeconds passed
    rc, out, err = finish(proc)
    assert rc == 1, err
    waits = [line for line in err.splitlines() if line.startswith("[wait] pod dapo-train-head")]
    # a look may see the pod before its events (the stand-in serves them one after the other, as an API server may
    # list them): the Back-off alone, then with its cause
    assert 1 <= len(waits) <= 2 and "429 Too Many Requests - Server message: toomanyrequests" in waits[-1], err
    assert waits[-1].startswith(f"[wait] pod dapo-train-head: container ray-head ImagePullBackOff: image {HEAD_IMAGE}: "
                                "the last pull failed: failed to pull and unpack image"), waits[-1]
    final = out.decode().strip().splitlines()[-1]
    assert "before its driver started" in final and "429 Too Many Requests" in final, final

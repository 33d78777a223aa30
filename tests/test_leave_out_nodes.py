"""Which nodes a failed attempt names and the RayJob patched to keep its next cluster off them (dapo.cluster.nodes),
judged by the scheduler's node-affinity rules (tests/kuberay_twin.py node_matches) on the chart's own RayJobs; and
the follower putting the exclusion back after a `helm upgrade` wrote the chart's groups over it."""

from __future__ import annotations

import copy

import pytest

from api_standin import StandInApi, merge_patch
from k8s_support import VALUES_DIR, by_key, chart_objects
from kuberay_twin import node_matches
from dapo.cluster import nodes
from dapo.cluster.budget import RunRecord
from dapo.cluster.keeper import Keeper
from dapo.cluster.rayjob_api import RayJobApi


def node(name, **labels):
    return {"kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}}}


def full_rayjob(extra=None) -> dict:
    objects = by_key(chart_objects([VALUES_DIR / "full.yaml"], extra=extra))
    rayjob = objects[("RayJob", "dapo-train")]
    rayjob["metadata"]["resourceVersion"] = "7"
    return rayjob


POOL_TERMS = [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
              {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]}]


@pytest.mark.parametrize("affinity", [None, {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": POOL_TERMS}}}], ids=["no-affinity", "two-pool-terms"])
def test_the_patched_rayjob_keeps_every_group_off_the_nodes_and_on_every_node_it_had(affinity):
    # the head's own affinity (a preference) survives the exclusion being added and removed again
    preferred = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {
        "matchExpressions": [{"key": "pool", "operator": "In", "values": ["c"]}]}}]}}
    extra = {"worker": {"affinity": affinity}, "head": {"affinity": preferred}} if affinity else None
    rayjob = full_rayjob(extra)
    candidates = [node("a-1", pool="a"), node("a-2", pool="a"), node("b-1", pool="b"), node("c-1", pool="c")]
    worker = lambda obj: obj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]  # noqa: E731
    before = {n["metadata"]["name"] for n in candidates if node_matches(worker(rayjob), n)}
    body = nodes.placement_patch(rayjob, ["a-1", "b-1"])
    assert body["metadata"] == {"resourceVersion": "7"}  # a list replaced whole: only the version it was read at
    patched = merge_patch(rayjob, body)
    after = {n["metadata"]["name"] for n in candidates if node_matches(worker(patched), n)}
    assert after == before - {"a-1", "b-1"} and after  # ANDed into each term: the user's pools still hold
    head = patched["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert not node_matches(head, candidates[0]) and node_matches(head, candidates[3])
    # everything else of the groups as it was (containers, resources, the one-per-host anti-affinity)
    w0, w1 = worker(rayjob), worker(patched)
    assert w1["containers"] == w0["containers"] and w1["affinity"].get("podAntiAffinity") == \
        w0.get("affinity", {}).get("podAntiAffinity")
    assert nodes.live_exclusions(patched) == ["a-1", "b-1"]
    assert nodes.placement_patch(patched, ["b-1", "a-1"]) is None  # in place already: nothing to patch
    # letting every node back removes the follower's entry and leaves the user's affinity as the chart rendered it
    back = merge_patch(patched, nodes.placement_patch(patched, []))
    assert worker(back).get("affinity") == w0.get("affinity")
    head_of = lambda obj: obj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]  # noqa: E731
    assert head_of(back).get("affinity") == head_of(rayjob).get("affinity") == (preferred if affinity else None)


def pod(name, node_name, ip, cluster="c1", **status):
    return {"metadata": {"name": name, "labels": {"ray.io/cluster": cluster}},
            "spec": {"nodeName": node_name}, "status": {"podIP": ip, **status}}


def test_end_record_entries_resolve_by_node_pod_or_ip_and_say_what_names_none():
    pods = [pod("w-0", "gpu-1", "10.0.0.1"), pod("w-1", "gpu-2", "10.0.0.2")]
    end = {"cause": "stalled", "nodes": [{"node": "gpu-9", "why": "rank 0 stuck"}, {"pod": "w-1", "why": "rank 9"},
                                         {"ip": "10.0.0.1", "why": "ActorDied"},
                                         {"ray_node_id": "ab12", "rank": 4, "why": "slow"}]}
    found, unresolved = nodes.suspects(end, pods, {"gpu-3": "pod w-3: container ray-worker OOMKilled"})
    assert list(found) == ["gpu-9", "gpu-2", "gpu-1", "gpu-3"]
    assert found["gpu-1"] == "ActorDied (the driver's end record)"
    assert unresolved == ["rank 4, ray_node_id ab12: slow"]


def test_what_the_follower_sees_names_the_node_only_for_the_nodes_fault():
    pods = [
        pod("oom", "n-oom", "1", containerStatuses=[{"name": "ray-worker", "lastState": {"terminated": {
            "reason": "OOMKilled", "exitCode": 137}}}]),
        pod("lost", "n-lost", "2", conditions=[{"type": "DisruptionTarget", "status": "True",
                                                "reason": "DeletionByTaintManager", "message": "Taint node.kubernetes.io/unreachable"}]),
        pod("drained", "n-drain", "3", conditions=[{"type": "DisruptionTarget", "status": "True",
                                                    "reason": "EvictionByEvictionAPI", "message": "Eviction API"}]),
        pod("preempted", "n-pre", "4", conditions=[{"type": "DisruptionTarget", "status": "True",
                                                    "reason": "PreemptionByScheduler", "message": "preempted"}]),
        pod("xid", "n-xid", "5"), pod("hook", "n-hook", "6"), pod("quiet", "n-quiet", "7"),
    ]
    events = [
        {"involvedObject": {"kind": "Pod", "name": "xid"}, "reason": "Warning",
         "message": "NVRM: Xid (PCI:0000:53:00): 79, pid=1234, GPU has fallen off the bus."},
        {"involvedObject": {"kind": "Pod", "name": "hook"}, "reason": "FailedPostStartHook",
         "message": "gpu_check: GPU 3 has 2 pending row remaps"},
        {"involvedObject": {"kind": "Pod", "name": "quiet"}, "reason": "BackOff", "message": "Back-off pulling image"},
    ]
    seen = nodes.cluster_suspects(pods, events)
    assert set(seen) == {"n-oom", "n-lost", "n-xid", "n-hook"}
    assert "OOMKilled" in seen["n-oom"] and "DeletionByTaintManager" in seen["n-lost"] and "Xid" in seen["n-xid"]


def test_a_deleted_pods_events_still_name_its_node():
    # the attempt failed, KubeRay deleted its pods; the events about them are still listed, and the follower knows
    # which node each pod was on from its earlier looks
    events = [{"involvedObject": {"kind": "Pod", "name": "c1-worker-x"}, "reason": "NodeNotReady",
               "message": "Node is not ready"}]
    assert nodes.cluster_suspects([], events) == {}
    assert nodes.cluster_suspects([], events, {"c1-worker-x": "gpu-5"}) == {
        "gpu-5": "pod c1-worker-x: NodeNotReady: Node is not ready"}


def test_only_the_attempts_own_pods_count():
    pods = [pod("old", "gpu-1", "1", cluster="c1"), pod("new", "gpu-2", "2", cluster="c2")]
    assert [p["metadata"]["name"] for p in nodes.pods_of_cluster(pods, "c2")] == ["new"]


def test_the_follower_puts_the_nodes_back_after_a_helm_upgrade_wrote_the_chart_groups(tmp_path):
    rayjob = full_rayjob()
    rayjob["metadata"].update(uid="u1", creationTimestamp="2026-01-01T00:00:00Z")
    rayjob["status"] = {"jobDeploymentStatus": "Running", "failed": 1, "rayClusterName": "c2"}
    api = StandInApi([copy.deepcopy(rayjob)])
    try:
        client = RayJobApi(api.url, "ml", "dapo-train")
        run_dir = tmp_path / "run"
        (run_dir / "logs").mkdir(parents=True)
        record = RunRecord(run_dir, "u1")
        record.leave_out({"gpu-4": "Xid 79"}, 1, 4)
        record.body["counted"] = 1
        record.save()
        keeper = Keeper(client, run_dir / "logs", selector="app.kubernetes.io/instance=dapo", leave_out=4,
                        say=lambda text: None)
        keeper.step(client.get(), None, lambda n: True, fresh_status=True)
        assert api.patched and nodes.live_exclusions(client.get() and client.last_object) == ["gpu-4"]
        # `helm upgrade` with the same values: the chart's worker groups again, without the follower's entry
        live = api.store[("/apis/ray.io/v1", "rayjobs", "ml")]["dapo-train"]
        live["spec"]["rayClusterSpec"] = copy.deepcopy(rayjob["spec"]["rayClusterSpec"])
        api.bump(live)
        keeper.step(client.get(), None, lambda n: True, fresh_status=True)
        assert len(api.patched) == 2 and nodes.live_exclusions(api.store[("/apis/ray.io/v1", "rayjobs", "ml")][
            "dapo-train"]) == ["gpu-4"]
    finally:
        api.close()

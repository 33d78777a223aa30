"""The fabric check (dapo.train.fabric, dapo.backends.verl.fabric): the all-reduce bus bandwidth measured for real
across two processes (gloo on CPU) with the floor passing and failing; the transport read from NCCL log lines of
public issues (tests/fixtures/nccl/*.log, each block names its source) for IB, EFA, GPUDirect-TCPX/TCPXO and Socket;
the run refused when the declared fabric is not the one NCCL chose; the chart's value reaching the entrypoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, free_port
from dapo.train import fabric

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"
SIZES = [2**16, 2**20, 2**22]


def _lines(name: str) -> list[str]:
    return [ln for ln in (FIXTURES / f"{name}.log").read_text().splitlines() if not ln.startswith("#")]


@pytest.fixture(scope="module")
def gloo_rows():
    """Two processes, one gloo group over loopback, the sweep measured (rank 0's JSON: the slowest rank's times)."""
    init = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    procs = [subprocess.Popen([sys.executable, "-m", "dapo.train.fabric", "--rank", str(r), "--world", "2", "--init",
                               init, "--backend", "gloo", "--sizes", ",".join(map(str, SIZES)), "--iters", "3"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    return json.loads(outs[0][0])


def test_the_bus_bandwidth_is_measured_across_two_processes(gloo_rows):
    assert [r["bytes"] for r in gloo_rows] == SIZES
    for r in gloo_rows:
        assert r["seconds"] > 0 and r["algbw_gbps"] == pytest.approx(r["bytes"] / r["seconds"] / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * (2 - 1) / 2)  # nccl-tests: 2(n-1)/n
    print("gloo over loopback, 2 ranks:", [(r["bytes"], round(r["busbw_gbps"], 3)) for r in gloo_rows])


_TEARDOWN_RANK = """
import json, os, sys
import torch.distributed as dist
from dapo.train.fabric import run_rank
rank = int(sys.argv[1])
rows = run_rank(rank, 2, sys.argv[2], backend="gloo", sizes=[2**16], iters=2, teardown=rank == 0)
print(json.dumps({"rows": len(rows), "group_up": dist.is_initialized()}), flush=True)
os._exit(0)  # rank 1's group stays up: the process ends without tearing it down, as a killed actor does
"""


def test_a_rank_leaves_its_process_group_only_when_asked_to_tear_down():
    """run_rank's teardown: rank 0 (teardown, the command line's ranks) leaves the group after measuring; rank 1
    (teardown=False, the fabric check's Ray actors, which the driver kills) leaves it up."""
    init = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    procs = [subprocess.Popen([sys.executable, "-c", _TEARDOWN_RANK, str(r), init], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for r in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    got = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert got == [{"rows": 1, "group_up": False}, {"rows": 1, "group_up": True}], outs


def test_the_floor_passes_and_fails_on_the_measured_bandwidth(gloo_rows):
    report = {"world": 2, "nodes": 1, "backend": "gloo", "sizes": gloo_rows, "transport": fabric.read_transport([])}
    measured = gloo_rows[-1]["busbw_gbps"]
    assert fabric.judge(report, "socket", floor_gbps=measured / 10) == []
    reasons = fabric.judge(report, "socket", floor_gbps=measured * 10)
    assert len(reasons) == 1 and "below the socket floor" in reasons[0] and "4 MiB" in reasons[0]
    text = fabric.format_report(report, "socket", reasons, measured * 10)
    assert "fabric check FAILED: all-reduce bus bandwidth" in text
    assert sum("busbw" in ln and "GB/s" in ln for ln in text.splitlines()) == len(SIZES) + 1  # + the header
    print(text)


@pytest.mark.parametrize("log, networks, expect", [
    ("socket", ["Socket"], "socket"),
    ("ib", ["IBext", "IB"], "ib"),
    ("efa", ["Libfabric", "AWS Libfabric"], "efa"),
    ("tcpx", ["GPUDirectTCPX_v7"], "tcpx"),
    ("tcpxo", ["FasTrak"], "tcpxo"),
    ("gib", ["gIB"], "gib"),
])
def test_the_transport_is_read_from_nccls_own_log_lines(log, networks, expect):
    tr = fabric.read_transport(_lines(log))
    assert tr["networks"] == networks and tr["fabrics"] == [expect]
    report = {"world": 16, "backend": "nccl", "sizes": [], "transport": tr}
    assert fabric.judge(report, expect) == []


def test_the_details_efa_provider_and_plugins_are_reported():
    efa, ib = fabric.read_transport(_lines("efa")), fabric.read_transport(_lines("ib"))
    assert efa["provider"] == "efa" and ib["plugins"] == ["NCCL RDMA Plugin v6"]
    assert fabric.read_transport(_lines("tcpx"))["plugins"] == ["GPUDirectTCPX_v7"]


def test_channel_lines_name_the_network_when_no_using_line_is_there():
    only_channels = [ln for ln in _lines("socket") if "via NET/" in ln]
    assert fabric.read_transport(only_channels)["networks"] == ["Socket"]
    fast = fabric.read_transport(_lines("fastsocket"))
    assert fast["networks"] == ["FastSocket"] and fast["fabrics"] == ["unknown:FastSocket"]


@pytest.mark.parametrize("declared, log", [("efa", "socket"), ("tcpx", "socket"), ("tcpxo", "tcpx"),
                                           ("ib", "socket"), ("tcpx", "fastsocket")])
def test_a_run_is_refused_when_nccl_did_not_choose_the_declared_fabric(declared, log):
    report = {"world": 16, "backend": "nccl", "sizes": [], "transport": fabric.read_transport(_lines(log))}
    reasons = fabric.judge(report, declared)
    assert len(reasons) == 1 and f"but the values declare {declared}" in reasons[0], reasons
    assert "NCCL chose" in fabric.format_report(report, declared, reasons)


def test_mixed_ranks_and_a_silent_log_are_refused():
    mixed = fabric.read_transport(_lines("efa") + _lines("socket"))
    assert mixed["fabrics"] == ["efa", "socket"]
    assert fabric.judge({"world": 16, "sizes": [], "transport": mixed}, "efa")
    silent = fabric.judge({"world": 16, "sizes": [], "transport": fabric.read_transport([])}, "efa")
    assert "no 'Using network' line" in silent[0]
    assert "not one of" in fabric.judge({"world": 2, "sizes": [], "transport": mixed}, "rdma")[0]


def test_bus_bandwidth_is_nccl_tests_definition():
    algbw, busbw = fabric.bus_bandwidth(8 * 10**9, 0.1, 16)
    assert algbw == pytest.approx(80.0) and busbw == pytest.approx(80.0 * 2 * 15 / 16)


def test_the_actor_turns_on_nccls_init_and_net_log_into_its_own_file():
    from dapo.backends.verl.fabric import nccl_debug_env

    assert nccl_debug_env({"NCCL_DEBUG_SUBSYS": "INIT,NET"}, "/tmp/x.%h.%p") == {
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": "/tmp/x.%h.%p"}
    assert nccl_debug_env({"NCCL_DEBUG_SUBSYS": "GRAPH"}, "f")["NCCL_DEBUG_SUBSYS"] == "GRAPH,INIT,NET"
    assert nccl_debug_env({"NCCL_DEBUG_SUBSYS": "^COLL"}, "f")["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert nccl_debug_env({}, "f")["NCCL_DEBUG_SUBSYS"] == "INIT,NET"


def test_dapo_train_refuses_the_check_on_the_local_backend(capsys):
    from dapo.train.cli import main

    assert main(["--preset", "tiny", "--fabric-check", "socket", "--no-attempt-log"]) == 2
    assert "--fabric-check measures the network between a verl run's GPUs" in capsys.readouterr().err


_RAY_SCRIPT = """
import json
from dapo.backends.verl.fabric import run_check
import ray
ray.init()  # RAY_ADDRESS: the loopback cluster's GCS
try:
    print("REPORT " + json.dumps(run_check(2, 1, backend="gloo", sizes=[2**16, 2**20], iters=3)))
finally:
    ray.shutdown()
"""


def _two_raylets() -> dict:
    """A RayJob whose cluster is a head and one worker of 2 CPUs each: room for both ranks on either node."""
    group = {"rayStartParams": {"num-cpus": "2"}, "template": {"spec": {"containers": [{"name": "ray", "resources": {}}]}}}
    return {"metadata": {"name": "fabric"}, "spec": {"rayClusterSpec": {
        "headGroupSpec": group, "workerGroupSpecs": [{**group, "groupName": "w", "replicas": 1}]}}}


@pytest.mark.slow
def test_the_check_runs_as_ray_actors_in_a_placement_group(tmp_path):
    """The path a cluster takes (actors in a placement group of one bundle per Ray node, rank 0's address handed to
    all, NCCL's debug file per process, actors and group removed after), with gloo ranks on CPU, on a loopback Ray
    cluster of two raylets (tests/kuberay_loopback.py) each with room for both ranks: the two ranks ran on the two
    Ray nodes, not packed onto one."""
    from kuberay_loopback import VENV_BIN, LoopbackRayCluster

    short = Path("/tmp") / f"dapo-fab-{os.getpid()}"  # Ray's socket paths must stay short
    short.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=str(ROOT), HOME=str(tmp_path), RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
               OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    cluster = None
    try:
        cluster = LoopbackRayCluster(_two_raylets(), short, env)
        out = subprocess.run([sys.executable, "-c", _RAY_SCRIPT], env={**env, "RAY_ADDRESS": f"127.0.0.1:{cluster.gcs_port}"},
                             capture_output=True, text=True, timeout=600)
    finally:
        if cluster is not None:
            cluster.close()
        subprocess.run(["rm", "-rf", str(short)], check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("REPORT "))[7:])
    assert report["world"] == 2 and report["nodes"] == 1 and report["ray_nodes"] == 2 and report["backend"] == "gloo"
    assert [r["bytes"] for r in report["sizes"]] == [2**16, 2**20] and report["sizes"][-1]["busbw_gbps"] > 0
    assert fabric.judge(report, "socket", floor_gbps=1e-6) == []


# --- the chart: fabric.* reaches the training entrypoint --------------------------------------------------------------

def _entrypoint(objects) -> str:
    return next(o for o in objects if o["kind"] == "RayJob")["spec"]["entrypoint"]


@pytest.mark.parametrize("fab, args", [
    ({"expect": "efa", "minBusBandwidthGBps": 25}, "--fabric-check=efa --fabric-min-busbw=25 placement.nodes="),
    ({"expect": "tcpxo", "minBusBandwidthGBps": 12.5}, "--fabric-check=tcpxo --fabric-min-busbw=12.5"),
    ({"expect": "ib", "recheck": "2026-12-02"}, "--fabric-check=ib --fabric-recheck=2026-12-02 placement.nodes="),
    ({"expect": "socket"}, "--fabric-check=socket placement.nodes="),
])
def test_fabric_values_reach_the_training_entrypoint(fab, args):
    from k8s_support import VALUES_DIR, helm_objects, user_values

    files = [VALUES_DIR / "full.yaml"]
    helm_job = _entrypoint(helm_objects(user_values(files, {"fabric": fab})))
    assert args in helm_job, helm_job
    from dapo.train.cli import build_parser

    parsed = build_parser().parse_args(helm_job.split(" ")[3:])  # what `python -m dapo.train` will parse
    assert parsed.fabric_check == fab["expect"] and parsed.fabric_recheck == fab.get("recheck")


def _refusal(values: dict) -> str:
    """The chart's message refusing these user values, with no stand-in (the template position left out)."""
    from k8s_support import refusal

    return refusal([], {"storage": {"storageClassName": "rwx"}, "image": {"published": True}, **values},
                   stand_in=False)


@pytest.mark.parametrize("values", [{"preset": "full"}, {"preset": "early"}, {"preset": "7b"},
                                    {"preset": "smoke", "nodes": 2}])
def test_a_multi_node_run_without_a_declared_fabric_is_refused_naming_the_fix(values):
    msg = _refusal(values)
    # the one missing value of these values (the images and the class are given): one line, naming the fix
    head, line = msg.split("\n")
    assert head == "1 value still needed before this installs:"
    assert line.startswith("- fabric.expect: ") and "GPUs, no fabric declared (NCCL would silently use TCP)" in line
    for fix in ("-f values/<cloud>.yaml (eks-p5, gke-a3-mega, gke-a3-high, gke-a3-ultra)",
                "--set fabric.expect=ib|efa|tcpx|tcpxo|gib|socket"):
        assert fix in line, fix


def test_a_multi_node_run_cannot_turn_its_check_off():
    msg = _refusal({"preset": "full", "fabric": {"expect": "efa", "check": False}})
    assert msg.startswith('fabric.check: preset "full" runs on 16 nodes x 8 GPUs: every')
    # a contradiction, refused on its own before the values still needed (here the fabric)
    assert _refusal({"preset": "full", "fabric": {"check": False}}).startswith("fabric.check: ")


@pytest.mark.parametrize("values, why", [
    ({"preset": "smoke"}, "one node"),
    ({"preset": "tiny"}, "the local backend"),
    ({"preset": "full", "train": {"runner": "reference"}, "rayAuth": {"enabled": False}}, "the upstream recipe"),
    ({"preset": "full", "train": {"enabled": False}, "eval": {"enabled": True}}, "evaluation only"),
    ({"preset": "full", "fabric": {"expect": "socket"}}, "TCP, declared"),
])
def test_runs_that_need_no_declared_fabric_render_without_one(values, why):
    from k8s_support import helm_objects

    values = {"storage": {"storageClassName": "rwx"}, "image": {"published": True}, **values}
    objects = helm_objects(values, stand_in=False)
    train = [o for o in objects if o["kind"] == "RayJob" and o["metadata"]["name"].endswith("-train")]
    if train and values.get("fabric", {}).get("expect") != "socket":
        assert "--fabric-check" not in train[0]["spec"]["entrypoint"], why


def test_the_readme_install_line_declares_a_fabric_and_full_alone_is_refused():
    """The README's install names a cloud file (`-f "values/$CLOUD.yaml"`, each cloud rendered by
    tests/test_docs_commands.py); the same line without it is refused with the fix."""
    import re

    readme = (ROOT / "README.md").read_text()
    install = next(ln for ln in readme.replace("\\\n", " ").splitlines()
                   if "charts/dapo" in ln and "values/full.yaml" in ln and ln.startswith("helm"))
    assert re.search(r'-f "?values/\$CLOUD\.yaml"?', install), install
    assert _refusal({"preset": "full"}).split("\n")[1].startswith("- fabric.expect:")


def test_notes_say_the_check_runs_first_and_where_a_failed_verdict_is():
    from k8s_support import VALUES_DIR, helm_notes, user_values

    notes = helm_notes(user_values([VALUES_DIR / "full.yaml", VALUES_DIR / "gke-a3-mega.yaml"]))
    assert "every attempt starts with the check of tcpxo across all 16 node(s)" in notes
    assert "/fabric-check.json" in notes and "--set fabric.recheck=<token>" in notes


# --- the verdict of a failed check, read by the retries (dapo.train.fabric_verdict) ----------------------------------

def test_a_failed_verdict_stops_only_the_same_check_and_a_pass_clears_it(tmp_path):
    from dapo.train import fabric_verdict as fv

    env = {"NCCL_SOCKET_IFNAME": "eth0", "FI_PROVIDER": "efa", "LD_LIBRARY_PATH": "/x", "HOME": "/h"}
    key = fv.check_key("efa", None, "", env)
    assert fv.read(tmp_path, key) is None  # no verdict yet
    path = fv.write(tmp_path, key, False, ["NCCL chose Socket"], "efa", {"fabric/passed": False})
    assert path == tmp_path / "fabric-check.json" and fv.read(tmp_path, key)["reasons"] == ["NCCL chose Socket"]
    # the same check: the same fabric, floor, token and network environment (others variables do not count)
    assert fv.check_key("efa", None, "", {**env, "HOME": "/other", "NCCL_DEBUG_FILE": "/tmp/n.%h"}) == key
    for other in (fv.check_key("ib", None, "", env), fv.check_key("efa", 50.0, "", env),
                  fv.check_key("efa", None, "2026-12-02", env), fv.check_key("efa", None, "", {**env, "FI_X": "1"}),
                  fv.check_key("efa", None, "", {**env, "LD_LIBRARY_PATH": "/y"})):
        assert other != key and fv.read(tmp_path, other) is None
    text = fv.refusal(path, fv.read(tmp_path, key))
    assert "not run again" in text and str(path) in text and "NCCL chose Socket" in text and "fabric.recheck" in text
    assert fv.write(tmp_path, key, True, [], "efa") is None and not path.exists()  # a pass removes it
    path.write_text("{not json")
    assert fv.read(tmp_path, key) is None  # an unreadable file stops nothing


def test_the_gate_refuses_before_connecting_and_records_a_measurement_error(tmp_path, monkeypatch):
    """dapo.backends.verl.fabric.gate without Ray: a recorded failure ends the attempt before connect(); an NCCL error
    during the measurement is a failed check, recorded like a low bandwidth."""
    from dapo.backends.verl import fabric as vf
    from dapo.train import fabric_verdict as fv

    calls, logged = [], []
    env = {"NCCL_SOCKET_IFNAME": "eth0"}

    def broken(*a, **k):
        raise vf.FabricMeasurementError("the all-reduce across 16 ranks did not complete: NCCL error: remote error")

    monkeypatch.setattr(vf, "check", broken)
    passed, _ = vf.gate(None, "efa", None, "", env, str(tmp_path), lambda: calls.append("connect"), log=logged.append)
    assert not passed and calls == ["connect"] and "NCCL error: remote error" in logged[0]
    assert fv.read(tmp_path, fv.check_key("efa", None, "", env))["reasons"][0].startswith("the all-reduce across 16")
    passed, _ = vf.gate(None, "efa", None, "", env, str(tmp_path), lambda: calls.append("connect"), log=logged.append)
    assert not passed and calls == ["connect"] and "not run again" in logged[-1]  # no second connect, no check
    monkeypatch.setattr(vf, "check", lambda *a, **k: ([], {"fabric/passed": True}))
    passed, _ = vf.gate(None, "efa", None, "after-fix", env, str(tmp_path), lambda: calls.append("connect"),
                        log=logged.append)
    assert passed and calls == ["connect", "connect"]  # a new token checks again
    assert fv.read(tmp_path, fv.check_key("efa", None, "after-fix", env)) is None


def test_a_placement_that_is_not_ready_names_the_nodes_that_fit_and_why_it_waits():
    from dapo.backends.verl.fabric import placement_shortfall

    gpu8 = {"Alive": True, "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 96, "GPU": 8}}
    head = {"Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 8}}
    dead = {"Alive": False, "NodeManagerAddress": "10.0.0.3", "Resources": {"CPU": 96, "GPU": 8}}
    msg = placement_shortfall([head, gpu8, dead], 2, 8, True, 600)
    assert "need 2 Ray node(s) with 8 CPU, 8 GPU each" in msg and "the cluster has 1 (10.0.0.2) of 2 alive" in msg
    assert "1 node(s) missing" in msg
    busy = placement_shortfall([gpu8, dict(gpu8, NodeManagerAddress="10.0.0.4")], 2, 8, True, 600)
    assert "has 2 (10.0.0.2, 10.0.0.4)" in busy and "taken by other Ray work" in busy and "missing" not in busy


@pytest.mark.parametrize("bad", ["0", "-5", "ten"])
def test_a_placement_timeout_that_is_not_a_positive_number_is_refused_naming_the_flag(bad, capsys):
    from dapo.train.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--preset", "verl-tiny", "--fabric-placement-timeout", bad])
    assert "--fabric-placement-timeout" in capsys.readouterr().err


# --- the placement judged from where the ranks ran (dapo.backends.verl.fabric.check) ---------------------------------

def _ranks_on(hosts: list[str], gloo_rows) -> list[dict]:
    """Every rank's answer as dapo.backends.verl.fabric._Rank.run returns it: 16 x 8 ranks spread over ``hosts`` in
    rank order, each with the measured rows and the NCCL lines of an IB fabric (tests/fixtures/nccl/ib.log)."""
    return [{"rank": r, "host": hosts[r * len(hosts) // 128], "ray_node": f"{r // 8:056x}", "sizes": gloo_rows,
             "nccl_lines": _lines("ib")} for r in range(128)]


@pytest.mark.parametrize("hosts, crossed", [(["gpu-a"], False), (["gpu-a", "gpu-b"], False),
                                            ([f"gpu-{i:02d}" for i in range(16)], True)])
def test_a_multi_node_check_whose_ranks_ran_on_fewer_hosts_than_the_preset_has_nodes_is_refused(
        hosts, crossed, gloo_rows, monkeypatch):
    """The 16-node preset's check measured on 1 or 2 hosts (Ray placed the bundles elsewhere than one per node: the
    all-reduce never crossed the fabric it judges) is refused naming the hosts, however good the numbers; on 16 it
    passes."""
    from dapo.backends.verl import fabric as vf
    from dapo.config.loader import load_preset

    preset = load_preset("full")
    assert (preset.placement.nodes, preset.placement.gpus_per_node) == (16, 8)
    monkeypatch.setattr(vf, "run_check", lambda nodes, gpus, backend, placement_timeout: vf.report_of(
        _ranks_on(hosts, gloo_rows), backend))
    logged: list[str] = []
    reasons, extra = vf.check(preset, "ib", floor_gbps=gloo_rows[-1]["busbw_gbps"] / 10, log=logged.append)
    if crossed:
        assert reasons == [] and extra["fabric/passed"] is True, reasons
        return
    assert len(reasons) == 1 and reasons[0].startswith(f"the ranks ran on {len(hosts)} host(s) ({', '.join(hosts)})")
    assert "not 16: the check did not cross the nodes" in reasons[0]
    assert extra["fabric/passed"] is False and "did not cross the nodes" in logged[-1]

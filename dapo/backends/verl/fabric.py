"""The fabric check on the run's Ray cluster (``dapo train --fabric-check FABRIC``), before verl's workers start.

:func:`run_check` places one Ray actor per GPU of the run (a placement group of one bundle per node, ``STRICT_SPREAD``
over the nodes, so the all-reduce crosses every node as training will), each with the job's environment -- the pods'
NCCL variables and the preset's ``placement.env`` reach it exactly as they reach verl's workers. Each actor turns on
NCCL's INFO log for INIT and NET into a file of its own (``NCCL_DEBUG_FILE``; the chart sets ``NCCL_DEBUG=INFO`` and
``NCCL_DEBUG_SUBSYS=INIT,NET`` already, a ``NCCL_DEBUG_SUBSYS`` without them gets them added), joins one NCCL process
group, runs :func:`dapo.train.fabric.measure` and returns its timings and its NCCL log lines. The driver reads the
transport from all ranks' lines, prints the report into the attempt log and judges it (:func:`dapo.train.fabric.judge`).
The actors and the placement group are gone before verl creates its own. On CPU ranks (gloo) the transport is gloo's
TCP (:data:`dapo.train.fabric.GLOO_TRANSPORT`), judged like NCCL's Socket.

:func:`gate` is what ``dapo train`` runs first: an earlier failed verdict of the same check ends the attempt at once
(:mod:`dapo.train.fabric_verdict`: KubeRay retries a failed attempt whatever its exit code), otherwise it connects,
checks and records a failure for the retries. A measurement that raises (an NCCL error) or does not finish within
:data:`MEASURE_TIMEOUT_S` is a failed check, recorded like the others. Ranks that cannot be placed within
``placement_timeout`` seconds (:data:`dapo.train.fabric.PLACEMENT_TIMEOUT_S`; fewer Ray nodes with a bundle's resources than the run
has nodes: a worker pod lost or never scheduled) end the attempt naming the nodes there are and the ones missing; that
is not a verdict on the fabric and is not recorded, so a retry -- a new RayCluster -- checks again.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from dapo.train import fabric, fabric_verdict

__all__ = ["run_check", "report_of", "nccl_debug_env", "check", "gate", "placement_shortfall", "FabricMeasurementError",
           "FabricPlacementError"]

# the all-reduce sweep takes seconds on a healthy fabric and tens of seconds on TCP; NCCL on a broken one can wait on
# its own timeouts for much longer
MEASURE_TIMEOUT_S = 900
PLACEMENT_TIMEOUT_S = fabric.PLACEMENT_TIMEOUT_S


class FabricMeasurementError(RuntimeError):
    """The ranks could not measure: NCCL failed, or the sweep did not finish within :data:`MEASURE_TIMEOUT_S`."""


class FabricPlacementError(RuntimeError):
    """The ranks could not be placed within the placement timeout: the Ray cluster lacks nodes the run needs."""


def placement_shortfall(ray_nodes: list[dict[str, Any]], nodes: int, gpus_per_node: int, gpu: bool,
                        waited_s: float) -> str:
    """Why a placement of ``nodes`` bundles (``gpus_per_node`` CPUs, and as many GPUs when ``gpu``), one per node, is
    not ready: the alive nodes that could hold a bundle (by their total resources) and how many are missing.
    ``ray_nodes``: :func:`ray.nodes`'s entries (``Alive``, ``NodeManagerAddress``, ``Resources``)."""
    need = {"CPU": gpus_per_node, **({"GPU": gpus_per_node} if gpu else {})}
    alive = [n for n in ray_nodes if n.get("Alive")]
    fit = [n for n in alive if all(n.get("Resources", {}).get(k, 0) >= v for k, v in need.items())]
    addrs = ", ".join(sorted(str(n.get("NodeManagerAddress", "?")) for n in fit)) or "none"
    want = ", ".join(f"{v} {k}" for k, v in need.items())
    msg = (f"the check's {nodes} x {gpus_per_node} ranks could not be placed in {waited_s:.0f} s: they need {nodes} "
           f"Ray node(s) with {want} each, one rank group per node; the cluster has {len(fit)} ({addrs}) of "
           f"{len(alive)} alive node(s)")
    if len(fit) < nodes:
        msg += (f": {nodes - len(fit)} node(s) missing -- a worker pod not scheduled, not ready or lost (kubectl get "
                "pods, the follower's causes), or placement.nodes above the worker group's replicas")
    else:  # enough nodes exist but their resources are held (another job, leftover actors)
        msg += ": enough nodes, but their resources are taken by other Ray work"
    return msg


def nccl_debug_env(environ: dict[str, str], log_file: str) -> dict[str, str]:
    """The variables an actor sets before NCCL starts: INFO, INIT and NET among the subsystems, one file per
    process (NCCL expands ``%h`` / ``%p``)."""
    subsys = [s for s in environ.get("NCCL_DEBUG_SUBSYS", "").split(",") if s]
    if subsys and subsys[0].startswith("^"):  # an exclusion list: replace it, INIT and NET are what is read
        subsys = []
    for s in ("INIT", "NET"):
        if s not in subsys and "ALL" not in subsys:
            subsys.append(s)
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": ",".join(subsys), "NCCL_DEBUG_FILE": log_file}


class _Rank:
    """One GPU of the check (a Ray actor: ``ray.remote(num_gpus=1)``)."""

    def address(self) -> tuple[str, int, str]:
        import socket

        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port, socket.gethostname()

    def run(self, rank: int, world: int, init: str, sizes: list[int], iters: int, backend: str) -> dict[str, Any]:
        import glob
        import socket
        import tempfile

        import ray

        log_dir = tempfile.mkdtemp(prefix="dapo-fabric-")
        os.environ.update(nccl_debug_env(dict(os.environ), os.path.join(log_dir, "nccl.%h.%p.log")))
        # no teardown: run_check kills this actor once every rank has answered, and a teardown that aborted would
        # turn a finished measurement into a failed check (recorded, refusing the retries)
        rows = fabric.run_rank(rank, world, init, backend=backend, sizes=sizes, iters=iters, teardown=False)
        lines: list[str] = []
        for path in sorted(glob.glob(os.path.join(log_dir, "nccl.*"))):
            with open(path, errors="replace") as f:
                lines += [ln.rstrip("\n") for ln in f if "NET" in ln or "Using network" in ln]
        return {"rank": rank, "host": socket.gethostname(), "ray_node": ray.get_runtime_context().get_node_id(),
                "sizes": rows, "nccl_lines": lines}


def run_check(nodes: int, gpus_per_node: int, *, backend: str = "nccl", sizes: Optional[list[int]] = None,
              iters: int = 20, placement_timeout: float = PLACEMENT_TIMEOUT_S) -> dict[str, Any]:
    """Measure on ``nodes`` x ``gpus_per_node`` ranks of the connected Ray cluster (one GPU each; ``backend="gloo"``:
    one CPU each, no GPU); returns the report (:func:`dapo.train.fabric.judge`'s input): world, nodes, backend, sizes
    (rank 0's rows: the all-reduced slowest times), transport, hosts. Raises :class:`FabricPlacementError` when the
    ranks cannot be placed within ``placement_timeout`` seconds."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    world = nodes * gpus_per_node
    gpu = 1 if backend == "nccl" else 0
    bundles = [{"CPU": gpus_per_node, **({"GPU": gpus_per_node} if gpu else {})}] * nodes
    pg = placement_group(bundles, strategy="STRICT_SPREAD" if nodes > 1 else "PACK")
    if not pg.wait(timeout_seconds=placement_timeout):
        remove_placement_group(pg)
        raise FabricPlacementError(placement_shortfall(ray.nodes(), nodes, gpus_per_node, bool(gpu),
                                                       placement_timeout))
    Rank = ray.remote(num_cpus=1, num_gpus=gpu)(_Rank)
    actors = [Rank.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=r // gpus_per_node)).remote() for r in range(world)]
    try:
        host, port, _ = ray.get(actors[0].address.remote())
        init = f"tcp://{host}:{port}"
        try:
            results = ray.get([a.run.remote(r, world, init, list(sizes or fabric.SIZES), iters, backend)
                               for r, a in enumerate(actors)], timeout=MEASURE_TIMEOUT_S)
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            raise FabricMeasurementError(f"the all-reduce across {world} ranks did not complete: {first}") from exc
    finally:
        for a in actors:
            ray.kill(a)
        remove_placement_group(pg)
    return report_of(results, backend)


def report_of(results: list[dict[str, Any]], backend: str) -> dict[str, Any]:
    """The check's report from every rank's answer (:meth:`_Rank.run`: rank, host, ray_node, sizes, nccl_lines, in
    rank order): world (the ranks), nodes (the distinct hosts they ran on), hosts, ray_nodes (the distinct Ray nodes:
    one per pod on Kubernetes, several per host on a loopback cluster), backend, sizes (rank 0's rows), transport
    (read from all ranks' NCCL lines; gloo: :data:`dapo.train.fabric.GLOO_TRANSPORT`)."""
    lines = [ln for r in results for ln in r["nccl_lines"]]
    hosts = sorted({r["host"] for r in results})
    transport = fabric.read_transport(lines) if backend == "nccl" else dict(fabric.GLOO_TRANSPORT)
    return {"world": len(results), "nodes": len(hosts), "hosts": hosts,
            "ray_nodes": len({r["ray_node"] for r in results}), "backend": backend,
            "sizes": results[0]["sizes"], "transport": transport}


def check(preset: Any, expect: str, floor_gbps: Optional[float] = None, log=print,
          placement_timeout: float = PLACEMENT_TIMEOUT_S) -> tuple[list[str], dict[str, Any]]:
    """Measure on the preset's placement, print the report, judge it. Returns (the reasons the run must not train --
    empty: it may --, the wandb config entries). Logical GPUs on CPU (``placement.accelerator: cpu``) measure gloo
    over CPU ranks."""
    from dapo.backends.verl.settings import CPU_ACCELERATOR

    pl = preset.placement
    backend = "gloo" if pl.accelerator == CPU_ACCELERATOR else "nccl"
    log(f"fabric check: all-reduce across {pl.nodes} x {pl.gpus_per_node} ranks before training (declared: {expect})")
    report = run_check(pl.nodes, pl.gpus_per_node, backend=backend, placement_timeout=placement_timeout)
    if backend == "nccl" and pl.nodes > 1 and report["nodes"] < pl.nodes:
        reasons = [f"the ranks ran on {report['nodes']} host(s) ({', '.join(report['hosts'])}), not {pl.nodes}: "
                   "the check did not cross the nodes"]
    else:
        reasons = []
    reasons += fabric.judge(report, expect, floor_gbps)
    log(fabric.format_report(report, expect, reasons, floor_gbps))
    return reasons, fabric.wandb_summary(report, expect, reasons)


def gate(preset: Any, expect: str, floor_gbps: Optional[float], recheck: str, environ: dict[str, str], run_dir: str,
         connect, log=print, placement_timeout: float = PLACEMENT_TIMEOUT_S) -> tuple[bool, dict[str, Any]]:
    """``dapo train --fabric-check``, before anything else of the run: an earlier attempt's failed verdict of the same
    check ends this one at once; otherwise ``connect()`` (join Ray), measure and judge, and record a failure for the
    retries (a pass removes an old one). Ranks that cannot be placed end the attempt unrecorded (the nodes, not the
    fabric). ``environ``: the job's own environment (part of what makes a check the same). Returns (passed, the wandb
    config entries)."""
    key = fabric_verdict.check_key(expect, floor_gbps, recheck, environ)
    earlier = fabric_verdict.read(run_dir, key)
    if earlier is not None:
        log(fabric_verdict.refusal(fabric_verdict.verdict_path(run_dir), earlier))
        return False, {}
    connect()
    try:
        reasons, extra = check(preset, expect, floor_gbps, log=log, placement_timeout=placement_timeout)
    except FabricPlacementError as exc:
        log(f"fabric check NOT RUN: {exc}; not recorded as a verdict (a retry checks again)")
        return False, {"fabric/declared": expect, "fabric/passed": False}
    except FabricMeasurementError as exc:
        reasons, extra = [str(exc)], {"fabric/declared": expect, "fabric/passed": False}
        log(f"fabric check FAILED: {exc}")
    path = fabric_verdict.write(run_dir, key, not reasons, reasons, expect, extra)
    if path is not None:
        log(f"fabric check: verdict in {path}; the retries of this run exit at once instead of checking again")
    return not reasons, extra

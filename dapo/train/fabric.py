"""The fabric check: which network NCCL chose, and the all-reduce bus bandwidth it gives, before training starts.

A 128-GPU run on the wrong transport (NCCL falls back to TCP sockets when the RDMA / EFA / GPUDirect-TCPX setup is
incomplete, and says so only in its INFO log) trains several times slower and nothing fails. ``dapo train
--fabric-check FABRIC`` (the chart's ``fabric.check``) runs this first, on the run's own GPUs and NCCL environment:

- **bus bandwidth**: an all-reduce of each message size in :data:`SIZES` across every rank, timed after warm-up;
  ``algbw = bytes / time`` and ``busbw = algbw x 2(n-1)/n`` -- nccl-tests' definition for all-reduce
  (NVIDIA/nccl-tests, doc/PERFORMANCE.md: "busBw = algBw * 2*(n-1)/n"), the number that is comparable to the
  hardware's link speed whatever the rank count. The time of a size is the slowest rank's mean.
- **transport**: read from NCCL's own log (``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS`` with INIT and NET, written per
  process to ``NCCL_DEBUG_FILE``): ``Using network <name>`` names the network plugin every communicator uses
  (``IB``/``IBext*`` = InfiniBand or RoCE, ``Socket`` = TCP, ``AWS Libfabric``/``Libfabric`` = aws-ofi-nccl on EFA,
  ``GPUDirectTCPX*`` = A3 High, ``FasTrak*`` = A3 Mega's TCPXO, ``gIB`` = A3 Ultra's RDMA plugin, ``FastSocket`` =
  GKE's TCP plugin, not GPUDirect; newer NCCL words it ``Assigned NET plugin <name> to comm``);
  the channel lines (``via NET/<name>/<dev>[/GDRDMA]``) and ``NET/OFI Selected Provider is efa`` add detail.
- **verdict** (:func:`judge`): the run fails, naming the reason, when any rank's network is not the declared
  fabric's, or the busbw of the largest message is below the fabric's floor (:data:`FABRICS`, or the value given).

The floors are ours and deliberately low: a fraction of what each fabric gives two healthy 8-GPU nodes, above what
NCCL's Socket transport gives on the same machines' TCP path (e.g. ~24 GB/s busbw over one 200 Gbps gVNIC). They catch
a fallback or a fabric running on a fraction of its NICs, not a 20% regression: set ``--fabric-min-busbw`` (chart:
``fabric.minBusBandwidthGBps``) from your first healthy run.

This module measures and judges (torch.distributed, any backend: NCCL on GPUs, gloo on CPU for the tests); the
processes come from the verl backend's Ray actors (:mod:`dapo.backends.verl.fabric`) or, for one rank by hand,
``python -m dapo.train.fabric --rank R --world N --init tcp://HOST:PORT``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from dapo.train.attempts import EXIT_FABRIC  # noqa: F401  (dapo train's exit codes live there)

# message sizes (bytes) of the all-reduce sweep: 1 MiB .. 1 GiB
SIZES = tuple(2**k for k in range(20, 31, 2))
# How long the check waits for its ranks' nodes (seconds). KubeRay submits the job once the RayCluster's pods are
# running, so every worker node is normally in Ray within seconds of the driver's start; ten minutes leave room for a
# worker pod that restarts or an autoscaler that adds one.
PLACEMENT_TIMEOUT_S = 600.0
# What torch.distributed's gloo backend runs on (its TCP transport, the only one PyTorch builds on Linux): the
# transport of a check on CPU ranks, judged like NCCL's Socket network.
GLOO_TRANSPORT = {"networks": ["Socket"], "plugins": [], "provider": None, "gdr": False, "fabrics": ["socket"]}


@dataclass(frozen=True)
class Fabric:
    networks: tuple[str, ...]  # NCCL network names ("Using network <name>", version suffix dropped) that count
    floor_gbps: float  # busbw floor of the largest message, GB/s (0: none)
    what: str


# The fabric a run declares -> what NCCL must pick and the busbw floor (see the module doc for what the floors are).
FABRICS: dict[str, Fabric] = {
    "socket": Fabric(("Socket",), 0.0, "TCP sockets (no RDMA): reported, never refused"),
    "ib": Fabric(("IB", "IBext"), 40.0, "InfiniBand or RoCE through NCCL's IB transport (NVIDIA network operator, "
                                        "AKS ND-series, GKE A3 Ultra RDMA networks)"),
    "efa": Fabric(("AWS Libfabric", "Libfabric", "OFI"), 40.0, "AWS EFA through the aws-ofi-nccl plugin (p5)"),
    "tcpx": Fabric(("GPUDirectTCPX",), 40.0, "GPUDirect-TCPX plugin (GKE A3 High)"),
    "tcpxo": Fabric(("FasTrak",), 60.0, "GPUDirect-TCPXO / FasTrak plugin (GKE A3 Mega)"),
    "gib": Fabric(("gIB",), 40.0, "Google's gIB plugin over the RDMA networks (GKE A3 Ultra, A4)"),
}

# "Using network X" (NCCL 2.4 .. 2.2x), "Assigned NET plugin X to comm" (newer NCCL)
_USING = re.compile(r"NCCL INFO (?:Using network |Assigned NET plugin )(?P<name>.+?)(?: to comm)?\s*$")
_LOADED = re.compile(r"NCCL INFO NET/Plugin ?: ?Loaded (?:net|coll) plugin (?P<name>.+?)(?: \(v\d+\))?\s*$")
_VIA = re.compile(r" via NET/(?P<name>[A-Za-z][^/\n]*?)/\d+(?P<gdr>/GDRDMA)?")
_PROVIDER = re.compile(r"NET/OFI Selected Provider is (?P<provider>\S+)")


def network_family(name: str) -> str:
    """An NCCL network name without its version suffix: ``IBext_v8`` -> ``IBext``, ``GPUDirectTCPX_v7`` ->
    ``GPUDirectTCPX``."""
    return re.sub(r"_v\d+$", "", name.strip())


def fabric_of(network: str) -> Optional[str]:
    """The :data:`FABRICS` key whose networks include ``network`` (None: a network no fabric here declares)."""
    family = network_family(network)
    for key, fab in FABRICS.items():
        if family in fab.networks:
            return key
    return None


def read_transport(lines: Iterable[str]) -> dict[str, Any]:
    """What NCCL's INIT/NET log lines say about the network: ``networks`` (every ``Using network`` name, in order of
    first appearance; the channel lines' ``via NET/<name>`` when no such line is present), ``plugins`` (net plugins
    NCCL loaded), ``provider`` (libfabric's, on EFA), ``gdr`` (a channel ran GPUDirect RDMA) and ``fabrics``."""
    networks: list[str] = []
    via: list[str] = []
    plugins: list[str] = []
    provider, gdr = None, False
    for line in lines:
        if m := _USING.search(line):
            networks.append(m.group("name"))
        elif m := _LOADED.search(line):
            plugins.append(m.group("name"))
        elif m := _PROVIDER.search(line):
            provider = m.group("provider")
        for v in _VIA.finditer(line):
            via.append(v.group("name"))
            gdr = gdr or bool(v.group("gdr"))
    names = list(dict.fromkeys(networks or via))
    return {"networks": names, "plugins": list(dict.fromkeys(plugins)), "provider": provider, "gdr": gdr,
            "fabrics": sorted({fabric_of(n) or f"unknown:{network_family(n)}" for n in names})}


def bus_bandwidth(size_bytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s) of one all-reduce: nccl-tests' ``algBw = S / t`` and ``busBw = algBw x
    2(n-1)/n``."""
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * 2.0 * (world - 1) / world


def measure(sizes: Iterable[int] = SIZES, *, iters: int = 20, warmup: int = 5, device: Any = None) -> list[dict]:
    """Time an all-reduce (fp32 sum) of each size on the initialised default process group; every rank calls it.
    Returns per size: bytes, the slowest rank's mean seconds, algbw and busbw (GB/s)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    sync = (lambda: torch.cuda.synchronize(device)) if device is not None and device.type == "cuda" else (lambda: None)
    rows = []
    for size in sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(x)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        sync()
        t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        algbw, busbw = bus_bandwidth(x.numel() * 4, float(t.item()), world)
        rows.append({"bytes": x.numel() * 4, "seconds": float(t.item()), "algbw_gbps": algbw, "busbw_gbps": busbw})
        del x
    return rows


def judge(report: dict[str, Any], expect: str, floor_gbps: Optional[float] = None) -> list[str]:
    """The reasons the run must not train (empty: it may). ``report``: ``transport`` (:func:`read_transport` over
    every rank's log), ``sizes`` (:func:`measure`), ``world``; ``expect``: a :data:`FABRICS` key."""
    if expect not in FABRICS:
        return [f"fabric {expect!r} is not one of {sorted(FABRICS)}"]
    fab = FABRICS[expect]
    floor = fab.floor_gbps if floor_gbps is None else float(floor_gbps)
    reasons = []
    tr = report["transport"]
    if tr["networks"] and tr["fabrics"] != [expect]:  # NCCL's choice from its log, or gloo's TCP (GLOO_TRANSPORT)
        reasons.append(f"NCCL chose {', '.join(tr['networks'])} ({', '.join(tr['fabrics'])}), but the values "
                       f"declare {expect}: {fab.what}")
    elif not tr["networks"] and report.get("backend", "nccl") == "nccl":
        reasons.append("NCCL logged no 'Using network' line (NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS INIT,NET "
                       "is needed to read the transport)")
    if report["sizes"] and floor > 0:
        last = report["sizes"][-1]
        if last["busbw_gbps"] < floor:
            reasons.append(f"all-reduce bus bandwidth {last['busbw_gbps']:.2f} GB/s at {_size(last['bytes'])} is "
                           f"below the {expect} floor {floor:g} GB/s")
    return reasons


def _size(n: int) -> str:
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{n / k:g} {unit}"
    return f"{n} B"


def format_report(report: dict[str, Any], expect: str, reasons: list[str],
                  floor_gbps: Optional[float] = None) -> str:
    """The driver log's account: transport, one line per message size, the verdict."""
    tr = report["transport"]
    floor = FABRICS[expect].floor_gbps if floor_gbps is None and expect in FABRICS else (floor_gbps or 0.0)
    lines = [f"fabric check: {report['world']} ranks on {report.get('nodes', '?')} node(s), backend "
             f"{report.get('backend', 'nccl')}, declared fabric {expect} (floor {floor:g} GB/s busbw)",
             f"fabric check: NCCL network {', '.join(tr['networks']) or '-'}"
             + (f"; plugins {', '.join(tr['plugins'])}" if tr["plugins"] else "")
             + (f"; provider {tr['provider']}" if tr["provider"] else "") + ("; GPUDirect RDMA" if tr["gdr"] else ""),
             "fabric check: all-reduce (busbw = algbw x 2(n-1)/n, nccl-tests)"]
    for r in report["sizes"]:
        lines.append(f"fabric check: {_size(r['bytes']):>9}  {r['seconds'] * 1e3:9.3f} ms  algbw "
                     f"{r['algbw_gbps']:8.2f} GB/s  busbw {r['busbw_gbps']:8.2f} GB/s")
    lines += [f"fabric check FAILED: {why}" for why in reasons] or ["fabric check passed"]
    return "\n".join(lines)


def wandb_summary(report: dict[str, Any], expect: str, reasons: list[str]) -> dict[str, Any]:
    """The check as flat keys for the run's wandb config (``fabric/...``)."""
    out: dict[str, Any] = {"fabric/declared": expect, "fabric/networks": ",".join(report["transport"]["networks"]),
                           "fabric/passed": not reasons, "fabric/world": report["world"]}
    for r in report["sizes"]:
        out[f"fabric/busbw_gbps/{r['bytes']}"] = round(r["busbw_gbps"], 3)
    return out


def run_rank(rank: int, world: int, init: str, *, backend: str = "gloo", sizes: Iterable[int] = SIZES,
             iters: int = 20, teardown: bool = True) -> list[dict]:
    """One rank of the measurement in this process: join ``init`` (``tcp://host:port``), measure, leave.
    ``teardown=False`` leaves the process group up: for a process that ends right after (the check's Ray actors, which
    the driver kills), where a teardown could only fail a finished measurement -- gloo's can abort the process after
    the work is done ("terminate called without an active exception", seen in this repository's tests)."""
    import torch
    import torch.distributed as dist

    device = None
    if backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    try:
        return measure(sizes, iters=iters, device=device)
    finally:
        if teardown:
            dist.destroy_process_group()


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dapo.train.fabric",
                                 description="one rank of the all-reduce bus-bandwidth sweep; rank 0 prints JSON")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--init", required=True, help="tcp://HOST:PORT of rank 0")
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="message sizes in bytes, comma-separated")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    rows = run_rank(args.rank, args.world, args.init, backend=args.backend,
                    sizes=[int(s) for s in args.sizes.split(",")], iters=args.iters)
    if args.rank == 0:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

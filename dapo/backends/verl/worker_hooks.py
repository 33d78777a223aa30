"""What every Ray worker process of a verl run does for the run's reliability, imported in each of them through
``VERL_USE_EXTERNAL_MODULES`` (verl's ``__init__`` imports the listed modules in every process that imports verl):

- **the process-group timeout, on purpose**: verl 0.9.1's FSDP workers create their process group with
  ``timeout_second=None`` (``verl/workers/engine_workers.py`` line 89 -> ``verl/utils/distributed.py``
  ``initialize_global_process_group_ray``), so torch's default applies (NCCL 10 min, gloo 30 min) and verl's own
  ``actor_rollout_ref.nccl_timeout`` is read by nothing. :func:`patch_process_group_timeout` passes that key's value
  (``DAPO_PG_TIMEOUT_S``, set by the driver from the config) where verl passes None. A collective that waits longer
  fails on the waiting ranks, and the NCCL flight recorder (``TORCH_NCCL_TRACE_BUFFER_SIZE``,
  ``TORCH_NCCL_DUMP_ON_TIMEOUT``, ``TORCH_FR_DUMP_TEMP_FILE``: :func:`env_for`) writes each rank's record of it to the
  attempt's evidence directory on the shared volume.
- **no checkpoint with non-finite weights**: verl's ``TrainingWorker.save_checkpoint`` checks this rank's shard first
  and refuses a non-finite one (:func:`patch_finite_save`), so no attempt can resume from one;
- **stacks on request**: a daemon thread (:class:`Requests`) looks for the driver's requests in
  ``<run dir>/evidence/attempt-<N>/requests.json`` every second. ``stacks``: it writes this process's Python stacks
  (every thread) and, where the flight recorder is on, its record of the collectives, to the request's directory --
  no ptrace, no privilege and no network needed, so it works under the restricted pod security level, which
  forbids the ``SYS_PTRACE`` capability py-spy needs. A process that does not answer (frozen, or its node gone) is
  named by its absence. ``probe``: each FSDP rank times a fixed matrix multiply on its device (CUDA events on a GPU)
  and reports it with its node, pod and process-group timeout (``ranks/rank-<r>.json``): in a synchronous data-
  parallel step every rank waits for the slowest, so a slow GPU shows only in work of its own.

Set up only in Ray workers of a run whose driver exported ``DAPO_RUN_DIR`` (:func:`env_for`); in the driver, in
tests, or without the variables importing it does nothing.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Optional

ENV_RUN_DIR, ENV_ATTEMPT, ENV_DRIVER_PID = "DAPO_RUN_DIR", "DAPO_ATTEMPT", "DAPO_DRIVER_PID"
ENV_PG_TIMEOUT, ENV_POLL = "DAPO_PG_TIMEOUT_S", "DAPO_HOOK_POLL_S"
# the flight recorder's ring buffer (entries), as PyTorch's flight-recorder tutorial recommends (2000)
FR_BUFFER = "2000"
MARK = "_dapo_pg_timeout"


def attempt_dir(run_dir: str | os.PathLike, attempt: int | str) -> Path:
    return Path(run_dir) / "evidence" / f"attempt-{attempt}"


def env_for(run_dir: str, attempt: int, pg_timeout_s: Optional[float], driver_pid: int) -> dict[str, str]:
    """The variables the driver adds to the workers' runtime env for attempt ``attempt``."""
    evidence = attempt_dir(run_dir, attempt)
    env = {ENV_RUN_DIR: str(run_dir), ENV_ATTEMPT: str(attempt), ENV_DRIVER_PID: str(driver_pid),
           # the flight recorder (PyTorch: torch_nccl_environment_variables; torch 2.11's names, still read by 2.13)
           "TORCH_NCCL_TRACE_BUFFER_SIZE": FR_BUFFER, "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
           "TORCH_FR_DUMP_TEMP_FILE": str(evidence / "nccl_trace_rank_")}
    if pg_timeout_s:
        env[ENV_PG_TIMEOUT] = str(int(pg_timeout_s))
    return env


# -- the process-group timeout -----------------------------------------------------------------------------------------
def patch_process_group_timeout(seconds: int) -> bool:
    """verl's ``initialize_global_process_group_ray`` with ``seconds`` where its caller passes no timeout (module
    docstring); also in ``verl.workers.engine_workers`` when that module already holds the old function. Returns
    False when already patched."""
    import verl.utils.distributed as dist

    fn = dist.initialize_global_process_group_ray
    if getattr(fn, MARK, False):
        return False

    @functools.wraps(fn)  # __wrapped__: the CPU platform's patch reads verl's own source through it
    def initialize_global_process_group_ray(timeout_second: Any = None, backend: Any = None, *args: Any,
                                            **kwargs: Any) -> Any:
        return fn(seconds if timeout_second is None else timeout_second, backend, *args, **kwargs)

    setattr(initialize_global_process_group_ray, MARK, True)
    dist.initialize_global_process_group_ray = initialize_global_process_group_ray
    workers = sys.modules.get("verl.workers.engine_workers")
    if workers is not None and getattr(workers, "initialize_global_process_group_ray", None) is fn:
        workers.initialize_global_process_group_ray = initialize_global_process_group_ray
    return True


def process_group_timeout_s() -> Optional[float]:
    """The default process group's timeout in seconds, read back from its backend (None: no process group)."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    pg = dist.distributed_c10d._get_default_group()
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        return pg._get_backend(device).options._timeout.total_seconds()
    except (AttributeError, RuntimeError):
        return None


# -- no checkpoint with non-finite weights -------------------------------------------------------------------------------
def nonfinite_parameters(module: Any) -> list[str]:
    """Names of ``module``'s parameters holding a NaN or an infinity in this rank's shard (an FSDP2 DTensor's local
    part: no collective)."""
    import torch

    bad = []
    with torch.no_grad():
        for name, p in module.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if local.numel() and not bool(torch.isfinite(local).all()):
                bad.append(name)
    return bad


def patch_finite_save(engine_workers: Any) -> bool:
    """verl's ``TrainingWorker.save_checkpoint`` refusing to write this rank's shard when it is not finite: it raises
    with :data:`dapo.train.attempts.NONFINITE_WEIGHTS_MARK`, the rank and the first parameters, which the loop turns
    into a non-finite end of the attempt (nothing of the step is saved). Returns False when already patched."""
    from dapo.train.attempts import NONFINITE_WEIGHTS_MARK

    cls = engine_workers.TrainingWorker
    fn = cls.save_checkpoint
    if getattr(fn, MARK, False):
        return False

    def save_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
        module = getattr(getattr(self, "engine", None), "module", None)
        bad = nonfinite_parameters(module) if module is not None else []
        if bad:
            me = who()
            raise RuntimeError(f"{NONFINITE_WEIGHTS_MARK}: rank {me['rank']} on node {me['node'] or me['host']}: "
                               f"{len(bad)} parameters not finite, e.g. {', '.join(bad[:3])}")
        return fn(self, *args, **kwargs)

    save_checkpoint.__doc__ = fn.__doc__
    setattr(save_checkpoint, MARK, True)
    cls.save_checkpoint = save_checkpoint
    return True


# -- requests: stacks and the compute probe ------------------------------------------------------------------------------
def who() -> dict[str, Any]:
    """What identifies this process in the evidence: rank, node, pod, host, pid, and Ray's process title (it names
    the actor class and the method it is running)."""
    try:
        title = Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        title = sys.argv[0]
    rank = os.environ.get("RANK")
    return {"rank": int(rank) if rank is not None and rank.isdigit() else None,
            "node": os.environ.get("DAPO_NODE_NAME"), "pod": os.environ.get("DAPO_POD_NAME"),
            "host": os.uname().nodename, "pid": os.getpid(), "title": title}


def _name(me: dict[str, Any]) -> str:
    tag = f"rank{me['rank']}" if me["rank"] is not None else "proc"
    return f"{tag}-{me['host']}-{me['pid']}"


def write_stacks(dest: Path, header: str) -> Path:
    """This process's Python stacks (every thread) and, when it has one, its flight-recorder record, into ``dest``."""
    me = who()
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    lines = [header, json.dumps(me, sort_keys=True), ""]
    for ident, frame in frames.items():
        lines.append(f"--- thread {names.get(ident, '?')} ({ident}) ---")
        lines.extend(s.rstrip("\n") for s in traceback.format_stack(frame))
        lines.append("")
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"stacks-{_name(me)}.txt"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)
    fr = _flight_record()
    if fr:
        fr_path = dest / f"flight-recorder-{_name(me)}.json"
        # torch's dump returns the JSON as bytes
        fr_path.write_bytes(fr) if isinstance(fr, bytes) else fr_path.write_text(fr)
    return path


def _flight_record() -> Optional[str | bytes]:
    """The flight recorder's entries of this process as JSON (its private dump call; None when it is off or absent)."""
    if "torch" not in sys.modules or not os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE"):
        return None
    try:
        import torch.distributed as dist

        if not dist.is_initialized():
            return None
        c10d = __import__("torch._C._distributed_c10d", fromlist=["_dump_fr_trace_json"])
        dump = getattr(c10d, "_dump_nccl_trace_json", None) or getattr(c10d, "_dump_fr_trace_json", None)
        return dump() if dump is not None else None
    except Exception:  # a debugging aid: never the reason a dump fails
        return None


def compute_probe() -> float:
    """Seconds of a fixed amount of matrix-multiply work on this rank's device: 10 x (4096^3) in bf16 on a GPU
    (timed with CUDA events, ~10 ms on an H100), 120 x (256^3) in float32 on a CPU (~50 ms: long against the
    scheduler's slices, so a rank that gets half the CPU is seen at half speed)."""
    import torch

    if torch.cuda.is_available():
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            a @ a
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1000.0
    a = torch.randn(256, 256)
    t0 = time.perf_counter()
    for _ in range(120):
        a @ a
    return time.perf_counter() - t0


def post(run_dir: str | os.PathLike, attempt: int, kind: str, keep: int = 8, **fields: Any) -> int:
    """The driver's side: append a request (``stacks``: ``dest``, ``header``; ``probe``: ``step``) to the attempt's
    ``requests.json`` (the newest ``keep`` are kept); returns its sequence number."""
    path = attempt_dir(run_dir, attempt) / "requests.json"
    try:
        reqs = json.loads(path.read_text())
    except (OSError, ValueError):
        reqs = []
    seq = max([r.get("seq", 0) for r in reqs] or [0]) + 1
    reqs = (reqs + [{"seq": seq, "kind": kind, **fields}])[-keep:]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(reqs, default=str))
    os.replace(tmp, path)
    return seq


class Requests:
    """The thread that answers the driver's requests (module docstring)."""

    def __init__(self, run_dir: str, attempt: str, poll: float = 1.0):
        self.dir = attempt_dir(run_dir, attempt)
        self.file = self.dir / "requests.json"
        self.poll = poll
        self.done: set[int] = set()

    def answer(self, req: dict[str, Any]) -> None:
        kind = req.get("kind")
        if kind == "stacks":
            write_stacks(Path(req["dest"]), str(req.get("header", "")))
        elif kind == "probe":
            me = who()
            if me["rank"] is None or process_group_timeout_s() is None:
                return  # not an FSDP rank (a vLLM server, the agent loop)
            body = {**me, "seq": req["seq"], "step": req.get("step"), "probe_s": compute_probe(),
                    "pg_timeout_s": process_group_timeout_s(), "time": time.time()}
            out = self.dir / "ranks" / f"rank-{me['rank']}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(body, sort_keys=True))
            os.replace(tmp, out)

    def run(self) -> None:
        patched = False
        while True:
            time.sleep(self.poll)
            workers = sys.modules.get("verl.workers.engine_workers")  # imported with the worker's class ...
            if not patched and workers is not None and hasattr(workers, "ActorRolloutRefWorker"):  # ... and done
                patched = True
                try:
                    patch_finite_save(workers)
                except Exception as exc:  # never the end of this thread
                    print(f"dapo worker hooks: the finite-save check is off here: {exc}", file=sys.stderr)
            try:
                reqs = json.loads(self.file.read_text())
            except (OSError, ValueError):
                continue
            for req in reqs if isinstance(reqs, list) else []:
                seq = req.get("seq")
                if isinstance(seq, int) and seq not in self.done:
                    self.done.add(seq)
                    try:
                        self.answer(req)
                    except Exception as exc:  # one failed answer must not end the thread
                        print(f"dapo worker hooks: request {req.get('kind')} failed: {exc}", file=sys.stderr)


def install(environ: "os._Environ[str] | dict[str, str]" = os.environ) -> bool:
    """Set this process up (module docstring) when it is a worker of a run; returns whether it did."""
    run_dir, attempt = environ.get(ENV_RUN_DIR), environ.get(ENV_ATTEMPT)
    if not run_dir or not attempt or environ.get(ENV_DRIVER_PID) == str(os.getpid()):
        return False
    if environ.get(ENV_PG_TIMEOUT):
        patch_process_group_timeout(int(float(environ[ENV_PG_TIMEOUT])))
    requests = Requests(run_dir, attempt, float(environ.get(ENV_POLL, "1") or 1))
    threading.Thread(target=requests.run, name="dapo-requests", daemon=True).start()
    return True


install()

"""A training driver's side of the attempt protocol (dapo.train.attempts), with faults injected by the tests of the
log follower's actions (tests/test_keeper.py): it writes its attempt log (dapo.train.runlog, the real writer), a
progress.json heartbeat from a thread, and at its end an end record; it then waits for the follower's answer
(``DAPO_ACK_TIMEOUT_S``) before it exits, as `dapo train` does.

    python tests/attempt_driver.py --log-dir RUN/logs --bad-node gpu-1 --cause error

Its node list is ``DAPO_ATTEMPT_NODES`` (the nodes of its attempt's workers, set by the KubeRay twin); ``--bad-node``
makes every attempt that runs on that node fail naming it (``--name-by ip``: by the pod's IP only, as an ActorDied
names an address; ``--cause``); ``--final`` writes the run's verdict and a final end record; ``--hang`` keeps
heartbeating without ending (the test freezes it with SIGSTOP); ``--fail-always`` fails every attempt.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

from dapo.train import attempts, runlog


def heartbeat(run_dir: Path, attempt: int, every: float) -> None:
    since = time.time()
    while True:
        now = time.time()
        attempts.write_json(attempts.progress_path(run_dir), {
            "attempt": attempt, "pid": os.getpid(), "host": os.uname().nodename, "pod": os.environ.get("DAPO_POD_NAME"),
            "phase": "update_actor", "step": 3, "since": since, "budget_s": 600, "deadline": since + 600,
            "heartbeat": now, "heartbeat_every_s": every})
        time.sleep(every)


def body(args) -> int:
    n = runlog.active().number
    run_dir = args.log_dir.parent
    threading.Thread(target=heartbeat, args=(run_dir, n, args.every), daemon=True).start()
    nodes = [x for x in os.environ.get("DAPO_ATTEMPT_NODES", "").split(",") if x]
    ips = json.loads(os.environ.get("DAPO_ATTEMPT_IPS", "{}"))
    print(f"attempt {n} on {nodes}", flush=True)
    time.sleep(0.3)
    if args.hang:
        while True:
            time.sleep(0.1)
    if args.final:
        attempts.write_verdict(run_dir, key="k", cause="nonfinite", message="actor/pg_loss = nan at step 3",
                               step=3, attempt=n)
        attempts.write_end(args.log_dir, n, cause="nonfinite", message="actor/pg_loss = nan at step 3, again",
                           step=3, phase="update_actor", final=True)
    elif args.fail_always or (args.bad_node and args.bad_node in nodes):
        bad = args.bad_node if args.bad_node in nodes else nodes[0]
        entry = (attempts.node_entry(ip=ips[bad], why=f"ActorDied: a worker at {ips[bad]} died", rank=1)
                 if args.name_by == "ip" else attempts.node_entry(bad, why="rank 1 stuck in update_actor", rank=1))
        attempts.write_end(args.log_dir, n, cause=args.cause, message=f"{args.cause} on {bad}", step=3,
                           phase="update_actor", nodes=[entry])
    else:
        attempts.write_end(args.log_dir, n, cause="complete", message="done", step=5)
        return 0
    ack = attempts.wait_for_ack(args.log_dir, n, poll=0.05)
    print(f"ack: {ack}", flush=True)
    return attempts.CAUSES["nonfinite" if args.final else args.cause]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--log-dir", type=Path, required=True)
    p.add_argument("--bad-node", default="")
    p.add_argument("--name-by", default="node", choices=["node", "ip"])
    p.add_argument("--cause", default="error")
    p.add_argument("--final", action="store_true")
    p.add_argument("--hang", action="store_true")
    p.add_argument("--fail-always", action="store_true")
    p.add_argument("--every", type=float, default=0.2)
    args = p.parse_args()
    return runlog.run_logged(args.log_dir, lambda: body(args), header="test driver", prog="attempt_driver")


if __name__ == "__main__":
    sys.exit(main())

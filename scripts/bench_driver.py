#!/usr/bin/env python
"""The driver's work on one generation batch at ``full``'s shapes: the token lists the verl backend hands the tokenizer,
before and after it stopped turning the padded tensor into Python ints (not a test).

One generation batch of ``full``: gen_batch_size 1536 x n 16 = 24,576 responses, right-padded to
max_response_length 20,480 with Qwen's pad id (151643), after prompts of 2,048; response lengths drawn from an
exponential distribution with ``dapo plan``'s assumed mean (4,096 tokens), capped at 20,480. Synthetic tensors, no
model. Each method runs in its own process (so each peak is its own):

- ``padded`` (the backend before): ``responses.tolist()`` -- every slot a Python int -- then each row cut to its length;
- ``valid`` (now, :func:`dapo.backends.verl.batch.valid_response_ids`): the valid tokens gathered by the mask in one
  tensor op, only they turned into Python ints.

Reported per method: seconds, and the peak resident memory the method adds on top of the batch's tensors (Linux:
the peak RSS, reset through ``/proc/self/clear_refs`` after the batch is built, minus the RSS then). ``--fraction`` runs the first fraction of the rows (both
methods are linear in the rows) when the machine cannot hold the whole batch; the printed totals are scaled to the
whole batch and say so.

Usage: ``python scripts/bench_driver.py [--fraction 0.0625] [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

ROWS, WIDTH, PROMPT, MEAN_LEN, PAD = 1536 * 16, 20480, 2048, 4096, 151643


def _batch(rows: int, seed: int = 0):
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.exponential(MEAN_LEN, rows)), 1, WIDTH).astype(np.int64)
    resp = torch.full((rows, WIDTH), PAD, dtype=torch.int64)
    valid = torch.arange(WIDTH)[None, :] < torch.as_tensor(lengths)[:, None]
    resp[valid] = torch.randint(0, 151000, (int(lengths.sum()),))
    attn = torch.cat([torch.ones((rows, PROMPT), dtype=torch.int64), valid.to(torch.int64)], dim=1)
    del valid
    return SimpleNamespace(batch={"responses": resp, "attention_mask": attn,
                                  "prompts": torch.empty((rows, PROMPT), dtype=torch.int64)}), lengths


def _padded(data):
    """The verl backend's token lists before (VerlBackend._rollout up to this change)."""
    import numpy as np

    from dapo.backends.verl.batch import response_lengths

    L = response_lengths(data).cpu().numpy().astype(np.int64)
    rows_ids = data.batch["responses"].cpu().tolist()
    return [r[: int(n)] for r, n in zip(rows_ids, L)]


def _valid(data):
    from dapo.backends.verl.batch import valid_response_ids

    return valid_response_ids(data)[0]


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _one(method: str, rows: int) -> dict:
    data, lengths = _batch(rows)
    with open("/proc/self/clear_refs", "w") as f:  # Linux: "5" resets the peak RSS (VmHWM) to the current RSS
        f.write("5")
    before = _status_bytes("VmRSS")
    t0 = time.perf_counter()
    ids = (_padded if method == "padded" else _valid)(data)
    seconds = time.perf_counter() - t0
    peak = _status_bytes("VmHWM")
    assert len(ids) == rows and [len(x) for x in ids[:50]] == lengths[:50].tolist()
    return {"method": method, "rows": rows, "tokens": int(lengths.sum()), "seconds": seconds,
            "added_peak_bytes": peak - before}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fraction", type=float, default=1.0, help="share of full's 24,576 rows to run (scaled up)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--one", choices=["padded", "valid"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    rows = max(1, int(round(ROWS * args.fraction)))
    if args.one:
        print(json.dumps(_one(args.one, rows)))
        return 0
    results = []
    for _ in range(args.repeats):
        for method in ("padded", "valid"):  # alternating, so that machine load hits both alike
            out = subprocess.run([sys.executable, __file__, "--one", method, "--fraction", str(args.fraction)],
                                 capture_output=True, text=True, check=True, env=os.environ)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    scale = ROWS / rows
    print(f"one generation batch of full: {ROWS:,} x {WIDTH:,} response slots; measured on {rows:,} rows "
          f"(x{scale:g} to the whole batch), {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    for method in ("padded", "valid"):
        rs = [r for r in results if r["method"] == method]
        s = min(r["seconds"] for r in rs)
        mem = max(r["added_peak_bytes"] for r in rs)
        print(f"  {method:6s}: {s:7.2f} s, +{mem / 2**30:6.2f} GiB peak on {rs[0]['tokens']:,} tokens -> whole batch "
              f"~{s * scale:7.1f} s, ~{mem * scale / 2**30:6.1f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

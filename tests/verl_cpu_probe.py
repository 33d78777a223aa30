"""``dapo train`` with a recorder around the verl backend's real calls, for tests/test_verl_cpu_e2e.py.

Usage: ``python tests/verl_cpu_probe.py RECORD_DIR -- <dapo train arguments>``. It runs :func:`dapo.train.cli.main`
in this process, exactly as ``dapo train`` does, after wrapping (never replacing) four methods, and appends what they
saw to ``RECORD_DIR/events-<attempt>.jsonl`` (attempt = 1, 2, ... per invocation):

- ``RayWorkers.sync_weights``: every actor -> vLLM weight push (verl's ``checkpoint_manager.update_weights``), with
  the loop step it served. Before the first push of the first attempt, the vLLM replicas still hold the dummy weights
  verl starts them with (``load_format: dummy``): the recorder generates from a few training prompts right then and
  has the actor score the sampled tokens (the backend's own ``generate`` / ``compute_old_log_probs``), so the test
  sees how far apart the two are *before* any sync.
- ``RayWorkers.compute_log_prob``: the batch sent to the actor (token ids, masks, vLLM's ``rollout_log_probs``, the
  placed rewards ``token_level_scores``) and the actor's ``old_log_probs``, saved as ``logprob-<attempt>-<n>.pt``.
- ``RayWorkers.load_checkpoint``: right after verl loaded a checkpoint (a resume), the actor's state is saved again by
  the workers into ``reloaded-<attempt>/``, so the test can compare it with the checkpoint it was loaded from.
- ``DynamicSampler.add``: the group ids and filter-metric values of every training generation batch, i.e. the input
  of the paper's Algorithm 1 as the run saw it.
- every verl call the loop makes on the trainer (:class:`dapo.bench.verl_calls.CallRecorder`: generate / validate,
  sleep, update_weights, old log-prob, update, save, load), as ``call`` events in order, with the replicas' state
  before each; the recorder's own calls above (the pre-sync probe, the re-save after a load) are left out.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    record = Path(argv[0])
    if argv[1] != "--":
        raise SystemExit("usage: verl_cpu_probe.py RECORD_DIR -- <dapo train arguments>")
    record.mkdir(parents=True, exist_ok=True)
    attempt = 1 + len(list(record.glob("events-*.jsonl")))
    events = open(record / f"events-{attempt}.jsonl", "a", buffering=1)

    def log(**kw) -> None:
        events.write(json.dumps({"attempt": attempt, **kw}) + "\n")
        events.flush()
        os.fsync(events.fileno())

    import torch

    from dapo.backends.base import Sampling
    from dapo.backends.verl import backend as backend_mod
    from dapo.backends.verl import workers as workers_mod
    from dapo.data.files import read_rows
    from dapo.sampler import DynamicSampler

    from dapo.bench.verl_calls import CallRecorder

    seen: dict = {"log_prob_calls": 0}
    attach = workers_mod.RayWorkers._attach

    def attach_recording(self, trainer):
        attach(self, trainer)
        seen["calls"] = CallRecorder(trainer, sink=lambda e: log(event="call", **e))

    workers_mod.RayWorkers._attach = attach_recording

    init = backend_mod.VerlBackend.__init__

    def backend_init(self, *a, **k):
        init(self, *a, **k)
        seen["backend"] = self

    backend_mod.VerlBackend.__init__ = backend_init

    def before_first_sync(workers) -> None:
        backend = seen["backend"]
        ro = backend.recipe.rollout
        rows = read_rows(list(backend.recipe.data.train_files), "recipe.data.train_files")[:4]
        sampling = Sampling(n=ro.n, temperature=ro.temperature, top_p=ro.top_p, top_k=ro.top_k, do_sample=True,
                            max_tokens=backend.recipe.data.max_response_length)
        # vLLM CPU has no sleep mode: the replicas are up, with the dummy weights they started with
        workers._awake, backend._rollout_step = True, backend.step
        rollout = backend.generate(rows, sampling, group_ids=[-1, -2, -3, -4])
        metrics = backend.compute_old_log_probs(rollout)
        workers._awake, backend._rollout_step = False, None
        log(event="presync", **{k: v for k, v in metrics.items() if k.startswith("training/rollout")})

    sync = workers_mod.RayWorkers.sync_weights

    def sync_weights(self, step):
        if attempt == 1 and not seen.get("presync"):
            seen["presync"] = True
            with seen["calls"].paused():
                before_first_sync(self)
        sync(self, step)
        log(event="sync", step=int(step))

    workers_mod.RayWorkers.sync_weights = sync_weights

    clp = workers_mod.RayWorkers.compute_log_prob

    def compute_log_prob(self, batch):
        out = clp(self, batch)
        seen["log_prob_calls"] += 1
        name = f"logprob-{attempt}-{seen['log_prob_calls']}.pt"
        keep = ("input_ids", "attention_mask", "position_ids", "prompts", "responses", "response_mask",
                "rollout_log_probs", "token_level_scores")
        torch.save({**{k: batch.batch[k].clone() for k in keep if k in batch.batch.keys()},
                    "old_log_probs": out.batch["old_log_probs"].clone(),
                    "uid": [str(u) for u in batch.non_tensor_batch["uid"]]}, record / name)
        log(event="log_prob", step=int(seen["backend"].step), file=name)
        return out

    workers_mod.RayWorkers.compute_log_prob = compute_log_prob

    load = workers_mod.RayWorkers.load_checkpoint

    def load_checkpoint(self, directory):
        load(self, directory)
        again = record / f"reloaded-{attempt}"
        with seen["calls"].paused():
            self.trainer.actor_rollout_wg.save_checkpoint(str(again), None, 0, max_ckpt_to_keep=None)
        log(event="loaded", directory=str(directory), saved_again=str(again))

    workers_mod.RayWorkers.load_checkpoint = load_checkpoint

    add = DynamicSampler.add

    def sampler_add(self, group_ids, values, *a, **k):
        log(event="gen_batch", step=int(seen["backend"].step) + 1, group_ids=[int(g) for g in group_ids],
            values=[float(v) for v in values])
        return add(self, group_ids, values, *a, **k)

    DynamicSampler.add = sampler_add

    from dapo.train.cli import main as dapo_train

    rc = dapo_train(argv[2:])
    log(event="exit", rc=int(rc))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

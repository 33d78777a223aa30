#!/usr/bin/env python3
"""Short DAPO runs on one CUDA device (H100/H200: one command, sized for <= 8 minutes); prints throughput and MFU.

    python scripts/gpu_tiny.py                      # cuda: the tiny model, then a ~0.5B-parameter model
    python scripts/gpu_tiny.py --models 0.5b        # one of them
    python scripts/gpu_tiny.py --device cpu --smoke # the same code path with toy sizes, minutes-free (CI runs this)

For each model (``MODELS``: ``tiny`` = the tiny preset's ~0.5M-parameter model; ``0.5b`` = a Qwen2-architecture
model of hidden 1024, 24 layers, 16 heads of 64, SwiGLU 5120 -- ~0.48B parameters, built locally from a config, no
download) it builds the tiny task and tokenizer, a short supervised warm start, then ``--steps`` DAPO rollout steps
with the local backend (the same loop as ``dapo train``), and prints:

- generation tokens/s (response tokens produced, KV-cache decoding) and update tokens/s (prompt + response tokens
  through forward+backward),
- the validation accuracy curve (avg@4 on the held-out problems, before RL and every few steps),
- model FLOP utilisation (MFU) of the update and of the old-log-prob pass against the card's dense bf16 peak
  (``--peak-tflops``, default from the device name: H100/H200 989, A100 312, L40S 362, L4 121), counting
  ``6 * N * tokens`` for forward+backward and ``2 * N * tokens`` for a forward (N = non-embedding parameters +
  the LM head; attention FLOPs ignored, small at these lengths). Generation MFU is reported too but decoding a
  small model is latency-bound, not FLOP-bound.

Results go to stdout and ``<run-dir>/gpu_tiny.json`` (one entry per model). On CUDA, float32 matmuls may use TF32
(the warm start runs in fp32; the RL phases in bf16 autocast).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "H800": 989.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0,
                    "L4": 121.0, "A10": 125.0, "B200": 2250.0, "GH200": 989.0}  # fmt: skip


def peak_tflops(device_name: str) -> float | None:
    name = device_name.upper()
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if key in name:
            return PEAK_BF16_TFLOPS[key]
    return None


# name -> (hidden, layers, heads, intermediate, warm-start steps, warm-start lr)
MODELS = {
    "tiny": (128, 2, 4, 512, 400, 3e-3),
    "0.5b": (1024, 24, 16, 5120, 150, 3e-4),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--smoke", action="store_true", help="toy sizes, 2 steps: the code path only")
    p.add_argument("--models", default="tiny,0.5b", help=f"comma-separated, from {sorted(MODELS)}")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak of the device (TFLOP/s)")
    p.add_argument("--run-dir", default=None)
    args = p.parse_args(argv)

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_tiny: no CUDA device here; run with --device cpu --smoke to check the code path", file=sys.stderr)
        return 2
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        print(f"gpu_tiny: unknown model(s) {unknown}; known: {sorted(MODELS)}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="dapo-gpu-tiny-"))
    t_all = time.time()
    results, rc = [], 0
    for name in names:
        res = run_model(name, args, run_dir / name)
        results.append(res)
        rc = rc or res["exit_code"]
        (run_dir / "gpu_tiny.json").write_text(json.dumps({"runs": results}, indent=2))
    print(f"total {time.time() - t_all:.0f}s for {len(names)} model(s); results: {run_dir / 'gpu_tiny.json'}")
    return 0 if rc == 0 else rc


def run_model(model: str, args, run_dir: Path) -> dict:
    """Build ``model`` and the task, warm-start, run the DAPO loop; its throughput and MFU, printed and returned."""
    import torch

    from dapo.backends.local.run import build
    from dapo.config import load_preset
    from dapo.train.loop import DAPOLoop
    from dapo.train.stream import configure_determinism

    preset = load_preset("tiny", _overrides(model, args))
    configure_determinism(preset.recipe.trainer.seed, deterministic=False)
    t0 = time.time()
    backend, train_rows, val_rows, _ = build(preset, run_dir)
    setup_s = time.time() - t0
    dev = backend.device
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    loop = DAPOLoop(preset, backend, train_rows, val_rows, run_dir, progress=False)
    t1 = time.time()
    rc = loop.fit()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    train_s = time.time() - t1
    res = _throughput(model, args, preset, backend, loop, name, run_dir, rc=rc, setup_s=setup_s, train_s=train_s)
    _print(res)
    return res


def _overrides(model: str, args) -> list[str]:
    """The tiny preset resized to ``model`` (toy sizes with ``--smoke``) on ``--device``."""
    if args.smoke:
        hidden, layers, heads, inter = 64, 1, 2, 128
        overrides = [
            "local.warm_start.steps=3", "local.warm_start.batch_size=16", "local.task.n_train=200",
            "local.task.n_val=16", "recipe.data.train_batch_size=4", "recipe.data.gen_batch_size=6",
            "recipe.rollout.n=4", "recipe.actor.ppo_mini_batch_size=4",
            # a 3-step warm start solves nothing: every group would be all-wrong, so no dynamic sampling here
            "recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=null",
            "recipe.trainer.total_training_steps=2", "recipe.trainer.test_freq=2", "recipe.trainer.save_freq=0",
        ]  # fmt: skip
    else:
        hidden, layers, heads, inter, warm_steps, warm_lr = MODELS[model]
        overrides = [
            f"local.warm_start.steps={warm_steps}", "local.warm_start.batch_size=256",
            f"local.warm_start.lr={warm_lr}",
            "local.task.n_train=8000", "local.task.n_val=512", "recipe.data.train_batch_size=64",
            "recipe.data.gen_batch_size=96", "recipe.rollout.n=16", "recipe.actor.ppo_mini_batch_size=32",
            "local.micro_batch_size=512", f"recipe.trainer.total_training_steps={args.steps}",
            f"recipe.trainer.test_freq={max(1, args.steps // 5)}", "recipe.trainer.save_freq=0",
            "recipe.filter_groups.max_num_gen_batches=20",
        ]  # fmt: skip
    return overrides + [
        f"local.model.hidden_size={hidden}", f"local.model.num_hidden_layers={layers}",
        f"local.model.num_attention_heads={heads}", f"local.model.num_key_value_heads={heads}",
        f"local.model.intermediate_size={inter}", f"placement.device={args.device}",
        "recipe.trainer.logger=[console]", "recipe.trainer.resume_mode=disable",
    ]  # fmt: skip


def _throughput(model: str, args, preset, backend, loop, name: str, run_dir: Path, *, rc: int, setup_s: float,
                train_s: float) -> dict:
    """Tokens/s, TFLOP/s and MFU of generation, update and the old-log-prob pass, from the backend's counters and
    the run's metrics (``6 N`` FLOPs per token for forward+backward, ``2 N`` for a forward)."""
    dev = backend.device
    m = backend.model
    n_total = sum(q.numel() for q in m.parameters())
    n_embed = m.get_input_embeddings().weight.numel()
    tied = bool(getattr(m.config, "tie_word_embeddings", False))
    n_flop = n_total - n_embed + (n_embed if tied else 0)  # the LM head matmul counts; the embedding lookup does not
    c = backend.counters
    peak = args.peak_tflops or (peak_tflops(name) if dev.type == "cuda" else None)
    from dapo.train.metrics import read_jsonl

    recs = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "timing_s/old_log_prob" in r]
    oldlp_s = sum(r["timing_s/old_log_prob"] for r in recs)
    upd_tok_s = c["update_tokens"] / c["update_seconds"] if c["update_seconds"] else 0.0
    gen_tok_s = c["gen_tokens"] / c["gen_seconds"] if c["gen_seconds"] else 0.0
    upd_tflops = 6 * n_flop * upd_tok_s / 1e12
    oldlp_tokens = c["update_tokens"] / max(1, preset.recipe.actor.ppo_epochs)  # the same rows, forward only
    oldlp_tflops = 2 * n_flop * oldlp_tokens / oldlp_s / 1e12 if oldlp_s else 0.0
    gen_tflops = 2 * n_flop * gen_tok_s / 1e12
    res = {
        "model": model,
        "device": name,
        "exit_code": rc,
        "params": n_total,
        "params_flop": n_flop,
        "setup_seconds": setup_s,
        "train_seconds": train_s,
        "steps": loop.step,
        "gen_tokens": c["gen_tokens"],
        "gen_tokens_per_s": gen_tok_s,
        "update_tokens": c["update_tokens"],
        "update_tokens_per_s": upd_tok_s,
        "update_tflops": upd_tflops,
        "old_log_prob_tflops": oldlp_tflops,
        "gen_tflops": gen_tflops,
        "peak_tflops": peak,
        "mfu_update": upd_tflops / peak if peak else None,
        "mfu_old_log_prob": oldlp_tflops / peak if peak else None,
        "mfu_gen": gen_tflops / peak if peak else None,
        "val_acc": loop.summary().get("val_acc"),
        "smoke": args.smoke,
    }
    return res


def _print(res: dict) -> None:
    def pct(x):
        return "n/a (no peak for this device; --peak-tflops)" if x is None else f"{x:.1%}"

    print(f"== {res['model']} == device {res['device']} | model {res['params'] / 1e6:.1f}M params "
          f"({res['params_flop'] / 1e6:.1f}M in matmuls) | {res['steps']} steps in {res['train_seconds']:.1f}s "
          f"(setup {res['setup_seconds']:.1f}s)")
    print(f"generation: {res['gen_tokens']} tokens, {res['gen_tokens_per_s']:,.0f} tokens/s, "
          f"{res['gen_tflops']:.2f} TFLOP/s, MFU {pct(res['mfu_gen'])}")
    print(f"update:     {res['update_tokens']} tokens, {res['update_tokens_per_s']:,.0f} tokens/s, "
          f"{res['update_tflops']:.2f} TFLOP/s, MFU {pct(res['mfu_update'])}")
    print(f"old log-prob: {res['old_log_prob_tflops']:.2f} TFLOP/s, MFU {pct(res['mfu_old_log_prob'])}")
    print(f"validation accuracy by step: {res['val_acc']}", flush=True)


if __name__ == "__main__":
    sys.exit(main())

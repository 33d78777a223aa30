"""Build (or reuse) the tiny preset's assets in a cache directory: tokenizer, task parquet files, warm-started policy.

Layout (``<cache>/<key>/`` where ``key`` hashes the ``local:`` spec and :data:`ASSETS_VERSION`, so a changed spec
never reuses stale files)::

    tokenizer/            PreTrainedTokenizerFast + chat template (trained on the task corpus)
    data/train.parquet    DAPO-Math-17k schema
    data/validation.parquet
    init/                 the randomly initialised Qwen2ForCausalLM (+ tokenizer)
    policy/               the warm-started policy RL starts from (+ tokenizer), warm_start.json (loss, seconds)

Each stage is written to a temporary directory and renamed into place, so an interrupted build is redone, never
half-used.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dapo.util.fsutil import atomic_dir

# 2: the warm start trains on a fixed thread count (dapo.tiny.warmstart.THREADS); caches built before, on the machine's
# default count, are not reused
ASSETS_VERSION = 2


@dataclass
class TinyAssets:
    root: Path
    tokenizer_dir: Path
    train_file: Path
    val_file: Path
    init_dir: Path
    policy_dir: Path
    warm_start: dict


def spec_key(local) -> str:
    payload = {
        "version": ASSETS_VERSION,
        "model": dataclasses.asdict(local.model),
        # min_digits=0 (the default) is left out so the tiny task keeps the cache key it had before the field existed
        "task": {k: v for k, v in dataclasses.asdict(local.task).items() if (k, v) != ("min_digits", 0)},
        # the later label styles at their defaults (recheck_rate=0, ...) are left out for the same reason
        "warm_start": {
            k: v for k, v in dataclasses.asdict(local.warm_start).items()
            if (k, v) not in (("recheck_rate", 0), ("guess_rate", 0), ("recheck_mistake_rate", None), ("swap_rate", 0))
        },
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def layout(local, cache_dir: Path) -> TinyAssets:
    """Where :func:`prepare` puts (or finds) the assets of ``local`` under ``cache_dir``; builds nothing
    (``warm_start`` is empty until they are built)."""
    root = Path(cache_dir) / spec_key(local)
    return TinyAssets(
        root=root,
        tokenizer_dir=root / "tokenizer",
        train_file=root / "data" / "train.parquet",
        val_file=root / "data" / "validation.parquet",
        init_dir=root / "init",
        policy_dir=root / "policy",
        warm_start={},
    )


def prepare(local, cache_dir: Path, log: Callable[[str], None] = print) -> TinyAssets:
    """Everything the tiny run needs, under ``cache_dir/<key>``; cheap when already built."""
    import torch

    from dapo.tiny.model import build_model
    from dapo.tiny.task import dapo_prompt, make_problems, write_parquet
    from dapo.tiny.tokenizer import train_tokenizer

    if local is None:
        raise ValueError("the tiny model needs the preset's 'local:' section")
    t = local.task
    where = layout(local, cache_dir)
    train, val = make_problems(t.digits, t.n_train, t.n_val, t.seed, t.min_digits)

    def build_tokenizer(d: Path) -> None:
        corpus = ["user\n" + dapo_prompt(p.text()) for p in train[:500]]
        corpus += ["assistant\n" + p.response() for p in train]
        corpus += ["assistant\n" + p.response(forget_carry=True) for p in train[:500]]
        if local.warm_start.recheck_rate > 0:
            corpus += ["assistant\n" + p.response(rechecks=1) for p in train[:500]]
        train_tokenizer(corpus, local.model.vocab_size, d)

    def build_data(d: Path) -> None:
        write_parquet(train, "train", d / "train.parquet")
        write_parquet(val, "validation", d / "validation.parquet")

    tok_dir = atomic_dir(where.tokenizer_dir, build_tokenizer)
    atomic_dir(where.train_file.parent, build_data)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))

    def build_init(d: Path) -> None:
        build_model(local.model, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, d)
        tokenizer.save_pretrained(str(d))

    init_dir = atomic_dir(where.init_dir, build_init)

    def build_policy(d: Path) -> None:
        from transformers import AutoModelForCausalLM

        from dapo.tiny.warmstart import THREADS, fixed_threads, sft, weights_digest

        ws = local.warm_start
        model = AutoModelForCausalLM.from_pretrained(str(init_dir), dtype=torch.float32)
        info = {"steps": 0, "loss": None, "seconds": 0.0}
        if ws.enable and ws.steps > 0:
            log(
                f"warm start: supervised training of the tiny policy ({ws.steps} steps x {ws.batch_size}, "
                f"mistake rate {ws.mistake_rate} on carrying problems, {THREADS} torch thread); cached for reruns"
            )
            with torch.random.fork_rng(devices=[]), fixed_threads(THREADS):
                torch.manual_seed(local.model.seed)
                info = sft(
                    model, tokenizer, train, steps=ws.steps, batch_size=ws.batch_size, lr=ws.lr,
                    mistake_rate=ws.mistake_rate, seed=local.model.seed, log=log, recheck_rate=ws.recheck_rate,
                    guess_rate=ws.guess_rate, recheck_mistake_rate=ws.recheck_mistake_rate, swap_rate=ws.swap_rate,
                )
        # the vector kernels that built it: another CPU type builds other weights (docs/ablation.md)
        info.update(threads=THREADS, torch=torch.__version__, cpu_capability=torch.backends.cpu.get_cpu_capability(),
                    weights_sha256=weights_digest(model))
        model.save_pretrained(str(d))
        tokenizer.save_pretrained(str(d))
        (d / "warm_start.json").write_text(json.dumps(info, indent=2))

    t0 = time.time()
    policy_dir = atomic_dir(where.policy_dir, build_policy)
    if time.time() - t0 > 1:
        log(f"warm start: done in {time.time() - t0:.0f}s -> {policy_dir}")
    return dataclasses.replace(where, warm_start=json.loads((policy_dir / "warm_start.json").read_text()))

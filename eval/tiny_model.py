"""Build a tiny random Qwen2 chat model in HF format, locally (no download): a smoke-test checkpoint for the serving
stack on CPU (vLLM needs head_dim >= 32 there).

    python eval/tiny_model.py OUT_DIR [--texts PARQUET]

The tokenizer is a byte-level BPE trained here on the given texts (default: a few built-in sentences) with the
ChatML template of Qwen2 instruct models (``<|im_start|>role\\n...<|im_end|>``); the weights are random (seeded), so
the answers are gibberish; only the plumbing is under test.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
DEFAULT_TEXTS = [
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.",
    "Remember to put your answer on its own line after \"Answer:\".",
    "Find the number of positive integers n less than 1000 such that n is a multiple of 7 and 11.",
    "Let x, y and z be real numbers with x + y + z = 10. Compute the largest possible value of xyz.",
]


def texts_from_parquet(path: str | Path, limit: int = 200) -> list[str]:
    import pandas as pd

    df = pd.read_parquet(path)
    out = []
    for prompt in df["prompt"].head(limit):
        for m in prompt:
            out.append(str(m["content"]))
    return out


def build(out_dir: str | Path, texts: list[str] | None = None, *, vocab_size: int = 400, seed: int = 0) -> Path:
    """Write ``config.json``, ``model.safetensors`` (float32), tokenizer files with a chat template to ``out_dir``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts or DEFAULT_TEXTS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32: vLLM's CPU attention needs >= 32
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out)
    # generation defaults a server may read; none that would change the requested sampling
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id}) + "\n"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--texts", default=None, help="a DAPO-schema parquet whose prompts train the tokenizer")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    texts = texts_from_parquet(args.texts) if args.texts else None
    print(build(args.out_dir, texts, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

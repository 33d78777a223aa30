"""A byte-level BPE tokenizer trained locally on the tiny task's text, saved as a ``PreTrainedTokenizerFast``.

Built like Qwen2's tokenizer, only smaller: a regex pre-tokenizer that isolates every digit (so numbers are read and
written digit by digit, as Qwen2 does), byte-level BPE merges learnt on the task corpus (the fixed DAPO prompt
template compresses to a few dozen tokens), the ChatML special tokens and a ChatML chat template, so prompts go through
``tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True)`` exactly like in the real recipe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIALS = [PAD, IM_START, IM_END]

# ChatML, as Qwen2.5's template without the tool/system-prompt branches.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Qwen2-style split: words with an optional leading non-letter, single digits, punctuation runs, newlines, spaces.
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def train_tokenizer(corpus: Iterable[str], vocab_size: int, out_dir: Path):
    """Train the BPE on ``corpus`` and save a ``PreTrainedTokenizerFast`` (with chat template) to ``out_dir``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no unknown characters
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START],
        padding_side="left",
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return fast

"""What only the GPU presets exercise, pinned on CPU: the driver's cost at full's padded widths, the profiler keys
the loop cannot honour, the context length vLLM is handed, and the checkpoint contents.

Each test states the rule it checks against (verl's or vLLM's code), not our own output.
"""

from __future__ import annotations

import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from dapo.backends.verl import config as verl_config  # noqa: E402
from dapo.backends.verl import passthrough as verl_passthrough  # noqa: E402
from dapo.backends.verl.backend import VerlBackend  # noqa: E402
from dapo.config import ConfigError, load_preset  # noqa: E402


# ---- the driver's work scales with tokens, not with padding ----------------------------------------------------------
class _LenTokenizer:
    eos_token_id = 2

    def batch_decode(self, seqs, skip_special_tokens: bool = False) -> list[str]:
        return [str(len(s)) for s in seqs]


def _padded_rollout(rows: int, width: int, length: int, pad: int = 151643):
    """A generation batch as verl's agent loop returns it: ``rows`` responses of ``length`` tokens right-padded to
    ``width`` with Qwen's pad id (not a cached small int: every padded slot would be its own Python object)."""
    from verl.protocol import DataProto

    P = 4
    responses = torch.full((rows, width), pad, dtype=torch.int64)
    responses[:, :length] = torch.randint(3, 150000, (rows, length))
    responses[0, length - 1] = 2  # one response ends with EOS
    resp_mask = torch.zeros((rows, width), dtype=torch.int64)
    resp_mask[:, :length] = 1
    attn = torch.cat([torch.ones((rows, P), dtype=torch.int64), resp_mask], dim=1)
    return DataProto.from_dict(tensors={"prompts": torch.ones((rows, P), dtype=torch.int64), "responses": responses,
                                        "attention_mask": attn, "response_mask": resp_mask})


def _rollout_backend(max_response_length: int) -> VerlBackend:
    b = object.__new__(VerlBackend)
    b.cfg = SimpleNamespace(data=SimpleNamespace(max_response_length=max_response_length))
    b.tokenizer, b.eos_token_ids = _LenTokenizer(), {2}
    return b


def _python_peak_bytes(rows: int, width: int, length: int) -> tuple[int, object]:
    data = _padded_rollout(rows, width, length)
    b = _rollout_backend(width)
    tracemalloc.start()
    try:
        out = b._rollout(data, [{}] * rows, np.arange(rows))
        return tracemalloc.get_traced_memory()[1], out
    finally:
        tracemalloc.stop()


def test_the_drivers_python_memory_per_generation_batch_grows_with_tokens_not_with_padded_width():
    """At full's scale a generation batch is 24,576 responses x 20,480 slots; turning that whole tensor into Python
    ints costs ~36 bytes per slot (~18 GB). Same responses, 64x the padding: the driver's Python allocations in
    ``_rollout`` must stay those of the tokens (here 64 x 16)."""
    rows, length = 64, 16
    narrow, out = _python_peak_bytes(rows, 256, length)
    wide, out_wide = _python_peak_bytes(rows, 256 * 64, length)
    assert list(out.response_length) == list(out_wide.response_length) == [length] * rows
    assert out.response_text == out_wide.response_text == [str(length)] * rows
    # padded slots as Python objects would add rows * (16384 - 256) * 8 bytes of list pointers alone (~8 MB)
    assert wide < narrow + 256 * 1024, f"Python peak {wide / 2**20:.1f} MiB at width 16384 vs {narrow / 2**20:.1f} MiB at 256"


def test_truncated_is_full_length_without_eos_at_the_end():
    data = _padded_rollout(4, 16, 16)
    data.batch["responses"][1, 15] = 2  # ends with EOS at full length: not truncated
    out = _rollout_backend(16)._rollout(data, [{}] * 4, np.arange(4))
    assert out.truncated.tolist() == [False, False, True, True]  # rows 0 and 1 end with EOS
    short = _rollout_backend(32)._rollout(data, [{}] * 4, np.arange(4))  # 16 of 32 tokens: not at the limit
    assert not short.truncated.any()


# ---- nothing accepted and then skipped: the roles' profiler keys ----------------------------------------------------
@pytest.mark.parametrize("role", ["actor", "ref", "rollout"])
def test_a_roles_profiler_keys_are_refused_because_only_fit_starts_the_profiler(role):
    """verl builds a ProfilerConfig for each role from ``actor_rollout_ref.<role>.profiler`` (its own config has the
    key), but only ``RayPPOTrainer.fit()`` starts and stops the profiler (``global_profiler.steps``)."""
    assert "profiler" in verl_config.compose([]).actor_rollout_ref[role]
    for key in ("enable=true", "all_ranks=true", "tool_config.torch.contents=[cpu]"):
        with pytest.raises(ConfigError, match=r"actor_rollout_ref\.%s\.profiler.*refused.*fit\(\)" % role):
            verl_config.resolve(load_preset("full"), [f"actor_rollout_ref.{role}.profiler.{key}"])
    assert verl_passthrough.passthrough_refusal(f"actor_rollout_ref.{role}.profiler") is not None

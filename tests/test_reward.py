"""dapo.reward equals verl 0.9.1: the math_dapo verifier on a corpus of several hundred answers, and the overlong
numbers of verl's DAPORewardManager run on a real DataProto with a locally built tokenizer."""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest
import torch

from dapo.reward import (
    INVALID,
    compute_score,
    math_verify_equal,
    normalize_final_answer,
    overlong_penalty,
    score_responses,
)

math_dapo = pytest.importorskip("verl.utils.reward_score.math_dapo", reason="verl 0.9.1 is the reference")

# ------------------------------------------------------------------------------------------------------------------
# The corpus: (response, ground truth) pairs in the shapes a policy actually produces, and some it should not.
# ------------------------------------------------------------------------------------------------------------------

GROUND_TRUTHS = [
    "42", "0", "-7", "1000", "1,000", "2.5", "\\frac{1}{2}", "\\frac12", "\\dfrac{3}{4}", "3\\sqrt{2}", "\\sqrt2",
    "x+1", "\\pi", "10^{3}", "(1,2)", "\\text{(A)}", "5\\%", "\\infty", "2024", "1/2", "B", "$6$", "12 cm",
    "90^\\circ", "\\boxed{17}", "a=3", "１２", "3.14159",
]  # fmt: skip


def renderings(gt: str) -> list[str]:
    """Ways a model writes the final answer ``gt`` (right and wrong ones)."""
    wrong = "43" if gt != "43" else "44"
    return [
        gt,
        f"${gt}$",
        f"\\boxed{{{gt}}}",
        f"$\\boxed{{{gt}}}$",
        f"{gt} degrees",
        f"{gt} cm.",
        f"{gt}^\\circ",
        f"x = {gt}",
        f"\\text{{{gt}}}",
        f"\\textbf{{{gt}}}",
        f"an {gt}",
        f" {gt} ",
        f"{gt}.",
        wrong,
        f"{gt}0",
        f"\\overline{{{gt}}}",
    ]


TEMPLATES = [
    "{body}\nAnswer: {ans}",
    "{body}\nanswer:{ans}",
    "{body}\nANSWER :\n\n{ans}",
    "{body}\nAnswer: 13\nLet me double-check.\nAnswer: {ans}",
    "{body}\nAnswer: {ans}\nWait, that is wrong.\nAnswer: 13",
    "Answer: {ans} Answer: 13",
    "{body} so the final answer is \\boxed{{{ans}}}",
    "{body}\nThe answer is {ans}",
    "{body}\nAnswer: {ans}" + " Checking the arithmetic once more." * 12,  # the answer ends up before the 300 chars
    "**Answer:** {ans}",
    "Answer: {ans}<|im_end|>",
]
BODIES = ["", "We add the numbers step by step.", "Let x be the unknown. " * 20]

HAND_WRITTEN = [
    ("", "42"),
    ("Answer:", "42"),
    ("Answer:   ", ""),
    ("Answer: \n", "42"),
    ("answer : 42", "42"),
    ("aNsWeR: 42", "42"),
    ("Answer: 1,234,567", "1234567"),
    ("Answer: 1,23", "123"),
    ("Answer: $1,000$ dollars", "1000"),
    ("Answer: \\$5", "5"),
    ("Answer: 5 \\text{ units}", "5"),
    ("Answer: 5\\text{ m}", "5"),
    ("Answer: \\frac 1 2", "\\frac{1}{2}"),
    ("Answer: \\frac{1}{2}", "\\frac12"),
    ("Answer: \\sqrt{2}", "\\sqrt2"),
    ("Answer: \\sqrt 2", "\\sqrt2"),
    ("Answer: 3\\;\\text{cm}", "3"),
    ("Answer: 10{,}000", "10000"),
    ("Answer: 10,\\!000", "10000"),
    ("Answer: \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("Answer: $a$ and $b$", "a"),
    ("Answer: $x = 3$, so", "3"),
    ("Answer: \\text{\\textbf{7}}", "7"),
    ("Answer: \\text{a\\text{b}}", "ab"),
    ("\\boxed{7}", "7"),
    ("\\boxed{ 7 }", "7"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\frac{1}{2}", "\\frac{1}{2}"),
    ("\\boxed{7} and \\boxed{8}", "8"),
    ("\\boxed{}", ""),
    ("\\boxed{7}" + "x" * 120, "7"),
    ("Answer: [INVALID]", "[INVALID]"),
    ("Answer: [INVALID] \\boxed{3}", "3"),
    ("no answer here", "[INVALID]"),
    ("Answer: ٤٢", "٤٢"),
    ("Answer: ４２", "４２"),
    ("Answer: 42 ✓", "42"),
    ("答案 Answer: 42", "42"),
    ("Answer: 42 🎉", "42 🎉"),
    ("Answer: 42\u200b", "42"),
    ("Answer: e\u0301", "é"),
    ("Answer: \u202e24", "42"),
    ("Answer\uff1a 42", "42"),  # full-width colon is not a colon
    ("Anſwer: 42", "42"),  # long s: Python's case-insensitive match
    ("\x00\x01Answer: 42\x7f", "42"),
    ("$$$$", "$"),
    ("{{{{}}}}", "{}"),
    ("\\boxed{", "7"),
    ("Answer: $", "$"),
    ("Answer: \\text{", "\\text{"),
    ("Answer: fracab", "frac{a}{b}"),
    ("Answer: sqrtsqrt", "sqrt{s}qrt"),
    ("Answer: frac\n1", "frac"),
    ("Answer: 1 = 2 = 3", "3"),
    ("Answer: a square", "1"),
    ("Answer: the students", "the"),
    ("Answer: 1\r\n", "1"),
    ("Answer:\t\t7", "7"),
    ("Answer: 7\\ldots", "7"),
    ("Answer: \"7\"", "7"),
    ("Answer: 7 \\mathrm{th}", "7"),
    ("Answer: 7^{\\circ}", "7"),
]


def build_corpus() -> list[tuple[str, str]]:
    corpus = list(HAND_WRITTEN)
    for gt in GROUND_TRUTHS:
        for ans, template in itertools.product(renderings(gt), TEMPLATES[:6]):
            corpus.append((template.format(body="We add the numbers.", ans=ans), gt))
    for gt, template, body in itertools.product(GROUND_TRUTHS[:6], TEMPLATES, BODIES):
        corpus.append((template.format(body=body, ans=gt), gt))
    seen, out = set(), []
    for case in corpus:
        if case not in seen:
            seen.add(case)
            out.append(case)
    return out


CORPUS = build_corpus()


def test_corpus_is_large_and_mixed():
    assert len(CORPUS) >= 300
    results = [math_dapo.compute_score(s, g) for s, g in CORPUS]
    accs = [r["acc"] for r in results]
    assert 0.2 < sum(accs) / len(accs) < 0.8  # both verdicts well represented
    assert sum(r["pred"] == INVALID for r in results) >= 5


def test_compute_score_equals_verl_math_dapo_on_the_corpus():
    mismatches = []
    for solution, gt in CORPUS:
        ours, ref = compute_score(solution, gt), math_dapo.compute_score(solution, gt)
        if ours != ref or type(ours["acc"]) is not bool:
            mismatches.append((solution[-80:], gt, ours, ref))
    assert not mismatches, f"{len(mismatches)} of {len(CORPUS)} differ from verl, e.g. {mismatches[:3]}"


def test_normalize_final_answer_equals_verl_on_corpus_answers():
    texts = [g for _, g in CORPUS] + [s[-120:] for s, _ in CORPUS]
    for t in texts:
        assert normalize_final_answer(t) == math_dapo.normalize_final_answer(t), t


def test_compute_score_never_raises_on_non_strings():
    assert compute_score(None, "1") == {"score": -1.0, "acc": False, "pred": INVALID}
    assert compute_score("Answer: 12", 12)["acc"] is True
    assert compute_score(b"Answer: 12", "12")["acc"] is True


# ------------------------------------------------------------------------------------------------------------------
# Soft overlong punishment (eq. 13) and the batch scorer vs verl's DAPORewardManager
# ------------------------------------------------------------------------------------------------------------------


def test_overlong_penalty_is_zero_then_linear_down_to_minus_factor():
    lengths = np.arange(0, 21)
    out = overlong_penalty(lengths, max_response_length=20, buffer_len=8, penalty_factor=0.5)
    assert np.all(out[:13] == 0.0)  # up to L_max - L_buf = 12 tokens
    np.testing.assert_allclose(out[12:], -0.5 * (lengths[12:] - 12) / 8)
    assert overlong_penalty(20, 20, 8, 0.5) == -0.5 and isinstance(overlong_penalty(13, 20, 8), float)
    t = overlong_penalty(torch.tensor([12, 16]), 20, 8, 1.0)
    assert isinstance(t, torch.Tensor) and t.tolist() == [0.0, -0.5]


@pytest.mark.parametrize("buffer_len, factor", [(0, 1.0), (21, 1.0), (4, -1.0)])
def test_overlong_penalty_rejects_bad_settings(buffer_len, factor):
    with pytest.raises(ValueError, match="buffer_len|penalty_factor"):
        overlong_penalty(10, 20, buffer_len, factor)


def char_tokenizer(texts: list[str]):
    """A character-level HF fast tokenizer built locally (no download): one token per character."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    chars = sorted(set("".join(texts)))
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>",
                                                unk_token="<unk>")  # fmt: skip


@pytest.mark.parametrize("overlong_enable", [True, False])
def test_score_responses_equals_verl_dapo_reward_manager(overlong_enable):
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.workers.reward_manager import DAPORewardManager

    max_resp, buffer_len, factor = 24, 8, 0.7
    answers = [("Answer: 12", "12"), ("Answer: 13", "12"), ("x \\boxed{5}", "5"), ("nothing", "1"),
               ("Answer: $3$", "3"), ("ANSWER: 1,000", "1000")]  # fmt: skip
    texts, gts, with_eos = [], [], []
    for k, (ans, gt) in enumerate(answers * 3):
        filler = "so " * (k % 6)
        text = (filler + ans)[: max_resp - 1]
        texts.append(text)
        gts.append(gt)
        with_eos.append(k % 4 != 3)  # some responses were truncated (no EOS)
    tokenizer = char_tokenizer(texts + ["Q?"])
    prompt_len = 4
    b = len(texts)
    prompts = torch.zeros(b, prompt_len, dtype=torch.long)
    responses = torch.zeros(b, max_resp, dtype=torch.long)
    attention = torch.zeros(b, prompt_len + max_resp, dtype=torch.long)
    lengths = []
    for i, (text, eos) in enumerate(zip(texts, with_eos)):
        p_ids = tokenizer.encode("Q?", add_special_tokens=False)
        prompts[i, prompt_len - len(p_ids):] = torch.tensor(p_ids)  # left-padded prompt
        attention[i, prompt_len - len(p_ids):prompt_len] = 1
        ids = tokenizer.encode(text, add_special_tokens=False) + ([tokenizer.eos_token_id] if eos else [])
        if not eos:  # a truncated response fills the whole budget
            ids = (ids * max_resp)[:max_resp]
        responses[i, : len(ids)] = torch.tensor(ids)
        attention[i, prompt_len: prompt_len + len(ids)] = 1
        lengths.append(len(ids))
    non_tensors = {
        "data_source": np.array(["math_dapo"] * b, dtype=object),
        "reward_model": np.array([{"ground_truth": g, "style": "rule"} for g in gts], dtype=object),
        "extra_info": np.array([{} for _ in range(b)], dtype=object),
    }
    data = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": attention}, non_tensors=non_tensors
    )
    cfg = OmegaConf.create({"enable": overlong_enable, "len": buffer_len, "penalty_factor": factor, "log": True})
    manager = DAPORewardManager(tokenizer, num_examine=0, max_resp_len=max_resp, overlong_buffer_cfg=cfg)
    ref = manager(data, return_dict=True)
    decoded = [tokenizer.decode(responses[i, : lengths[i]], skip_special_tokens=True) for i in range(b)]

    ours = score_responses(decoded, gts, lengths, max_response_length=max_resp, overlong_buffer_len=buffer_len,
                           overlong_penalty_factor=factor, overlong_enable=overlong_enable)  # fmt: skip

    ref_reward = ref["reward_tensor"][torch.arange(b), torch.tensor(lengths) - 1].double().numpy()
    np.testing.assert_allclose(ours["reward"], ref_reward, rtol=0, atol=1e-6)
    info = ref["reward_extra_info"]
    np.testing.assert_array_equal(ours["score"], np.asarray(info["score"], dtype=float))
    np.testing.assert_array_equal(ours["acc"], np.asarray(info["acc"], dtype=bool))
    assert list(ours["pred"]) == list(info["pred"])
    if overlong_enable:
        np.testing.assert_allclose(ours["overlong_reward"], [float(x) for x in info["overlong_reward"]], atol=1e-6)
        np.testing.assert_array_equal(ours["overlong"], [bool(x) for x in info["overlong"]])
        assert ours["overlong"].any() and not ours["overlong"].all()
    else:
        assert "overlong_reward" not in info and not ours["overlong_reward"].any()
    assert ours["acc"].any() and not ours["acc"].all()
    np.testing.assert_array_equal(ours["seq_reward"], ours["reward"])


def test_score_responses_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="ground truths"):
        score_responses(["a"], [], [1])
    with pytest.raises(ValueError, match="response lengths"):
        score_responses(["a"], ["1"], [1, 2])
    with pytest.raises(ValueError, match="max_response_length"):
        score_responses(["a"], ["1"], [1], overlong_enable=True, overlong_buffer_len=4)


def test_math_verify_is_a_separate_metric_that_never_changes_the_reward():
    pytest.importorskip("math_verify", reason="optional extra 'mathverify'")
    texts = ["Answer: \\frac{1}{2}", "Answer: 0.5", "Answer: 3", "garbage"]
    gts = ["0.5", "0.5", "4", "1"]
    with_mv = score_responses(texts, gts, [5] * 4, math_verify=True)
    without = score_responses(texts, gts, [5] * 4)
    assert with_mv["math_verify_acc"].tolist() == [True, True, False, False]
    assert with_mv["acc"].tolist() == [False, True, False, False]  # the exact-match verifier decides the reward
    np.testing.assert_array_equal(with_mv["reward"], without["reward"])
    assert "math_verify_acc" not in without


def test_math_verify_requested_but_missing_raises_a_clear_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes `import math_verify` fail
    with pytest.raises(ImportError, match=r"pip install 'dapo-k8s\[mathverify\]'"):
        score_responses(["Answer: 1"], ["1"], [3], math_verify=True)
    with pytest.raises(ImportError, match="math-verify"):
        math_verify_equal("Answer: 1", "1")
    assert score_responses(["Answer: 1"], ["1"], [3])["acc"].tolist() == [True]  # off by default: not needed

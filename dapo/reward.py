"""The DAPO rule-based verifier and the soft overlong punishment (paper arXiv 2503.14476, eq. 1 and eq. 13).

Outcome reward (eq. 1)::

    R(y_hat, y) = +1 if is_equivalent(y_hat, y) else -1

with the DAPO-Math-17k convention: the model ends its solution with ``Answer: <integer>``. Equivalence is an exact
string match after a fixed normalisation (the Minerva/lm-eval ``hendrycks_math`` normaliser used by the DAPO recipe
and verl's ``math_dapo``)::

    1. keep the last 300 characters of the response;
    2. pred = text after the LAST match of  /answer\\s*:\\s*([^\\n]+)/i  (case-insensitive), else "[INVALID]";
    3. normalise pred and the ground truth (below) and compare exactly;
    4. if pred is "[INVALID]" and the last 100 characters hold a balanced ``\\boxed{...}``, its raw content is the
       prediction and must equal the raw ground truth.

Normalisation: the text after the last ``=``; fixed substitutions (articles, spaces, ``\\$``, ``mbox``...); removal
of units and filler words (``degrees``, ``cm``, ``\\text{}``...); per line, ``...$x$...`` -> ``x``; unwrap
``\\text{}``, ``\\textbf{}``, ``\\overline{}`` (first ``}``) and ``\\boxed{}`` (last ``}`` on the line); shorthand
``\\fracab`` -> ``\\frac{a}{b}``, ``\\sqrta`` -> ``\\sqrt{a}``; drop ``$``; ``1,000`` -> ``1000``; strip.

This module implements those rules with plain string scans (no backtracking regex) so it is linear in the input
and never raises, and ``tests/test_reward.py`` proves it returns exactly what verl 0.9.1's
``verl.utils.reward_score.math_dapo.compute_score`` returns on a corpus of several hundred answers plus
property-generated strings.

Soft overlong punishment (eq. 13), added to the outcome reward for a response of ``L`` tokens::

    R_length(L) = min(-(L - (L_max - L_cache)) / L_cache * factor, 0)

i.e. 0 up to ``L_max - L_cache`` tokens, then linearly down to ``-factor`` at ``L_max``.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Optional, Sequence

import numpy as np

__all__ = [
    "INVALID",
    "compute_score",
    "extract_answer",
    "math_verify_equal",
    "normalize_final_answer",
    "overlong_penalty",
    "score_responses",
]

INVALID = "[INVALID]"
_TAIL_CHARS = 300  # the verifier only looks at the end of a response
_BOX_TAIL_CHARS = 100  # \boxed{} fallback window (inside the 300-char tail)

# ``Answer:`` followed by the rest of the line. ``\s`` may span newlines before the answer, ``[^\n]+`` stops at the
# end of the line. Applied to at most 300 characters, so the bounded backtracking of ``\s*`` is harmless.
_ANSWER_RE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)

# (old, new) literal replacements, applied in this order.
_REPLACE = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
# literal substrings deleted, in this order (units, filler words, spacing macros).
_DELETE = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue", "points",
    "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
    "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
    "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
)  # fmt: skip


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _first_dollar_pair_per_line(s: str) -> str:
    """Each line holding at least two ``$`` becomes ``$<text between its first two $>$``; other lines unchanged."""
    if s.count("$") < 2:
        return s
    lines = s.split("\n")
    for k, line in enumerate(lines):
        i = line.find("$")
        if i < 0:
            continue
        j = line.find("$", i + 1)
        if j < 0:
            continue
        lines[k] = "$" + line[i + 1 : j] + "$"
    return "\n".join(lines)


def _unwrap_first_brace(s: str, opener: str) -> str:
    """``<opener>X}`` -> ``X`` where ``}`` is the first closing brace on the same line; left to right, no overlap.

    The next ``}`` and the next newline are cached (both only move forward), so the scan is linear.
    """
    if opener not in s:
        return s
    out: list[str] = []
    pos, n, width = 0, len(s), len(opener)
    next_close = next_newline = -2  # -2: not looked up yet; -1: none left
    while pos < n:
        k = s.find(opener, pos)
        if k < 0:
            break
        start = k + width
        if next_close != -1 and next_close < start:
            next_close = s.find("}", start)
        if next_close < 0:
            break  # no '}' anywhere after k: nothing further can match
        if next_newline != -1 and next_newline < start:
            next_newline = s.find("\n", start)
        if 0 <= next_newline < next_close:
            # no '}' before the end of this line: no opener on the rest of this line can match either
            out.append(s[pos:next_newline])
            pos = next_newline
            continue
        out.append(s[pos:k])
        out.append(s[start:next_close])
        pos = next_close + 1
    out.append(s[pos:])
    return "".join(out)


def _unwrap_boxed_greedy(s: str) -> str:
    """``\\boxed{X}`` -> ``X`` where ``}`` is the LAST closing brace on the line of the first ``\\boxed{``."""
    opener = "\\boxed{"
    if opener not in s:
        return s
    lines = s.split("\n")
    for idx, line in enumerate(lines):
        k = line.find(opener)
        if k < 0:
            continue
        close = line.rfind("}")
        if close < k + len(opener):
            continue
        lines[idx] = line[:k] + line[k + len(opener) : close] + line[close + 1 :]
    return "\n".join(lines)


def _frac_shorthand(s: str) -> str:
    """``fracXY`` -> ``frac{X}{Y}`` when X is not ``{`` (X may be a newline, Y may not)."""
    if "frac" not in s:
        return s
    out: list[str] = []
    pos, n = 0, len(s)
    while True:
        k = s.find("frac", pos)
        if k < 0:
            break
        a, b = k + 4, k + 5
        if b < n and s[a] != "{" and s[b] != "\n":
            out.append(s[pos:k])
            out.append("frac{" + s[a] + "}{" + s[b] + "}")
            pos = b + 1
        else:
            out.append(s[pos : k + 1])
            pos = k + 1
    out.append(s[pos:])
    return "".join(out)


def _sqrt_shorthand(s: str) -> str:
    """``sqrtX`` -> ``sqrt{X}`` when X is not ``{``."""
    if "sqrt" not in s:
        return s
    out: list[str] = []
    pos, n = 0, len(s)
    while True:
        k = s.find("sqrt", pos)
        if k < 0:
            break
        a = k + 4
        if a < n and s[a] != "{":
            out.append(s[pos:k])
            out.append("sqrt{" + s[a] + "}")
            pos = a + 1
        else:
            out.append(s[pos : k + 1])
            pos = k + 1
    out.append(s[pos:])
    return "".join(out)


def normalize_final_answer(answer: Any) -> str:
    """Normalise a final answer for exact comparison (the rules in the module docstring). Linear time, never raises."""
    s = _as_text(answer).split("=")[-1]
    for old, new in _REPLACE:
        if old in s:
            s = s.replace(old, new)
    for junk in _DELETE:
        if junk in s:
            s = s.replace(junk, "")
    s = _first_dollar_pair_per_line(s)
    s = _unwrap_first_brace(s, "\\text{")
    s = _unwrap_first_brace(s, "\\textbf{")
    s = _unwrap_first_brace(s, "\\overline{")
    s = _unwrap_boxed_greedy(s)
    s = _frac_shorthand(s)
    s = _sqrt_shorthand(s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def extract_answer(text: Any) -> str:
    """The raw text after the last ``Answer:`` in the last 300 characters (not normalised), or ``"[INVALID]"``."""
    tail = _as_text(text)[-_TAIL_CHARS:]
    last = None
    for last in _ANSWER_RE.finditer(tail):
        pass
    return last.group(1) if last is not None else INVALID


def _last_boxed_content(text: str) -> Optional[str]:
    """Content of the last ``\\boxed{`` whose braces balance before the end of ``text``; None if there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + len("\\boxed{") : i]
    return None


def compute_score(solution_str: Any, ground_truth: Any) -> dict[str, Any]:
    """Score one response against its ground truth (DAPO eq. 1).

    Returns ``{"score": 1.0 | -1.0, "acc": bool, "pred": str}`` where ``pred`` is the normalised extracted answer
    (``"[INVALID]"`` when there is none, or the raw ``\\boxed{}`` content when the box fallback decided).
    Never raises: non-string inputs are converted with ``str()`` (``None`` -> ``""``), where verl would raise.
    """
    try:
        tail = _as_text(solution_str)[-_TAIL_CHARS:]
        gt = _as_text(ground_truth)
        pred = normalize_final_answer(extract_answer(tail))
        correct = pred == normalize_final_answer(gt)
        if pred == INVALID:
            boxed = _last_boxed_content(tail[-_BOX_TAIL_CHARS:])
            if boxed is not None:
                pred, correct = boxed, boxed == gt
        return {"score": 1.0 if correct else -1.0, "acc": bool(correct), "pred": pred}
    except Exception:  # pragma: no cover - defensive: the verifier must never stop a training step
        return {"score": -1.0, "acc": False, "pred": INVALID}


def overlong_penalty(response_length, max_response_length: int, buffer_len: int, penalty_factor: float = 1.0):
    """Soft overlong punishment (eq. 13): ``min(-(L - (L_max - L_buf)) / L_buf * factor, 0)``.

    ``response_length``: a number (-> float), a numpy array or a torch tensor (-> float array/tensor, same shape).
    Requires ``0 < buffer_len <= max_response_length`` and ``penalty_factor >= 0``.
    """
    if not 0 < buffer_len <= max_response_length:
        raise ValueError(
            f"overlong buffer_len must satisfy 0 < buffer_len <= max_response_length ({max_response_length}), "
            f"got {buffer_len}"
        )
    if penalty_factor < 0:
        raise ValueError(f"overlong penalty_factor must be >= 0, got {penalty_factor}")
    expected = max_response_length - buffer_len
    try:
        import torch

        if isinstance(response_length, torch.Tensor):
            exceed = response_length.to(torch.float64) - expected
            return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)
    except ImportError:  # pragma: no cover
        pass
    if np.ndim(response_length) == 0:
        exceed = float(response_length) - expected
        return min(-exceed / buffer_len * penalty_factor, 0.0)
    exceed = np.asarray(response_length, dtype=np.float64) - expected
    return np.minimum(-exceed / buffer_len * penalty_factor, 0.0)


_MATH_VERIFY_HINT = ("math_verify=True needs the 'math-verify' package: pip install 'dapo-k8s[mathverify]' "
                     "(or math-verify)")


def _load_math_verify():
    try:
        import math_verify  # noqa: F401
    except ImportError as exc:
        raise ImportError(_MATH_VERIFY_HINT) from exc
    return math_verify


def math_verify_equal(solution_str: Any, ground_truth: Any) -> bool:
    """Second opinion with HF ``math-verify`` (symbolic equivalence); False on any parse failure.

    Parses the ground truth as ``\\boxed{gt}`` and the last 300 characters of the response with math-verify's
    default extraction. Needs the optional ``math-verify`` package (``ImportError`` with the install hint if absent).
    """
    mv = _load_math_verify()
    # math-verify bounds its sympy work with SIGALRM, which only works in the main thread: elsewhere run unbounded
    in_main = threading.current_thread() is threading.main_thread()
    parse_kw = {} if in_main else {"parsing_timeout": None}
    verify_kw = {} if in_main else {"timeout_seconds": None}
    try:
        gold = mv.parse("\\boxed{" + _as_text(ground_truth) + "}", **parse_kw)
        answer = mv.parse(_as_text(solution_str)[-_TAIL_CHARS:], **parse_kw)
        return bool(gold) and bool(answer) and bool(mv.verify(gold, answer, **verify_kw))
    except Exception:
        return False


def score_responses(
    texts: Sequence[Any],
    ground_truths: Sequence[Any],
    response_lengths,
    *,
    max_response_length: Optional[int] = None,
    overlong_buffer_len: int = 0,
    overlong_penalty_factor: float = 1.0,
    overlong_enable: bool = False,
    math_verify: bool = False,
) -> dict[str, np.ndarray]:
    """Score a batch the way verl 0.9.1's ``DAPORewardManager`` does (same numbers).

    For each response: ``result = compute_score(text, gt)``; with ``overlong_enable`` the reward is
    ``result["score"] + overlong_penalty(L, max_response_length, overlong_buffer_len, overlong_penalty_factor)``
    where ``L`` is the number of generated tokens (EOS included); verl puts that reward on the last response token.

    Returns ``[N]`` numpy arrays:

    - ``score`` float64: the verifier's ±1 (verl's ``reward_extra_info["score"]``; the ``score`` filter metric),
    - ``acc`` bool, ``pred`` object (str),
    - ``overlong_reward`` float64 (0 when disabled), ``overlong`` bool (``overlong_reward < 0``),
    - ``reward`` float64: ``score + overlong_reward``, the outcome reward R used for the advantages; also under
      ``seq_reward`` and ``seq_final_reward`` (verl's filter metric names for the summed token-level reward; equal
      here because DAPO uses no KL-in-reward),
    - ``math_verify_acc`` bool, only when ``math_verify=True`` (a separate metric; never changes ``reward``).
    """
    n = len(texts)
    if len(ground_truths) != n:
        raise ValueError(f"{n} responses but {len(ground_truths)} ground truths")
    lengths = np.asarray(response_lengths, dtype=np.float64).reshape(-1)
    if lengths.shape[0] != n:
        raise ValueError(f"{n} responses but {lengths.shape[0]} response lengths")
    if overlong_enable:
        if max_response_length is None:
            raise ValueError("overlong_enable=True needs max_response_length")
    verify_fn = None
    if math_verify:
        _load_math_verify()
        verify_fn = math_verify_equal

    results = [compute_score(t, g) for t, g in zip(texts, ground_truths)]
    score = np.array([r["score"] for r in results], dtype=np.float64)
    acc = np.array([r["acc"] for r in results], dtype=bool)
    pred = np.empty(n, dtype=object)
    pred[:] = [r["pred"] for r in results]
    if overlong_enable:
        over = np.asarray(
            overlong_penalty(lengths, max_response_length, overlong_buffer_len, overlong_penalty_factor),
            dtype=np.float64,
        ).reshape(-1)
    else:
        over = np.zeros(n, dtype=np.float64)
    reward = score + over
    out = {
        "score": score,
        "acc": acc,
        "pred": pred,
        "overlong_reward": over,
        "overlong": over < 0,
        "reward": reward,
        "seq_reward": reward,
        "seq_final_reward": reward,
    }
    if verify_fn is not None:
        out["math_verify_acc"] = np.array([verify_fn(t, g) for t, g in zip(texts, ground_truths)], dtype=bool)
    return out

"""A synthetic math task in the DAPO-Math-17k schema: integer addition with a DAPO-style ``Answer:`` line.

Every row has the columns of DAPO-Math-17k (``data_source``, ``prompt`` -- a chat list with one user turn holding the
full DAPO prompt template --, ``ability``, ``reward_model`` = ``{"style": "rule", "ground_truth": "85"}``,
``extra_info``), so the same loop, verifier and data tooling serve the tiny run and the 32B run.

Reference response (what the supervised warm start imitates): column addition, units first, the carry written out,
then the DAPO answer line. For 47 + 38::

    7+8=15
    4+3+1=8
    Answer: 85

The warm start's labels carry a *systematic, plausible mistake* part of the time: on problems where a column
carries, a fraction ``mistake_rate`` of the labels "forget the carry" (``4+3=7`` ... ``Answer: 75``). The
warm-started policy thus has both behaviours; RL with the verifier's reward then has something real to select (see
docs/tiny.md for what this does and does not demonstrate).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

DATA_SOURCE = "tiny-addition"

# The DAPO-Math-17k prompt template (stored verbatim in every row; the tokenizer covers it).
PROMPT_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
PROMPT_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def dapo_prompt(problem: str) -> str:
    """The user message of a DAPO-Math-17k row for ``problem``."""
    return f"{PROMPT_PREFIX}{problem}{PROMPT_SUFFIX}"


@dataclass(frozen=True)
class Problem:
    a: int
    b: int

    @property
    def answer(self) -> int:
        return self.a + self.b

    @property
    def carries(self) -> bool:
        """True when some column of the written addition carries."""
        a, b = self.a, self.b
        while a or b:
            if a % 10 + b % 10 >= 10:
                return True
            a, b = a // 10, b // 10
        return False

    def columns(self) -> int:
        return max(len(str(self.a)), len(str(self.b)))

    def solution(self, forget_carry: bool = False, rechecks: int = 0, swaps: tuple[bool, ...] = ()) -> tuple[str, int]:
        """(response text, its final answer): one line per column, units first, then ``Answer: <n>``.

        ``forget_carry``: the systematic mistake -- carries are never added to the next column (nor written as a
        leading digit). ``rechecks``: the working is written again that many times, each copy after a ``Check:``
        line, before the answer (a long, correct-in-substance response that a length cap may cut). ``swaps[i]``:
        column i is written with its two digits in the other order (``8+7=15`` for 7 + 8): a style the verifier
        ignores.
        """
        lines, digits, carry = [], [], 0
        for i in range(self.columns()):
            da, db = (self.a // 10**i) % 10, (self.b // 10**i) % 10
            total = da + db + carry
            if i < len(swaps) and swaps[i]:
                da, db = db, da
            lines.append(f"{da}+{db}+{carry}={total}" if carry else f"{da}+{db}={total}")
            digits.append(total % 10)
            carry = 0 if forget_carry else total // 10
        if carry:
            digits.append(carry)
        answer = int("".join(str(d) for d in reversed(digits)))
        body = list(lines)
        for _ in range(rechecks):
            body += ["Check:"] + lines
        return "\n".join(body + [f"Answer: {answer}"]), answer

    def text(self) -> str:
        return f"What is {self.a} + {self.b}?"

    def response(self, forget_carry: bool = False, rechecks: int = 0, swaps: tuple[bool, ...] = ()) -> str:
        return self.solution(forget_carry, rechecks, swaps)[0]


def make_problems(
    digits: int, n_train: int, n_val: int, seed: int, min_digits: int = 0
) -> tuple[list[Problem], list[Problem]]:
    """Disjoint train / validation problems.

    ``min_digits == 0``: ordered pairs (a, b) with up to ``digits`` digits each (uniform over all pairs).
    ``min_digits >= 1``: a length d uniform in ``[min_digits, digits]`` per problem, then two uniform d-digit
    operands; response lengths (one line of working per digit) then spread evenly over the range.
    """
    if digits < 1:
        raise ValueError(f"local.task.digits must be >= 1, got {digits}")
    if min_digits == 0:
        hi = 10**digits
        total = hi * hi
        if n_train + n_val > total:
            raise ValueError(
                f"local.task: n_train + n_val = {n_train + n_val} exceeds the {total} distinct {digits}-digit problems"
            )
        rng = np.random.default_rng(seed)
        flat = rng.choice(total, size=n_train + n_val, replace=False)
        probs = [Problem(int(i // hi), int(i % hi)) for i in flat]
        return probs[:n_train], probs[n_train:]
    if not 1 <= min_digits <= digits:
        raise ValueError(f"local.task.min_digits must be 0 or in [1, digits={digits}], got {min_digits}")
    # per length d there are (9 * 10**(d-1))**2 distinct problems; the shortest length bounds how many fit
    per_len = (n_train + n_val) / (digits - min_digits + 1)
    if per_len > 0.5 * (9 * 10 ** (min_digits - 1)) ** 2:
        raise ValueError(
            f"local.task: n_train + n_val = {n_train + n_val} is too many distinct problems for min_digits={min_digits}"
        )
    rng = np.random.default_rng(seed)
    seen: set[tuple[int, int]] = set()
    probs = []
    while len(probs) < n_train + n_val:
        d = int(rng.integers(min_digits, digits + 1))
        lo, hi = 10 ** (d - 1), 10**d
        p = (int(rng.integers(lo, hi)), int(rng.integers(lo, hi)))
        if p not in seen:
            seen.add(p)
            probs.append(Problem(*p))
    return probs[:n_train], probs[n_train:]


def to_row(p: Problem, split: str, index: int) -> dict[str, Any]:
    """One row in the DAPO-Math-17k schema."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": dapo_prompt(p.text())}],
        "ability": "MATH",
        "reward_model": {"style": "rule", "ground_truth": str(p.answer)},
        "extra_info": {"split": split, "index": index, "a": p.a, "b": p.b},
    }


def write_parquet(problems: list[Problem], split: str, path: Path) -> Path:
    import pandas as pd

    rows = [to_row(p, split, i) for i, p in enumerate(problems)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.parquet")
    pd.DataFrame(rows).to_parquet(tmp, index=False)
    tmp.replace(path)
    return path


MAX_RECHECKS = 3


def sft_response(
    p: Problem, rng: np.random.Generator, mistake_rate: float, recheck_rate: float = 0.0, guess_rate: float = 0.0,
    recheck_mistake_rate: Optional[float] = None, swap_rate: float = 0.0,
) -> str:
    """A warm-start label: correct, or -- on carrying problems, with probability ``mistake_rate`` -- the
    "forgot the carry" solution. More label styles, each drawn only when its rate is set (so the labels of the
    tasks without it do not depend on it):

    - ``recheck_rate``: the working is rewritten 1 to :data:`MAX_RECHECKS` times after ``Check:`` lines before the
      answer (long, correct in substance, cut by a length cap);
    - ``recheck_mistake_rate`` (None: ``mistake_rate``): a rechecking label on a carrying problem forgets the carry
      with this probability instead -- long responses that are wrong (1.0: all of them, on carrying problems);
    - ``guess_rate``: otherwise only the answer line is written (short: a model this small cannot add several digits
      without the working, so sampled guesses are mostly wrong);
    - ``swap_rate``: each line of working writes its two digits in the other order with this probability -- a
      rare style the reward ignores (many low-probability tokens in rewarded responses).
    """
    forget = bool(p.carries and rng.random() < mistake_rate)
    rechecks = int(rng.integers(1, MAX_RECHECKS + 1)) if recheck_rate > 0 and rng.random() < recheck_rate else 0
    if rechecks and recheck_mistake_rate is not None and p.carries:
        forget = bool(rng.random() < recheck_mistake_rate)
    swaps = tuple(bool(x) for x in rng.random(p.columns()) < swap_rate) if swap_rate > 0 else ()
    text, answer = p.solution(forget_carry=forget, rechecks=rechecks, swaps=swaps)
    if not rechecks and guess_rate > 0 and rng.random() < guess_rate:
        return f"Answer: {answer}"
    return text

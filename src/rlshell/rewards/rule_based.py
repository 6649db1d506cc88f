"""Rule-based rewards: math answer equivalence (math-verify), exact match, answer format."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

__all__ = ["exact_match_reward", "format_reward", "has_final_answer", "math_reward"]

# A plain decimal number: optional sign, digits (thousands may be comma-grouped),
# optional fraction part; "12", "-3.5", "1,000", ".5".
_NUMBER = r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
_BARE_NUMBER = re.compile(_NUMBER)
_GSM8K_ANSWER_LINE = re.compile(rf"^[ \t]*####[ \t]*\$?{_NUMBER}[ \t]*$", re.MULTILINE)
_BOXED = re.compile(r"\\boxed\s*\{")


def math_reward(response: str, answer: str) -> float:
    """1.0 when math-verify finds the response's answer equivalent to ``answer``, else 0.0.

    One exception to math-verify's verdict: where ``answer`` is a number, a
    response whose answer is an unevaluated sum, difference or product of
    integers (``19+1``, ``2*10``) scores 0. math-verify evaluates it and
    accepts it, but it restates arithmetic instead of doing it: a policy
    trained on the arithmetic task learned to answer ``9+9+2=`` with ``19+1``
    and ``1+9+0=`` with ``1+9``. Fractions (``1/4``, ``\\frac{1}{4}``),
    percentages, powers and symbolic answers keep math-verify's verdict.

    math-verify's own signal-based timeouts only work on a main thread, so
    they are off here; callers bound the time of each call themselves.
    Verdicts are memoised per (response, answer) and parses per text: a
    group's answer is the same for all its samples, and short responses repeat.
    """
    return 1.0 if _math_equivalent(response, answer) else 0.0


@lru_cache(maxsize=8192)
def _math_equivalent(response: str, answer: str) -> bool:
    from math_verify import verify

    gold, predicted = _parsed(answer), _parsed(response)
    if not gold or not predicted:
        return False
    if _is_number(gold[0]) and _integer_arithmetic(predicted[0]):
        return False
    # Fresh lists around the cached (immutable) parse results: verify reads lists only.
    return bool(verify(list(gold), list(predicted), timeout_seconds=None))


def _is_number(expression: Any) -> bool:
    return bool(getattr(expression, "is_Number", False))


def _integer_arithmetic(expression: Any) -> bool:
    """Whether a parsed answer is a sum or difference (sympy ``Add``) of anything, or a product
    (``Mul``) of integers only: arithmetic left undone. ``1/4`` is ``Mul(1, Pow(4, -1))``, a
    fraction, and is not."""
    import sympy

    if isinstance(expression, sympy.Add):
        return True
    return isinstance(expression, sympy.Mul) and all(arg.is_Integer for arg in expression.args)


@lru_cache(maxsize=8192)
def _parsed(text: str) -> tuple[Any, ...]:
    from math_verify import parse

    return tuple(parse(text, parsing_timeout=None))


def exact_match_reward(response: str, answer: str) -> float:
    """1.0 when the stripped response equals the stripped answer, else 0.0."""
    return 1.0 if response.strip() == answer.strip() else 0.0


def format_reward(response: str, answer: str) -> float:
    """1.0 when the response states a final answer in a recognised format, else 0.0.

    Right or wrong does not matter (``answer`` is unused): this rewards a
    policy for ending where `math_reward` can read it. See `has_final_answer`
    for the formats.
    """
    del answer
    return 1.0 if has_final_answer(response) else 0.0


def has_final_answer(response: str) -> bool:
    """Whether ``response`` states its final answer in one of three formats.

    - a GSM8K answer line, ``#### <number>`` alone on its line (``#### 72``,
      ``#### -3.5``, ``#### 1,000``, ``#### $18``);
    - a LaTeX ``\\boxed{...}`` with balanced, non-empty braces (``\\boxed{\\frac{1}{2}}``);
    - a bare number and nothing else, surrounding whitespace aside (``12``),
      which is how the short arithmetic task asks to be answered.

    math-verify also reads answers out of free text ("so the answer is 12"),
    but that is not a format a policy should be rewarded for learning.
    """
    if _BARE_NUMBER.fullmatch(response.strip()) or _GSM8K_ANSWER_LINE.search(response):
        return True
    return any(_boxed_content(response, m.end()) for m in _BOXED.finditer(response))


def _boxed_content(text: str, start: int) -> str:
    """The stripped text from ``start`` (just after a "{") to its closing brace; "" if unclosed."""
    depth = 1
    for position in range(start, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[start:position].strip()
    return ""

"""Rule-based rewards: math answer equivalence (math-verify) and exact match."""

from __future__ import annotations

__all__ = ["exact_match_reward", "math_reward"]


def math_reward(response: str, answer: str) -> float:
    """1.0 when math-verify finds the response's answer equivalent to ``answer``, else 0.0.

    math-verify's own signal-based timeouts only work on a main thread, so
    they are off here; callers bound the time of each call themselves.
    """
    from math_verify import parse, verify

    gold = parse(answer, parsing_timeout=None)
    predicted = parse(response, parsing_timeout=None)
    if not gold or not predicted:
        return 0.0
    return 1.0 if verify(gold, predicted, timeout_seconds=None) else 0.0


def exact_match_reward(response: str, answer: str) -> float:
    """1.0 when the stripped response equals the stripped answer, else 0.0."""
    return 1.0 if response.strip() == answer.strip() else 0.0

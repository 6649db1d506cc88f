"""A rule-based reward: does the response contain the answer as a whole word?"""

from __future__ import annotations

import re


def contains_answer(response: str, answer: str) -> float:
    """1.0 when ``answer`` appears in ``response`` as a whole token, else 0.0."""
    pattern = rf"(?<![\w.]){re.escape(answer.strip())}(?!\w|\.\d)"
    return 1.0 if answer.strip() and re.search(pattern, response) else 0.0

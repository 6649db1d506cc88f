"""Whether rlcore's run-time checks run at a point of a test (hot loops skip them after one)."""

from __future__ import annotations

import torch
from jaxtyping import TypeCheckError

from rlcore.masked import masked_sum


def rlcore_checks_run() -> bool:
    """Whether rlcore checks calls here: an int tensor where floats belong raises if it does."""
    try:
        masked_sum(torch.ones(1, 2, dtype=torch.int32), torch.ones(1, 2, dtype=torch.bool))
    except TypeCheckError:
        return True
    return False

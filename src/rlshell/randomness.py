"""A process's random states, saved into checkpoints and restored on resume.

Every part is plain data (ints, floats, strings, lists, tensors), so that a state file
loads with ``torch.load(weights_only=True)``: reading a checkpoint never unpickles an
arbitrary object (NumPy's state, an array, is kept as a list of ints)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["rng_state", "set_rng_state"]


def rng_state() -> dict[str, Any]:
    """This process's random states: Python, NumPy, torch (and CUDA when present)."""
    kind, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (
            str(kind),
            [int(key) for key in keys],
            int(position),
            int(has_gauss),
            float(cached),
        ),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned (CUDA's only where this process has CUDA)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

"""Task descriptions as tensors: one row of Unicode code points per env.

An env that states its task in words (a gymnasium ``spaces.Text`` observation,
e.g. "balance the pole") reaches the policy as ``env_obs["task_descriptions"]``.
`EnvStepper` hands it over as an int32 ``[num_envs, max_length]`` tensor of
code points, zero-padded on the right, rather than a list of strings: the
observation dict stays a dict of tensors, so rows are selected, merged with
final observations and moved between devices like every other entry.
`texts_of` reads either form back as one string per row, so a policy also
accepts the list of strings RLinf's env wrappers hand over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

__all__ = ["decode_texts", "encode_texts", "texts_of"]


def encode_texts(
    texts: Sequence[str] | np.ndarray[Any, Any],
    width: int,
    device: torch.device | None = None,
) -> Int[Tensor, "rows width"]:
    """``texts`` as int32 code points ``[len(texts), width]``, zero-padded on the right.

    A text longer than ``width`` characters raises ValueError (the env's
    ``spaces.Text.max_length`` bounds what it may send).
    """
    rows = [str(text) for text in texts]
    codes = np.zeros((len(rows), width), dtype=np.int32)
    for index, text in enumerate(rows):
        if len(text) > width:
            raise ValueError(
                f"task description {index} has {len(text)} characters, more than the "
                f"{width} its text space allows: {text!r}"
            )
        if "\0" in text:
            raise ValueError(f"task description {index} contains NUL, the padding code point")
        codes[index, : len(text)] = [ord(char) for char in text]
    return torch.as_tensor(codes, device=device)


def decode_texts(codes: Int[Tensor, "rows width"]) -> list[str]:
    """The strings `encode_texts` encoded (the zero padding dropped)."""
    return ["".join(chr(code) for code in row if code) for row in codes.tolist()]


def texts_of(value: Any, what: str = "task_descriptions") -> list[str]:
    """One string per row from a code-point tensor (`EnvStepper`) or a sequence of strings."""
    if isinstance(value, Tensor):
        if value.dim() != 2 or value.is_floating_point():
            raise TypeError(
                f"{what}: expected int code points [rows, width] (rlshell.envs.text.encode_texts) "
                f"or a list of strings, got a {value.dtype} tensor of shape {tuple(value.shape)}"
            )
        return decode_texts(value)
    if isinstance(value, str):
        raise TypeError(f"{what}: expected one string per row, got a single string {value!r}")
    if isinstance(value, Sequence | np.ndarray) and all(isinstance(v, str) for v in value):
        return [str(v) for v in value]
    raise TypeError(
        f"{what}: expected a list of strings or int code points [rows, width], "
        f"got {type(value).__name__}"
    )

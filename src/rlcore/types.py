"""Shared annotations and result records of rlcore.

Shape convention: batch first, time (token) axis last, ``"*batch time"``.
Masks mark valid positions; they are ``bool`` tensors, and float or integer
0/1 tensors are accepted at the boundary and converted by `as_bool_mask`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs
import torch
from jaxtyping import AbstractDtype, Float
from torch import Tensor

__all__ = ["Advantages", "LossOutput", "Mask", "as_bool_mask"]

if TYPE_CHECKING:
    from typing import Annotated as Mask
else:

    class Mask(AbstractDtype):
        """A validity mask: ``bool``, or a float/integer tensor holding only 0 and 1."""

        dtypes = [  # noqa: RUF012  (jaxtyping reads this class attribute)
            "bool",
            "uint8",
            "int8",
            "int16",
            "int32",
            "int64",
            "float16",
            "bfloat16",
            "float32",
            "float64",
        ]


def as_bool_mask(mask: Tensor, name: str = "mask") -> Tensor:
    """Return ``mask`` as a bool tensor; a non-bool mask must hold only 0 and 1."""
    if mask.dtype == torch.bool:
        return mask
    if bool(((mask != 0) & (mask != 1)).any()):
        bad = mask[(mask != 0) & (mask != 1)].flatten()[:3].tolist()
        raise ValueError(f"{name}: a {mask.dtype} mask must hold only 0 and 1, found {bad}")
    return mask != 0


# Records holding tensors compare by identity (eq=False): tensor == is elementwise.
@attrs.frozen(eq=False)
class Advantages:
    """Advantages and the value targets (returns) they imply, both ``[*batch, time]``."""

    advantages: Float[Tensor, "*batch time"]
    returns: Float[Tensor, "*batch time"]


@attrs.frozen(eq=False)
class LossOutput:
    """A scalar loss to minimise and detached scalar diagnostics.

    ``metrics`` keys are short names (``clipfrac``, ``approx_kl``...); the shell
    prefixes them with its namespace (``train/``).
    """

    loss: Float[Tensor, ""]
    metrics: Mapping[str, Tensor] = attrs.field(factory=dict)

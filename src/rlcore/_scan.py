"""The reverse linear recurrence behind every return and advantage estimator.

    yₜ = xₜ + dₜ · yₜ₊₁,   y after the last step = c (0 unless given)

evaluated along the last axis. The obvious implementation is a Python loop over
time with a few small tensor ops per step (what verl and RLinf write). Here the
T steps are cut into n = T/C chunks of C = 8 and solved in two levels, in place
in one buffer and without a loop over time:

1. for all chunks at once (vectorised over rows and chunks), the value at each
   chunk's start with 0 entering from the right, ŷᵢ = Σⱼ (Πₖ<ⱼ dᵢₖ) xᵢⱼ, and
   the chunk's total decay Pᵢ = Πⱼ dᵢⱼ;
2. the true chunk-start values satisfy the same recurrence one level up,
   Yᵢ = ŷᵢ + Pᵢ · Yᵢ₊₁, solved recursively (T/8, T/64, ... steps);
3. every chunk is then solved in place, entered with its successor's Yᵢ₊₁.

Python runs about 2C·log_C(T) vectorised steps (≈ 64 for T = 4,096 instead of
4,096), and the arithmetic is the loop's, re-associated at chunk boundaries
only. Working in place matters on this hardware: first-touching a fresh
4 MB buffer costs about as much as the whole computation.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK = 8


def reverse_linear_recurrence(x: Tensor, decay: Tensor, carry: Tensor | None = None) -> Tensor:
    """Solve yₜ = xₜ + decayₜ · yₜ₊₁ along the last axis, returning a new tensor.

    ``carry`` (shape ``x.shape[:-1]``) is y just after the last step, 0 when None.
    """
    shape = torch.broadcast_shapes(x.shape, decay.shape)  # type: ignore[no-untyped-call]
    y = x.expand(shape).clone(memory_format=torch.contiguous_format)
    solve_(y, decay, carry)
    return y


def solve_(y: Tensor, decay: Tensor, carry: Tensor | None = None) -> None:
    """In place: ``y`` holds x on entry and the solution on exit (any leading shape)."""
    if not y.is_contiguous():
        raise ValueError("solve_ works in place on a contiguous buffer")
    if y.numel() == 0:
        return
    steps = y.shape[-1]
    y2 = y.view(-1, steps)
    d2 = decay.expand_as(y).reshape(-1, steps)
    carry2 = None if carry is None else carry.expand(y.shape[:-1]).reshape(-1)
    _solve(y2, d2, carry2)


def _solve(y: Tensor, decay: Tensor, carry: Tensor | None) -> None:
    steps = y.shape[-1]
    if steps <= 2 * CHUNK:
        _sequential(y, decay, carry)
        return
    tail = steps % CHUNK
    body = steps - tail
    if tail:
        _sequential(y[:, body:], decay[:, body:], carry)
        carry = y[:, body]
    rows, chunks = y.shape[0], body // CHUNK
    y3 = y[:, :body].view(rows, chunks, CHUNK)
    d3 = decay[:, :body].reshape(rows, chunks, CHUNK)
    starts = _local_starts(y3, d3)
    _solve(starts, d3.prod(dim=-1), carry)
    # Each chunk is entered with the true start value of the chunk after it.
    last = starts.new_zeros(starts.shape[0], 1) if carry is None else carry.unsqueeze(1)
    entering = torch.cat([starts[:, 1:], last], dim=1)
    _sequential(y3, d3, entering)


def _local_starts(y3: Tensor, d3: Tensor) -> Tensor:
    """For ``[rows, chunks, C]``: each chunk's y at offset 0 with 0 entering from the right."""
    width = y3.shape[-1]
    acc = y3[..., width - 1].clone()
    for j in range(width - 2, -1, -1):
        acc = torch.addcmul(y3[..., j], d3[..., j], acc)
    return acc


def _sequential(y: Tensor, decay: Tensor, carry: Tensor | None) -> None:
    """The recurrence in place along the last axis, one vectorised step per position."""
    width = y.shape[-1]
    if carry is not None:
        y[..., width - 1].addcmul_(decay[..., width - 1], carry)
    for j in range(width - 2, -1, -1):
        y[..., j].addcmul_(decay[..., j], y[..., j + 1])

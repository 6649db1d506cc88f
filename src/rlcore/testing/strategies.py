"""Hypothesis strategies for the data rlcore functions take.

Each strategy draws small tensors whose structure exercises the edge cases
that break RL maths in practice: masks with holes and fully masked rows,
episodes that terminate or are truncated anywhere (also at the first and last
step), groups whose scores are all equal, float64 values spanning several
orders of magnitude, uniform and sharply peaked action logits, and
pre-squash actions far out where tanh rounds to ±1.
"""

from __future__ import annotations

import attrs
import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from jaxtyping import Bool, Float, Int
from torch import Tensor

__all__ = [
    "CategoricalBatch",
    "GaussianBatch",
    "TokenBatch",
    "Trajectory",
    "categorical_batches",
    "gaussian_batches",
    "group_scores",
    "masks",
    "token_batches",
    "trajectories",
]

_FINITE = st.floats(-10.0, 10.0, allow_nan=False, allow_infinity=False)


@st.composite
def _values(
    draw: st.DrawFn, shape: tuple[int, ...], dtype: torch.dtype, elements: st.SearchStrategy[float]
) -> Tensor:
    # fill=nothing(): draw every element, not one repeated fill value.
    array = draw(hnp.arrays(np.float64, shape, elements=elements, fill=st.nothing()))
    return torch.from_numpy(array).to(dtype)


@st.composite
def masks(
    draw: st.DrawFn,
    shape: tuple[int, int],
    contiguous: bool = False,
    allow_empty_rows: bool = True,
) -> Tensor:
    """Bool masks ``[batch, time]``: right-padded prefixes, or arbitrary holes.

    With ``contiguous`` every row is a prefix (a generated response followed by
    padding); otherwise rows may have holes (observation tokens in a
    multi-turn response). ``allow_empty_rows`` allows rows with no valid token.
    """
    batch, time = shape
    if contiguous:
        low = 0 if allow_empty_rows else min(1, time)
        lengths = draw(st.lists(st.integers(low, time), min_size=batch, max_size=batch))
        steps = torch.arange(time)
        return steps.unsqueeze(0) < torch.tensor(lengths, dtype=torch.long).unsqueeze(-1)
    mask = torch.from_numpy(draw(hnp.arrays(np.bool_, (batch, time), fill=st.nothing())))
    if not allow_empty_rows and time > 0:
        mask[:, 0] |= ~mask.any(dim=-1)
    return mask


@attrs.frozen(eq=False)
class Trajectory:
    """One window of environment steps ``[batch, time]`` (see `rlcore.advantages.gae`)."""

    rewards: Float[Tensor, "batch time"]
    values: Float[Tensor, "batch time"]
    next_values: Float[Tensor, "batch time"]
    terminated: Bool[Tensor, "batch time"]
    truncated: Bool[Tensor, "batch time"]


@st.composite
def trajectories(
    draw: st.DrawFn,
    max_batch: int = 4,
    max_time: int = 24,
    dtype: torch.dtype = torch.float64,
    consistent_values: bool = False,
    min_batch: int = 1,
    min_time: int = 1,
) -> Trajectory:
    """Windows of steps with terminations and truncations anywhere.

    ``consistent_values`` makes ``next_values[t] = values[t + 1]`` whenever
    step t neither ended the episode nor was the last of the window, as a
    critic evaluated on the same observations would give. The shape is drawn
    from ``[min_batch, max_batch] × [min_time, max_time]`` (equal bounds fix it).
    """
    batch = draw(st.integers(min_batch, max_batch))
    time = draw(st.integers(min_time, max_time))
    shape = (batch, time)
    rewards = draw(_values(shape, dtype, _FINITE))
    values = draw(_values(shape, dtype, _FINITE))
    next_values = draw(_values(shape, dtype, _FINITE))
    terminated = torch.from_numpy(draw(hnp.arrays(np.bool_, shape, fill=st.nothing())))
    truncated = torch.from_numpy(draw(hnp.arrays(np.bool_, shape, fill=st.nothing()))) & ~terminated
    if consistent_values and time > 1:
        done = terminated | truncated
        follow = torch.cat([values[:, 1:], next_values[:, -1:]], dim=1)
        inside = ~done
        inside[:, -1] = False
        next_values = torch.where(inside, follow, next_values)
    return Trajectory(rewards, values, next_values, terminated, truncated)


@attrs.frozen(eq=False)
class TokenBatch:
    """Everything a reasoning-RL loss reads, ``[batch, time]``, with a mask."""

    logprobs: Float[Tensor, "batch time"]
    old_logprobs: Float[Tensor, "batch time"]
    ref_logprobs: Float[Tensor, "batch time"]
    advantages: Float[Tensor, "batch time"]
    token_rewards: Float[Tensor, "batch time"]
    values: Float[Tensor, "batch time"]
    old_values: Float[Tensor, "batch time"]
    returns: Float[Tensor, "batch time"]
    mask: Bool[Tensor, "batch time"]


@st.composite
def token_batches(
    draw: st.DrawFn,
    max_batch: int = 6,
    max_time: int = 12,
    dtype: torch.dtype = torch.float64,
    contiguous_mask: bool = False,
    allow_empty_rows: bool = True,
    batch_multiple_of: int = 1,
    min_batch: int = 1,
    min_time: int = 1,
) -> TokenBatch:
    """Token batches with log-probabilities in [−8, 0] close to each other.

    ``old_logprobs`` and ``ref_logprobs`` differ from ``logprobs`` by up to
    ±1.5 nats, so ratios exercise both sides of a clip range.
    ``batch_multiple_of`` makes the batch a whole number of groups. The batch
    lies in ``[min_batch, max_batch]`` (rounded to whole groups) and the time
    axis in ``[min_time, max_time]``; equal bounds fix the shape.
    """
    fewest = max(1, -(-min_batch // batch_multiple_of))
    groups = draw(st.integers(fewest, max(fewest, max_batch // batch_multiple_of)))
    batch = groups * batch_multiple_of
    time = draw(st.integers(min_time, max_time))
    shape = (batch, time)
    logprobs = draw(_values(shape, dtype, st.floats(-8.0, 0.0)))
    shift = st.floats(-1.5, 1.5)
    old_logprobs = logprobs + draw(_values(shape, dtype, shift))
    ref_logprobs = logprobs + draw(_values(shape, dtype, shift))
    mask = draw(masks(shape, contiguous=contiguous_mask, allow_empty_rows=allow_empty_rows))
    values = draw(_values(shape, dtype, _FINITE))
    old_values = values + draw(_values(shape, dtype, st.floats(-1.0, 1.0)))
    return TokenBatch(
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        ref_logprobs=ref_logprobs,
        advantages=draw(_values(shape, dtype, _FINITE)),
        token_rewards=draw(_values(shape, dtype, _FINITE)),
        values=values,
        old_values=old_values,
        returns=draw(_values(shape, dtype, _FINITE)),
        mask=mask,
    )


@st.composite
def group_scores(
    draw: st.DrawFn,
    max_groups: int = 5,
    min_group_size: int = 2,
    max_group_size: int = 8,
    dtype: torch.dtype = torch.float64,
    min_groups: int = 1,
) -> Tensor:
    """Outcome scores ``[groups, group_size]``: binary, small integers, or continuous.

    Binary and integer scores make groups of equal scores (all right, all
    wrong) common, the case group-relative estimators must map to 0. The
    number of groups lies in ``[min_groups, max_groups]``.
    """
    groups = draw(st.integers(min_groups, max_groups))
    size = draw(st.integers(min_group_size, max_group_size))
    kind = draw(st.sampled_from(["binary", "integer", "continuous"]))
    elements = {
        "binary": st.sampled_from([0.0, 1.0]),
        "integer": st.integers(-2, 2).map(float),
        "continuous": _FINITE,
    }[kind]
    return draw(_values((groups, size), dtype, elements))


@attrs.frozen(eq=False)
class CategoricalBatch:
    """Logits ``[batch, actions]`` of a categorical policy and one action per row."""

    logits: Float[Tensor, "batch actions"]
    actions: Int[Tensor, " batch"]


@st.composite
def categorical_batches(
    draw: st.DrawFn,
    max_batch: int = 6,
    max_actions: int = 8,
    dtype: torch.dtype = torch.float64,
    min_batch: int = 1,
    min_actions: int = 1,
) -> CategoricalBatch:
    """Logits on every scale, from uniform rows to one action with all the mass.

    Each row is ``offset + scale · w`` with w ∈ [−1, 1]: the scale is 0
    (every action equally likely), 10⁻³, 1, 10 or 40 (π within about e⁻⁸⁰
    of one-hot), the offset up to ±50 (the softmax must subtract the maximum).
    Actions are int64 in ``[0, actions)``. The shape lies in
    ``[min_batch, max_batch] × [min_actions, max_actions]``.
    """
    batch = draw(st.integers(min_batch, max_batch))
    count = draw(st.integers(min_actions, max_actions))
    scale = draw(st.sampled_from([0.0, 1e-3, 1.0, 10.0, 40.0]))
    offset = draw(st.floats(-50.0, 50.0))
    logits = offset + scale * draw(_values((batch, count), dtype, st.floats(-1.0, 1.0)))
    actions = draw(hnp.arrays(np.int64, (batch,), elements=st.integers(0, count - 1)))
    return CategoricalBatch(logits, torch.from_numpy(actions))


@attrs.frozen(eq=False)
class GaussianBatch:
    """A diagonal Gaussian per row, ``mean`` and ``log_std``, and a point ``x`` to score.

    ``log_std`` is ``[batch, dim]``, or ``[dim]`` when it is shared by every row
    (a state-independent σ); ``x`` and ``mean`` are ``[batch, dim]``.
    """

    x: Float[Tensor, "batch dim"]
    mean: Float[Tensor, "batch dim"]
    log_std: Float[Tensor, "*#batch dim"]


@st.composite
def gaussian_batches(
    draw: st.DrawFn,
    max_batch: int = 6,
    max_dim: int = 4,
    dtype: torch.dtype = torch.float64,
    shared_log_std: bool | None = None,
    max_abs_x: float = 25.0,
    min_batch: int = 1,
    min_dim: int = 1,
) -> GaussianBatch:
    """Means in [−5, 5], log σ in [−5, 2] (SAC's clamp range), points near and far.

    ``x`` is either μ + σ k with k ∈ [−4, 4] (where samples fall) or anywhere
    in ``[−max_abs_x, max_abs_x]`` (read as a pre-squash u, up to ±25 tanh
    rounds to ±1 even in float64). ``shared_log_std`` makes log σ ``[dim]``;
    None draws either. The shape lies in
    ``[min_batch, max_batch] × [min_dim, max_dim]``.
    """
    batch = draw(st.integers(min_batch, max_batch))
    dim = draw(st.integers(min_dim, max_dim))
    shared = draw(st.booleans()) if shared_log_std is None else shared_log_std
    mean = draw(_values((batch, dim), dtype, st.floats(-5.0, 5.0)))
    log_std = draw(_values((dim,) if shared else (batch, dim), dtype, st.floats(-5.0, 2.0)))
    if draw(st.booleans()):
        x = mean + log_std.exp() * draw(_values((batch, dim), dtype, st.floats(-4.0, 4.0)))
    else:
        x = draw(_values((batch, dim), dtype, st.floats(-max_abs_x, max_abs_x)))
    return GaussianBatch(x, mean, log_std)

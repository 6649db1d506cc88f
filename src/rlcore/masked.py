"""Reductions over the valid positions of a tensor, and loss aggregation.

Masked positions never reach a result: values there are replaced by zero
before reducing (``torch.where``, not a product), so a NaN or inf in padding
cannot leak into a sum, a mean or a gradient.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from jaxtyping import Float
from torch import Tensor

from rlcore._checking import typecheck
from rlcore.types import Mask, as_bool_mask

__all__ = [
    "AggregationMode",
    "aggregate",
    "aggregation_normalizer",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]

AggregationMode = Literal[
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]
AGGREGATION_MODES: tuple[str, ...] = get_args(AggregationMode)


def _dims(axis: int | tuple[int, ...] | None, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    return (axis,) if isinstance(axis, int) else tuple(axis)


@typecheck
def masked_sum(
    values: Float[Tensor, "*shape"],
    mask: Mask[Tensor, "*shape"],
    axis: int | tuple[int, ...] | None = None,
) -> Float[Tensor, "..."]:
    """Σᵢ mᵢ xᵢ over ``axis`` (all axes when None)."""
    mask = as_bool_mask(mask)
    return torch.where(mask, values, 0.0).sum(dim=_dims(axis, values.ndim))


@typecheck
def masked_mean(
    values: Float[Tensor, "*shape"],
    mask: Mask[Tensor, "*shape"],
    axis: int | tuple[int, ...] | None = None,
) -> Float[Tensor, "..."]:
    """Σᵢ mᵢ xᵢ / max(Σᵢ mᵢ, 1): the mean of the valid entries.

    A slice with no valid entry has mean 0 (its sum is 0); it never yields NaN.
    """
    mask = as_bool_mask(mask)
    dims = _dims(axis, values.ndim)
    total = torch.where(mask, values, 0.0).sum(dim=dims)
    count = mask.sum(dim=dims).clamp(min=1)
    return total / count


@typecheck
def masked_var(
    values: Float[Tensor, "*shape"],
    mask: Mask[Tensor, "*shape"],
    unbiased: bool = True,
) -> Float[Tensor, ""]:
    """Variance of all valid entries.

    μ = Σ m x / n,   σ² = Σ m (x − μ)² / (n − 1)   (n when ``unbiased=False``)

    With fewer than two valid entries (one for the biased form) there is no
    spread to measure and the result is 0. Matches verl's ``masked_var``
    (Bessel-corrected by default) where that is defined.
    """
    mask = as_bool_mask(mask)
    # Zero the padding first: (x − μ)² at a NaN would put 0·NaN into μ's gradient.
    values = torch.where(mask, values, 0.0)
    count = mask.sum()
    mean = values.sum() / count.clamp(min=1)
    squares = torch.where(mask, (values - mean) ** 2, 0.0).sum()
    denominator = count - 1 if unbiased else count
    return squares / denominator.clamp(min=1) * (denominator > 0)


@typecheck
def masked_whiten(
    values: Float[Tensor, "*shape"],
    mask: Mask[Tensor, "*shape"],
    shift_mean: bool = True,
    eps: float = 1e-8,
) -> Float[Tensor, "*shape"]:
    """Standardise the valid entries: (x − μ) / √(σ² + ε), masked entries set to 0.

    μ and σ² are the masked mean and (Bessel-corrected) variance over all axes.
    With ``shift_mean=False`` the mean is added back: x ↦ (x − μ)/√(σ²+ε) + μ,
    the convention PPO implementations use to whiten rewards.
    """
    mask = as_bool_mask(mask)
    values = torch.where(mask, values, 0.0)  # see masked_var: no NaN may reach μ or σ
    mean = masked_mean(values, mask)
    variance = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(variance + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask, whitened, 0.0)


def _check_mode(mode: str) -> None:
    if mode not in AGGREGATION_MODES:
        import difflib

        close = difflib.get_close_matches(mode, AGGREGATION_MODES, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        expected = ", ".join(AGGREGATION_MODES)
        raise ValueError(f"unknown aggregation mode '{mode}'{hint}; expected one of {expected}")


@typecheck
def aggregation_normalizer(
    mask: Mask[Tensor, "batch time"],
    mode: AggregationMode,
    horizon: int | None = None,
) -> Float[Tensor, ""]:
    """The denominator `aggregate` divides by, for the rows in ``mask``.

    - ``token-mean``: the number of valid tokens, Σ mᵢₜ;
    - ``token-sum``: 1, whatever the batch (the loss is the plain token sum);
    - ``seq-mean-token-sum`` and ``seq-mean-token-mean``: the number of
      sequences with at least one valid token;
    - ``seq-mean-token-sum-norm``: the number of rows B, a fully masked row
      included, times the horizon L (``horizon``, default the time
      dimension): Dr. GRPO's constant B · L, the sampled responses times the
      generation budget, which depends on neither their lengths nor the padding.

    Every normaliser but ``token-sum``'s is a count, so it is additive over
    any split of the rows: the normaliser of a global batch is the sum of its
    micro-batches' (an all-reduce with SUM across data-parallel ranks).
    ``token-sum``'s is the constant 1 for a batch and for every part of it:
    use it as it is, never summed.
    """
    _check_mode(mode)
    mask = as_bool_mask(mask)
    dtype = torch.get_default_dtype()
    if mode == "token-mean":
        return mask.sum().to(dtype)
    if mode == "token-sum":
        return torch.ones((), dtype=dtype, device=mask.device)
    if mode == "seq-mean-token-sum-norm":
        length = mask.shape[-1] if horizon is None else horizon
        if length <= 0:
            raise ValueError(f"horizon must be positive, got {length}")
        return torch.tensor(float(mask.shape[0] * length), dtype=dtype, device=mask.device)
    return mask.any(dim=-1).sum().to(dtype)


@typecheck
def aggregate(
    values: Float[Tensor, "batch time"],
    mask: Mask[Tensor, "batch time"],
    mode: AggregationMode = "token-mean",
    normalizer: float | Float[Tensor, ""] | None = None,
    horizon: int | None = None,
) -> Float[Tensor, ""]:
    """Reduce per-token losses ``ℓ[b, t]`` to one scalar.

    With mᵢₜ the mask, nᵢ = Σₜ mᵢₜ, B the number of rows and Z the normaliser:

    - ``token-mean``:               Σᵢ Σₜ mᵢₜ ℓᵢₜ / Z,        Z = Σᵢ nᵢ   (DAPO; verl default)
    - ``token-sum``:                Σᵢ Σₜ mᵢₜ ℓᵢₜ / Z,        Z = 1
    - ``seq-mean-token-sum``:       Σᵢ Σₜ mᵢₜ ℓᵢₜ / Z,        Z = #sequences
    - ``seq-mean-token-mean``:      Σᵢ (Σₜ mᵢₜ ℓᵢₜ / nᵢ) / Z, Z = #sequences (GRPO paper)
    - ``seq-mean-token-sum-norm``:  Σᵢ Σₜ mᵢₜ ℓᵢₜ / Z,        Z = B · L (Dr. GRPO)

    #sequences counts the rows with a valid token. ``seq-mean-token-sum-norm``
    divides by a constant in which every row counts (Dr. GRPO, arXiv:2503.20783;
    TRL's ``dr_grpo``: batch size × ``max_completion_length``), so no token's
    weight depends on the lengths in its batch. verl 0.9.1's mode of the same
    name divides by the rows with a valid token times L: the same value
    unless a row is fully masked.

    The numerator is a sum over rows, so when ``normalizer`` is the global
    batch's (see `aggregation_normalizer`), summing the results of any split
    of the batch into micro-batches or ranks gives exactly the whole batch's
    result. Left as None, the normaliser of this batch is used. A zero
    normaliser (no valid token, or no row) gives 0.
    """
    _check_mode(mode)
    mask = as_bool_mask(mask)
    token_sums = torch.where(mask, values, 0.0).sum(dim=-1)
    if mode == "seq-mean-token-mean":
        numerator = (token_sums / mask.sum(dim=-1).clamp(min=1)).sum()
    else:
        numerator = token_sums.sum()
    if normalizer is None:
        normalizer = aggregation_normalizer(mask, mode, horizon)
    denominator = torch.as_tensor(normalizer, dtype=values.dtype, device=values.device)
    return numerator / denominator.clamp(min=torch.finfo(values.dtype).tiny)

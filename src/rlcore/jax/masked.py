"""JAX twins of `rlcore.masked`: reductions over valid positions, loss aggregation.

Same names, arguments and semantics as the torch functions (see their
docstrings for the full story). Masked positions are replaced by zero with
``jnp.where`` before reducing, so NaN or inf in padding never reaches a result
or a gradient. Static under `jax.jit`: ``axis``, ``unbiased``, ``shift_mean``,
``eps``, ``mode``, ``horizon`` (`rlcore.jax.jit` marks them).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import Float

from rlcore.jax._checking import as_bool_mask, typecheck
from rlcore.masked import AggregationMode, _check_mode
from rlcore.types import Mask

__all__ = [
    "AggregationMode",
    "aggregate",
    "aggregation_normalizer",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]


def _dims(axis: int | tuple[int, ...] | None, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    return (axis,) if isinstance(axis, int) else tuple(axis)


def _default_float() -> jnp.dtype:
    """JAX's default float: float32, float64 with ``jax_enable_x64`` (torch's default dtype)."""
    return jnp.result_type(float)


@typecheck
def masked_sum(
    values: Float[Array, "*shape"],
    mask: Mask[Array, "*shape"],
    axis: int | tuple[int, ...] | None = None,
) -> Float[Array, "..."]:
    """Σᵢ mᵢ xᵢ over ``axis`` (all axes when None)."""
    mask = as_bool_mask(mask)
    return jnp.where(mask, values, 0.0).sum(axis=_dims(axis, values.ndim))


@typecheck
def masked_mean(
    values: Float[Array, "*shape"],
    mask: Mask[Array, "*shape"],
    axis: int | tuple[int, ...] | None = None,
) -> Float[Array, "..."]:
    """Σᵢ mᵢ xᵢ / max(Σᵢ mᵢ, 1); a slice with no valid entry has mean 0."""
    mask = as_bool_mask(mask)
    dims = _dims(axis, values.ndim)
    total = jnp.where(mask, values, 0.0).sum(axis=dims)
    count = jnp.maximum(mask.sum(axis=dims), 1)
    return total / count.astype(values.dtype)


@typecheck
def masked_var(
    values: Float[Array, "*shape"],
    mask: Mask[Array, "*shape"],
    unbiased: bool = True,
) -> Float[Array, ""]:
    """Variance of all valid entries; 0 with too few of them to measure a spread.

    μ = Σ m x / n,   σ² = Σ m (x − μ)² / (n − 1)   (n when ``unbiased=False``)
    """
    mask = as_bool_mask(mask)
    values = jnp.where(mask, values, 0.0)
    count = mask.sum()
    mean = values.sum() / jnp.maximum(count, 1).astype(values.dtype)
    squares = jnp.where(mask, (values - mean) ** 2, 0.0).sum()
    denominator = count - 1 if unbiased else count
    return squares / jnp.maximum(denominator, 1).astype(values.dtype) * (denominator > 0)


@typecheck
def masked_whiten(
    values: Float[Array, "*shape"],
    mask: Mask[Array, "*shape"],
    shift_mean: bool = True,
    eps: float = 1e-8,
) -> Float[Array, "*shape"]:
    """(x − μ) / √(σ² + ε) over the valid entries (+ μ when ``shift_mean=False``), 0 elsewhere."""
    mask = as_bool_mask(mask)
    values = jnp.where(mask, values, 0.0)
    mean = masked_mean(values, mask)
    variance = masked_var(values, mask)
    whitened = (values - mean) * jax.lax.rsqrt(variance + eps)
    if not shift_mean:
        whitened = whitened + mean
    return jnp.where(mask, whitened, 0.0)


@typecheck
def aggregation_normalizer(
    mask: Mask[Array, "batch time"],
    mode: AggregationMode,
    horizon: int | None = None,
) -> Float[Array, ""]:
    """What `aggregate` divides by: valid tokens (``token-mean``), 1 (``token-sum``),
    sequences with a valid token (``seq-mean-token-sum``, ``seq-mean-token-mean``), every
    row times the horizon L (``seq-mean-token-sum-norm``, Dr. GRPO's constant B · L).

    Additive over any split of the rows, but ``token-sum``'s constant 1; returned in
    JAX's default float dtype.
    """
    _check_mode(mode)
    mask = as_bool_mask(mask)
    if mode == "token-mean":
        return mask.sum().astype(_default_float())
    if mode == "token-sum":
        return jnp.ones((), dtype=_default_float())
    if mode == "seq-mean-token-sum-norm":
        length = mask.shape[-1] if horizon is None else horizon
        if length <= 0:
            raise ValueError(f"horizon must be positive, got {length}")
        return jnp.asarray(float(mask.shape[0] * length), dtype=_default_float())
    return mask.any(axis=-1).sum().astype(_default_float())


@typecheck
def aggregate(
    values: Float[Array, "batch time"],
    mask: Mask[Array, "batch time"],
    mode: AggregationMode = "token-mean",
    normalizer: float | Float[Array, ""] | None = None,
    horizon: int | None = None,
) -> Float[Array, ""]:
    """Reduce per-token losses ℓ[b, t] to one scalar, Σᵢ Σₜ mᵢₜ ℓᵢₜ / Z (per-sequence
    means first for ``seq-mean-token-mean``), Z from `aggregation_normalizer` unless given.

    A zero normaliser gives 0. See `rlcore.masked.aggregate` for the modes' sources.
    """
    _check_mode(mode)
    mask = as_bool_mask(mask)
    token_sums = jnp.where(mask, values, 0.0).sum(axis=-1)
    if mode == "seq-mean-token-mean":
        lengths = jnp.maximum(mask.sum(axis=-1), 1).astype(values.dtype)
        numerator = (token_sums / lengths).sum()
    else:
        numerator = token_sums.sum()
    if normalizer is None:
        normalizer = aggregation_normalizer(mask, mode, horizon)
    denominator = jnp.asarray(normalizer, dtype=values.dtype)
    return numerator / jnp.maximum(denominator, float(np.finfo(values.dtype).tiny))

"""JAX twin of `rlcore.normalize`: running mean and variance as pure state.

The state holds the count n, the mean μ and M₂ = Σ (x − μ)² per feature;
`merge` combines two disjoint sample sets exactly (Chan, Golub & LeVeque 1979):

    n = n_a + n_b,  δ = μ_b − μ_a,  μ = μ_a + δ n_b / n,  M₂ = M₂,a + M₂,b + δ² n_a n_b / n

`RunningStats` is a pytree, so the state passes through jitted functions.
Static under `jax.jit`: ``unbiased``, ``eps``, ``clip``.
"""

from __future__ import annotations

import attrs
import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import DTypeLike
from jaxtyping import Float, TypeCheckError

from rlcore.jax._checking import typecheck
from rlcore.jax.types import register_pytree

__all__ = ["RunningStats", "init", "merge", "normalize", "std", "update", "variance"]


@register_pytree
@attrs.frozen(eq=False)
class RunningStats:
    """Count, mean and sum of squared deviations of the samples seen so far."""

    count: Float[Array, ""]
    mean: Float[Array, "*feature"]
    m2: Float[Array, "*feature"]


def init(
    shape: tuple[int, ...] = (),
    dtype: DTypeLike | None = None,
    device: jax.Device | None = None,
) -> RunningStats:
    """Statistics of no samples: n = 0, μ = 0, M₂ = 0, per feature of ``shape``.

    ``dtype`` defaults to float64, which JAX gives only with ``jax_enable_x64``
    (float32 otherwise); ``device`` places the state (default device when None).
    """
    dtype = jax.dtypes.canonicalize_dtype(jnp.float64 if dtype is None else dtype)
    state = RunningStats(
        jnp.zeros((), dtype=dtype), jnp.zeros(shape, dtype=dtype), jnp.zeros(shape, dtype=dtype)
    )
    return state if device is None else jax.device_put(state, device)


@typecheck
def merge(a: RunningStats, b: RunningStats) -> RunningStats:
    """Statistics of the union of two disjoint sample sets (exact, order-free)."""
    if a.mean.shape != b.mean.shape:
        raise TypeCheckError(
            f"rlcore.jax.normalize.merge: argument 'b' tracks feature shape {tuple(b.mean.shape)} "
            f"but 'a' tracks {tuple(a.mean.shape)}"
        )
    count = a.count + b.count
    safe = jnp.maximum(count, 1)
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.count / safe)
    m2 = a.m2 + b.m2 + delta**2 * (a.count * b.count / safe)
    return RunningStats(count, mean, m2)


@typecheck
def update(state: RunningStats, batch: Float[Array, "samples *feature"]) -> RunningStats:
    """Fold a batch of samples (leading axis) into ``state``."""
    if tuple(batch.shape[1:]) != tuple(state.mean.shape):
        raise TypeCheckError(
            f"rlcore.jax.normalize.update: argument 'batch' has shape {tuple(batch.shape)}: "
            f"feature dimensions {tuple(batch.shape[1:])} after 'samples' but 'state' "
            f"tracks {tuple(state.mean.shape)}"
        )
    if batch.shape[0] == 0:
        return state
    samples = batch.astype(state.mean.dtype)
    count = jnp.asarray(float(samples.shape[0]), dtype=state.count.dtype)
    mean = samples.mean(axis=0)
    m2 = ((samples - mean) ** 2).sum(axis=0)
    return merge(state, RunningStats(count, mean, m2))


@typecheck
def variance(state: RunningStats, unbiased: bool = False) -> Float[Array, "*feature"]:
    """σ² = M₂ / n (M₂ / (n − 1) when ``unbiased``); 0 before enough samples."""
    denominator = state.count - 1 if unbiased else state.count
    return state.m2 / jnp.maximum(denominator, 1) * (denominator > 0)


@typecheck
def std(state: RunningStats, unbiased: bool = False) -> Float[Array, "*feature"]:
    """σ = √σ²."""
    return jnp.sqrt(variance(state, unbiased))


@typecheck
def normalize(
    state: RunningStats,
    x: Float[Array, "*batch"],
    eps: float = 1e-8,
    clip: float | None = None,
) -> Float[Array, "*batch"]:
    """(x − μ) / √(σ² + ε), optionally clipped to ±clip; keeps ``x``'s dtype."""
    feature_ndim = state.mean.ndim
    trailing = tuple(x.shape[max(x.ndim - feature_ndim, 0) :])
    if x.ndim < feature_ndim or trailing != tuple(state.mean.shape):
        raise TypeCheckError(
            f"rlcore.jax.normalize.normalize: argument 'x' has shape {tuple(x.shape)}: "
            f"trailing dimensions {trailing} but 'state' tracks {tuple(state.mean.shape)}"
        )
    if clip is not None and not clip > 0:
        raise ValueError(f"clip must be positive (or None), got {clip}")
    scaled = (x - state.mean) / jnp.sqrt(variance(state) + eps)
    if clip is not None:
        scaled = jnp.clip(scaled, -clip, clip)
    return scaled.astype(x.dtype)

"""Running mean and variance as pure state, with an exact parallel merge.

The state holds the count n, the mean μ and M₂ = Σ (x − μ)² of every sample
seen (per feature). `update` folds in a batch and `merge` combines the states
of two disjoint sample sets exactly (Chan, Golub & LeVeque 1979):

    n = n_a + n_b,   δ = μ_b − μ_a
    μ = μ_a + δ · n_b / n
    M₂ = M₂,a + M₂,b + δ² · n_a n_b / n

so statistics gathered by separate env workers or ranks combine into the
statistics of the union, whatever the order (use float64 state: the default).
Nothing is mutated; every function returns a new `RunningStats`.
"""

from __future__ import annotations

import attrs
import torch
from jaxtyping import Float, TypeCheckError
from torch import Tensor

from rlcore._checking import typecheck

__all__ = ["RunningStats", "init", "merge", "normalize", "std", "update", "variance"]


@attrs.frozen(eq=False)
class RunningStats:
    """Count, mean and sum of squared deviations of the samples seen so far."""

    count: Float[Tensor, ""]
    mean: Float[Tensor, "*feature"]
    m2: Float[Tensor, "*feature"]


@typecheck
def init(
    shape: tuple[int, ...] = (),
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> RunningStats:
    """Statistics of no samples: n = 0, μ = 0, M₂ = 0, per feature of ``shape``."""
    zeros = torch.zeros(shape, dtype=dtype, device=device)
    return RunningStats(torch.zeros((), dtype=dtype, device=device), zeros, zeros.clone())


@typecheck
def merge(a: RunningStats, b: RunningStats) -> RunningStats:
    """Statistics of the union of two disjoint sample sets (exact, order-free)."""
    if a.mean.shape != b.mean.shape:
        raise TypeCheckError(
            f"rlcore.normalize.merge: argument 'b' tracks feature shape {tuple(b.mean.shape)} "
            f"but 'a' tracks {tuple(a.mean.shape)}"
        )
    count = a.count + b.count
    safe = count.clamp(min=1)
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.count / safe)
    m2 = a.m2 + b.m2 + delta.square() * (a.count * b.count / safe)
    return RunningStats(count, mean, m2)


@typecheck
def update(state: RunningStats, batch: Float[Tensor, "samples *feature"]) -> RunningStats:
    """Fold a batch of samples (leading axis) into ``state``."""
    if tuple(batch.shape[1:]) != tuple(state.mean.shape):
        raise TypeCheckError(
            f"rlcore.normalize.update: argument 'batch' has shape {tuple(batch.shape)}: "
            f"feature dimensions {tuple(batch.shape[1:])} after 'samples' but 'state' "
            f"tracks {tuple(state.mean.shape)}"
        )
    if batch.shape[0] == 0:
        return state
    samples = batch.to(state.mean.dtype)
    count = torch.tensor(float(samples.shape[0]), dtype=state.count.dtype, device=samples.device)
    mean = samples.mean(dim=0)
    m2 = (samples - mean).square().sum(dim=0)
    return merge(state, RunningStats(count, mean, m2))


@typecheck
def variance(state: RunningStats, unbiased: bool = False) -> Float[Tensor, "*feature"]:
    """σ² = M₂ / n (M₂ / (n − 1) when ``unbiased``); 0 before enough samples."""
    denominator = state.count - 1 if unbiased else state.count
    return state.m2 / denominator.clamp(min=1) * (denominator > 0)


@typecheck
def std(state: RunningStats, unbiased: bool = False) -> Float[Tensor, "*feature"]:
    """σ = √σ²."""
    return variance(state, unbiased).sqrt()


@typecheck
def normalize(
    state: RunningStats,
    x: Float[Tensor, "*batch"],
    eps: float = 1e-8,
    clip: float | None = None,
) -> Float[Tensor, "*batch"]:
    """(x − μ) / √(σ² + ε), optionally clipped to ±clip (observation normalisation).

    The trailing axes of ``x`` must match the feature shape; the result keeps
    ``x``'s dtype.
    """
    feature_ndim = state.mean.ndim
    trailing = tuple(x.shape[max(x.ndim - feature_ndim, 0) :])
    if x.ndim < feature_ndim or trailing != tuple(state.mean.shape):
        raise TypeCheckError(
            f"rlcore.normalize.normalize: argument 'x' has shape {tuple(x.shape)}: "
            f"trailing dimensions {trailing} but 'state' tracks {tuple(state.mean.shape)}"
        )
    if clip is not None and not clip > 0:
        raise ValueError(f"clip must be positive (or None), got {clip}")
    scaled = (x - state.mean) / torch.sqrt(variance(state) + eps)
    if clip is not None:
        scaled = scaled.clamp(-clip, clip)
    return scaled.to(x.dtype)

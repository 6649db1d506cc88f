"""The reverse linear recurrence yₜ = xₜ + dₜ · yₜ₊₁ as a parallel (associative) scan.

Each step is the affine map y ↦ xₜ + dₜ y; composing two maps is again one,

    (d_early, x_early) ∘ (d_late, x_late) = (d_early · d_late, x_early + d_early · x_late),

and composition is associative, so `jax.lax.associative_scan` evaluates all
T suffix compositions in O(log T) depth. With 0 entering after the last
step, yₜ is the x-part of the composition of steps t … T − 1. The torch twin
(`rlcore._scan`) solves the same recurrence with a chunked in-place solver.
"""

from __future__ import annotations

from typing import cast

import jax
import jax.numpy as jnp
from jax import Array


def _compose(late: tuple[Array, Array], early: tuple[Array, Array]) -> tuple[Array, Array]:
    late_decay, late_x = late
    early_decay, early_x = early
    return early_decay * late_decay, early_x + early_decay * late_x


def reverse_linear_recurrence(x: Array, decay: Array) -> Array:
    """Solve yₜ = xₜ + decayₜ · yₜ₊₁ along the last axis, y after the last step = 0."""
    return cast(Array, _solve(x, decay))


# Jitted on its own so that eager callers compile the O(log T) slicing program once
# per shape rather than dispatching (and compiling) its dozens of ops one by one;
# inside a caller's jit it is inlined.
@jax.jit
def _solve(x: Array, decay: Array) -> Array:
    shape = jnp.broadcast_shapes(x.shape, decay.shape)
    dtype = jnp.result_type(x, decay)
    x = jnp.broadcast_to(x, shape).astype(dtype)
    if shape[-1] == 0:
        return x
    decay = jnp.broadcast_to(decay, shape).astype(dtype)
    _, y = jax.lax.associative_scan(_compose, (decay, x), reverse=True, axis=x.ndim - 1)
    return cast(Array, y)

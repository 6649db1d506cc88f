"""JAX twins of `rlcore.distributions`: categorical, Gaussian, tanh-Gaussian, flow chains.

    log π(a) = zₐ − log Σᵥ exp zᵥ,                     H = −Σᵥ π(v) log π(v)
    log N(x; μ, σ²) = Σᵢ −(xᵢ − μᵢ)²/(2σᵢ²) − log σᵢ − ½ log 2π,   H = Σᵢ ½ log(2πe σᵢ²)
    log π(tanh u) = log N(u; μ, σ²) − Σᵢ 2 (log 2 − uᵢ − softplus(−2uᵢ))

Same names, arguments, defaults and formulas as the torch functions, computed
in at least float32. The samplers take a JAX key where the torch ones take an
optional ``generator``: ``categorical_sample(logits, key)`` runs the same
exponential race, argmaxᵥ πᵥ / Eᵥ with Eᵥ ~ Exp(1), and ``gaussian_sample(mean,
log_std, key)`` draws μ + σ ε; the draws follow the same distributions, not
the same numbers (the two frameworks' generators differ). Nothing is static
under `jax.jit`. Actions outside [0, actions) raise `ValueError` when concrete
(and ``RLCORE_TYPECHECK`` is on), as torch's gather raises; under jit their
log-probability is NaN.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import Float, Int, PRNGKeyArray

from rlcore._checking import typecheck_enabled
from rlcore.jax._checking import is_concrete, typecheck

__all__ = [
    "categorical_entropy",
    "categorical_log_prob",
    "categorical_sample",
    "flow_euler_step",
    "flow_interpolate",
    "flow_matching_loss",
    "flow_sde_sigma",
    "flow_sde_step",
    "flow_step_log_prob",
    "gaussian_entropy",
    "gaussian_log_prob",
    "gaussian_sample",
    "tanh_gaussian_log_prob",
]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


def _at_least_float32(x: Array) -> Array:
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


@typecheck
def categorical_log_prob(
    logits: Float[Array, "*batch actions"], actions: Int[Array, "*batch"]
) -> Float[Array, "*batch"]:
    """log π(a) = zₐ − log Σᵥ exp zᵥ; NaN under jit for an action outside [0, actions)."""
    count = logits.shape[-1]
    if typecheck_enabled() and is_concrete(actions) and actions.size > 0:
        low, high = int(actions.min()), int(actions.max())
        if low < 0 or high >= count:
            raise ValueError(
                f"actions: indices must lie in [0, {count}) (the logits' last axis), "
                f"got [{low}, {high}]"
            )
    log_probs = jax.nn.log_softmax(_at_least_float32(logits), axis=-1)
    inside = (actions >= 0) & (actions < count)
    picked = jnp.take_along_axis(log_probs, jnp.where(inside, actions, 0)[..., None], axis=-1)
    return jnp.where(inside, picked[..., 0], jnp.nan)


@typecheck
def categorical_entropy(logits: Float[Array, "*batch actions"]) -> Float[Array, "*batch"]:
    """H[π] = −Σᵥ π(v) log π(v)."""
    log_probs = jax.nn.log_softmax(_at_least_float32(logits), axis=-1)
    return -(jnp.exp(log_probs) * log_probs).sum(axis=-1)


@typecheck
def categorical_sample(
    logits: Float[Array, "*batch actions"], key: PRNGKeyArray
) -> Int[Array, "*batch"]:
    """a = argmaxᵥ πᵥ / Eᵥ, Eᵥ ~ Exp(1) i.i.d. (the exponential race: P(a = v) = πᵥ)."""
    probs = jax.nn.softmax(_at_least_float32(logits), axis=-1)
    return jnp.argmax(probs / jax.random.exponential(key, probs.shape, probs.dtype), axis=-1)


def _gaussian_log_prob(x: Array, mean: Array, log_std: Array) -> Array:
    x, mean, log_std = (_at_least_float32(t) for t in (x, mean, log_std))
    z = (x - mean) * jnp.exp(-log_std)
    return (-0.5 * jnp.square(z) - log_std - _HALF_LOG_2PI).sum(axis=-1)


@typecheck
def gaussian_log_prob(
    x: Float[Array, "*batch dim"],
    mean: Float[Array, "*batch dim"],
    log_std: Float[Array, "*#batch dim"],
) -> Float[Array, "*batch"]:
    """log N(x; μ, diag σ²) = Σᵢ −(xᵢ − μᵢ)²/(2σᵢ²) − log σᵢ − ½ log 2π."""
    return _gaussian_log_prob(x, mean, log_std)


@typecheck
def gaussian_entropy(log_std: Float[Array, "*batch dim"]) -> Float[Array, "*batch"]:
    """H[N(μ, diag σ²)] = Σᵢ ½ + ½ log 2π + log σᵢ."""
    return (0.5 + _HALF_LOG_2PI + _at_least_float32(log_std)).sum(axis=-1)


@typecheck
def gaussian_sample(
    mean: Float[Array, "*batch dim"],
    log_std: Float[Array, "*#batch dim"],
    key: PRNGKeyArray,
) -> Float[Array, "*batch dim"]:
    """u = μ + σ ⊙ ε, ε ~ N(0, I) drawn with ``key`` in ``mean``'s dtype; reparameterised."""
    return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)


@typecheck
def tanh_gaussian_log_prob(
    u: Float[Array, "*batch dim"],
    mean: Float[Array, "*batch dim"],
    log_std: Float[Array, "*#batch dim"],
) -> Float[Array, "*batch"]:
    """log π(tanh u) = log N(u; μ, σ²) − Σᵢ 2 (log 2 − uᵢ − softplus(−2uᵢ)), finite for any u."""
    u32 = _at_least_float32(u)
    log_det = 2.0 * (_LOG_2 - u32 - jax.nn.softplus(-2.0 * u32))
    return _gaussian_log_prob(u32, mean, log_std) - log_det.sum(axis=-1)


# Flow-matching action chains: x_t = t·ε + (1 − t)·a, v = ε − a (π0's convention).


@typecheck
def flow_interpolate(
    actions: Float[Array, "*batch horizon dim"],
    noise: Float[Array, "*batch horizon dim"],
    t: Float[Array, "*batch"],
) -> Float[Array, "*batch horizon dim"]:
    """x_t = t·ε + (1 − t)·a."""
    t = t[..., None, None]
    return t * noise + (1.0 - t) * actions


@typecheck
def flow_matching_loss(
    velocity: Float[Array, "*batch horizon dim"],
    noise: Float[Array, "*batch horizon dim"],
    actions: Float[Array, "*batch horizon dim"],
) -> Float[Array, ""]:
    """mean ‖v_θ(x_t, t) − (ε − a)‖² over every element."""
    target = _at_least_float32(noise) - _at_least_float32(actions)
    return jnp.square(_at_least_float32(velocity) - target).mean()


@typecheck
def flow_euler_step(
    x: Float[Array, "*batch horizon dim"],
    velocity: Float[Array, "*batch horizon dim"],
    delta: Float[Array, "*batch"],
) -> Float[Array, "*batch horizon dim"]:
    """x_{t−δ} = x_t − δ·v."""
    return x - delta[..., None, None] * velocity


@typecheck
def flow_sde_sigma(
    t: Float[Array, "*batch"], delta: Float[Array, "*batch"], noise_level: float
) -> Float[Array, "*batch"]:
    """σ_t = a·√(t / max(1 − t, δ))."""
    return noise_level * jnp.sqrt(t / jnp.maximum(1.0 - t, delta))


@typecheck
def flow_sde_step(
    x: Float[Array, "*batch horizon dim"],
    velocity: Float[Array, "*batch horizon dim"],
    t: Float[Array, "*batch"],
    delta: Float[Array, "*batch"],
    noise_level: float,
) -> tuple[Float[Array, "*batch horizon dim"], Float[Array, "*batch"]]:
    """(μ, log σ_step): μ = x − δv − (σ_t²δ/2t)(x + (1 − t)v), σ_step = σ_t √δ."""
    sigma = flow_sde_sigma(t, delta, noise_level)
    t_, d_, s_ = t[..., None, None], delta[..., None, None], sigma[..., None, None]
    mean = x - d_ * velocity - (jnp.square(s_) * d_ / (2.0 * t_)) * (x + (1.0 - t_) * velocity)
    return mean, jnp.log(sigma) + 0.5 * jnp.log(delta)


@typecheck
def flow_step_log_prob(
    x_next: Float[Array, "*batch horizon dim"],
    mean: Float[Array, "*batch horizon dim"],
    log_std: Float[Array, "*#batch #horizon #dim"],
) -> Float[Array, "*batch"]:
    """Σ_{h,d} log N(x_{t−δ}; μ, σ²) over the chunk."""
    shape = (*mean.shape[:-2], -1)
    log_std = jnp.broadcast_to(log_std, mean.shape)
    return _gaussian_log_prob(x_next.reshape(shape), mean.reshape(shape), log_std.reshape(shape))

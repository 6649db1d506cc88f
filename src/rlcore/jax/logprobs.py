"""JAX twins of `rlcore.logprobs`: per-token log-probabilities and entropies.

For logits zₜ ∈ ℝⱽ at temperature τ and sampled token yₜ:

    log πₜ(yₜ) = zₜ[yₜ]/τ − log Σᵥ exp(zₜ[v]/τ),    Hₜ = − Σᵥ πₜ(v) log πₜ(v)

computed in at least float32. Same names, arguments and defaults as the torch
functions. With ``chunk_size`` the rows are processed ``chunk_size`` at a time
by `jax.lax.map` over a `jax.checkpoint` ed function, so the softmax buffers
(and, for the ``*_from_hidden`` functions, the logits themselves) exist for
one chunk at a time, forward and backward (recomputed in the backward pass).
The torch twin hand-writes that backward pass; here autodiff derives it.

Static under `jax.jit` (`rlcore.jax.jit` marks them): ``temperature`` and
``chunk_size``. Token ids are range-checked when concrete (and
``RLCORE_TYPECHECK`` is on); under jit an id outside [0, vocab) gives NaN.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import attrs
import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import Float, Int

from rlcore._checking import typecheck_enabled
from rlcore.jax._checking import is_concrete, typecheck
from rlcore.jax.types import register_pytree

__all__ = [
    "TokenStats",
    "entropy_from_hidden",
    "entropy_from_logits",
    "token_logprobs",
    "token_logprobs_from_hidden",
    "token_stats",
    "token_stats_from_hidden",
]


@register_pytree
@attrs.frozen(eq=False)
class TokenStats:
    """Log-probability of the taken token and the policy's entropy, per token."""

    logprobs: Float[Array, "*batch time"]
    entropy: Float[Array, "*batch time"]


def _compute_dtype(dtype: jnp.dtype) -> jnp.dtype:
    # Half-precision logits are upcast: a log-softmax in bf16 loses ~3 digits.
    return jnp.promote_types(dtype, jnp.float32)


def _validate(tokens: Array, vocab: int, temperature: float, chunk_size: int | None) -> None:
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive number of rows, got {chunk_size}")
    if typecheck_enabled() and is_concrete(tokens) and tokens.size > 0:
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab:
            raise ValueError(
                f"tokens: ids must lie in [0, {vocab}) (the vocabulary), got [{low}, {high}]"
            )


def _row_stats(z: Array, tokens: Array) -> tuple[Array, Array]:
    """(log π(y), H) of rows of scaled logits ``z`` (compute dtype); NaN for an id out of range."""
    log_softmax = jax.nn.log_softmax(z, axis=-1)
    vocab = z.shape[-1]
    inside = (tokens >= 0) & (tokens < vocab)
    picked = jnp.take_along_axis(log_softmax, jnp.where(inside, tokens, 0)[..., None], axis=-1)
    logprobs = jnp.where(inside, picked[..., 0], jnp.nan)
    entropy = -(jnp.exp(log_softmax) * log_softmax).sum(axis=-1)
    return logprobs, entropy


def _by_chunks(
    fn: Callable[[Array, Array], tuple[Array, Array]],
    rows: Array,
    tokens: Array,
    chunk_size: int,
) -> tuple[Array, Array]:
    """``fn`` over ``[N, ...]`` rows ``chunk_size`` at a time, each chunk recomputed backward."""
    count = rows.shape[0]
    body = count - count % chunk_size
    checkpointed = jax.checkpoint(fn)
    parts: list[tuple[Array, Array]] = []
    if body:
        chunks = rows[:body].reshape(body // chunk_size, chunk_size, *rows.shape[1:])
        chunk_tokens = tokens[:body].reshape(body // chunk_size, chunk_size)
        logprobs, entropy = jax.lax.map(lambda xs: checkpointed(*xs), (chunks, chunk_tokens))
        parts.append((logprobs.reshape(body), entropy.reshape(body)))
    if body < count:
        parts.append(checkpointed(rows[body:], tokens[body:]))
    if len(parts) == 1:
        return parts[0]
    return (
        jnp.concatenate([part[0] for part in parts]),
        jnp.concatenate([part[1] for part in parts]),
    )


def _scaled(z: Array, temperature: float) -> Array:
    z = z.astype(_compute_dtype(z.dtype))
    return z / temperature if temperature != 1.0 else z


# The kernels are jitted (inlined into a caller's jit): called eagerly, they compile
# once per shape and static arguments instead of tracing fresh chunk functions per call.
@functools.partial(jax.jit, static_argnames=("temperature", "chunk_size"))
def _logit_kernel(
    logits: Array, tokens: Array, temperature: float, chunk_size: int | None
) -> tuple[Array, Array]:
    def stats(rows: Array, row_tokens: Array) -> tuple[Array, Array]:
        return _row_stats(_scaled(rows, temperature), row_tokens)

    if chunk_size is None:
        return stats(logits, tokens)
    vocab = logits.shape[-1]
    logprobs, entropy = _by_chunks(stats, logits.reshape(-1, vocab), tokens.reshape(-1), chunk_size)
    return logprobs.reshape(tokens.shape), entropy.reshape(tokens.shape)


@functools.partial(jax.jit, static_argnames=("temperature", "chunk_size"))
def _hidden_kernel(
    hidden: Array, weight: Array, tokens: Array, temperature: float, chunk_size: int
) -> tuple[Array, Array]:
    def stats(rows: Array, row_tokens: Array) -> tuple[Array, Array]:
        return _row_stats(_scaled(rows @ weight.T, temperature), row_tokens)

    logprobs, entropy = _by_chunks(
        stats, hidden.reshape(-1, hidden.shape[-1]), tokens.reshape(-1), chunk_size
    )
    return logprobs.reshape(tokens.shape), entropy.reshape(tokens.shape)


def _logit_stats(
    logits: Array, tokens: Array, temperature: float, chunk_size: int | None
) -> tuple[Array, Array]:
    _validate(tokens, logits.shape[-1], temperature, chunk_size)
    result: tuple[Array, Array] = _logit_kernel(logits, tokens, temperature, chunk_size)
    return result


def _hidden_stats(
    hidden: Array, weight: Array, tokens: Array, temperature: float, chunk_size: int
) -> tuple[Array, Array]:
    _validate(tokens, weight.shape[0], temperature, chunk_size)
    if hidden.dtype != weight.dtype:
        raise TypeError(
            f"hidden ({hidden.dtype}) and lm_head_weight ({weight.dtype}) must share a dtype"
        )
    result: tuple[Array, Array] = _hidden_kernel(hidden, weight, tokens, temperature, chunk_size)
    return result


@typecheck
def token_logprobs(
    logits: Float[Array, "*batch time vocab"],
    tokens: Int[Array, "*batch time"],
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> Float[Array, "*batch time"]:
    """log π(yₜ) = zₜ[yₜ]/τ − logsumexp(zₜ/τ); ``logits[..., t, :]`` predicted ``tokens[..., t]``.

    The plain path (``chunk_size=None``) works on the whole ``[*batch, time, vocab]``.
    """
    return _logit_stats(logits, tokens, temperature, chunk_size)[0]


@typecheck
def entropy_from_logits(
    logits: Float[Array, "*batch time vocab"],
    chunk_size: int | None = None,
    temperature: float = 1.0,
) -> Float[Array, "*batch time"]:
    """Hₜ = logsumexp(zₜ/τ) − Σᵥ πₜ(v) zₜ[v]/τ, the entropy of each token's distribution."""
    tokens = jnp.zeros(logits.shape[:-1], dtype=jnp.int32)
    return _logit_stats(logits, tokens, temperature, chunk_size)[1]


@typecheck
def token_stats(
    logits: Float[Array, "*batch time vocab"],
    tokens: Int[Array, "*batch time"],
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> TokenStats:
    """`token_logprobs` and `entropy_from_logits` in one pass over the logits."""
    logprobs, entropy = _logit_stats(logits, tokens, temperature, chunk_size)
    return TokenStats(logprobs=logprobs, entropy=entropy)


@typecheck
def token_logprobs_from_hidden(
    hidden: Float[Array, "*batch time hidden"],
    lm_head_weight: Float[Array, "vocab hidden"],
    tokens: Int[Array, "*batch time"],
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> Float[Array, "*batch time"]:
    """log π(yₜ) with zₜ = W hₜ, holding at most ``chunk_size`` rows of logits at a time.

    ``lm_head_weight`` is the ``[vocab, hidden]`` output projection (no bias);
    gradients flow to ``hidden`` and the weight.
    """
    return _hidden_stats(hidden, lm_head_weight, tokens, temperature, chunk_size)[0]


@typecheck
def entropy_from_hidden(
    hidden: Float[Array, "*batch time hidden"],
    lm_head_weight: Float[Array, "vocab hidden"],
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> Float[Array, "*batch time"]:
    """Hₜ of πₜ = softmax(W hₜ / τ), without materialising the logits."""
    tokens = jnp.zeros(hidden.shape[:-1], dtype=jnp.int32)
    return _hidden_stats(hidden, lm_head_weight, tokens, temperature, chunk_size)[1]


@typecheck
def token_stats_from_hidden(
    hidden: Float[Array, "*batch time hidden"],
    lm_head_weight: Float[Array, "vocab hidden"],
    tokens: Int[Array, "*batch time"],
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> TokenStats:
    """`token_logprobs_from_hidden` and `entropy_from_hidden` sharing one matmul per chunk."""
    logprobs, entropy = _hidden_stats(hidden, lm_head_weight, tokens, temperature, chunk_size)
    return TokenStats(logprobs=logprobs, entropy=entropy)

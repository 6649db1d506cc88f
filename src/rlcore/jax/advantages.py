"""JAX twins of `rlcore.advantages`: advantage and return estimators.

Same names, arguments, defaults and semantics as the torch functions, whose
docstrings hold the derivations and references. Recursions are one reverse
linear recurrence yₜ = xₜ + dₜ yₜ₊₁ evaluated by `jax.lax.associative_scan`
(O(log T) depth, `rlcore.jax._scan`). Estimators produce constants: their
inputs pass through `jax.lax.stop_gradient`, as the torch ones run under
``torch.no_grad``.

Static under `jax.jit` (`rlcore.jax.jit` marks them): ``gamma``, ``lam``,
``eps``, ``std_normalize``, ``unbiased``; everything else may be traced.

The registry adapters of the torch module (``AdvantageBatch``,
``AdvantageConfig``, ``AdvantageEstimator``) have no twin here: the shell's
registry holds torch estimators only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import Float

from rlcore.advantages import _check_discount
from rlcore.jax._checking import as_bool_mask, typecheck
from rlcore.jax._scan import reverse_linear_recurrence
from rlcore.jax.masked import masked_whiten
from rlcore.jax.types import Advantages
from rlcore.types import Mask

__all__ = [
    "discounted_returns",
    "gae",
    "group_normalized",
    "on_policy_distillation",
    "reinforce_pp",
    "rloo",
    "token_gae",
]

_constant = jax.lax.stop_gradient


def _where_scalar(condition: Array, if_true: float, if_false: float, like: Array) -> Array:
    """``where`` of two Python scalars in ``like``'s dtype (no float32 rounding on the way)."""
    dtype = like.dtype
    return jnp.where(condition, jnp.asarray(if_true, dtype), jnp.asarray(if_false, dtype))


@typecheck
def gae(
    rewards: Float[Array, "*batch time"],
    values: Float[Array, "*batch time"],
    next_values: Float[Array, "*batch time"],
    terminated: Mask[Array, "*batch time"],
    truncated: Mask[Array, "*batch time"],
    gamma: float,
    lam: float,
) -> Advantages:
    """Generalized advantage estimation (Schulman et al. 2016), twin of `rlcore.advantages.gae`.

    δₜ = rₜ + γ (1 − termₜ) V'ₜ − Vₜ
    Aₜ = δₜ + γ λ (1 − termₜ)(1 − truncₜ) Aₜ₊₁,   A after the last step = 0
    returns Gₜ = Aₜ + Vₜ

    All arrays ``[*batch, time]``; ``next_values[t]`` is V(sₜ₊₁).
    """
    _check_discount(gamma, lam)
    rewards, values, next_values = _constant((rewards, values, next_values))
    terminated = as_bool_mask(terminated, "terminated")
    truncated = as_bool_mask(truncated, "truncated")
    delta = jnp.where(terminated, 0.0, next_values) * gamma + rewards - values
    decay = _where_scalar(terminated | truncated, 0.0, gamma * lam, like=delta)
    advantages = reverse_linear_recurrence(delta, decay)
    return Advantages(advantages=advantages, returns=advantages + values)


@typecheck
def token_gae(
    token_rewards: Float[Array, "batch time"],
    values: Float[Array, "batch time"],
    mask: Mask[Array, "batch time"],
    gamma: float = 1.0,
    lam: float = 1.0,
) -> Advantages:
    """GAE over the valid tokens of each row, passing over masked positions.

    With t' the next valid position after t (none: Vₜ' = 0, Aₜ' = 0):
    δₜ = rₜ + γ Vₜ' − Vₜ,   Aₜ = δₜ + γ λ Aₜ',   Gₜ = Aₜ + Vₜ   for valid t; 0 where masked.
    """
    _check_discount(gamma, lam)
    token_rewards, values = _constant((token_rewards, values))
    valid = as_bool_mask(mask)
    # Uₜ = Vₜ + λ Aₜ obeys Uₜ = (1 − λ) Vₜ + λ rₜ + γ λ Uₜ' (see the torch twin).
    carried = jnp.where(valid, values + lam * (token_rewards - values), 0.0)
    carried = reverse_linear_recurrence(carried, _where_scalar(valid, gamma * lam, 1.0, carried))
    advantages = token_rewards - values
    advantages = advantages.at[..., :-1].add(gamma * carried[..., 1:])
    advantages = jnp.where(valid, advantages, 0.0)
    returns = jnp.where(valid, advantages + values, 0.0)
    return Advantages(advantages=advantages, returns=returns)


@typecheck
def discounted_returns(
    rewards: Float[Array, "*batch time"],
    terminated: Mask[Array, "*batch time"],
    truncated: Mask[Array, "*batch time"],
    gamma: float,
    next_values: Float[Array, "*batch time"] | None = None,
) -> Float[Array, "*batch time"]:
    """Gₜ = rₜ + γ (1 − termₜ) · (V'ₜ if truncₜ or t is the last step, else Gₜ₊₁).

    Without ``next_values`` the bootstrap value is 0.
    """
    _check_discount(gamma, 1.0)
    rewards = _constant(rewards)
    terminated = as_bool_mask(terminated, "terminated")
    truncated = as_bool_mask(truncated, "truncated")
    last = jnp.zeros(truncated.shape, dtype=bool).at[..., -1:].set(True)
    bootstrap = (truncated | last) & ~terminated
    x = rewards
    if next_values is not None:
        x = rewards + gamma * (bootstrap.astype(rewards.dtype) * _constant(next_values))
    decay = _where_scalar(terminated | bootstrap, 0.0, gamma, like=rewards)
    return reverse_linear_recurrence(x, decay)


@typecheck
def group_normalized(
    scores: Float[Array, "groups group_size"],
    std_normalize: bool = True,
    eps: float = 1e-6,
    unbiased: bool = True,
) -> Float[Array, "groups group_size"]:
    """GRPO: Âᵢ = (sᵢ − mean(s)) / (std(s) + ε) per group (Dr. GRPO: sᵢ − mean(s)).

    A group of equal scores has advantage exactly 0.
    """
    _check_group_size(scores)
    scores = _constant(scores)
    centred = scores - scores.mean(axis=-1, keepdims=True)
    if std_normalize:
        std = scores.std(axis=-1, keepdims=True, ddof=1 if unbiased else 0)
        centred = centred / (std + eps)
    return jnp.where(_varies(scores), centred, 0.0)


@typecheck
def rloo(scores: Float[Array, "groups group_size"]) -> Float[Array, "groups group_size"]:
    """REINFORCE leave-one-out: Âᵢ = sᵢ − 1/(n−1) Σⱼ≠ᵢ sⱼ; 0 for a group of equal scores."""
    n = _check_group_size(scores)
    scores = _constant(scores)
    others = scores.sum(axis=-1, keepdims=True) - scores
    return jnp.where(_varies(scores), scores - others / (n - 1), 0.0)


@typecheck
def reinforce_pp(
    token_rewards: Float[Array, "batch time"],
    mask: Mask[Array, "batch time"],
    gamma: float = 1.0,
    baseline: Float[Array, "batch"] | None = None,
    eps: float = 1e-8,
) -> Advantages:
    """REINFORCE++: Gₜ = Σₖ≥ₜ γ^(k−t) rₖ over valid tokens, Âₜ = whiten(Gₜ − bᵢ) over the batch.

    The returns are Gₜ itself (0 where masked), without the baseline.
    """
    _check_discount(gamma, 1.0)
    token_rewards = _constant(token_rewards)
    valid = as_bool_mask(mask)
    returns = jnp.where(valid, token_rewards, 0.0)
    returns = reverse_linear_recurrence(returns, _where_scalar(valid, gamma, 1.0, like=returns))
    returns = jnp.where(valid, returns, 0.0)
    centred = returns if baseline is None else returns - _constant(baseline)[..., None]
    return Advantages(advantages=masked_whiten(centred, valid, eps=eps), returns=returns)


@typecheck
def on_policy_distillation(
    student_logprobs: Float[Array, "batch time"],
    teacher_logprobs: Float[Array, "batch time"],
    mask: Mask[Array, "batch time"] | None = None,
) -> Float[Array, "batch time"]:
    """Âₜ = log π_teacher(yₜ) − log π_student(yₜ), 0 where masked (the negative reverse KL)."""
    advantages = _constant(teacher_logprobs - student_logprobs)
    if mask is None:
        return advantages
    return jnp.where(as_bool_mask(mask), advantages, 0.0)


def _varies(scores: Array) -> Array:
    """Groups whose scores are not all equal, ``[groups, 1]`` (NaN counts as varying)."""
    return (scores != scores[..., :1]).any(axis=-1, keepdims=True)


def _check_group_size(scores: Array) -> int:
    size = int(scores.shape[-1])
    if size < 2:
        raise ValueError(
            f"scores has shape {tuple(scores.shape)}: a group needs at least 2 responses "
            "to form a baseline (group_size >= 2)"
        )
    return size

"""JAX twins of `rlcore.losses`: policy, value, KL, entropy, SFT and SAC losses.

Same names, arguments, defaults and semantics as the torch functions, whose
docstrings hold the derivations and references. Every loss returns a
`rlcore.jax.types.LossOutput` (a pytree: return it from a jitted function,
differentiate it with ``jax.grad(..., has_aux=True)`` on ``.loss``); metrics
carry no gradient. Gradients match torch's, including at the kinks: a clamp
passes the gradient at its bounds, a max of two equal branches splits it.

Static under `jax.jit` (`rlcore.jax.jit` marks them): ``clip_low``,
``clip_high``, ``dual_clip``, ``behavior_weight_cap``, ``agg``, ``clip``,
``huber_delta``, ``kind``, ``clamp``, ``gamma``, ``target_entropy``.
``normalizer``, ``alpha`` and the policy losses' per-token ``weights``
(ℓₜ ← sg[wₜ] ℓₜ, 0 at masked positions) may be traced arrays.

The registry adapters of the torch module (``PolicyLossBatch``,
``PolicyLossConfig``, ``PolicyLoss``) have no twin here: the shell's registry
holds torch losses only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import Float

from rlcore.jax._checking import as_bool_mask, typecheck
from rlcore.jax.masked import aggregate, masked_mean
from rlcore.jax.types import LossOutput
from rlcore.losses import _LOG_RATIO_BOUND, KLKind, _check_clip, _kl_base
from rlcore.masked import AggregationMode
from rlcore.types import Mask

__all__ = [
    "KLKind",
    "decoupled_ppo_policy_loss",
    "entropy_loss",
    "gspo_policy_loss",
    "kl_estimate",
    "ppo_policy_loss",
    "sac_actor_loss",
    "sac_critic_loss",
    "sac_critic_target",
    "sac_temperature_loss",
    "sft_loss",
    "value_loss",
    "vanilla_policy_loss",
]

Normalizer = float | Float[Array, ""] | None
Weights = Float[Array, "batch time"] | None

_detach = jax.lax.stop_gradient


def _clamp(x: Array, low: float | None, high: float | None) -> Array:
    """``torch.clamp``: the gradient passes where low ≤ x ≤ high, bounds included.

    (``jnp.clip`` would halve it at a bound, where ``max(x, low)`` ties.)
    """
    if low is not None:
        x = jnp.where(x < low, jnp.asarray(low, x.dtype), x)
    if high is not None:
        x = jnp.where(x > high, jnp.asarray(high, x.dtype), x)
    return x


def _clipped_surrogate(
    ratio: Array,
    advantages: Array,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
) -> tuple[Array, Array, Array]:
    """Per-token clipped loss, and where the clip and the dual clip were active."""
    unclipped = -advantages * ratio
    clipped = -advantages * _clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = jnp.maximum(unclipped, clipped)
    clip_active = clipped > unclipped
    if dual_clip is None:
        return loss, clip_active, jnp.zeros_like(clip_active)
    bound = -advantages * dual_clip
    dual_active = (advantages < 0) & (loss > bound)
    return jnp.where(dual_active, bound, loss), clip_active, dual_active


def _valid_only(valid: Array, *arrays: Array) -> tuple[Array, ...]:
    """Each array with masked positions set to 0, so no NaN reaches a gradient."""
    return tuple(jnp.where(valid, array, 0.0) for array in arrays)


def _weighted(token_loss: Array, weights: Array | None, valid: Array) -> Array:
    """ℓₜ ← sg[wₜ] ℓₜ, the weight 0 at masked positions (NaN there included)."""
    if weights is None:
        return token_loss
    return token_loss * jnp.where(valid, _detach(weights), 0.0)


def _fraction(flags: Array, valid: Array, like: Array) -> Array:
    """The share of valid positions where ``flags`` holds, in ``like``'s dtype."""
    return _detach(masked_mean(flags.astype(like.dtype), valid))


@typecheck
def ppo_policy_loss(
    logprobs: Float[Array, "batch time"],
    old_logprobs: Float[Array, "batch time"],
    advantages: Float[Array, "batch time"],
    mask: Mask[Array, "batch time"],
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    agg: AggregationMode = "token-mean",
    normalizer: Normalizer = None,
    weights: Weights = None,
) -> LossOutput:
    """PPO's clipped surrogate with clip-higher and dual clip (twin of the torch loss).

    ρₜ = exp(clamp(log π − log π_old, ±20))
    ℓₜ = max(−Âₜ ρₜ, −Âₜ clip(ρₜ, 1 − ε_low, 1 + ε_high))
    dual clip c > 1:  ℓₜ ← min(ℓₜ, −c Âₜ) where Âₜ < 0

    Arrays ``[batch, time]``; ``clip_high`` defaults to ``clip_low``. Metrics:
    ``clipfrac``, ``dual_clipfrac``, ``approx_kl``, ``ratio_mean``.
    """
    clip_high = clip_low if clip_high is None else clip_high
    _check_clip(clip_low, clip_high, dual_clip)
    valid = as_bool_mask(mask)
    logprobs, old_logprobs, advantages = _valid_only(valid, logprobs, old_logprobs, advantages)
    log_ratio = _clamp(logprobs - old_logprobs, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    ratio = jnp.exp(log_ratio)
    token_loss, clip_active, dual_active = _clipped_surrogate(
        ratio, advantages, clip_low, clip_high, dual_clip
    )
    loss = aggregate(_weighted(token_loss, weights, valid), valid, agg, normalizer)
    return LossOutput(
        loss,
        {
            "clipfrac": _fraction(clip_active, valid, token_loss),
            "dual_clipfrac": _fraction(dual_active, valid, token_loss),
            "approx_kl": _detach(masked_mean(-log_ratio, valid)),
            "ratio_mean": _detach(masked_mean(ratio, valid)),
        },
    )


@typecheck
def vanilla_policy_loss(
    logprobs: Float[Array, "batch time"],
    advantages: Float[Array, "batch time"],
    mask: Mask[Array, "batch time"],
    agg: AggregationMode = "token-mean",
    normalizer: Normalizer = None,
    weights: Weights = None,
) -> LossOutput:
    """REINFORCE: ℓₜ = −Âₜ log π(yₜ), arrays ``[batch, time]``."""
    valid = as_bool_mask(mask)
    logprobs, advantages = _valid_only(valid, logprobs, advantages)
    loss = aggregate(_weighted(-advantages * logprobs, weights, valid), valid, agg, normalizer)
    return LossOutput(loss, {})


@typecheck
def gspo_policy_loss(
    logprobs: Float[Array, "batch time"],
    old_logprobs: Float[Array, "batch time"],
    advantages: Float[Array, "batch time"],
    mask: Mask[Array, "batch time"],
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    agg: AggregationMode = "seq-mean-token-mean",
    normalizer: Normalizer = None,
    weights: Weights = None,
) -> LossOutput:
    """GSPO, GSPO-token form (Zheng et al. 2025):

    sᵢ = exp( (1/|yᵢ|) Σₜ mᵢₜ (log π − log π_old) ),   sᵢₜ = sg[sᵢ] · π(yᵢₜ) / sg[π(yᵢₜ)]
    ℓᵢₜ = max(−Âᵢₜ sᵢₜ, −Âᵢₜ clip(sᵢₜ, 1 − ε_low, 1 + ε_high))
    """
    _check_clip(clip_low, clip_high, None)
    valid = as_bool_mask(mask)
    logprobs, old_logprobs, advantages = _valid_only(valid, logprobs, old_logprobs, advantages)
    token_log_ratio = jnp.where(valid, logprobs - old_logprobs, 0.0)
    lengths = jnp.maximum(valid.sum(axis=-1), 1).astype(logprobs.dtype)
    sequence_log_ratio = token_log_ratio.sum(axis=-1) / lengths
    log_ratio = logprobs - _detach(logprobs) + _detach(sequence_log_ratio)[..., None]
    ratio = jnp.exp(_clamp(log_ratio, None, _LOG_RATIO_BOUND))
    token_loss, clip_active, _ = _clipped_surrogate(ratio, advantages, clip_low, clip_high, None)
    loss = aggregate(_weighted(token_loss, weights, valid), valid, agg, normalizer)
    return LossOutput(
        loss,
        {
            "clipfrac": _fraction(clip_active, valid, token_loss),
            "approx_kl": _detach(masked_mean(-token_log_ratio, valid)),
            "ratio_mean": _detach(masked_mean(ratio, valid)),
        },
    )


@typecheck
def decoupled_ppo_policy_loss(
    logprobs: Float[Array, "batch time"],
    proximal_logprobs: Float[Array, "batch time"],
    behavior_logprobs: Float[Array, "batch time"],
    advantages: Float[Array, "batch time"],
    mask: Mask[Array, "batch time"],
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    behavior_weight_cap: float | None = None,
    agg: AggregationMode = "token-mean",
    normalizer: Normalizer = None,
    weights: Weights = None,
) -> LossOutput:
    """Decoupled PPO for stale batches (Hilton et al. 2021; AReaL):

    wₜ = π_prox(yₜ) / μ(yₜ) (no gradient),   rₜ = π(yₜ) / π_prox(yₜ)
    ℓₜ = wₜ · max(−Âₜ rₜ, −Âₜ clip(rₜ, 1 − ε_low, 1 + ε_high)),  0 where wₜ > cap
    """
    clip_high = clip_low if clip_high is None else clip_high
    _check_clip(clip_low, clip_high, dual_clip)
    valid = as_bool_mask(mask)
    logprobs, proximal_logprobs, behavior_logprobs, advantages = _valid_only(
        valid, logprobs, proximal_logprobs, behavior_logprobs, advantages
    )
    behavior_log_weight = _detach(proximal_logprobs - behavior_logprobs)
    weight = jnp.exp(_clamp(behavior_log_weight, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND))
    capped = jnp.zeros_like(valid)
    if behavior_weight_cap is not None:
        capped = valid & (weight > behavior_weight_cap)
    kept = valid & ~capped
    log_ratio = _clamp(logprobs - proximal_logprobs, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    ratio = jnp.exp(log_ratio)
    token_loss, clip_active, dual_active = _clipped_surrogate(
        ratio, advantages, clip_low, clip_high, dual_clip
    )
    token_loss = _weighted(jnp.where(capped, 0.0, weight * token_loss), weights, valid)
    loss = aggregate(token_loss, valid, agg, normalizer)
    return LossOutput(
        loss,
        {
            "clipfrac": _fraction(clip_active, kept, token_loss),
            "dual_clipfrac": _fraction(dual_active, kept, token_loss),
            "approx_kl": _detach(masked_mean(-log_ratio, kept)),
            "ratio_mean": _detach(masked_mean(ratio, kept)),
            "behavior_weight_mean": _detach(masked_mean(weight, valid)),
            "behavior_capped_frac": _fraction(capped, valid, token_loss),
        },
    )


def _huber(residual: Array, delta: float) -> Array:
    """½ x² if |x| < δ, δ (|x| − ½ δ) otherwise (``torch.nn.functional.huber_loss``)."""
    size = jnp.abs(residual)
    return jnp.where(size < delta, 0.5 * residual**2, delta * (size - 0.5 * delta))


@typecheck
def value_loss(
    values: Float[Array, "batch time"],
    old_values: Float[Array, "batch time"],
    returns: Float[Array, "batch time"],
    mask: Mask[Array, "batch time"],
    clip: float | None = None,
    huber_delta: float | None = None,
    agg: AggregationMode = "token-mean",
    normalizer: Normalizer = None,
) -> LossOutput:
    """Value regression, optionally clipped around the old values and Huber-robust.

    f(x) = ½ x²  or Huber(x; δ);   ℓₜ = f(Vₜ − Gₜ)
    with ``clip`` = c:  ℓₜ = max(f(Vₜ − Gₜ), f(V_old,ₜ + clip(Vₜ − V_old,ₜ, ±c) − Gₜ))

    Metrics: ``vf_clipfrac``, ``value_mean``.
    """
    if clip is not None and clip <= 0:
        raise ValueError(f"clip must be positive, got {clip}")
    if huber_delta is not None and huber_delta <= 0:
        raise ValueError(f"huber_delta must be positive, got {huber_delta}")
    valid = as_bool_mask(mask)
    values, old_values, returns = _valid_only(valid, values, old_values, returns)

    def error(prediction: Array) -> Array:
        residual = prediction - returns
        if huber_delta is None:
            return 0.5 * residual**2
        return _huber(residual, huber_delta)

    token_loss = error(values)
    clipped_frac = jnp.zeros((), dtype=token_loss.dtype)
    if clip is not None:
        clipped_values = old_values + _clamp(values - old_values, -clip, clip)
        clipped_loss = error(clipped_values)
        outside = jnp.abs(values - old_values) > clip
        clipped_frac = _fraction(outside & (clipped_loss > token_loss), valid, token_loss)
        token_loss = jnp.maximum(token_loss, clipped_loss)
    loss = aggregate(token_loss, valid, agg, normalizer)
    return LossOutput(
        loss, {"vf_clipfrac": clipped_frac, "value_mean": _detach(masked_mean(values, valid))}
    )


@typecheck
def kl_estimate(
    logprobs: Float[Array, "*batch time"],
    ref_logprobs: Float[Array, "*batch time"],
    kind: KLKind = "k3",
    clamp: float | None = None,
) -> Float[Array, "*batch time"]:
    """Per-token estimates of KL(π ‖ π_ref) from tokens sampled from π; log r = log π_ref − log π:

    ``k1`` −log r,  ``k2`` ½ (log r)²,  ``k3`` (r − 1) − log r,  ``abs`` |log r|,
    bounded to ±``clamp`` when given (aliases ``kl``, ``mse``, ``low_var_kl``). A kind
    ending in ``+`` is straight-through: the named estimate's value, k2's gradient,
    k2 − sg[k2] + sg[k].
    """
    name, straight_through = _kl_base(kind)
    if clamp is not None and clamp <= 0:
        raise ValueError(f"clamp must be positive, got {clamp}")
    log_ratio = ref_logprobs - logprobs
    if name == "k1":
        estimate = -log_ratio
    elif name == "k2":
        estimate = 0.5 * log_ratio**2
    elif name == "k3":
        bounded = _clamp(log_ratio, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
        estimate = jnp.expm1(bounded) - bounded
    else:
        # |x| as x·sign(x): torch's derivative at 0 is sign(0) = 0, jnp.abs's is 1.
        estimate = log_ratio * jnp.sign(log_ratio)
    if clamp is not None:
        estimate = _clamp(estimate, -clamp, clamp)
    if not straight_through:
        return estimate
    k2 = 0.5 * log_ratio**2
    return k2 - _detach(k2) + _detach(estimate)


@typecheck
def entropy_loss(
    entropy: Float[Array, "batch time"],
    mask: Mask[Array, "batch time"],
    agg: AggregationMode = "token-mean",
    normalizer: Normalizer = None,
) -> LossOutput:
    """The entropy bonus as a loss: −agg(Hₜ)."""
    mean_entropy = aggregate(entropy, as_bool_mask(mask), agg, normalizer)
    return LossOutput(-mean_entropy, {"entropy": _detach(mean_entropy)})


@typecheck
def sft_loss(
    logprobs: Float[Array, "batch time"],
    mask: Mask[Array, "batch time"],
    agg: AggregationMode = "token-mean",
    normalizer: Normalizer = None,
) -> LossOutput:
    """Negative log-likelihood of the target tokens: −agg(log π(yₜ))."""
    loss = aggregate(-logprobs, as_bool_mask(mask), agg, normalizer)
    return LossOutput(loss, {"nll": _detach(loss)})


def _alpha(alpha: float | Array) -> float | Array:
    return alpha if isinstance(alpha, float | int) else _detach(alpha)


@typecheck
def sac_critic_target(
    rewards: Float[Array, "*batch"],
    next_q_values: Float[Array, "*batch critics"],
    next_logprobs: Float[Array, "*batch"],
    terminated: Mask[Array, "*batch"],
    gamma: float,
    alpha: float | Float[Array, ""],
) -> Float[Array, "*batch"]:
    """y = r + γ (1 − term) (minᵢ Q'ᵢ(s', a') − α log π(a'|s')); no gradient flows through it."""
    soft_value = next_q_values.min(axis=-1) - _alpha(alpha) * next_logprobs
    target = rewards + gamma * jnp.where(as_bool_mask(terminated, "terminated"), 0.0, soft_value)
    return _detach(target)


@typecheck
def sac_critic_loss(
    q_values: Float[Array, "*batch critics"],
    target: Float[Array, "*batch"],
) -> LossOutput:
    """Σᵢ ½ E[(Qᵢ(s, a) − y)²] over the critics, y held fixed."""
    residual = q_values - _detach(target)[..., None]
    per_critic = (0.5 * residual**2).reshape(-1, q_values.shape[-1]).mean(axis=0)
    return LossOutput(per_critic.sum(), {"q_mean": _detach(q_values.mean())})


@typecheck
def sac_actor_loss(
    logprobs: Float[Array, "*batch"],
    q_values: Float[Array, "*batch critics"],
    alpha: float | Float[Array, ""],
) -> LossOutput:
    """E[α log π(a|s) − minᵢ Qᵢ(s, a)], α held fixed."""
    loss = (_alpha(alpha) * logprobs - q_values.min(axis=-1)).mean()
    return LossOutput(loss, {"entropy": _detach(-logprobs.mean())})


@typecheck
def sac_temperature_loss(
    log_alpha: Float[Array, ""],
    logprobs: Float[Array, "*batch"],
    target_entropy: float,
) -> LossOutput:
    """−E[log α · (log π(a|s) + H̄)], log-probabilities held fixed."""
    loss = -(log_alpha * (_detach(logprobs) + target_entropy)).mean()
    return LossOutput(loss, {"alpha": _detach(jnp.exp(log_alpha))})

"""Policy, value, KL, entropy, SFT and SAC losses.

Every loss returns a `LossOutput`: a scalar to minimise and detached
diagnostics. Token losses are reduced by `rlcore.masked.aggregate`; pass the
global batch's ``normalizer`` (`rlcore.masked.aggregation_normalizer`, summed
over micro-batches and ranks) and the sum of the micro-batch losses equals the
loss of the whole batch, whatever the split.

Notation: π the current policy, π_old the policy that produced the batch
(behaviour), ρₜ = π(yₜ)/π_old(yₜ) = exp(log π − log π_old), Âₜ the advantage.
Every policy loss takes per-token ``weights``: ℓₜ ← wₜ ℓₜ with ``weights``, e.g.
`rlcore.mismatch.rollout_importance_weights`.
"""

from __future__ import annotations

from typing import Literal, Protocol, get_args

import attrs
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlcore._checking import typecheck
from rlcore.masked import AggregationMode, aggregate, masked_mean
from rlcore.registry import POLICY_LOSSES
from rlcore.types import LossOutput, Mask, as_bool_mask

__all__ = [
    "KLKind",
    "PolicyLoss",
    "PolicyLossBatch",
    "PolicyLossConfig",
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

Normalizer = float | Float[Tensor, ""] | None
Weights = Float[Tensor, "batch time"] | None

# exp() of a log-ratio beyond ±20 overflows float16 and means the batch is far
# off-policy; verl clamps at the same bound.
_LOG_RATIO_BOUND = 20.0


def _clipped_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token clipped loss, and where the clip and the dual clip were active."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    clip_active = clipped > unclipped
    if dual_clip is None:
        return loss, clip_active, torch.zeros_like(clip_active)
    bound = -advantages * dual_clip
    dual_active = (advantages < 0) & (loss > bound)
    return torch.where(dual_active, bound, loss), clip_active, dual_active


def _valid_only(valid: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
    """Each tensor with its masked positions set to 0.

    Padding may hold NaN or ±inf (a log-probability of −inf is common). Masking
    only the final loss is not enough: the backward pass multiplies the zero
    gradient there by local derivatives such as exp(NaN), and 0 · NaN = NaN
    would flow into the model. Replacing the inputs first keeps every
    gradient at a masked position exactly 0.
    """
    return tuple(torch.where(valid, tensor, 0.0) for tensor in tensors)


def _weighted(token_loss: Tensor, weights: Tensor | None, valid: Tensor) -> Tensor:
    """ℓₜ ← wₜ ℓₜ; the weights are constants, and 0 at masked positions (NaN there included)."""
    if weights is None:
        return token_loss
    return token_loss * torch.where(valid, weights.detach(), 0.0)


def _check_clip(clip_low: float, clip_high: float, dual_clip: float | None) -> None:
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must lie in [0, 1), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be non-negative, got {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be greater than 1, got {dual_clip}")


@typecheck
def ppo_policy_loss(
    logprobs: Float[Tensor, "batch time"],
    old_logprobs: Float[Tensor, "batch time"],
    advantages: Float[Tensor, "batch time"],
    mask: Mask[Tensor, "batch time"],
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    agg: AggregationMode = "token-mean",
    normalizer: Normalizer = None,
    weights: Weights = None,
) -> LossOutput:
    """PPO's clipped surrogate (Schulman et al. 2017, arXiv:1707.06347), clip-higher, dual clip.

    ℓₜ = max(−Âₜ ρₜ, −Âₜ clip(ρₜ, 1 − ε_low, 1 + ε_high))
    dual clip (Ye et al. 2020, arXiv:1912.09729), c > 1:  ℓₜ ← min(ℓₜ, −c Âₜ) where Âₜ < 0

    ``clip_high`` defaults to ``clip_low``; DAPO (arXiv:2503.14476) decouples
    them (ε_high = 0.28) to keep low-probability tokens explorable. The
    log-ratio is clamped to ±20 before exp. Metrics: ``clipfrac``,
    ``dual_clipfrac``, ``approx_kl`` (mean of log π_old − log π), ``ratio_mean``.
    ℓₜ ← wₜ ℓₜ with ``weights``, e.g. `rlcore.mismatch.rollout_importance_weights`.
    """
    clip_high = clip_low if clip_high is None else clip_high
    _check_clip(clip_low, clip_high, dual_clip)
    valid = as_bool_mask(mask)
    logprobs, old_logprobs, advantages = _valid_only(valid, logprobs, old_logprobs, advantages)
    log_ratio = (logprobs - old_logprobs).clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    token_loss, clip_active, dual_active = _clipped_surrogate(
        ratio, advantages, clip_low, clip_high, dual_clip
    )
    loss = aggregate(_weighted(token_loss, weights, valid), valid, agg, normalizer)
    return LossOutput(
        loss,
        {
            "clipfrac": _fraction(clip_active, valid, token_loss),
            "dual_clipfrac": _fraction(dual_active, valid, token_loss),
            "approx_kl": masked_mean(-log_ratio, valid).detach(),
            "ratio_mean": masked_mean(ratio, valid).detach(),
        },
    )


@typecheck
def vanilla_policy_loss(
    logprobs: Float[Tensor, "batch time"],
    advantages: Float[Tensor, "batch time"],
    mask: Mask[Tensor, "batch time"],
    agg: AggregationMode = "token-mean",
    normalizer: Normalizer = None,
    weights: Weights = None,
) -> LossOutput:
    """REINFORCE (Williams 1992): ℓₜ = −Âₜ log π(yₜ), on-policy samples only.

    Its gradient equals `ppo_policy_loss`'s at ρ = 1 (a fresh batch).
    ℓₜ ← wₜ ℓₜ with ``weights``, e.g. `rlcore.mismatch.rollout_importance_weights`.
    """
    valid = as_bool_mask(mask)
    logprobs, advantages = _valid_only(valid, logprobs, advantages)
    token_loss = _weighted(-advantages * logprobs, weights, valid)
    loss = aggregate(token_loss, valid, agg, normalizer)
    return LossOutput(loss, {})


@typecheck
def gspo_policy_loss(
    logprobs: Float[Tensor, "batch time"],
    old_logprobs: Float[Tensor, "batch time"],
    advantages: Float[Tensor, "batch time"],
    mask: Mask[Tensor, "batch time"],
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    agg: AggregationMode = "seq-mean-token-mean",
    normalizer: Normalizer = None,
    weights: Weights = None,
) -> LossOutput:
    """Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071), GSPO-token form.

    sᵢ = exp( (1/|yᵢ|) Σₜ mᵢₜ (log π(yᵢₜ) − log π_old(yᵢₜ)) )     sequence ratio
    sᵢₜ = sg[sᵢ] · π(yᵢₜ) / sg[π(yᵢₜ)]                          value sᵢ, token gradient
    ℓᵢₜ = max(−Âᵢₜ sᵢₜ, −Âᵢₜ clip(sᵢₜ, 1 − ε_low, 1 + ε_high))

    With one advantage per sequence this is GSPO exactly (the gradient of
    sᵢₜ averaged over tokens is ∇sᵢ); per-token advantages give GSPO-token.
    The paper's clip range is tiny (3e-4, 4e-4) because sᵢ is a geometric mean.
    ℓᵢₜ ← wᵢₜ ℓᵢₜ with ``weights``, e.g. `rlcore.mismatch.rollout_importance_weights`.
    """
    _check_clip(clip_low, clip_high, None)
    valid = as_bool_mask(mask)
    logprobs, old_logprobs, advantages = _valid_only(valid, logprobs, old_logprobs, advantages)
    token_log_ratio = torch.where(valid, logprobs - old_logprobs, 0.0)
    sequence_log_ratio = token_log_ratio.sum(dim=-1) / valid.sum(dim=-1).clamp(min=1)
    log_ratio = logprobs - logprobs.detach() + sequence_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(log_ratio.clamp(max=_LOG_RATIO_BOUND))
    token_loss, clip_active, _ = _clipped_surrogate(ratio, advantages, clip_low, clip_high, None)
    loss = aggregate(_weighted(token_loss, weights, valid), valid, agg, normalizer)
    return LossOutput(
        loss,
        {
            "clipfrac": _fraction(clip_active, valid, token_loss),
            "approx_kl": masked_mean(-token_log_ratio, valid).detach(),
            "ratio_mean": masked_mean(ratio, valid).detach(),
        },
    )


@typecheck
def decoupled_ppo_policy_loss(
    logprobs: Float[Tensor, "batch time"],
    proximal_logprobs: Float[Tensor, "batch time"],
    behavior_logprobs: Float[Tensor, "batch time"],
    advantages: Float[Tensor, "batch time"],
    mask: Mask[Tensor, "batch time"],
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    behavior_weight_cap: float | None = None,
    agg: AggregationMode = "token-mean",
    normalizer: Normalizer = None,
    weights: Weights = None,
) -> LossOutput:
    """Decoupled PPO for stale (asynchronous) batches (Hilton et al. 2021; AReaL, Fu et al. 2025).

    The batch was sampled by a behaviour policy μ that may be several versions
    old; the trust region is centred on a recent proximal policy π_prox instead:

    wₜ = π_prox(yₜ) / μ(yₜ)           importance weight, no gradient
    rₜ = π(yₜ) / π_prox(yₜ)
    ℓₜ = wₜ · max(−Âₜ rₜ, −Âₜ clip(rₜ, 1 − ε_low, 1 + ε_high))

    Tokens whose weight exceeds ``behavior_weight_cap`` are dropped from the
    loss (AReaL's ``behav_imp_weight_cap``): they contribute 0, like a zero
    advantage, and still count in the normaliser. With π_prox = μ it is
    `ppo_policy_loss` exactly. Metrics add ``behavior_weight_mean`` and
    ``behavior_capped_frac``. ℓₜ ← wₜ ℓₜ with ``weights``, e.g.
    `rlcore.mismatch.rollout_importance_weights`.
    """
    clip_high = clip_low if clip_high is None else clip_high
    _check_clip(clip_low, clip_high, dual_clip)
    valid = as_bool_mask(mask)
    logprobs, proximal_logprobs, behavior_logprobs, advantages = _valid_only(
        valid, logprobs, proximal_logprobs, behavior_logprobs, advantages
    )
    behavior_log_weight = (proximal_logprobs - behavior_logprobs).detach()
    weight = torch.exp(behavior_log_weight.clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND))
    capped = torch.zeros_like(valid)
    if behavior_weight_cap is not None:
        capped = valid & (weight > behavior_weight_cap)
    kept = valid & ~capped
    log_ratio = (logprobs - proximal_logprobs).clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    token_loss, clip_active, dual_active = _clipped_surrogate(
        ratio, advantages, clip_low, clip_high, dual_clip
    )
    # A dropped token contributes 0 but still counts in the normaliser, as in
    # AReaL, so the global normaliser of ``mask`` applies unchanged.
    token_loss = _weighted(torch.where(capped, 0.0, weight * token_loss), weights, valid)
    loss = aggregate(token_loss, valid, agg, normalizer)
    return LossOutput(
        loss,
        {
            "clipfrac": _fraction(clip_active, kept, token_loss),
            "dual_clipfrac": _fraction(dual_active, kept, token_loss),
            "approx_kl": masked_mean(-log_ratio, kept).detach(),
            "ratio_mean": masked_mean(ratio, kept).detach(),
            "behavior_weight_mean": masked_mean(weight, valid).detach(),
            "behavior_capped_frac": _fraction(capped, valid, token_loss),
        },
    )


@typecheck
def value_loss(
    values: Float[Tensor, "batch time"],
    old_values: Float[Tensor, "batch time"],
    returns: Float[Tensor, "batch time"],
    mask: Mask[Tensor, "batch time"],
    clip: float | None = None,
    huber_delta: float | None = None,
    agg: AggregationMode = "token-mean",
    normalizer: Normalizer = None,
) -> LossOutput:
    """Value regression, optionally clipped around the old values and Huber-robust.

    f(x) = ½ x²   or Huber: ½ x² if |x| ≤ δ, δ (|x| − ½ δ) otherwise
    ℓₜ = f(Vₜ − Gₜ)                                   without clipping
    ℓₜ = max(f(Vₜ − Gₜ), f(V_old,ₜ + clip(Vₜ − V_old,ₜ, ±c) − Gₜ))   with ``clip`` = c (PPO2)

    Metrics: ``vf_clipfrac`` (tokens outside the clip range where the clipped
    branch was larger), ``value_mean``.
    """
    if clip is not None and clip <= 0:
        raise ValueError(f"clip must be positive, got {clip}")
    if huber_delta is not None and huber_delta <= 0:
        raise ValueError(f"huber_delta must be positive, got {huber_delta}")
    valid = as_bool_mask(mask)
    values, old_values, returns = _valid_only(valid, values, old_values, returns)

    def error(prediction: Tensor) -> Tensor:
        residual = prediction - returns
        if huber_delta is None:
            return 0.5 * residual.square()
        return torch.nn.functional.huber_loss(
            prediction, returns, reduction="none", delta=huber_delta
        )

    token_loss = error(values)
    clipped_frac = torch.zeros((), dtype=token_loss.dtype, device=values.device)
    if clip is not None:
        clipped_values = old_values + (values - old_values).clamp(-clip, clip)
        clipped_loss = error(clipped_values)
        # Inside the clip range V_old + (V − V_old) can round one ulp away from V;
        # only a step that was actually clipped may count as clipped.
        outside = (values - old_values).abs() > clip
        clipped_frac = _fraction(outside & (clipped_loss > token_loss), valid, token_loss)
        token_loss = torch.maximum(token_loss, clipped_loss)
    loss = aggregate(token_loss, valid, agg, normalizer)
    return LossOutput(
        loss, {"vf_clipfrac": clipped_frac, "value_mean": masked_mean(values, valid).detach()}
    )


KLKind = Literal[
    "k1",
    "k2",
    "k3",
    "abs",
    "kl",
    "mse",
    "low_var_kl",
    "k1+",
    "k2+",
    "k3+",
    "abs+",
    "kl+",
    "mse+",
    "low_var_kl+",
]
_KL_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}
_KL_KINDS = ", ".join(get_args(KLKind))


def _kl_base(kind: str) -> tuple[str, bool]:
    """The estimator a kind names (aliases resolved) and whether it is straight-through (``+``)."""
    straight_through = kind.endswith("+")
    base = kind[:-1] if straight_through else kind
    name = _KL_ALIASES.get(base, base)
    if name not in ("k1", "k2", "k3", "abs"):
        raise ValueError(f"unknown KL estimator kind {kind!r}; expected one of {_KL_KINDS}")
    return name, straight_through


@typecheck
def kl_estimate(
    logprobs: Float[Tensor, "*batch time"],
    ref_logprobs: Float[Tensor, "*batch time"],
    kind: KLKind = "k3",
    clamp: float | None = None,
) -> Float[Tensor, "*batch time"]:
    """Per-token estimates of KL(π ‖ π_ref) from tokens sampled from π (Schulman 2020).

    Argument order matters: ``logprobs`` are log π(yₜ) of the policy that
    sampled yₜ (the actor), ``ref_logprobs`` log π_ref(yₜ) of the reference.
    With log rₜ = log π_ref(yₜ) − log π(yₜ):

    - ``k1`` (``kl``):          −log r                 unbiased, can be negative
    - ``k2`` (``mse``):         ½ (log r)²             biased, ≥ 0, low variance
    - ``k3`` (``low_var_kl``):  (r − 1) − log r        unbiased, ≥ 0, low variance
    - ``abs``:                  |log r|                ≥ 0

    A kind ending in ``+`` (``k3+``, ``low_var_kl+``, ...) is straight-through:
    the value of the named estimate, the gradient of k2,

        k⁺ = k2 − sg[k2] + sg[k]

    For tokens sampled from π the expected gradient of k2 is ∇KL(π ‖ π_ref),
    while k1's is 0 and k3's is ∇KL(π_ref ‖ π); so a ``+`` kind logs the
    estimate it names and, as a loss, pulls along the gradient of the KL it
    estimates. ``k2+`` is ``k2``. (verl's ``kl_penalty`` kinds of the same names.)

    Swapping the arguments estimates something else (k1 and k3 are no longer
    unbiased for KL(π ‖ π_ref)). ``clamp`` bounds the estimate's value to
    ±clamp (not the gradient of a ``+`` kind); verl clamps ``low_var_kl`` at 10.
    """
    name, straight_through = _kl_base(kind)
    if clamp is not None and clamp <= 0:
        raise ValueError(f"clamp must be positive, got {clamp}")
    log_ratio = ref_logprobs - logprobs
    if name == "k1":
        estimate = -log_ratio
    elif name == "k2":
        estimate = 0.5 * log_ratio.square()
    elif name == "k3":
        # exp of a log-ratio beyond ±20 is the far-off regime verl clamps too; it would give inf.
        bounded = log_ratio.clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
        estimate = torch.expm1(bounded) - bounded
    else:
        estimate = log_ratio.abs()
    if clamp is not None:
        estimate = estimate.clamp(-clamp, clamp)
    if not straight_through:
        return estimate
    k2 = 0.5 * log_ratio.square()
    # k2 − sg[k2] is exactly 0, so the value is the estimate's to the last bit.
    return k2 - k2.detach() + estimate.detach()


@typecheck
def entropy_loss(
    entropy: Float[Tensor, "batch time"],
    mask: Mask[Tensor, "batch time"],
    agg: AggregationMode = "token-mean",
    normalizer: Normalizer = None,
) -> LossOutput:
    """The entropy bonus as a loss: −agg(Hₜ). Add ``coef ×`` it to encourage exploration."""
    mean_entropy = aggregate(entropy, as_bool_mask(mask), agg, normalizer)
    return LossOutput(-mean_entropy, {"entropy": mean_entropy.detach()})


@typecheck
def sft_loss(
    logprobs: Float[Tensor, "batch time"],
    mask: Mask[Tensor, "batch time"],
    agg: AggregationMode = "token-mean",
    normalizer: Normalizer = None,
) -> LossOutput:
    """Negative log-likelihood of the target tokens: −agg(log π(yₜ))."""
    loss = aggregate(-logprobs, as_bool_mask(mask), agg, normalizer)
    return LossOutput(loss, {"nll": loss.detach()})


# ---------------------------------------------------------------------------
# Soft actor-critic (Haarnoja et al. 2018, arXiv:1801.01290 and arXiv:1812.05905).


def _alpha(alpha: float | Tensor) -> float | Tensor:
    return alpha.detach() if isinstance(alpha, Tensor) else alpha


@torch.no_grad()
@typecheck
def sac_critic_target(
    rewards: Float[Tensor, "*batch"],
    next_q_values: Float[Tensor, "*batch critics"],
    next_logprobs: Float[Tensor, "*batch"],
    terminated: Mask[Tensor, "*batch"],
    gamma: float,
    alpha: float | Float[Tensor, ""],
) -> Float[Tensor, "*batch"]:
    """Soft Bellman target with clipped double-Q (Fujimoto et al. 2018):

    y = r + γ (1 − term) (minᵢ Q'ᵢ(s', a') − α log π(a'|s')),   a' ~ π(·|s')

    ``next_q_values[..., i]`` comes from target critic i. Truncated steps are
    not terminated: they bootstrap. No gradient flows through the target.
    """
    soft_value = next_q_values.amin(dim=-1) - _alpha(alpha) * next_logprobs
    return rewards + gamma * torch.where(as_bool_mask(terminated, "terminated"), 0.0, soft_value)


@typecheck
def sac_critic_loss(
    q_values: Float[Tensor, "*batch critics"],
    target: Float[Tensor, "*batch"],
) -> LossOutput:
    """Σᵢ ½ E[(Qᵢ(s, a) − y)²] over the critics, y from `sac_critic_target` (held fixed)."""
    residual = q_values - target.detach().unsqueeze(-1)
    per_critic = 0.5 * residual.square().reshape(-1, q_values.shape[-1]).mean(dim=0)
    return LossOutput(per_critic.sum(), {"q_mean": q_values.detach().mean()})


@typecheck
def sac_actor_loss(
    logprobs: Float[Tensor, "*batch"],
    q_values: Float[Tensor, "*batch critics"],
    alpha: float | Float[Tensor, ""],
) -> LossOutput:
    """E[α log π(a|s) − minᵢ Qᵢ(s, a)],  a ~ π(·|s) reparameterised (α held fixed)."""
    loss = (_alpha(alpha) * logprobs - q_values.amin(dim=-1)).mean()
    return LossOutput(loss, {"entropy": -logprobs.detach().mean()})


@typecheck
def sac_temperature_loss(
    log_alpha: Float[Tensor, ""],
    logprobs: Float[Tensor, "*batch"],
    target_entropy: float,
) -> LossOutput:
    """−E[log α · (log π(a|s) + H̄)] with the log-probabilities held fixed.

    Minimising it raises α when the policy's entropy −E[log π] is below the
    target H̄ (often −dim(A)) and lowers it when above. Parameterised by log α
    as Stable-Baselines3 does (CleanRL multiplies by α instead; same sign of
    gradient).
    """
    loss = -(log_alpha * (logprobs.detach() + target_entropy)).mean()
    return LossOutput(loss, {"alpha": log_alpha.detach().exp()})


def _fraction(flags: Tensor, valid: Tensor, like: Tensor) -> Tensor:
    """The share of valid positions where ``flags`` holds, in ``like``'s dtype."""
    return masked_mean(flags.to(like.dtype), valid).detach()


# ---------------------------------------------------------------------------
# Registry adapters: one signature for every policy loss.


@attrs.frozen(eq=False)
class PolicyLossBatch:
    """What a policy loss may read. ``old_logprobs`` are the behaviour policy's;
    ``weights`` multiply each token's loss (`rlcore.mismatch.rollout_importance_weights`).
    """

    logprobs: Float[Tensor, "batch time"]
    old_logprobs: Float[Tensor, "batch time"]
    advantages: Float[Tensor, "batch time"]
    mask: Bool[Tensor, "batch time"]
    proximal_logprobs: Float[Tensor, "batch time"] | None = None
    normalizer: float | Tensor | None = None
    weights: Float[Tensor, "batch time"] | None = None


@attrs.frozen
class PolicyLossConfig:
    """Hyperparameters a policy loss may use; each ignores those it does not need, and says
    which it reads when registered (`rlcore.registry.Registry.reads`).

    Unset clip bounds take each loss's own defaults: 0.2 for the PPO family,
    (3e-4, 4e-4) for GSPO, whose ratio is a per-token geometric mean.
    """

    clip_low: float | None = None
    clip_high: float | None = None
    dual_clip: float | None = None
    behavior_weight_cap: float | None = None
    agg: AggregationMode = "token-mean"

    def clip_range(
        self, default_low: float, default_high: float | None = None
    ) -> tuple[float, float]:
        """(ε_low, ε_high), falling back to a loss's own defaults where unset.

        An unset ``clip_high`` follows ``clip_low`` when that was set, else the default.
        """
        if self.clip_low is None:
            low, high = default_low, default_low if default_high is None else default_high
        else:
            low, high = self.clip_low, self.clip_low
        return low, high if self.clip_high is None else self.clip_high


class PolicyLoss(Protocol):
    """What `rlcore.registry.POLICY_LOSSES` holds."""

    def __call__(self, batch: PolicyLossBatch, config: PolicyLossConfig) -> LossOutput: ...


_PPO_CLIP = 0.2
_GSPO_CLIP = (3e-4, 4e-4)


def _ppo(batch: PolicyLossBatch, config: PolicyLossConfig) -> LossOutput:
    clip_low, clip_high = config.clip_range(_PPO_CLIP)
    return ppo_policy_loss(
        batch.logprobs,
        batch.old_logprobs,
        batch.advantages,
        batch.mask,
        clip_low,
        clip_high,
        config.dual_clip,
        config.agg,
        batch.normalizer,
        batch.weights,
    )


def _gspo(batch: PolicyLossBatch, config: PolicyLossConfig) -> LossOutput:
    clip_low, clip_high = config.clip_range(*_GSPO_CLIP)
    return gspo_policy_loss(
        batch.logprobs,
        batch.old_logprobs,
        batch.advantages,
        batch.mask,
        clip_low,
        clip_high,
        config.agg,
        batch.normalizer,
        batch.weights,
    )


def _decoupled_ppo(batch: PolicyLossBatch, config: PolicyLossConfig) -> LossOutput:
    if batch.proximal_logprobs is None:
        raise ValueError("policy loss 'decoupled_ppo' needs PolicyLossBatch.proximal_logprobs")
    clip_low, clip_high = config.clip_range(_PPO_CLIP)
    return decoupled_ppo_policy_loss(
        batch.logprobs,
        batch.proximal_logprobs,
        batch.old_logprobs,
        batch.advantages,
        batch.mask,
        clip_low,
        clip_high,
        config.dual_clip,
        config.behavior_weight_cap,
        config.agg,
        batch.normalizer,
        batch.weights,
    )


def _vanilla(batch: PolicyLossBatch, config: PolicyLossConfig) -> LossOutput:
    return vanilla_policy_loss(
        batch.logprobs, batch.advantages, batch.mask, config.agg, batch.normalizer, batch.weights
    )


# ``reads``: the PolicyLossConfig fields each uses (callers refuse the others).
POLICY_LOSSES.register("ppo", _ppo, reads=("clip_low", "clip_high", "dual_clip", "agg"))
POLICY_LOSSES.register("gspo", _gspo, reads=("clip_low", "clip_high", "agg"))
POLICY_LOSSES.register(
    "decoupled_ppo",
    _decoupled_ppo,
    reads=("clip_low", "clip_high", "dual_clip", "behavior_weight_cap", "agg"),
    needs=("proximal_logprobs",),
)
POLICY_LOSSES.register("vanilla", _vanilla, reads=("agg",))

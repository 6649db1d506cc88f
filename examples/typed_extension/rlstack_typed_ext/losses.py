"""CISPO: a policy loss that clips the importance weight, not the gradient.

PPO's clipped surrogate gives a token whose ratio left [1 − ε, 1 + ε] (in the
direction its advantage pushes) no gradient at all. In long reasoning
rollouts those are often the rare, high-ratio tokens that open a new line of
thought ("Wait", "However"), and they stop being learned after the first
update of a batch. CISPO keeps every token's REINFORCE gradient and bounds
only its importance weight.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from rlcore import typecheck
from rlcore.losses import PolicyLossBatch, PolicyLossConfig
from rlcore.masked import AggregationMode, aggregate, masked_mean
from rlcore.types import LossOutput, Mask, as_bool_mask

__all__ = ["CLIP_HIGH", "CLIP_LOW", "NAME", "cispo", "cispo_policy_loss"]

NAME = "cispo"
CLIP_LOW = 1.0  # ε_low = 1: no lower bound on the weight
CLIP_HIGH = 4.0  # ε_high: a weight is at most 5

# exp() of a log-ratio beyond ±20 overflows float16; rlcore's losses clamp at the same bound.
_LOG_RATIO_BOUND = 20.0


@typecheck
def cispo_policy_loss(
    logprobs: Float[Tensor, "batch time"],
    old_logprobs: Float[Tensor, "batch time"],
    advantages: Float[Tensor, "batch time"],
    mask: Mask[Tensor, "batch time"],
    clip_low: float = CLIP_LOW,
    clip_high: float = CLIP_HIGH,
    agg: AggregationMode = "token-mean",
    normalizer: float | Float[Tensor, ""] | None = None,
) -> LossOutput:
    """Clipped importance-sampling policy optimisation (MiniMax-M1, arXiv:2506.13585).

    ρₜ = exp(log π(yₜ) − log π_old(yₜ))
    ŵₜ = clip(ρₜ, 1 − ε_low, 1 + ε_high)
    ℓₜ = −sg[ŵₜ] Âₜ log π(yₜ),     so   ∇ℓₜ = −ŵₜ Âₜ ∇log π(yₜ)

    sg is stop-gradient: the weight scales the gradient and is not
    differentiated. Every valid token with Âₜ ≠ 0 gets a gradient of sign
    −sign(Âₜ) whatever its ratio; PPO gives 0 to a token clipped on the side
    its advantage pushes. Unclipped (ε_low = 1, ε_high = ∞) the gradient is
    PPO's unclipped one, −ρₜ Âₜ ∇log π; at ρ = 1 it is REINFORCE's.

    Defaults: ε_low = 1 (no lower bound), ε_high = 4. The log-ratio is clamped
    to ±20 before exp. Reduced by `rlcore.masked.aggregate` (``agg``,
    ``normalizer``), so micro-batch losses add up to the batch's. Metrics:
    ``clipfrac`` (valid tokens whose weight was clipped), ``approx_kl``
    (mean of log π_old − log π), ``ratio_mean``, ``weight_mean``.
    """
    if not 0.0 <= clip_low <= 1.0:
        raise ValueError(f"clip_low must lie in [0, 1], got {clip_low}")
    if not clip_high >= 0.0:  # NaN fails too
        raise ValueError(f"clip_high must be non-negative, got {clip_high}")
    valid = as_bool_mask(mask)
    # Padding may hold NaN or -inf: replaced before use so no gradient of it can be NaN.
    logprobs = torch.where(valid, logprobs, 0.0)
    old_logprobs = torch.where(valid, old_logprobs, 0.0)
    advantages = torch.where(valid, advantages, 0.0)
    log_ratio = (logprobs - old_logprobs).detach().clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    token_loss = -weight * advantages * logprobs
    loss = aggregate(token_loss, valid, agg, normalizer)
    return LossOutput(
        loss,
        {
            "clipfrac": masked_mean((weight != ratio).to(ratio.dtype), valid),
            "approx_kl": masked_mean(-log_ratio, valid),
            "ratio_mean": masked_mean(ratio, valid),
            "weight_mean": masked_mean(weight, valid),
        },
    )


def cispo(batch: PolicyLossBatch, config: PolicyLossConfig) -> LossOutput:
    """The registry entry: `cispo_policy_loss` with the clip range of ``config``.

    Unset bounds take CISPO's defaults (ε_low = 1, ε_high = 4); an unset
    ``clip_high`` follows a set ``clip_low``, as for every rlcore loss.
    """
    clip_low, clip_high = config.clip_range(CLIP_LOW, CLIP_HIGH)
    return cispo_policy_loss(
        batch.logprobs,
        batch.old_logprobs,
        batch.advantages,
        batch.mask,
        clip_low,
        clip_high,
        config.agg,
        batch.normalizer,
    )

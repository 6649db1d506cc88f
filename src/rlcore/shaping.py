"""Reward shaping before advantages: the KL penalty in the reward and its adaptive
coefficient, DAPO's overlong penalty and dynamic-sampling filter, Kimi k1.5's length
penalty, and the weighted total of several rewards."""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from rlcore._checking import typecheck
from rlcore.losses import KLKind, kl_estimate
from rlcore.types import Mask, as_bool_mask

__all__ = [
    "adaptive_kl_coef",
    "combine_rewards",
    "filter_informative_groups",
    "kl_penalized_rewards",
    "length_penalty",
    "overlong_penalty",
]


@typecheck
def kl_penalized_rewards(
    token_rewards: Float[Tensor, "batch time"],
    logprobs: Float[Tensor, "batch time"],
    ref_logprobs: Float[Tensor, "batch time"],
    mask: Mask[Tensor, "batch time"],
    coef: float,
    kind: KLKind = "k1",
) -> tuple[Float[Tensor, "batch time"], Float[Tensor, "batch time"]]:
    """The KL penalty in the reward (Ziegler et al. 2019, arXiv:1909.08593; InstructGPT):
    (r̃, k) with

    r̃ₜ = rₜ − β·kₜ on valid tokens, rₜ at padding,    kₜ = KL estimate of token t

    where kₜ = `rlcore.losses.kl_estimate` (``kind``) of the sampling policy's
    ``logprobs`` (π_old, before the update) against ``ref_logprobs``, 0 at padding, and
    β = ``coef``. The estimator sees no gradient here: the straight-through ``+`` kinds,
    which differ from their base only in the gradient, are refused. With ``k1`` the
    penalty of a row sums to β·Σₜ log π(yₜ)/π_ref(yₜ), the sampled estimate of
    β·KL(π ‖ π_ref) over the whole response; an outcome estimator (GRPO, RLOO) then
    works on that row's penalised total, GAE and REINFORCE++ on the tokens.
    """
    if kind.endswith("+"):
        raise ValueError(
            f"KL estimator kind {kind!r} is straight-through: it changes the gradient of a KL "
            "loss, and a reward has none; use its base kind "
            f"{kind[:-1]!r}"
        )
    if coef < 0:
        raise ValueError(f"the KL coefficient must be at least 0, got {coef}")
    valid = as_bool_mask(mask)
    with torch.no_grad():
        kl = torch.where(valid, kl_estimate(logprobs, ref_logprobs, kind), 0.0)
        return token_rewards - coef * kl, kl


@typecheck
def adaptive_kl_coef(coef: float, kl: float, target: float, horizon: int, samples: int) -> float:
    """The next KL coefficient of the adaptive controller (Ziegler et al. 2019, §2.2):

    eₜ = clip(KLₜ / KL_target − 1, −0.2, 0.2),    βₜ₊₁ = βₜ · (1 + eₜ · n / H)

    with KLₜ the step's observed KL (``kl``, ≥ 0), n = ``samples`` the responses it
    was measured on and H = ``horizon``: β grows while the policy drifts further from
    the reference than ``target`` and shrinks while it stays closer, by at most a
    factor 1 ± 0.2·n/H a step. n/H must stay below 5, or a step could drive β to 0
    or below.
    """
    if target <= 0 or horizon < 1 or samples < 1:
        raise ValueError(
            f"the adaptive KL controller needs target > 0, horizon ≥ 1 and samples ≥ 1, got "
            f"{target}, {horizon} and {samples}"
        )
    if samples >= 5 * horizon:
        raise ValueError(
            f"{samples} samples a step against a horizon of {horizon}: a step could scale the "
            "KL coefficient by 1 − 0.2·n/H ≤ 0; lengthen the horizon"
        )
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * samples / horizon)


@typecheck
def overlong_penalty(
    lengths: Int[Tensor, "batch"],
    max_length: int,
    buffer_length: int,
    penalty_factor: float = 1.0,
) -> Float[Tensor, "batch"]:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13).

    With L_max = ``max_length`` and L_cache = ``buffer_length``:

    R(L) = 0                                  if L ≤ L_max − L_cache
         = ((L_max − L_cache) − L) / L_cache  if L_max − L_cache < L ≤ L_max
         = −1                                 if L > L_max

    times ``penalty_factor``; added to the task reward.
    """
    if not 0 < buffer_length <= max_length:
        raise ValueError(
            f"buffer_length must lie in (0, max_length={max_length}], got {buffer_length}"
        )
    expected = max_length - buffer_length
    ramp = (expected - lengths).to(torch.get_default_dtype()) / buffer_length
    penalty = ramp.clamp(min=-1.0, max=0.0)
    return penalty * penalty_factor


@typecheck
def filter_informative_groups(
    scores: Float[Tensor, "groups group_size"], tolerance: float = 0.0
) -> Bool[Tensor, "groups"]:
    """DAPO dynamic sampling: keep groups whose scores are not all equal.

    keepᵍ = max(sᵍ) − min(sᵍ) > tolerance. A group where every response is
    right (or every one wrong) has zero group-relative advantage and only
    dilutes the batch.
    """
    spread = scores.amax(dim=-1) - scores.amin(dim=-1)
    return spread > tolerance


@typecheck
def length_penalty(
    lengths: Int[Tensor, "groups group_size"], correct: Bool[Tensor, "groups group_size"]
) -> Float[Tensor, "groups group_size"]:
    """Kimi k1.5's length reward (Kimi Team 2025, arXiv:2501.12599, §2.3.3 "Length Penalty").

    Within a group of responses to one prompt, with Lᵢ the length of response
    i and L_min, L_max the group's shortest and longest:

    λᵢ = 0.5 − (Lᵢ − L_min) / (L_max − L_min)
    Rᵢ = λᵢ             if response i is correct
       = min(0, λᵢ)     otherwise

    and Rᵢ = 0 throughout a group whose responses all have one length. So
    Rᵢ ∈ [−0.5, 0.5]: the shortest correct responses gain 0.5, the longest of
    the group lose 0.5 whether right or wrong, and a wrong response is never
    rewarded for being short (it would teach the policy to give up early).
    Lengths enter only through (Lᵢ − L_min) / (L_max − L_min), so the penalty
    does not change when every length of a group is shifted or scaled.
    Added to the task reward with a weight.
    """
    length = lengths.to(torch.get_default_dtype())
    shortest = length.amin(dim=-1, keepdim=True)
    spread = length.amax(dim=-1, keepdim=True) - shortest
    # Integer lengths: a spread that is not 0 is at least 1, so the clamp only guards 0 / 0.
    lam = 0.5 - (length - shortest) / spread.clamp(min=1.0)
    lam = torch.where(spread > 0, lam, 0.0)
    return torch.where(correct, lam, lam.clamp(max=0.0))


@typecheck
def combine_rewards(
    scores: Float[Tensor, "rewards batch"], weights: Float[Tensor, "rewards"]
) -> Float[Tensor, "batch"]:
    """The weighted total of several reward functions' scores of one batch.

    sᵢ = Σₖ wₖ sₖᵢ, with sₖᵢ the score of reward function k on sample i (TRL's
    ``reward_funcs`` with ``reward_weights``). A weight of 0 leaves its
    function out of the total; one function with weight 1 gives its scores
    unchanged.
    """
    return (weights.to(scores.dtype).unsqueeze(-1) * scores).sum(dim=0)

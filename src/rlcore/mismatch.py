"""The sampler–trainer log-probability mismatch: diagnostics and importance weights.

A trainer that samples with an inference engine (vLLM, SGLang) and trains
with another (FSDP, Megatron) scores the same token under the same weights
twice, and the two differ: kernels, precision and batching are not the same.
The batch comes from π_rollout while the gradient is taken for π_train, so an
"on-policy" update is off-policy (Yao et al. 2025, "Your efficient RL
framework secretly brings you off-policy RL training"). `logprob_mismatch`
measures the gap; `rollout_importance_weights` corrects for it, as per-token
``weights`` of the policy losses in `rlcore.losses`.

Notation: mₜ the mask, δₜ = log π_train(yₜ) − log π_rollout(yₜ) and
ρₜ = exp(clamp(δₜ, ±20)) the importance ratio of token yₜ ~ π_rollout.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from jaxtyping import Float
from torch import Tensor

from rlcore._checking import typecheck
from rlcore.losses import kl_estimate
from rlcore.masked import masked_mean
from rlcore.types import Mask, as_bool_mask

__all__ = [
    "ROLLOUT_IS_MODES",
    "RolloutISMode",
    "logprob_mismatch",
    "rollout_importance_weights",
]

RolloutISMode = Literal[
    "token_truncate",
    "token_mask",
    "sequence_truncate",
    "sequence_mask",
    "geometric_mask",
]
ROLLOUT_IS_MODES: tuple[str, ...] = get_args(RolloutISMode)

# The bound rlcore.losses clamps log-ratios at: exp(±20) is already far off-policy.
_LOG_RATIO_BOUND = 20.0


def _log_ratio(train: Tensor, rollout: Tensor, valid: Tensor) -> Tensor:
    """δₜ without gradient, 0 at masked positions (NaN or ±inf there included)."""
    return torch.where(valid, train.detach() - rollout.detach(), 0.0)


def _valid_max(values: Tensor, valid: Tensor) -> Tensor:
    """The largest valid entry of a non-negative tensor; 0 when nothing is valid."""
    return torch.cat([torch.where(valid, values, 0.0).flatten(), values.new_zeros(1)]).max()


def _fraction(flags: Tensor, valid: Tensor, like: Tensor) -> Tensor:
    """The share of valid positions where ``flags`` holds, in ``like``'s dtype."""
    return masked_mean(flags.to(like.dtype), valid)


@typecheck
def logprob_mismatch(
    train_logprobs: Float[Tensor, "batch time"],
    rollout_logprobs: Float[Tensor, "batch time"],
    mask: Mask[Tensor, "batch time"],
) -> dict[str, Float[Tensor, ""]]:
    """How far the trainer's log-probabilities are from the sampler's (detached scalars).

    - ``abs_diff_mean``, ``abs_diff_max``:  mean and max of |δₜ| over valid tokens
    - ``kl_k1``:  mean of −δₜ, the k1 estimate of KL(π_rollout ‖ π_train) on yₜ ~ π_rollout
    - ``kl_k3``:  mean of ρₜ − 1 − log ρₜ, the k3 estimate of the same KL (≥ 0)
    - ``seq_log_ratio_abs_mean``:  mean over sequences with a valid token of |Σₜ mₜ δₜ|,
      the log of the sequence-level ratio that sequence-level corrections use

    Masked positions are ignored; with no valid token every value is 0.
    """
    valid = as_bool_mask(mask)
    delta = _log_ratio(train_logprobs, rollout_logprobs, valid)
    # kl_estimate(log π_rollout, log π_train), both shifted by −log π_rollout.
    zeros = torch.zeros_like(delta)
    return {
        "abs_diff_mean": masked_mean(delta.abs(), valid),
        "abs_diff_max": _valid_max(delta.abs(), valid),
        "kl_k1": masked_mean(kl_estimate(zeros, delta, "k1"), valid),
        "kl_k3": masked_mean(kl_estimate(zeros, delta, "k3"), valid),
        "seq_log_ratio_abs_mean": masked_mean(delta.sum(dim=-1).abs(), valid.any(dim=-1)),
    }


@typecheck
def rollout_importance_weights(
    train_logprobs: Float[Tensor, "batch time"],
    rollout_logprobs: Float[Tensor, "batch time"],
    mask: Mask[Tensor, "batch time"],
    mode: RolloutISMode,
    threshold: float,
    lower: float | None = None,
) -> tuple[Float[Tensor, "batch time"], dict[str, Float[Tensor, ""]]]:
    """Per-token weights wₜ correcting for tokens sampled from π_rollout while training π_train.

    E_{y~π_rollout}[ρ(y) f(y)] = E_{y~π_train}[f(y)], but ρ is heavy-tailed, so
    each mode bounds it with C = ``threshold`` > 1 and L = ``lower`` ∈ (0, 1]
    (default 1/C). With the sequence ratio ρ_seq = exp(clamp(Σₜ mₜ log ρₜ, ±20))
    and its geometric mean ρ_geo = exp(Σₜ mₜ log ρₜ / Σₜ mₜ):

    - ``token_truncate`` (TIS):     wₜ = min(ρₜ, C)
    - ``token_mask`` (MIS):         wₜ = 1 if L ≤ ρₜ ≤ C else 0
    - ``sequence_truncate``:        wₜ = min(ρ_seq, C) for every token of the sequence
    - ``sequence_mask``:            wₜ = 1 if L ≤ ρ_seq ≤ C else 0, the whole sequence
    - ``geometric_mask``:           wₜ = 1 if L ≤ ρ_geo ≤ C else 0, the whole sequence

    Truncation (Ionides 2008, truncated importance sampling) bounds the
    variance of the estimate and keeps its bias small: only the rare tokens
    with ρₜ > C are under-weighted. It is the fix of Yao et al. 2025 ("Your
    efficient RL framework secretly brings you off-policy RL training", TIS).
    Masking instead drops the tokens (ICE-POP, MIS) or sequences whose
    mismatch is too large to trust, in both directions; the sequence ratio is
    the unbiased one for sequence-level rewards, its geometric mean does not
    grow with the length. verl's ``rollout_is`` offers the same modes.

    Weights carry no gradient and are 0 at masked positions. Metrics:
    ``weight_mean``, ``weight_max``, ``truncated_frac`` (valid tokens whose
    weight was capped at C, truncate modes) and ``masked_frac`` (valid tokens
    whose weight the mask set to 0, mask modes).
    """
    if not threshold > 1.0:
        raise ValueError(f"threshold must be greater than 1, got {threshold}")
    low = 1.0 / threshold if lower is None else lower
    if not 0.0 < low <= 1.0:
        raise ValueError(f"lower must lie in (0, 1], got {lower}")
    if mode not in ROLLOUT_IS_MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(ROLLOUT_IS_MODES)}")
    valid = as_bool_mask(mask)
    bound = _LOG_RATIO_BOUND
    log_ratio = _log_ratio(train_logprobs, rollout_logprobs, valid).clamp(-bound, bound)
    if mode.startswith("token"):
        log_weight = log_ratio
    elif mode.startswith("sequence"):
        log_weight = log_ratio.sum(dim=-1, keepdim=True).clamp(-bound, bound)
    else:
        lengths = valid.sum(dim=-1, keepdim=True).clamp(min=1)
        log_weight = log_ratio.sum(dim=-1, keepdim=True) / lengths
    ratio = torch.exp(log_weight).expand_as(log_ratio)
    none = torch.zeros_like(valid)
    if mode.endswith("truncate"):
        truncated, dropped = valid & (ratio > threshold), none
        weights = ratio.clamp(max=threshold)
    else:
        truncated, dropped = none, valid & ((ratio < low) | (ratio > threshold))
        weights = torch.where(dropped, 0.0, torch.ones_like(ratio))
    weights = torch.where(valid, weights, 0.0)
    return weights, {
        "weight_mean": masked_mean(weights, valid),
        "weight_max": _valid_max(weights, valid),
        "truncated_frac": _fraction(truncated, valid, weights),
        "masked_frac": _fraction(dropped, valid, weights),
    }

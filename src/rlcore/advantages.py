"""Advantage and return estimators.

Every estimator computes constants for the loss: its inputs are detached and
its outputs carry no gradient. Recursions run through one fast reverse linear
recurrence solver (`rlcore._scan`), not a Python loop over time.

Two layouts appear here:

- per-step trajectories ``[*batch, time]`` (embodied RL) with separate
  ``terminated`` and ``truncated`` flags, for `gae` and `discounted_returns`;
- token batches ``[batch, time]`` with a validity ``mask`` (reasoning RL):
  `token_gae`, `reinforce_pp`, `on_policy_distillation`; and outcome scores
  grouped by prompt, ``[groups, group_size]``, for `group_normalized` and
  `rloo`. Rows ``g·n … g·n + n − 1`` of a token batch form prompt group g.

The registry adapters at the end give every estimator one signature,
``(AdvantageBatch, AdvantageConfig) -> Advantages``, under the names the shell
and configs use (`rlcore.registry.ADVANTAGES`).
"""

from __future__ import annotations

from typing import Literal, Protocol, get_args

import attrs
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlcore import _scan
from rlcore._checking import typecheck
from rlcore.masked import masked_sum, masked_whiten
from rlcore.registry import ADVANTAGES
from rlcore.tokens import broadcast_to_tokens
from rlcore.types import Advantages, Mask, as_bool_mask

__all__ = [
    "BASELINE_FORMS",
    "AdvantageBatch",
    "AdvantageConfig",
    "AdvantageEstimator",
    "BaselineForm",
    "discounted_returns",
    "gae",
    "group_normalized",
    "on_policy_distillation",
    "reinforce_pp",
    "rloo",
    "token_gae",
]


@torch.no_grad()
@typecheck
def gae(
    rewards: Float[Tensor, "*batch time"],
    values: Float[Tensor, "*batch time"],
    next_values: Float[Tensor, "*batch time"],
    terminated: Mask[Tensor, "*batch time"],
    truncated: Mask[Tensor, "*batch time"],
    gamma: float,
    lam: float,
) -> Advantages:
    """Generalized advantage estimation (Schulman et al. 2016, arXiv:1506.02438).

    δₜ = rₜ + γ (1 − termₜ) V'ₜ − Vₜ
    Aₜ = δₜ + γ λ (1 − termₜ)(1 − truncₜ) Aₜ₊₁,   A after the last step = 0
    returns Gₜ = Aₜ + Vₜ

    ``next_values[t]`` is V(sₜ₊₁), the value of the observation that followed
    step t: the final observation when the episode ended there (gymnasium's
    ``final_obs``), the next step's first observation otherwise. A terminated
    step does not bootstrap; a truncated step bootstraps from V'ₜ and cuts the
    λ-trace (the next step belongs to a new episode). The last step of the
    window bootstraps from V'ₜ as a truncation would.
    """
    _check_discount(gamma, lam)
    terminated = as_bool_mask(terminated, "terminated")
    truncated = as_bool_mask(truncated, "truncated")
    # Buffers handed to the in-place solver are made contiguous: inputs are often transposed
    # views of time-major [time, batch] storage.
    advantages = torch.where(terminated, 0.0, next_values).contiguous()
    advantages.mul_(gamma).add_(rewards).sub_(values)  # δₜ, solved in place below
    decay = _where_scalar(terminated | truncated, 0.0, gamma * lam, like=advantages)
    _scan.solve_(advantages, decay)
    return Advantages(advantages=advantages, returns=advantages + values)


@torch.no_grad()
@typecheck
def token_gae(
    token_rewards: Float[Tensor, "batch time"],
    values: Float[Tensor, "batch time"],
    mask: Mask[Tensor, "batch time"],
    gamma: float = 1.0,
    lam: float = 1.0,
) -> Advantages:
    """GAE over the valid tokens of each row, skipping masked positions.

    With t' the next valid position after t (none: Vₜ' = 0, Aₜ' = 0):

    δₜ = rₜ + γ Vₜ' − Vₜ,   Aₜ = δₜ + γ λ Aₜ',   Gₜ = Aₜ + Vₜ   for valid t.

    Masked positions (padding, or observation/tool tokens inside a multi-turn
    response) are passed over: the value and advantage carried from the next
    valid token reach the previous valid one unchanged, and rewards placed on
    masked positions are ignored. This is verl's ``compute_gae_advantage_return``
    with a response mask, without its whitening (compose `masked_whiten`);
    outputs are 0 at masked positions.
    """
    _check_discount(gamma, lam)
    valid = as_bool_mask(mask)
    masked = ~valid
    # One recurrence instead of two: with Uₜ = Vₜ + λ Aₜ at valid t,
    #   Uₜ = (1 − λ) Vₜ + λ rₜ + γ λ Uₜ',   Aₜ = rₜ − Vₜ + γ Uₜ',
    # and U passed through unchanged at masked positions (x = 0, decay = 1).
    carried = torch.lerp(values, token_rewards, lam).contiguous().masked_fill_(masked, 0.0)
    _scan.solve_(carried, _where_scalar(valid, gamma * lam, 1.0, like=carried))
    advantages = token_rewards - values
    advantages[..., :-1].add_(carried[..., 1:], alpha=gamma)
    advantages.masked_fill_(masked, 0.0)
    returns = (advantages + values).masked_fill_(masked, 0.0)
    return Advantages(advantages=advantages, returns=returns)


@torch.no_grad()
@typecheck
def discounted_returns(
    rewards: Float[Tensor, "*batch time"],
    terminated: Mask[Tensor, "*batch time"],
    truncated: Mask[Tensor, "*batch time"],
    gamma: float,
    next_values: Float[Tensor, "*batch time"] | None = None,
) -> Float[Tensor, "*batch time"]:
    """Discounted returns with bootstrapping at truncation.

    Gₜ = rₜ + γ (1 − termₜ) · (V'ₜ if truncₜ or t is the last step, else Gₜ₊₁)

    Without ``next_values`` the bootstrap value is 0 (a Monte-Carlo return cut
    off at the window). With consistent values (V'ₜ = Vₜ₊₁ inside an episode),
    `gae` with λ = 1 gives advantages Gₜ − Vₜ.
    """
    _check_discount(gamma, 1.0)
    terminated = as_bool_mask(terminated, "terminated")
    truncated = as_bool_mask(truncated, "truncated")
    last = torch.zeros_like(truncated)
    last[..., -1:] = True  # a slice, so that an empty window is no error
    bootstrap = (truncated | last) & ~terminated
    if next_values is None:
        x = rewards.clone(memory_format=torch.contiguous_format)
    else:
        x = torch.addcmul(rewards, bootstrap.to(rewards.dtype), next_values, value=gamma)
        x = x.contiguous()
    decay = _where_scalar(terminated | bootstrap, 0.0, gamma, like=rewards)
    _scan.solve_(x, decay)
    return x


@torch.no_grad()
@typecheck
def group_normalized(
    scores: Float[Tensor, "groups group_size"],
    std_normalize: bool = True,
    eps: float = 1e-6,
    unbiased: bool = True,
) -> Float[Tensor, "groups group_size"]:
    """GRPO's group-relative advantage (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    Âᵢ = (sᵢ − mean(s)) / (std(s) + ε)   over the n responses of one prompt;
    Âᵢ = sᵢ − mean(s)                      with ``std_normalize=False``
                                           (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783).

    std is Bessel-corrected (``unbiased=True``) and ε = 1e-6, as in verl; TRL
    uses ε = 1e-4. A group of equal scores has advantage exactly 0 everywhere,
    ε = 0 included.
    """
    _check_group_size(scores)
    centred = scores - scores.mean(dim=-1, keepdim=True)
    if std_normalize:
        std = scores.std(dim=-1, keepdim=True, unbiased=unbiased)
        centred = centred / (std + eps)
    return torch.where(_varies(scores), centred, 0.0)


@torch.no_grad()
@typecheck
def rloo(scores: Float[Tensor, "groups group_size"]) -> Float[Tensor, "groups group_size"]:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740).

    Âᵢ = sᵢ − 1/(n−1) Σⱼ≠ᵢ sⱼ  =  n/(n−1) · (sᵢ − mean(s))

    A group of equal scores has advantage exactly 0.
    """
    n = _check_group_size(scores)
    others = scores.sum(dim=-1, keepdim=True) - scores
    return torch.where(_varies(scores), scores - others / (n - 1), 0.0)


@torch.no_grad()
@typecheck
def reinforce_pp(
    token_rewards: Float[Tensor, "batch time"],
    mask: Mask[Tensor, "batch time"],
    gamma: float = 1.0,
    baseline: Float[Tensor, "batch"] | None = None,
    eps: float = 1e-8,
) -> Advantages:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted token returns, whitened over the batch.

    Gₜ = Σₖ≥ₜ γ^(k−t) rₖ   (over valid tokens; masked ones are passed over)
    Âₜ = whiten(Gₜ − bᵢ)   over all valid tokens of the batch

    ``baseline`` bᵢ is a per-sequence baseline; REINFORCE++-baseline uses the
    mean outcome score of the sequence's prompt group (registry name
    ``reinforce_pp_baseline``; its ``AdvantageConfig.baseline_form='score'``
    centres the row's undiscounted total reward instead, as verl does). The
    returns are Gₜ itself, without the baseline.
    """
    _check_discount(gamma, 1.0)
    valid = as_bool_mask(mask)
    returns = torch.where(valid, token_rewards, 0.0).contiguous()
    _scan.solve_(returns, _where_scalar(valid, gamma, 1.0, like=returns))
    returns = torch.where(valid, returns, 0.0)
    centred = returns if baseline is None else returns - baseline.unsqueeze(-1)
    return Advantages(advantages=masked_whiten(centred, valid, eps=eps), returns=returns)


@torch.no_grad()
@typecheck
def on_policy_distillation(
    student_logprobs: Float[Tensor, "batch time"],
    teacher_logprobs: Float[Tensor, "batch time"],
    mask: Mask[Tensor, "batch time"] | None = None,
) -> Float[Tensor, "batch time"]:
    """On-policy distillation: the per-token negative reverse KL as the advantage.

    Âₜ = log π_teacher(yₜ) − log π_student(yₜ),   yₜ sampled from the student

    Maximising E[Âₜ] minimises the sampled reverse KL(π_student ‖ π_teacher)
    token by token (Agarwal et al. 2024, GKD, arXiv:2306.13649; Thinking
    Machines 2025, "On-Policy Distillation"). Masked positions are 0.
    """
    advantages = teacher_logprobs - student_logprobs
    if mask is None:
        return advantages
    return torch.where(as_bool_mask(mask), advantages, 0.0)


def _where_scalar(condition: Tensor, if_true: float, if_false: float, like: Tensor) -> Tensor:
    """``torch.where`` of two Python scalars, built in ``like``'s dtype.

    ``torch.where(c, 0.99, 1.0)`` would round 0.99 to float32 before any cast.
    """
    return torch.full_like(like, if_false).masked_fill_(condition, if_true)


def _varies(scores: Tensor) -> Tensor:
    """Groups whose scores are not all equal, ``[groups, 1]`` (NaN counts as varying).

    The mean of equal scores is rounded (3 × 0.1 / 3 ≠ 0.1), which would leave
    ±1e-17 advantages, blown up to ±0.8 by the std when ε = 0: such groups carry
    no signal and are set to exactly 0.
    """
    return (scores != scores[..., :1]).any(dim=-1, keepdim=True)


def _check_discount(gamma: float, lam: float) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must lie in [0, 1], got {lam}")


def _check_group_size(scores: Tensor) -> int:
    size = scores.shape[-1]
    if size < 2:
        raise ValueError(
            f"scores has shape {tuple(scores.shape)}: a group needs at least 2 responses "
            "to form a baseline (group_size >= 2)"
        )
    return size


# ---------------------------------------------------------------------------
# Registry adapters: one signature for every estimator.


@attrs.frozen(eq=False)
class AdvantageBatch:
    """What an advantage estimator may read from a token batch.

    ``token_rewards`` holds the reward of each token (the outcome score placed
    on the last valid token, per-token penalties added); rows
    ``g·group_size … (g+1)·group_size − 1`` answer the same prompt.
    """

    token_rewards: Float[Tensor, "batch time"]
    mask: Bool[Tensor, "batch time"]
    group_size: int = 1
    values: Float[Tensor, "batch time"] | None = None
    logprobs: Float[Tensor, "batch time"] | None = None
    teacher_logprobs: Float[Tensor, "batch time"] | None = None

    def require(self, estimator: str, field: str) -> Tensor:
        value = getattr(self, field)
        if value is None:
            raise ValueError(f"advantage estimator '{estimator}' needs AdvantageBatch.{field}")
        return value  # type: ignore[no-any-return]

    def grouped_scores(self, estimator: str) -> Tensor:
        """Outcome scores Σₜ mₜ rₜ as ``[groups, group_size]``."""
        rows = self.token_rewards.shape[0]
        if self.group_size < 2 or rows % self.group_size:
            raise ValueError(
                f"advantage estimator '{estimator}' needs group_size >= 2 dividing the "
                f"batch of {rows} rows, got group_size={self.group_size}"
            )
        scores = masked_sum(self.token_rewards, self.mask, axis=-1)
        return scores.view(-1, self.group_size)


BaselineForm = Literal["reward_to_go", "score"]
BASELINE_FORMS: tuple[str, ...] = get_args(BaselineForm)


def _check_baseline_form(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in BASELINE_FORMS:
        expected = " or ".join(repr(form) for form in BASELINE_FORMS)
        raise ValueError(f"AdvantageConfig.baseline_form must be {expected}, got {value!r}")


@attrs.frozen
class AdvantageConfig:
    """Hyperparameters an estimator may use; each ignores those it does not need, and says
    which it reads when registered (`rlcore.registry.Registry.reads`).

    ``baseline_form`` chooses what REINFORCE++-baseline (``reinforce_pp_baseline``)
    centres on the group mean b of the outcome scores before whitening:

    - ``reward_to_go``: the discounted reward-to-go, Âₜ = whiten(Gₜ − b), Gₜ = Σₖ≥ₜ γ^(k−t) rₖ;
    - ``score``: the row's total reward sᵢ = Σₜ mₜ rₜ, Âᵢₜ = whiten(sᵢ − b), the same on
      every token and undiscounted (verl's ``reinforce_plus_plus_baseline``); it needs
      ``gamma`` = 1.

    The two agree when γ = 1 and each row's reward lies on its last valid token.
    """

    gamma: float = 1.0
    lam: float = 1.0
    eps: float = 1e-6
    whiten: bool = True
    baseline_form: BaselineForm = attrs.field(
        default="reward_to_go", validator=_check_baseline_form
    )


class AdvantageEstimator(Protocol):
    """What `rlcore.registry.ADVANTAGES` holds: a token batch in, token advantages out."""

    def __call__(self, batch: AdvantageBatch, config: AdvantageConfig) -> Advantages: ...


def _outcome(batch: AdvantageBatch, per_sequence: Tensor) -> Advantages:
    advantages = broadcast_to_tokens(per_sequence.reshape(-1), batch.mask)
    return Advantages(advantages=advantages, returns=advantages)


def _gae_estimator(batch: AdvantageBatch, config: AdvantageConfig) -> Advantages:
    result = token_gae(
        batch.token_rewards, batch.require("gae", "values"), batch.mask, config.gamma, config.lam
    )
    if not config.whiten:
        return result
    return Advantages(masked_whiten(result.advantages, batch.mask), result.returns)


def _grpo_estimator(batch: AdvantageBatch, config: AdvantageConfig) -> Advantages:
    return _outcome(batch, group_normalized(batch.grouped_scores("grpo"), eps=config.eps))


def _dr_grpo_estimator(batch: AdvantageBatch, config: AdvantageConfig) -> Advantages:
    scores = batch.grouped_scores("dr_grpo")
    return _outcome(batch, group_normalized(scores, std_normalize=False))


def _rloo_estimator(batch: AdvantageBatch, config: AdvantageConfig) -> Advantages:
    return _outcome(batch, rloo(batch.grouped_scores("rloo")))


def _reinforce_pp_estimator(batch: AdvantageBatch, config: AdvantageConfig) -> Advantages:
    return reinforce_pp(batch.token_rewards, batch.mask, config.gamma)


def _reinforce_pp_baseline_estimator(batch: AdvantageBatch, config: AdvantageConfig) -> Advantages:
    scores = batch.grouped_scores("reinforce_pp_baseline")
    baseline = scores.mean(dim=-1, keepdim=True).expand_as(scores).reshape(-1)
    if config.baseline_form == "reward_to_go":
        return reinforce_pp(batch.token_rewards, batch.mask, config.gamma, baseline=baseline)
    if config.gamma != 1.0:
        raise ValueError(
            f"advantage estimator 'reinforce_pp_baseline' with baseline_form='score' centres "
            f"the undiscounted score of each row, so it does not use gamma (got {config.gamma}); "
            "leave gamma at 1.0 or choose baseline_form='reward_to_go'"
        )
    with torch.no_grad():
        returns = broadcast_to_tokens(scores.reshape(-1), batch.mask)
        centred = broadcast_to_tokens(scores.reshape(-1) - baseline, batch.mask)
        return Advantages(masked_whiten(centred, batch.mask, eps=1e-8), returns)


def _opd_estimator(batch: AdvantageBatch, config: AdvantageConfig) -> Advantages:
    advantages = on_policy_distillation(
        batch.require("opd", "logprobs"), batch.require("opd", "teacher_logprobs"), batch.mask
    )
    return Advantages(advantages=advantages, returns=advantages)


# ``reads``: the AdvantageConfig fields each uses (callers refuse the others).
ADVANTAGES.register("gae", _gae_estimator, reads=("gamma", "lam", "whiten"))
ADVANTAGES.register("grpo", _grpo_estimator, reads=("eps",))
ADVANTAGES.register("dr_grpo", _dr_grpo_estimator, reads=())
ADVANTAGES.register("rloo", _rloo_estimator, reads=())
ADVANTAGES.register("reinforce_pp", _reinforce_pp_estimator, reads=("gamma",))
ADVANTAGES.register(
    "reinforce_pp_baseline", _reinforce_pp_baseline_estimator, reads=("gamma", "baseline_form")
)
ADVANTAGES.register("opd", _opd_estimator, reads=())

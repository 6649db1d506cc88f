"""A rank-based group advantage: each response's pairwise win rate against its group.

GRPO centres each score on its group's mean and divides by the group's
standard deviation, so one outlying score (a reward model's 40 among scores
near 0.2) moves the mean and the std, and the other responses of its group
all get about the same advantage, however they rank among themselves. The
pairwise win rate looks only at the order of the scores: it is bounded,
unchanged by any strictly increasing change of the reward, and exactly 0 for
a group of equal scores. On binary (right/wrong) scores it equals RLOO.
"""

from __future__ import annotations

import attrs
import torch
from jaxtyping import Float
from torch import Tensor

from rlcore import typecheck
from rlcore.advantages import AdvantageBatch, AdvantageConfig
from rlcore.tokens import broadcast_to_tokens
from rlcore.types import Advantages

__all__ = ["NAME", "WinRateEstimator", "pairwise_win_rate"]

NAME = "win_rate"


@torch.no_grad()
@typecheck
def pairwise_win_rate(
    scores: Float[Tensor, "groups group_size"], margin: float = 0.0
) -> Float[Tensor, "groups group_size"]:
    """Centred pairwise win rate of each response within its prompt group.

    Âᵢ = 1/(n−1) Σⱼ≠ᵢ sign_δ(sᵢ − sⱼ),   sign_δ(x) = sign(x) if |x| > δ, else 0

    that is (wins − losses)/(n − 1) against the other n − 1 responses to the
    same prompt, δ = ``margin``. With δ = 0 it is the centred mid-rank
    (2 rᵢ − (n − 1))/(n − 1), rᵢ ∈ [0, n − 1] the rank of sᵢ with ties averaged:
    the centred-rank fitness shaping of evolution strategies (Salimans et al.
    2017, arXiv:1703.03864), scaled to [−1, 1] and applied per prompt group.
    Properties:

    - Âᵢ ∈ [−1, 1]; Σᵢ Âᵢ = 0 in every group; a group of equal scores gives 0;
    - with δ = 0, invariant under any strictly increasing f: Â(f(s)) = Â(s);
    - on binary scores, equal to RLOO: sᵢ − 1/(n−1) Σⱼ≠ᵢ sⱼ.

    A margin δ > 0 treats scores closer than δ as a tie (a noisy reward model's
    near-equal scores carry no preference).
    A NaN score makes its group's advantages NaN. Costs O(n²) per group,
    negligible at the group sizes of RL post-training.
    """
    size = scores.shape[-1]
    if size < 2:
        raise ValueError(
            f"scores has shape {tuple(scores.shape)}: a win rate needs at least 2 responses "
            "per group (group_size >= 2)"
        )
    if not margin >= 0.0:
        raise ValueError(f"margin must be a non-negative float, got {margin}")
    difference = scores.unsqueeze(-1) - scores.unsqueeze(-2)  # [groups, i, j]: sᵢ − sⱼ
    outcome = (difference > margin).to(scores.dtype) - (difference < -margin).to(scores.dtype)
    # A comparison with NaN is False, which would make a NaN score tie with everything.
    outcome = torch.where(difference.isnan(), difference, outcome)
    return outcome.sum(dim=-1) / (size - 1)


@attrs.frozen
class WinRateEstimator:
    """The registry entry: `pairwise_win_rate` of the outcome scores, on every valid token.

    An instance is an `rlcore.advantages.AdvantageEstimator`; ``margin`` is δ,
    a hyperparameter `AdvantageConfig` does not have. Instances with the same
    margin compare equal, so registering one twice is not a replacement.
    """

    margin: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))

    def __call__(self, batch: AdvantageBatch, config: AdvantageConfig) -> Advantages:
        scores = batch.grouped_scores(NAME)  # [groups, group_size]: Σₜ mₜ rₜ per response
        per_sequence = pairwise_win_rate(scores, self.margin).reshape(-1)
        advantages = broadcast_to_tokens(per_sequence, batch.mask)
        return Advantages(advantages=advantages, returns=advantages)

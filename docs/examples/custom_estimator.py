"""A custom advantage estimator: leave-one-out baseline on length-penalised scores.

Each response i of a prompt group gets the outcome score sᵢ minus a penalty
proportional to its length, then the RLOO baseline of the other responses:

    s̃ᵢ = sᵢ − β · nᵢ / L          nᵢ valid tokens of response i, L the length budget
    Âᵢ = s̃ᵢ − 1/(n−1) Σⱼ≠ᵢ s̃ⱼ     (`rlcore.advantages.rloo`)

Among responses with the same score, shorter ones get the larger advantage; β
is what a response of the full budget L costs in score. L is a constant (the
generation limit), not the padded width of the batch, so the penalty does not
depend on how a batch happens to be padded. The estimator is registered in
`rlcore.registry.ADVANTAGES`, checked with
`rlcore.testing.check_advantage_estimator`, and run on a small batch.

Run it from the repository root::

    .venv/bin/python docs/examples/custom_estimator.py
"""

from __future__ import annotations

import attrs
import torch

from rlcore.advantages import AdvantageBatch, AdvantageConfig, rloo
from rlcore.registry import ADVANTAGES
from rlcore.testing import check_advantage_estimator
from rlcore.tokens import broadcast_to_tokens, place_on_last_token, response_mask
from rlcore.types import Advantages

NAME = "rloo_length_penalty"


@attrs.frozen
class LengthPenalisedRLOO:
    """RLOO on sᵢ − β · nᵢ / L. An instance is an `AdvantageEstimator`."""

    penalty: float = 0.5  # β
    max_length: int = attrs.field(default=6, validator=attrs.validators.gt(0))  # L

    def __call__(self, batch: AdvantageBatch, config: AdvantageConfig) -> Advantages:
        with torch.no_grad():
            scores = batch.grouped_scores(NAME)  # [groups, group_size], Σₜ mₜ rₜ per row
            lengths = batch.mask.sum(dim=-1).to(scores.dtype).view_as(scores)
            penalised = scores - self.penalty * lengths / self.max_length
            per_sequence = rloo(penalised).reshape(-1)
            advantages = broadcast_to_tokens(per_sequence, batch.mask)
        return Advantages(advantages=advantages, returns=advantages)


def small_batch() -> AdvantageBatch:
    """Two prompts, two responses each; EOS is token 2, padding token 0."""
    tokens = torch.tensor(
        [
            [5, 7, 2, 0, 0, 0],  # prompt 0: right, short
            [5, 7, 9, 9, 9, 2],  # prompt 0: right, long
            [4, 2, 0, 0, 0, 0],  # prompt 1: wrong, short
            [4, 8, 8, 2, 0, 0],  # prompt 1: right
        ]
    )
    mask = response_mask(tokens, eos_id=2)
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0])
    return AdvantageBatch(token_rewards=place_on_last_token(scores, mask), mask=mask, group_size=2)


def main() -> None:
    # force=True: main() may run more than once in one process (a notebook, a test).
    ADVANTAGES.register(NAME, LengthPenalisedRLOO(penalty=0.5, max_length=6), force=True)
    estimator = ADVANTAGES.get(NAME)

    check_advantage_estimator(estimator, group_size=2, max_examples=20)
    print(f"check_advantage_estimator({NAME!r}): passed")

    batch = small_batch()
    config = AdvantageConfig()
    ours = estimator(batch, config).advantages
    plain = ADVANTAGES.get("rloo")(batch, config).advantages
    print("row  length  rloo    rloo_length_penalty")
    for row in range(batch.mask.shape[0]):
        length = int(batch.mask[row].sum())
        print(f"{row:>3}  {length:>6}  {plain[row, 0]:+.3f}  {ours[row, 0]:+.3f}")


if __name__ == "__main__":
    main()

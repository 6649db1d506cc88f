"""A batch's token advantages from its outcome scores, by the estimator the config names.

Run on the driver by the reasoning trainer between the reward and the update (and by
custom trainers): the scores go on the responses' last tokens and rlcore's registered
estimator (``algorithm.adv_type``) does the rest, with the hyperparameters the config
sets for it (`rlshell.hyperparameters`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlcore.advantages import AdvantageBatch, AdvantageConfig
from rlcore.registry import ADVANTAGES
from rlcore.tokens import place_on_last_token
from rlcore.types import Advantages
from rlshell.config import Config
from rlshell.hyperparameters import ESTIMATOR_KEYS, read_for
from rlshell.rollout import RolloutBatch

__all__ = ["compute_advantages", "outcome_token_rewards"]


def compute_advantages(
    batch: RolloutBatch,
    scores: Tensor,
    config: Config,
    values: Tensor | None = None,
    token_rewards: Tensor | None = None,
) -> Advantages:
    """Token advantages (and returns) of a batch from its outcome scores, by
    ``algorithm.adv_type``.

    The score of each response is placed on its last valid token
    (`rlcore.tokens.place_on_last_token`) and the registered estimator does
    the rest (GRPO: (s − mean_group)/(std_group + ε) on every token; GAE: the
    critic's ``values`` of the response tokens, the returns are its targets).
    ``token_rewards``: the token rewards when the trainer shaped them further
    (the KL penalty in the reward, `rlcore.shaping.kl_penalized_rewards`);
    ``scores`` are then not read.
    """
    algorithm = config.algorithm
    if token_rewards is None:
        token_rewards = outcome_token_rewards(batch, scores)
    estimator = ADVANTAGES.get(algorithm.adv_type)
    return estimator(
        AdvantageBatch(
            token_rewards=token_rewards,
            mask=batch.trained_mask,
            group_size=batch.group_size,
            values=None if values is None else values.to(torch.float32),
        ),
        AdvantageConfig(**read_for(ADVANTAGES, algorithm.adv_type, config, ESTIMATOR_KEYS)),
    )


def outcome_token_rewards(batch: RolloutBatch, scores: Tensor) -> Tensor:
    """Each response's score on its last trained token, plus the per-turn rewards its
    rollout gave (`RolloutBatch.token_rewards`, a multi-turn rollout's)."""
    placed = place_on_last_token(scores.to(torch.float32), batch.trained_mask)
    return placed if batch.token_rewards is None else placed + batch.token_rewards.to(placed)

"""Reward worker: a Ray worker that scores responses in its own warm `RewardPool`.

reward = RewardWorker.create_group(cfg.reward).launch(cluster, plan.component("reward"))
(results,) = reward.score(responses, answers).wait()    # {reward name: RewardResult}, rank 0's
"""

from __future__ import annotations

from collections.abc import Sequence

from rlshell.cluster.worker import Worker
from rlshell.config import RewardConfig
from rlshell.rewards.pool import RewardPool, RewardResult
from rlshell.rewards.weighted import WeightedReward

__all__ = ["RewardWorker"]


class RewardWorker(Worker):
    """Owns a `RewardPool` of ``cfg.num_processes`` processes scoring the run's rewards.

    The rewards are ``cfg.reward_type``, or the registered names of
    ``cfg.weights`` (`rlshell.rewards.weighted.WeightedReward.pooled`; the
    length penalty is the driver's). An unknown reward fails the launch (the
    pool checks the names at construction); a call that hangs or raises
    scores its sample as failed for its reward and is counted in that
    reward's `RewardResult`, which also carries the first failure of each
    kind with its traceback (`RewardResult.failures`) for the driver to show.
    """

    def __init__(self, cfg: RewardConfig) -> None:
        self.pool = RewardPool(
            WeightedReward.of(cfg).pooled,
            timeout_s=cfg.timeout_s,
            num_processes=cfg.num_processes,
            memory_mb=cfg.memory_mb,
            isolation=cfg.isolation,
        )

    def score(
        self,
        responses: Sequence[str],
        answers: Sequence[str],
        reward_types: Sequence[str] | None = None,
    ) -> dict[str, RewardResult]:
        """Score ``responses[i]`` against ``answers[i]`` with each of ``reward_types`` (all the
        pool's rewards by default); see `RewardPool.score_each`."""
        return self.pool.score_each(responses, answers, reward_types)

    def close(self) -> None:
        """Stop the pool's processes (the group's shutdown kills them in any case)."""
        self.pool.close()

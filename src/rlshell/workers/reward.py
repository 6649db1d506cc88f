"""Reward worker: a Ray worker that scores responses in its own warm `RewardPool`.

reward = RewardWorker.create_group(cfg.reward).launch(cluster, plan.component("reward"))
(result,) = reward.score(responses, answers).wait()      # one RewardResult per rank
"""

from __future__ import annotations

from collections.abc import Sequence

from rlshell.cluster.worker import Worker
from rlshell.config import RewardConfig
from rlshell.rewards.pool import RewardPool, RewardResult

__all__ = ["RewardWorker"]


class RewardWorker(Worker):
    """Owns a `RewardPool` of ``cfg.num_processes`` processes scoring ``cfg.reward_type``.

    An unknown reward type fails the launch (the pool checks the name at
    construction); a call that hangs or raises scores its sample as failed and
    is counted in the returned `RewardResult`, which also carries the first
    failure of each kind with its traceback (`RewardResult.failures`) for the
    driver to show.
    """

    def __init__(self, cfg: RewardConfig) -> None:
        self.pool = RewardPool(
            cfg.reward_type, timeout_s=cfg.timeout_s, num_processes=cfg.num_processes
        )

    def score(self, responses: Sequence[str], answers: Sequence[str]) -> RewardResult:
        """Score ``responses[i]`` against ``answers[i]``; see `RewardPool.score`."""
        return self.pool.score(responses, answers)

    def close(self) -> None:
        """Stop the pool's processes (the group's shutdown kills them in any case)."""
        self.pool.close()

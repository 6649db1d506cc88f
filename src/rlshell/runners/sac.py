"""Asynchronous SAC: while the learner trains on chunk k the collectors gather chunk k + 1.

One step is one chunk: ``runner.rollout_steps`` steps of every env
(``env.num_envs × rollout_steps`` transitions) from the collectors
(`rlshell.workers.sac_workers.SACCollector`, the ``rollout,env`` placement),
the learner's updates on it (`SACLearnerWorker`, the ``actor``, one process),
and the new weights queued to the collectors behind the chunk they are
collecting (Ray runs a worker's calls in order), so the policy that collects
chunk k + 2 is the one trained on chunk k. Chunks before
``algorithm.sac.learning_starts`` transitions use uniform random actions. A
checkpoint holds the learner, its replay buffer and RNG states; the envs
start new episodes on resume.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Self

from rlshell.cluster.group import GroupCall, WorkerGroup
from rlshell.cluster.placement import PlacementPlan
from rlshell.cluster.ray_cluster import Cluster
from rlshell.config import Config
from rlshell.metrics import merge_rank_metrics
from rlshell.runners.embodied import EmbodiedTrainer
from rlshell.runners.rules.embodied import SACRules
from rlshell.runners.spec import RunSpec
from rlshell.runners.trainer import launched_together
from rlshell.workers.sac_workers import SACCollector, SACLearnerWorker

__all__ = ["SACTrainer"]


class SACTrainer(SACRules, EmbodiedTrainer):
    """Env collectors and one learner, overlapped a chunk apart."""

    def __init__(
        self,
        config: Config,
        collectors: WorkerGroup[SACCollector],
        learner: WorkerGroup[SACLearnerWorker],
        stack: ExitStack,
    ) -> None:
        super().__init__(config, learner, stack)
        self.collectors = collectors
        self.learner = learner
        self.chunk = config.env.num_envs * config.runner.rollout_steps
        self._pending: GroupCall | None = None  # the chunk being collected

    @classmethod
    def launch(cls, spec: RunSpec, cluster: Cluster, plan: PlacementPlan, run_dir: Path) -> Self:
        config = spec.config
        timeout = config.cluster.call_timeout_s
        stack = ExitStack()
        try:
            started = time.perf_counter()
            collectors, learner = launched_together(
                stack,
                cluster,
                timeout,
                (SACCollector.create_group(config), plan.component("env")),
                (SACLearnerWorker.create_group(config), plan.component("actor")),
            )
            shares = collectors.init_worker().wait()
            learner.init_worker(shares[0].obs_dim, shares[0].action_dim).wait()
        except BaseException:
            stack.close()
            raise
        print(
            f"workers up in {time.perf_counter() - started:.1f} s ({len(shares)} env workers × "
            f"{shares[0].envs} {shares[0].env_id} envs, 1 learner)",
            flush=True,
        )
        return cls(config, collectors, learner, stack)

    def _random_chunk(self, step: int) -> bool:
        """Whether chunk ``step`` (from 1) acts at random."""
        return (step - 1) * self.chunk < self.config.algorithm.sac.learning_starts

    def step(self, step: int) -> dict[str, float]:
        config = self.config
        started = time.perf_counter()
        if self._pending is None:  # the first step of this process: weights, then a chunk
            weights = self.learner.policy_weights().wait()[0]
            self.collectors.set_weights(weights).wait()
            self._pending = self.collectors.collect(
                config.runner.rollout_steps, self._random_chunk(step)
            )
        collected = self._pending.wait()
        if step < config.runner.max_steps:
            self._pending = self.collectors.collect(
                config.runner.rollout_steps, self._random_chunk(step + 1)
            )
        train_metrics, weights = self.learner.train([batch for batch, _ in collected]).wait()[0]
        if weights is not None:
            self.collectors.set_weights(weights)  # runs after the chunk being collected
        metrics = merge_rank_metrics([m for _, m in collected])
        metrics.update(train_metrics)
        return self.counted(metrics, started)

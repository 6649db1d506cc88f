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
from typing import ClassVar, Self

import attrs

from rlshell.cluster.group import GroupCall, WorkerGroup
from rlshell.cluster.placement import PlacementPlan
from rlshell.cluster.ray_cluster import Cluster
from rlshell.config import Config, OptimConfig
from rlshell.metrics import merge_rank_metrics
from rlshell.runners.embodied import EmbodiedTrainer
from rlshell.runners.offload import not_offloading_problems
from rlshell.runners.spec import ProcessLayout, RunSpec
from rlshell.runners.trainer import launched_together
from rlshell.runners.unread import compile_unread, embodied_unread, stages_unread
from rlshell.workers.sac_workers import SACCollector, SACLearnerWorker

__all__ = ["SACTrainer"]

_EXAMPLE = '{"actor": "0", "rollout,env": "0"}'


class SACTrainer(EmbodiedTrainer):
    """Env collectors and one learner, overlapped a chunk apart."""

    registered_names: ClassVar[tuple[str, ...]] = ("actor.model.model_type", "env.env_type")

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
    def problems(cls, config: Config, plan: PlacementPlan | None) -> list[str]:
        layout = ProcessLayout.of(config.cluster.component_placement)
        problems = []
        if layout.key_of("rollout") != layout.key_of("env"):
            problems.append(
                "cluster.component_placement: SAC's env workers step the policy themselves; "
                f"place 'rollout' and 'env' under one key, e.g. {_EXAMPLE}"
            )
        if layout.key_of("actor") is not None and layout.shared("actor", "env"):
            problems.append(
                "cluster.component_placement: SAC runs its learner ('actor') in a process of its "
                "own beside the env workers, so that stepping and training overlap; give it a "
                f"key of its own, e.g. {_EXAMPLE}"
            )
        problems += not_offloading_problems(config, "SAC")
        sac = config.algorithm.sac
        if sac.learning_starts < sac.batch_size:
            problems.append(
                f"algorithm.sac.learning_starts: the first update samples batch_size="
                f"{sac.batch_size} transitions, so at least that many must be collected first, "
                f"got {sac.learning_starts}"
            )
        if sac.replay_size < sac.batch_size:
            problems.append(
                f"algorithm.sac.replay_size: {sac.replay_size} is smaller than batch_size "
                f"{sac.batch_size}"
            )
        if plan is not None:
            learners = len(plan.component("actor").workers)
            collectors = len(plan.component("env").workers)
            if learners != 1:
                problems.append(
                    "cluster.component_placement: SAC's learner ('actor') runs in one process, "
                    f"got {learners}"
                )
            if config.env.num_envs % collectors:
                problems.append(
                    f"env.num_envs: {config.env.num_envs} envs do not split evenly over the "
                    f"{collectors} env workers"
                )
        return problems

    @classmethod
    def unread(cls, config: Config) -> dict[str, str]:
        unread = {
            **compile_unread("SAC does not read it"),
            **stages_unread(config, "SAC"),
            **embodied_unread(config, "SAC"),
            "actor.backend": "SAC's learner trains in plain torch in one process; "
            "actor.backend picks the other runners' training backend",
            "actor.fsdp_config": "SAC's learner is one process in plain torch: FSDP shards and "
            "casts nothing",
            "actor.model.gradient_checkpointing": "SAC's learner keeps every activation (its "
            "MLPs are small)",
            "rollout.precision": "SAC's env workers act with the learner's policy as it sends "
            "it (actor.model.precision); leave it null",
        }
        own = (
            "SAC's learner makes its own Adam optimizers at actor.optim.lr (policy), "
            "algorithm.sac.q_lr and algorithm.sac.alpha_lr, without clipping or schedule"
        )
        for field in attrs.fields(OptimConfig):
            if field.name != "lr":
                unread[f"actor.optim.{field.name}"] = own
        losses = (
            "SAC trains with its own losses (rlcore's sac_*, set by algorithm.sac.* and "
            "algorithm.gamma); this key sets PPO's or the reasoning runner's"
        )
        for key in (
            "adv_type",
            "group_size",
            "clip_low",
            "clip_high",
            "dual_clip",
            "loss_agg_mode",
            "entropy_coef",
            "lam",
            "baseline_form",
            "ppo_epochs",
            "num_minibatches",
            "vf_coef",
            "value_clip",
            "norm_adv",
            "norm_reward",
            "target_kl",
        ):
            unread[f"algorithm.{key}"] = losses
        return unread

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

"""The worker groups of a reasoning run, started together, and the calls that span a group.

`launch_groups` starts the actor, the reward, and where the run has them the
rollout, the reference and the critic groups side by side
(`rlshell.runners.trainer.launched_together`), initialises them and hands the
actor the rollout's handles. `reference_logprobs` spreads a batch's rows over
the reference ranks.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import torch
from attrs import frozen

from rlshell.cluster.group import WorkerGroup
from rlshell.cluster.placement import PlacementPlan
from rlshell.cluster.ray_cluster import Cluster
from rlshell.config import Config
from rlshell.rollout import RolloutBatch
from rlshell.runners.facts import RunFacts
from rlshell.runners.rules.reasoning import optimizer_steps_per_batch
from rlshell.runners.trainer import Launch, launched_together
from rlshell.workers.actor import ActorWorker
from rlshell.workers.critic import CriticWorker
from rlshell.workers.reward import RewardWorker
from rlshell.workers.rollout import ReferenceWorker, RolloutWorker

__all__ = ["ReasoningGroups", "launch_groups", "reference_logprobs"]


@frozen
class ReasoningGroups:
    """A running reasoning run's groups. ``rollout`` is the actor's own group where the
    rollout runs in the actor's processes; ``reference`` and ``critic`` are None where the
    run has none (``algorithm.kl_coef`` 0; no critic trained)."""

    actor: WorkerGroup[ActorWorker]
    reward: WorkerGroup[RewardWorker]
    rollout: WorkerGroup[Any]
    reference: WorkerGroup[ReferenceWorker] | None
    critic: WorkerGroup[CriticWorker] | None


def launch_groups(
    stack: ExitStack,
    cluster: Cluster,
    plan: PlacementPlan,
    config: Config,
    facts: RunFacts,
    tokenizer_dir: str,
) -> ReasoningGroups:
    """Every group the run needs, started on ``plan`` and initialised; each is shut down when
    ``stack`` closes, from the moment its actors exist. ``config``: ``facts.config`` with
    the tokenizer's ids."""
    rollout_in_actor = facts.rollout_in_actor
    updates = config.runner.max_steps * optimizer_steps_per_batch(config)
    actor = ActorWorker.create_group(config, updates, rollout_in_actor)
    reward = RewardWorker.create_group(config.reward)
    launches: list[Launch] = [
        (actor, plan.component("actor")),
        (reward, plan.component("reward")),
    ]
    rollout: WorkerGroup[Any] | None = None
    if not rollout_in_actor:
        # Partial rollouts: syncs are offered in a thread of their own, while one generates.
        partial = config.runner.mode == "async" and config.rollout.partial_rollouts
        rollout = RolloutWorker.create_group(config)
        launches.append((rollout, plan.component("rollout"), {"control": 1} if partial else None))
    reference = None
    if config.algorithm.kl_coef > 0:
        reference = ReferenceWorker.create_group(config)
        launches.append((reference, plan.component("reference")))
    critic = None
    if facts.critic:
        critic = CriticWorker.create_group(config, updates)
        launches.append((critic, plan.component("critic")))
    launched_together(stack, cluster, config.cluster.call_timeout_s, *launches)
    calls = [actor.init_worker(tokenizer_dir)]
    if rollout is not None:
        calls.append(rollout.init_worker(tokenizer_dir))
    if reference is not None:
        calls.append(reference.init_worker())
    if critic is not None:
        calls.append(critic.init_worker())
    for call in calls:
        call.wait()
    if rollout is None:
        rollout = actor
    else:
        actor.execute_on(0).set_rollout_handles(rollout.actors).wait()
    return ReasoningGroups(actor, reward, rollout, reference, critic)


def reference_logprobs(
    reference: WorkerGroup[ReferenceWorker], batch: RolloutBatch
) -> torch.Tensor:
    """The reference policy's log-probabilities of ``batch``'s responses, its rows dealt
    round-robin over the reference ranks."""
    ranks = reference.world_size
    rows = [list(range(rank, batch.rows, ranks)) for rank in range(ranks)]
    calls = [
        (mine, reference.execute_on(rank).compute_ref_logprobs(batch.select(mine)))
        for rank, mine in enumerate(rows)
        if mine
    ]
    out = torch.zeros_like(batch.logprobs)
    for mine, call in calls:
        part = call.wait()[0]
        out[torch.as_tensor(mine), : part.shape[1]] = part
    return out

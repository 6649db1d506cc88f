"""Embodied PPO (and embodied GRPO) with env, rollout and actor in the same processes.

Placement ``"actor,rollout,env": ...``: each rank of the actor group is also
the rollout and the env worker (`rlshell.workers.embodied_actor.EmbodiedWorker`).
Cheap environments cannot afford a Ray round trip per env step, so a rank
steps its share of ``env.num_envs`` envs with its own copy of the policy for
``runner.rollout_steps`` steps, then all ranks run PPO's update together as
FSDP2 ranks. One Ray call per rank per step:

    rollout (collect_rollout, parameters gathered once) → GAE (rlcore) →
    ppo_epochs × num_minibatches steps of the registered policy loss → metrics

The policy loss is ``algorithm.loss_type``'s entry in `rlcore.registry.POLICY_LOSSES`
(PPO's clipped loss by default; a plug-in registered rlcore's way or RLinf's,
`rlshell.rlinf_plugins`), as in the reasoning runner. With another estimator
than ``gae`` as ``algorithm.adv_type`` (no critic) the rollout is one episode
per env from group-seeded resets and the registered estimator scores them
(`rlshell.workers.embodied_grpo`: GRPO's group-normalised returns, or a
plug-in of the same registry). Checkpoints hold
each rank's model, optimizer, schedule and RNG states; envs start new
episodes on resume.
"""

from __future__ import annotations

import time
from collections.abc import Container, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Self

from rlshell.cluster.errors import WorkerDiedError
from rlshell.cluster.group import WorkerGroup
from rlshell.cluster.placement import PlacementPlan
from rlshell.cluster.ray_cluster import Cluster
from rlshell.config import Config
from rlshell.metrics import merge_rank_metrics
from rlshell.runners.embodied import EmbodiedTrainer
from rlshell.runners.rules.embodied import CollocatedPPORules
from rlshell.runners.spec import RunSpec
from rlshell.runners.trainer import Cadence, launched_together
from rlshell.workers.embodied_actor import EmbodiedWorker

__all__ = ["CollocatedPPOTrainer", "train_steps"]


def train_steps(
    group: WorkerGroup[Any], count: int, after: Container[int] = ()
) -> Iterator[dict[str, float]]:
    """The merged metrics of ``count`` ``train_step`` calls on ``group``, in order.

    The next call is queued while one runs (Ray runs an actor's calls in the
    order they were made), so a worker starts its next rollout at once
    instead of idling through the driver's round trip (~2 ms a step, a tenth
    of a CartPole step). After the i-th result (from 1) with i in ``after``
    nothing is queued until the caller asks for the next: a checkpoint saved
    then is the state after step i. A failed call raises from the iterator;
    a call queued behind it fails or is dropped with the group.
    """
    pending = group.train_step() if count > 0 else None
    for i in range(1, count + 1):
        call = pending
        assert call is not None
        pending = group.train_step() if i < count and i not in after else None
        yield merge_rank_metrics(call.wait())
        if pending is None and i < count:
            pending = group.train_step()


class CollocatedPPOTrainer(CollocatedPPORules, EmbodiedTrainer):
    """Embodied PPO whose actor ranks step their own envs (`EmbodiedWorker`)."""

    def __init__(self, config: Config, group: WorkerGroup[EmbodiedWorker], stack: ExitStack):
        super().__init__(config, group, stack)
        self.group = group
        self._results: Iterator[dict[str, float]] | None = None

    @classmethod
    def launch(cls, spec: RunSpec, cluster: Cluster, plan: PlacementPlan, run_dir: Path) -> Self:
        config = spec.config
        stack = ExitStack()
        try:
            (group,) = launched_together(
                stack,
                cluster,
                config.cluster.call_timeout_s,
                (EmbodiedWorker.create_group(config, spec.critic), plan.component("actor")),
            )
            started = time.perf_counter()
            shares = group.init_worker().wait()
        except BaseException as error:
            stack.close()
            if isinstance(error, WorkerDiedError):
                _note_env_crash(error, config)
            raise
        print(
            f"workers up in {time.perf_counter() - started:.1f} s ({len(shares)} ranks × "
            f"{shares[0].envs} {shares[0].env_id} envs, env and policy in the same processes)",
            flush=True,
        )
        return cls(config, group, stack)

    def step(self, step: int) -> dict[str, float]:
        started = time.perf_counter()
        if self._results is None:
            cadence = Cadence.of(self.config)
            steps = range(step, cadence.max_steps + 1)
            saves = {s - step + 1 for s in steps if cadence.checkpoint_due(s)}
            self._results = train_steps(self.group, len(steps), after=saves)
        try:
            metrics = next(self._results)
        except WorkerDiedError as error:
            _note_env_crash(error, self.config)
            raise
        return self.counted(metrics, started)


def _note_env_crash(error: WorkerDiedError, config: Config) -> None:
    """A dead rank's traceback died with it: say what it was running."""
    error.extend_message(
        f"\nIt was stepping env {config.env.env_id or config.env.env_type} (an env that "
        "crashes its process ends this way); checkpoint.resume=auto continues from the last "
        "checkpoint."
    )

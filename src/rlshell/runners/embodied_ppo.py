"""Embodied PPO (and embodied GRPO) with env, rollout and actor in the same processes.

Placement ``"actor,rollout,env": ...``: each rank of the actor group is also
the rollout and the env worker (`rlshell.workers.embodied_actor.EmbodiedWorker`).
Cheap environments cannot afford a Ray round trip per env step, so a rank
steps its share of ``env.num_envs`` envs with its own copy of the policy for
``runner.rollout_steps`` steps, then all ranks run PPO's update together as
FSDP2 ranks. One Ray call per rank per step:

    rollout (collect_rollout, parameters gathered once) → GAE (rlcore) →
    ppo_epochs × num_minibatches PPO steps (rlcore's losses) → metrics

With a group estimator as ``algorithm.adv_type`` (no critic) the rollout is
one episode per env from group-seeded resets and the advantages are
group-normalised returns (`rlshell.workers.embodied_grpo`). Checkpoints hold
each rank's model, optimizer, schedule and RNG states; envs start new
episodes on resume.
"""

from __future__ import annotations

import time
from collections.abc import Container, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, ClassVar, Self

from rlshell.cluster.errors import WorkerDiedError
from rlshell.cluster.group import WorkerGroup
from rlshell.cluster.placement import PlacementPlan
from rlshell.cluster.ray_cluster import Cluster
from rlshell.config import Config
from rlshell.metrics import merge_rank_metrics
from rlshell.runners.embodied import EmbodiedTrainer
from rlshell.runners.offload import not_offloading_problems
from rlshell.runners.spec import ProcessLayout, RunSpec, resolve_spec
from rlshell.runners.trainer import Cadence, launched_together
from rlshell.runners.unread import embodied_unread, ppo_update_unread, sac_unread
from rlshell.workers.embodied_actor import EmbodiedWorker

__all__ = [
    "COLLOCATED_EXAMPLE",
    "HYBRID_EXAMPLE",
    "CollocatedPPOTrainer",
    "actor_share_problems",
    "train_steps",
]

COLLOCATED_EXAMPLE = '{"actor,rollout,env": "0:0-1"}'
HYBRID_EXAMPLE = '{"actor": "0:0-1", "rollout": "0:0", "env": "0:0"}'
_TRIO = ("actor", "rollout", "env")


def ppo_problems(config: Config, who: str) -> list[str]:
    """What both embodied PPO trainers refuse: a policy loss other than PPO's, offloading."""
    problems = not_offloading_problems(config, who)
    if config.algorithm.loss_type != "ppo":
        problems.append(
            f"algorithm.loss_type: {who}'s update is rlcore's ppo_policy_loss "
            f"(rlshell.workers.embodied_update); '{config.algorithm.loss_type}' is a reasoning "
            "runner's loss (or 'sac' with the SAC placement). Set algorithm.loss_type=ppo"
        )
    return problems


def ppo_unread(config: Config, who: str) -> dict[str, str]:
    """What both embodied PPO trainers leave unread (`rlshell.runners.unread`)."""
    critic = resolve_spec(config).critic
    return {
        **embodied_unread(config, who),
        **sac_unread(who),
        **ppo_update_unread(config, critic, who),
    }


def actor_share_problems(config: Config, ranks: int) -> list[str]:
    """Each of the actor's ``ranks`` trains on an equal share of ``env.num_envs`` envs,
    whose samples must fill ``algorithm.num_minibatches``."""
    problems = []
    if config.env.num_envs % ranks:
        problems.append(
            f"env.num_envs: {config.env.num_envs} envs do not split evenly over the actor's "
            f"{ranks} ranks"
        )
    samples = config.env.num_envs // ranks * config.runner.rollout_steps
    if config.algorithm.num_minibatches > samples:
        problems.append(
            f"algorithm.num_minibatches: {config.algorithm.num_minibatches} minibatches of a "
            f"rank's {samples} samples per step (env.num_envs / ranks × runner.rollout_steps)"
        )
    return problems


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


class CollocatedPPOTrainer(EmbodiedTrainer):
    """Embodied PPO whose actor ranks step their own envs (`EmbodiedWorker`)."""

    registered_names: ClassVar[tuple[str, ...]] = (
        "actor.model.model_type",
        "algorithm.adv_type",
        "env.env_type",
    )

    def __init__(self, config: Config, group: WorkerGroup[EmbodiedWorker], stack: ExitStack):
        super().__init__(config, group, stack)
        self.group = group
        self._results: Iterator[dict[str, float]] | None = None

    @classmethod
    def problems(cls, config: Config, plan: PlacementPlan | None) -> list[str]:
        layout = ProcessLayout.of(config.cluster.component_placement)
        keys = [layout.key_of(name) for name in _TRIO]
        if None not in keys and len(set(keys)) == 2:  # a missing one is a missing placement
            grouped = next(key for key in keys if keys.count(key) == 2)
            alone = next(name for name, key in zip(_TRIO, keys, strict=True) if key != grouped)
            # Nothing else is worth checking against a layout no trainer runs.
            return [
                f"cluster.component_placement: the embodied PPO runner places env, rollout "
                f"and actor either all under one key (collocated, e.g. {COLLOCATED_EXAMPLE}) "
                f"or each under its own (hybrid, pipelined, e.g. {HYBRID_EXAMPLE}); "
                f"'{grouped}' groups two of them apart from '{alone}'"
            ]
        problems = []
        if plan is not None:
            ranks = len(plan.component("actor").workers)
            problems += actor_share_problems(config, ranks)
            for key, on in (
                ("actor.compile", config.actor.compile),
                ("rollout.compile", config.rollout.compile),
            ):
                if on and ranks != 1:
                    what = "update" if key == "actor.compile" else "rollout call"
                    problems.append(
                        f"{key}: the compiled {what} needs one actor rank (an unsharded "
                        f"policy); got {ranks}. Set {key}=false or place the actor on one "
                        'process, e.g. {"actor,rollout,env": "0:0"}'
                    )
        if config.actor.compile and config.algorithm.adv_type != "gae":
            problems.append(
                f"actor.compile: compiles PPO's update with algorithm.adv_type 'gae'; got "
                f"'{config.algorithm.adv_type}', whose windows vary in size. Set "
                "actor.compile=false"
            )
        problems += ppo_problems(config, "the embodied PPO runner")
        return problems

    @classmethod
    def unread(cls, config: Config) -> dict[str, str]:
        key = ProcessLayout.of(config.cluster.component_placement).key_of("actor")
        return {
            **ppo_unread(config, "the embodied PPO runner"),
            "rollout.precision": (
                f"'{key}' places the rollout in the actor's processes, where it acts with the "
                "actor's own module (in actor.model.precision); leave it null"
            ),
            "rollout.pipeline_stage_num": (
                f"{config.rollout.pipeline_stage_num} stages pipeline env workers and rollout "
                f"workers of their own, but '{key}' places env, rollout and actor in the same "
                f"processes; use 1 there, or the hybrid placement, e.g. {HYBRID_EXAMPLE}"
            ),
        }

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

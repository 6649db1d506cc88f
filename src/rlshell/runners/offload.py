"""Who moves to host memory between a reasoning step's phases: decided once from config and plan.

Where the plan has the actor and the rollout time-share a GPU, each moves
out of the other's way: while the rollout generates, the actor's optimizer
state and (unless ``rollout.weight_sync`` is ``shared``, whose engine
generates with the actor's own parameters) its parameters and gradients sit
in host memory; while the actor updates, a rollout in processes of its own
moves its model there. ``actor.enable_offload`` and ``rollout.enable_offload``:

- null (the default): offload exactly where the plan shares a GPU;
- true: offload, and refuse a plan where that makes no room for anything
  (no GPU, or no GPU shared with the other side);
- false: never offload; the planner then refuses a plan that shares a GPU
  (`rlshell.runners.validation`).

Pure: `plan_offload` and `offload_problems` read a run's facts (its config and layout) and a
`rlshell.cluster.placement.PlacementPlan` (a simulated one as well) and
nothing else. `rlshell.runners.reasoning.ReasoningTrainer` acts on the result.
"""

from __future__ import annotations

from attrs import frozen

from rlshell.cluster.placement import ComponentPlan, PlacementPlan
from rlshell.config import Config
from rlshell.runners.facts import RunFacts

__all__ = ["OffloadPlan", "not_offloading_problems", "offload_problems", "plan_offload"]


@frozen
class OffloadPlan:
    """What moves to host memory, and when.

    ``actor_optimizer``: the actor's optimizer state, while the rollout
    generates. ``actor_params``: the actor's parameters and gradients, then
    too. ``rollout``: the rollout workers' model, while the actor updates.
    """

    actor_optimizer: bool = False
    actor_params: bool = False
    rollout: bool = False

    @property
    def any(self) -> bool:
        return self.actor_optimizer or self.actor_params or self.rollout


def _gpus(component: ComponentPlan | None) -> frozenset[tuple[int, int]]:
    return frozenset() if component is None else component.devices


def _component(plan: PlacementPlan, name: str) -> ComponentPlan | None:
    return next((c for c in plan.components if c.name == name), None)


def _shared_gpus(plan: PlacementPlan) -> frozenset[tuple[int, int]]:
    """The GPUs both the actor and the rollout hold."""
    return _gpus(_component(plan, "actor")) & _gpus(_component(plan, "rollout"))


def plan_offload(facts: RunFacts, plan: PlacementPlan) -> OffloadPlan:
    """What a reasoning run of ``config`` on ``plan`` offloads (see the module docstring)."""
    shared = bool(_shared_gpus(plan))
    config, in_actor = facts.config, facts.rollout_in_actor
    actor = config.actor.enable_offload
    actor_offloads = shared if actor is None else actor and shared
    rollout = config.rollout.enable_offload
    # A rollout in the actor's processes makes room through the actor's offload.
    rollout_offloads = not in_actor and (shared if rollout is None else rollout and shared)
    return OffloadPlan(
        actor_optimizer=actor_offloads,
        actor_params=actor_offloads and config.rollout.weight_sync != "shared",
        rollout=rollout_offloads,
    )


def offload_problems(facts: RunFacts, plan: PlacementPlan) -> list[str]:
    """``enable_offload=true`` where it would make room for nothing, each with the reason."""
    problems = []
    shared = _shared_gpus(plan)
    config, in_actor = facts.config, facts.rollout_in_actor
    for name, other in (("actor", "rollout"), ("rollout", "actor")):
        section = config.actor if name == "actor" else config.rollout
        if section.enable_offload is not True:
            continue
        key = f"{name}.enable_offload"
        if name == "rollout" and in_actor:
            problems.append(
                f"{key}: the rollout runs in the actor's processes (one placement key), where "
                "actor.enable_offload makes room for it; rollout.enable_offload moves a rollout "
                "of its own. Leave it null"
            )
        elif not _gpus(_component(plan, name)):
            problems.append(
                f"{key}: the plan gives the {name} no GPU; on CPU the weights already live in "
                "host memory. Leave it null (offload where a GPU is shared)"
            )
        elif not shared:
            problems.append(
                f"{key}: the {name}'s GPUs are not shared with the {other}, so offloading makes "
                "room for nothing. Leave it null (offload where a GPU is shared)"
            )
    return problems


def not_offloading_problems(config: Config, who: str) -> list[str]:
    """``enable_offload=true`` for a trainer (``who``) that never offloads between phases."""
    return [
        f"{name}.enable_offload: {who} does not offload between phases (its workers keep "
        "their models where they are); leave it null"
        for name, section in (("actor", config.actor), ("rollout", config.rollout))
        if section.enable_offload is True
    ]

"""The run spec: what a config asks for, resolved once, read by everything after.

`resolve_spec` turns a config into a `RunSpec`: which trainer runs it (its
rules, `rlshell.runners.rules`, without importing the trainer) and the facts
that trainer and its workers branch on (whether a critic is trained,
which components share processes). Nothing downstream re-derives a mode from
strings (``loss_type == "sac"``, ``adv_type != "gae"``, placement keys): it
reads the spec. Which trainer runs what:

    runner_type  algorithm              component_placement               trainer
    reasoning    an rlcore estimator    rollout with or apart from actor  ReasoningTrainer
    sft          (loss_agg_mode only)   actor                             SFTTrainer
    embodied     gae or group estimator "actor,rollout,env" one key       CollocatedPPOTrainer
    embodied     gae                    actor, rollout, env: three keys   PipelinedPPOTrainer
    embodied     loss_type sac          "actor" apart from "rollout,env"  SACTrainer
    probe        (not read)             any                               none: the probe
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from attrs import frozen

from rlshell.config import Config, PlacementEntry

if TYPE_CHECKING:
    from rlshell.runners.rules import TrainerRules
    from rlshell.runners.trainer import Trainer

__all__ = ["ProcessLayout", "RunSpec", "resolve_spec", "trainer_class", "trainer_classes"]


@frozen
class ProcessLayout:
    """Which placement key places each component: components under one key share processes.

    ``{"actor,rollout": "0-1", "reward": "0"}``: the actor's ranks also run the
    rollout; the reward runs in processes of its own.
    """

    keys: Mapping[str, str]

    @classmethod
    def of(cls, placement: Mapping[str, str | PlacementEntry]) -> ProcessLayout:
        return cls(
            {name.strip(): key for key in placement for name in key.split(",") if name.strip()}
        )

    def shared(self, *names: str) -> bool:
        """Whether every one of ``names`` is placed, all under the same key."""
        keys = {self.keys.get(name) for name in names}
        return None not in keys and len(keys) == 1

    def apart(self, *names: str) -> bool:
        """Whether every one of ``names`` is placed, each under a key of its own."""
        keys = [self.keys.get(name) for name in names]
        return None not in keys and len(set(keys)) == len(keys)

    def key_of(self, name: str) -> str | None:
        return self.keys.get(name)


@frozen
class RunSpec:
    """A run, resolved from its config: the trainer and the facts it dispatches on.

    ``rules``: the rules of the trainer that runs it (None: the probe, which
    checks a placement and trains nothing); `trainer` imports the trainer class
    itself. ``critic``: a value function is trained (embodied PPO with GAE).
    ``rollout_in_actor``: the rollout runs in the actor's processes (one
    placement key names both).
    """

    config: Config
    rules: type[TrainerRules] | None
    critic: bool
    rollout_in_actor: bool
    layout: ProcessLayout

    @property
    def trainer(self) -> type[Trainer] | None:
        """The `Trainer` class that runs it (imported now: its workers' stacks with it)."""
        return None if self.rules is None else trainer_class(self.rules.trainer_name)


# Each trainer's module, imported only when a run needs that trainer: a reasoning run's
# driver never imports the embodied runners, nor an embodied run's the tokenizer's stack.
_TRAINER_MODULES = {
    "ReasoningTrainer": "rlshell.runners.reasoning",
    "SFTTrainer": "rlshell.runners.sft",
    "CollocatedPPOTrainer": "rlshell.runners.embodied_ppo",
    "PipelinedPPOTrainer": "rlshell.runners.embodied_pipeline",
    "SACTrainer": "rlshell.runners.sac",
}
_PPO_TRAINERS = ("CollocatedPPOTrainer", "PipelinedPPOTrainer")


def trainer_class(name: str) -> type[Trainer]:
    """The trainer class called ``name`` (a key of the installation's trainers)."""
    trainer: type[Trainer] = getattr(importlib.import_module(_TRAINER_MODULES[name]), name)
    return trainer


def trainer_classes() -> dict[str, type[Trainer]]:
    """Every trainer of this installation, by class name."""
    return {name: trainer_class(name) for name in _TRAINER_MODULES}


def _trainer_name(config: Config, layout: ProcessLayout) -> str | None:
    runner = config.runner.runner_type
    if runner == "reasoning":
        return "ReasoningTrainer"
    if runner == "sft":
        return "SFTTrainer"
    if runner == "embodied" and config.algorithm.loss_type == "sac":
        return "SACTrainer"
    if runner == "embodied" and layout.apart("actor", "rollout", "env"):
        return "PipelinedPPOTrainer"
    if runner == "embodied":
        return "CollocatedPPOTrainer"
    return None


def resolve_spec(config: Config) -> RunSpec:
    """The `RunSpec` of ``config`` (the table in this module's docstring).

    Whether the config is one the chosen trainer can run is its rules'
    `rlshell.runners.rules.TrainerRules.problems`; this only picks them.
    """
    from rlshell.runners.rules import rules_of

    layout = ProcessLayout.of(config.cluster.component_placement)
    name = _trainer_name(config, layout)
    return RunSpec(
        config=config,
        rules=None if name is None else rules_of(name),
        critic=name in _PPO_TRAINERS and config.algorithm.adv_type == "gae",
        rollout_in_actor=layout.shared("actor", "rollout"),
        layout=layout,
    )

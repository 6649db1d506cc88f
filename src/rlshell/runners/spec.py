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
    sft, an embodied model (not read)   actor                             EmbodiedSFTTrainer
    embodied     gae or group estimator "actor,rollout,env" one key       CollocatedPPOTrainer
    embodied     gae                    actor, rollout, env: three keys   PipelinedPPOTrainer
    embodied     loss_type sac          "actor" apart from "rollout,env"  SACTrainer
    probe        (not read)             any                               none: the probe
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol, Self

from attrs import frozen

from rlshell.checkpoint import TrainerState
from rlshell.config import Config
from rlshell.runners.facts import ProcessLayout, RunFacts
from rlshell.runners.rules import TrainerRules
from rlshell.runners.rules.embodied import CollocatedPPORules, PipelinedPPORules, SACRules
from rlshell.runners.rules.reasoning import ReasoningRules
from rlshell.runners.rules.sft import EmbodiedSFTRules, SFTRules

if TYPE_CHECKING:
    from rlshell.cluster.placement import PlacementPlan
    from rlshell.cluster.ray_cluster import Cluster

__all__ = [
    "ProcessLayout",
    "RunSpec",
    "Trainer",
    "resolve_spec",
    "rules_of",
    "trainer_class",
    "trainer_classes",
]


class Trainer(TrainerRules, Protocol):
    """One kind of run: its worker groups, one step, evaluation and checkpoints.

    A trainer inherits its rules (`rlshell.runners.rules.TrainerRules`: what it
    cannot run, the keys it does not read), which validation reads without
    importing it. ``curves``: the metric keys `rlshell.metrics.plot_run` draws
    at the end.
    """

    curves: ClassVar[tuple[str, ...]]

    @classmethod
    def launch(cls, spec: RunSpec, cluster: Cluster, plan: PlacementPlan, run_dir: Path) -> Self:
        """Start every worker group of the run; on failure, stop what was started."""
        ...

    def load(self, checkpoint: Path, state: TrainerState) -> int:
        """Restore a checkpoint (``state`` is its ``trainer_state.json``); its step."""
        ...

    def step(self, step: int) -> dict[str, float]:
        """Run step ``step`` (from 1); its metrics."""
        ...

    def evaluate(self, step: int) -> dict[str, float]:
        """``eval/`` metrics of the current policy (only called when ``runner.eval_interval``
        is set, which a trainer that cannot evaluate lists in `unread`)."""
        ...

    def save(self, directory: Path, step: int) -> TrainerState:
        """Write the workers' state of step ``step`` into ``directory``; what the driver
        needs beside it to continue (written last, as ``trainer_state.json``)."""
        ...

    def close(self) -> None:
        """Stop every worker group (idempotent)."""
        ...


@frozen
class RunSpec(RunFacts):
    """A run, resolved from its config: the facts it dispatches on
    (`rlshell.runners.facts.RunFacts`: ``layout``, ``critic``, ``rollout_in_actor``) and
    the trainer that runs it.

    ``rules``: the rules of the trainer that runs it (None: the probe, which
    checks a placement and trains nothing); they read the facts from the spec
    (``rules.problems(spec, plan)``). `trainer` imports the trainer class itself.
    """

    rules: type[TrainerRules] | None

    @property
    def trainer(self) -> type[Trainer] | None:
        """The `Trainer` class that runs it (imported now: its workers' stacks with it)."""
        return None if self.rules is None else trainer_class(self.rules.trainer_name)


# Each trainer's module, imported only when a run needs that trainer: a reasoning run's
# driver never imports the embodied runners, nor an embodied run's the tokenizer's stack.
_TRAINER_MODULES = {
    "ReasoningTrainer": "rlshell.runners.reasoning",
    "SFTTrainer": "rlshell.runners.sft",
    "EmbodiedSFTTrainer": "rlshell.runners.embodied_sft",
    "CollocatedPPOTrainer": "rlshell.runners.embodied_ppo",
    "PipelinedPPOTrainer": "rlshell.runners.embodied_pipeline",
    "SACTrainer": "rlshell.runners.sac",
}


def trainer_class(name: str) -> type[Trainer]:
    """The trainer class called ``name`` (a key of the installation's trainers)."""
    trainer: type[Trainer] = getattr(importlib.import_module(_TRAINER_MODULES[name]), name)
    return trainer


def trainer_classes() -> dict[str, type[Trainer]]:
    """Every trainer of this installation, by class name."""
    return {name: trainer_class(name) for name in _TRAINER_MODULES}


def rules_of(trainer_name: str) -> type[TrainerRules]:
    """The rules of the trainer class called ``trainer_name``."""
    rules: tuple[type[TrainerRules], ...] = (
        ReasoningRules,
        SFTRules,
        EmbodiedSFTRules,
        CollocatedPPORules,
        PipelinedPPORules,
        SACRules,
    )
    return next(r for r in rules if r.trainer_name == trainer_name)


def _trainer_name(config: Config, layout: ProcessLayout) -> str | None:
    runner = config.runner.runner_type
    if runner == "reasoning":
        return "ReasoningTrainer"
    if runner == "sft" and config.actor.model.category == "embodied":
        return "EmbodiedSFTTrainer"
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
    facts = RunFacts.of(config)
    name = _trainer_name(config, facts.layout)
    return RunSpec(
        config=config,
        layout=facts.layout,
        critic=facts.critic,
        rules=None if name is None else rules_of(name),
    )

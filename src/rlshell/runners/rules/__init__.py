"""What each trainer accepts, kept apart from the trainer: validation reads these.

A trainer's rules (`TrainerRules`) are the config keys that name registry
entries it builds, what it cannot run (`TrainerRules.problems`) and the keys
it never reads (`TrainerRules.unread`). They live here, one module per kind
of run, and each trainer class inherits its own (``ReasoningTrainer(ReasoningRules)``):
a dry run or `rlshell.runners.validation.validate` imports these and not the
trainers, whose workers bring torch.distributed, transformers, the
tokenizer and Ray (an sft ``--dry-run`` took 8.0 s and takes 2.7).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

from rlshell.runners.facts import RunFacts

if TYPE_CHECKING:
    from rlshell.cluster.placement import PlacementPlan

__all__ = ["TrainerRules"]


class TrainerRules(Protocol):
    """One kind of run's rules.

    ``trainer_name``: the `rlshell.runners.trainer.Trainer` class that runs it
    (`rlshell.runners.spec.trainer_class` imports it; `rlshell.runners.spec.rules_of`
    finds the rules by it). ``registered_names``: the
    config keys whose values name registry entries it builds
    (``actor.model.model_type``, ``env.env_type``, ...); validation looks each up.
    """

    trainer_name: ClassVar[str]
    registered_names: ClassVar[tuple[str, ...]]

    @classmethod
    def problems(cls, facts: RunFacts, plan: PlacementPlan | None) -> list[str]:
        """What this trainer cannot run in ``facts.config`` (and, when given, ``plan``); each line
        starts with the key path it concerns. Called once, before anything starts."""
        ...

    @classmethod
    def unread(cls, facts: RunFacts) -> dict[str, str]:
        """Key paths (a section names every key under it) this trainer does not read with
        ``facts.config``, each with the reason; validation refuses any of them set."""
        ...

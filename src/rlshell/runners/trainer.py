"""What the run loop drives: the `Trainer` protocol (defined beside the run spec it is launched
from, `rlshell.runners.spec`, and re-exported here), its cadence, and launching groups together.

A trainer owns its worker groups and the choreography of one step between
them; the loop (`rlshell.runners.loop.run`) owns everything around the steps,
the same for every trainer:

    trainer = Trainer.launch(spec, cluster, plan, run_dir)    # every group up
    try:
        start = trainer.load(checkpoint, state) if resuming else 0
        if evaluating and start == 0: log(0, trainer.evaluate(0))
        for step in range(start + 1, max_steps + 1):
            metrics = trainer.step(step)
            if cadence.eval_due(step): metrics |= trainer.evaluate(step)
            log(step, metrics)
            if cadence.checkpoint_due(step): commit(trainer.save(staging, step))
    finally:
        trainer.close()

What a trainer accepts is its own business too, in its rules
(`rlshell.runners.rules`), which the trainer class inherits: `problems`
returns every rule of its own that a config and plan break (sizes that must
divide, components that must share processes), and `unread` names the keys
it never reads, each with the reason, so that validation refuses them when
set (`rlshell.runners.validation`): a key accepted and ignored is a bug.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from attrs import frozen

from rlshell.cluster.group import WorkerGroup
from rlshell.cluster.placement import ComponentPlan
from rlshell.config import Config
from rlshell.runners.spec import Trainer

if TYPE_CHECKING:
    from rlshell.cluster.ray_cluster import Cluster

__all__ = [
    "Cadence",
    "Launch",
    "Reporting",
    "Salvaging",
    "Trainer",
    "closed_on_failure",
    "launched_together",
]


@frozen
class Cadence:
    """When the loop evaluates and saves: ``runner.eval_interval`` and ``checkpoint.interval``.

    A checkpoint is due every ``checkpoint_interval`` steps and at the last
    step (0: never); an evaluation every ``eval_interval`` steps and before
    the first (0: never).
    """

    max_steps: int
    checkpoint_interval: int
    eval_interval: int

    @classmethod
    def of(cls, config: Config) -> Cadence:
        return cls(
            max_steps=config.runner.max_steps,
            checkpoint_interval=config.checkpoint.interval,
            eval_interval=config.runner.eval_interval,
        )

    def checkpoint_due(self, step: int) -> bool:
        interval = self.checkpoint_interval
        return bool(interval) and (step % interval == 0 or step == self.max_steps)

    def eval_due(self, step: int) -> bool:
        return bool(self.eval_interval) and step % self.eval_interval == 0

    @property
    def evaluates(self) -> bool:
        return self.eval_interval > 0


@runtime_checkable
class Reporting(Protocol):
    """A trainer with things to tell the reader between steps (a reward's first traceback).

    Once the metric logger is open, the loop hands it the logger's `print`
    (`rlshell.metrics.MetricLogger.print`), which writes above the progress
    bar instead of through it; until then the trainer prints to stderr.
    """

    def report_to(self, print_line: Callable[[str], None]) -> None: ...


@runtime_checkable
class Salvaging(Protocol):
    """A trainer that can still save a checkpoint after some failures of a step.

    When a step raises ``error``, the loop asks `salvage`; True means the
    state of the last completed step is intact (the actor is alive: a
    rollout worker died, say) and `Trainer.save` of that step will work, and
    the loop saves it before the error stops the run.
    """

    def salvage(self, error: BaseException) -> bool: ...


Launch = (
    tuple[WorkerGroup[Any], ComponentPlan]
    | tuple[WorkerGroup[Any], ComponentPlan, Mapping[str, int] | None]
)
"""``(group, placement)``, or with the group's Ray concurrency groups (name → threads)."""


_Closing = TypeVar("_Closing", bound="Trainer")


def closed_on_failure(trainer: _Closing, start: Callable[[], None]) -> _Closing:
    """``trainer`` once ``start()`` has launched it; closed (every group it started shut
    down) before ``start``'s error goes on."""
    try:
        start()
    except BaseException:
        trainer.close()
        raise
    return trainer


def launched_together(
    stack: ExitStack, cluster: Cluster, timeout: float | None, *launches: Launch
) -> list[Any]:
    """Each ``(group, placement[, concurrency_groups])`` launched, their actors all created
    before any is waited for (their processes start and import side by side); each group is
    shut down when ``stack`` closes, from the moment its actors exist."""
    for group, placement, *groups in launches:
        group.start(
            cluster,
            placement,
            concurrency_groups=groups[0] if groups else None,
            call_timeout_s=timeout,
        )
        stack.callback(group.shutdown)
    return [launch[0].wait_started() for launch in launches]

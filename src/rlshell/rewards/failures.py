"""Reward failures made loud: what a failed call was, and what a run says and does about it.

A reward call fails four ways in a `rlshell.rewards.pool.RewardPool`: it
raises, it outlives ``reward.timeout_s``, its process dies (a crash,
``os._exit``), or it returns something other than a finite number. The pool
scores the sample ``failure_score`` and keeps, per batch, the first failure of
each *kind* as a `RewardFailure`: the exception's type and the line it was
raised at, "timed out", "process died" or "non-finite return", with the
sample and the formatted traceback (or what happened, where there is none).

`FailureWatch` is the driver's side, one per run:

    watch = FailureWatch("math", function_name(get_reward("math")), max_failed_steps=3)
    result = pool.score(responses, answers)
    for line in watch.notices(result, "step 7"):    # each new kind's traceback, once a run
        logger.print(line)
    watch.check(7, result)    # RewardFailedError when every call failed 3 steps running

Later failures of a kind already shown are counted, not printed:
``reward/errors``, ``reward/timeouts`` and ``reward/failed_frac``.

A run scored by several rewards (``reward.weights``) keeps a `FailureWatches`,
one watch per reward: each reward's failures are shown, and its all-failed
steps counted, apart from the others'.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from attrs import frozen

from rlshell.cluster.errors import WorkerError, WorkerFailure

__all__ = [
    "CRASH",
    "NON_FINITE",
    "TIMEOUT",
    "FailureWatch",
    "FailureWatches",
    "RewardFailedError",
    "RewardFailure",
    "function_name",
]

TIMEOUT = "timed out"
CRASH = "process died"
NON_FINITE = "non-finite return"


def function_name(fn: Callable[..., object]) -> str:
    """``module.qualname`` of a reward function (its type's, for a callable object)."""
    named = fn if hasattr(fn, "__qualname__") else type(fn)
    module = getattr(named, "__module__", None)
    qualname = getattr(named, "__qualname__", repr(fn))
    return f"{module}.{qualname}" if module else qualname


@frozen
class RewardFailure:
    """The first failed call of one kind in a batch, with what a reader needs to fix it.

    ``kind``: ``"ValueError at my_rewards.py:12 in score"`` for an exception
    (its type and the innermost line of its traceback), else `TIMEOUT`,
    `CRASH` or `NON_FINITE`. ``index``: the sample in the batch;
    ``response``, ``answer``: its texts, cut to a few hundred characters;
    ``details``: the formatted traceback of an exception, else what happened
    in words; ``count``: how many samples of the batch failed this way.
    """

    kind: str
    index: int
    response: str
    answer: str
    details: str
    count: int = 1

    @property
    def last_line(self) -> str:
        """The last line of ``details``: ``ValueError: boom`` for a traceback."""
        lines = self.details.strip().splitlines()
        return lines[-1] if lines else self.kind


class RewardFailedError(WorkerError):
    """Every call of a reward failed for ``reward.max_failed_steps`` steps in a row: the run
    stops.

    A `WorkerError` of component ``reward`` and method ``score`` (so the
    command line exits with status 1); ``remote_traceback`` is the traceback
    of ``reward_failure``, the first failure of the last step.
    """

    def __init__(self, message: str, reward_failure: RewardFailure) -> None:
        failure = WorkerFailure(
            component="reward", method="score", remote_traceback=reward_failure.details
        )
        super().__init__(message, failure)
        self.reward_failure = reward_failure


class _Scored(Protocol):
    """What `FailureWatch` reads of a `rlshell.rewards.pool.RewardResult`."""

    @property
    def scores(self) -> tuple[float, ...]: ...

    @property
    def failed(self) -> tuple[int, ...]: ...

    @property
    def failures(self) -> tuple[RewardFailure, ...]: ...


class FailureWatch:
    """One run's account of its reward's failures.

    ``reward_type`` and ``function`` (`function_name`) name the reward in
    every message; ``max_failed_steps``: stop after that many consecutive
    steps on which every call failed (0: never).
    """

    def __init__(self, reward_type: str, function: str, max_failed_steps: int) -> None:
        if max_failed_steps < 0:
            raise ValueError(
                f"reward.max_failed_steps: expected an integer ≥ 0, got {max_failed_steps}"
            )
        self.reward_type = reward_type
        self.function = function
        self.max_failed_steps = max_failed_steps
        self.failed_streak = 0
        self._shown: dict[str, str] = {}  # kind -> when its traceback was printed

    @property
    def reward(self) -> str:
        """``reward 'math' (rlshell.rewards.rule_based.math_reward)``."""
        return f"reward '{self.reward_type}' ({self.function})"

    def notices(self, result: _Scored, when: str) -> list[str]:
        """A message for each kind of failure in ``result`` that this run has not shown yet:
        the reward, ``when`` (``"step 3"``), the sample and the traceback."""
        lines = []
        total = len(result.scores)
        for failure in result.failures:
            if failure.kind in self._shown:
                continue
            self._shown[failure.kind] = when
            lines.append(
                f"{self.reward} failed at {when} on {len(result.failed)} of {total} samples, "
                f"{failure.count} of them: {failure.kind}; the first, shown once a run:\n"
                f"  sample {failure.index}: response {failure.response!r}, "
                f"answer {failure.answer!r}\n" + _indent(failure.details)
            )
        return lines

    def check(self, step: int, result: _Scored) -> None:
        """Count step ``step``: raise `RewardFailedError` when every call of it failed and
        of the ``max_failed_steps - 1`` steps before it."""
        everything_failed = bool(result.scores) and len(result.failed) == len(result.scores)
        self.failed_streak = self.failed_streak + 1 if everything_failed else 0
        if not self.max_failed_steps or self.failed_streak < self.max_failed_steps:
            return
        first = result.failures[0]
        kinds = ", ".join(f"{f.count} × {f.kind}" for f in result.failures)
        first_step = step - self.failed_streak + 1
        steps = f"step {step}" if first_step == step else f"steps {first_step}-{step}"
        shown = self._shown.get(first.kind)
        where = (
            f" {first.last_line} (its traceback is printed above, at {shown})"
            if shown is not None
            else "\n" + first.details.rstrip()
        )
        raise RewardFailedError(
            f"{self.reward} failed on every sample of {steps} "
            f"(reward.max_failed_steps={self.max_failed_steps}); stopping before step {step}'s "
            f"update. Step {step}: {kinds}; the first, sample {first.index} "
            f"(response {first.response!r}, answer {first.answer!r}):{where}",
            first,
        )


class FailureWatches:
    """A `FailureWatch` for each reward of a run, by name (``functions``: name →
    `function_name`).

    A reward whose every call fails for ``max_failed_steps`` steps in a row
    stops the run, whatever the other rewards do: with its term stuck at the
    failure value, the total would train on the others' terms alone, which is
    not the reward the config asked for.
    """

    def __init__(self, functions: Mapping[str, str], max_failed_steps: int) -> None:
        self.watches = {
            name: FailureWatch(name, function, max_failed_steps)
            for name, function in functions.items()
        }

    def notices(self, results: Mapping[str, _Scored], when: str) -> list[str]:
        """`FailureWatch.notices` of each reward in ``results`` (some or all of the run's;
        a result of a reward not watched, the length penalty that cannot fail, is passed
        over)."""
        return [
            line
            for name, result in results.items()
            if name in self.watches
            for line in self.watches[name].notices(result, when)
        ]

    def check(self, step: int, results: Mapping[str, _Scored]) -> None:
        """`FailureWatch.check` of every reward, in order: ``results`` holds each one's."""
        missing = [name for name in self.watches if name not in results]
        if missing:
            raise ValueError(
                f"step {step}: no results of the rewards {missing} (got {list(results)})"
            )
        for name, watch in self.watches.items():
            watch.check(step, results[name])


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.rstrip().splitlines())

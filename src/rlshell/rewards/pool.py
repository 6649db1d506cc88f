"""Reward pool: registered rewards scored in warm processes, each call under a timeout.

    with RewardPool("math", timeout_s=5.0, num_processes=4) as pool:
        result = pool.score(responses, answers)     # RewardResult
        logger.log(step, result.metrics())          # reward/mean, reward/timeouts, ...

    with RewardPool(["math", "format"], timeout_s=5.0, num_processes=4) as pool:
        results = pool.score_each(responses, answers)   # {"math": RewardResult, "format": ...}

The pool starts ``num_processes`` processes once and keeps them for every
later call. They are forked from multiprocessing's fork server (the
"forkserver" start method): a fresh interpreter, started once per process
that makes pools, which has imported this module and the rewards' heavy
dependencies (torch through rlcore, math-verify); a fork of it starts in
a fraction of a second, where a spawned interpreter imports them again
(about 4 CPU-seconds each), and never is a fork of the caller, which may
hold threads (a Ray worker does). Each process takes the caller's
environment as it is when the process starts, as a spawned one would.
Each process loads ``RLSHELL_EXT_MODULE`` before it looks its rewards up,
so rewards registered by extension modules work there too. A pool of several
rewards has every process hold all of them: a batch is one queue of calls
(each reward on each sample), shared out as one reward's batch is, and each
reward's calls come back as its own `RewardResult`.

Timeouts. Work goes out in chunks (a few samples per message keeps thousands
of millisecond-long math-verify calls cheap), but every call has a deadline of
its own: ``timeout_s`` after it started, which is when the process reported
the call before it. A call past its deadline has its process killed
(SIGKILL, so a sleep, a spin loop or a C loop all stop); that sample alone
fails, the unstarted rest of its chunk (which waited behind it) goes back to
the queue, and a fresh process starts in the background while the others
keep scoring. Hung calls on different processes time out side by side, so a
batch whose hangs each hit another process ends about ``timeout_s`` after
the last hang began; hangs that fall on the same process follow one another
(with a fresh process's start-up, a fork of the fork server, in between). A
process that dies mid-call (a crash, ``os._exit``) fails that one sample as
an error the same way.

A call that times out, raises, or returns anything but a finite number
scores ``failure_score`` (0.0 unless set) for its reward and sample and is
counted in that reward's `RewardResult`, never raised; the result also keeps the first failure of
each kind in the batch (`rlshell.rewards.failures.RewardFailure`: an
exception's type and line with its formatted traceback, a time-out, a dead
process, a non-finite return) with its sample, for the run to show. What
does raise: mismatched lengths (ValueError), an unknown reward name
(KeyError, at construction), and a process that cannot start
(`RewardPoolError`).

The processes, their deadlines and replacement are `rlshell.process_pool.ProcessPool`'s,
shared with the tool sandbox; what crosses back from a reward process is JSON, never a
pickle.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import multiprocessing
import numbers
import os
import signal
import threading
import time
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any, Literal

from attrs import frozen

from rlshell.extensions import ENV_VAR, load_extensions
from rlshell.isolation import Confinement, SandboxContext, isolation_problems
from rlshell.limits import limit_address_space
from rlshell.process_pool import (
    ClosedOnExit,
    ProcessPool,
    ProtocolError,
    Starter,
    exit_when_orphaned,
    receive_message,
    send_message,
)
from rlshell.rewards import RewardFn, get_reward
from rlshell.rewards.failures import CRASH, NON_FINITE, TIMEOUT, RewardFailure, function_name

__all__ = ["RewardPool", "RewardPoolError", "RewardResult"]

# Samples per message at most: chunks cut the pool's overhead per fast call ~4x.
_MAX_CHUNK = 64
_ERROR_EXAMPLES = 3
# How much of a sample's texts, and of a traceback (its end), a RewardFailure keeps.
_SAMPLE_CHARS = 200
_TRACEBACK_CHARS = 4000
_ORPHAN_CHECK_S = 1.0
# Imported by each process before it reports ready, so no first call is timed with it.
_PRELOAD = ("math_verify",)


class RewardPoolError(RuntimeError):
    """A reward process could not start (its reward is unknown there, or it died or hung first)."""


@frozen
class RewardResult:
    """The scores of one batch and what went wrong while computing them.

    ``scores[i]`` is sample i's reward, or the pool's ``failure_score`` for a
    sample listed in ``failed`` (its call timed out, raised, returned a
    non-finite value or killed its process). ``timeouts + errors ==
    len(failed)``; ``error_examples`` holds the messages of the first few
    failed samples, for logs; ``failures`` the first failure of each kind,
    with its sample and traceback, in sample order; ``seconds`` is the wall
    time of the batch (of every reward of a `RewardPool.score_each` call,
    whose calls are interleaved).
    """

    scores: tuple[float, ...]
    timeouts: int
    errors: int
    seconds: float
    failed: tuple[int, ...] = ()
    error_examples: tuple[str, ...] = ()
    failures: tuple[RewardFailure, ...] = ()

    @property
    def failed_frac(self) -> float:
        """The fraction of samples whose call failed (0.0 for an empty batch)."""
        return len(self.failed) / len(self.scores) if self.scores else 0.0

    def metrics(self) -> dict[str, float]:
        """``reward/mean``, ``reward/timeouts``, ``reward/errors``, ``reward/failed_frac``
        ((timeouts + errors) ÷ samples) and ``reward/seconds``.

        The mean is that of ``scores``: failed samples count at the failure score.
        """
        mean = sum(self.scores) / len(self.scores) if self.scores else 0.0
        return {
            "reward/mean": mean,
            "reward/timeouts": float(self.timeouts),
            "reward/errors": float(self.errors),
            "reward/failed_frac": self.failed_frac,
            "reward/seconds": self.seconds,
        }


class RewardPool(ClosedOnExit):
    """``num_processes`` warm processes scoring ``reward_types``, each call within ``timeout_s``.

    ``reward_types``: one registered name, or several (`score_each` scores
    them all). ``failure_score`` is what a failed call scores;
    ``start_timeout_s`` bounds a process's start-up (interpreter, imports,
    extensions). The reward names are checked here, in this process, after
    loading ``RLSHELL_EXT_MODULE``: a typo raises the registry's KeyError with
    close names before anything starts. Use as a context manager or call
    `close`. One `score` runs at a time; one that is interrupted (Ctrl-C)
    closes the pool.
    """

    def __init__(
        self,
        reward_types: str | Sequence[str],
        *,
        timeout_s: float,
        num_processes: int,
        failure_score: float = 0.0,
        start_timeout_s: float = 120.0,
        memory_mb: int | None = None,
        isolation: Literal["sandbox", "weak"] = "sandbox",
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s}")
        if num_processes < 1:
            raise ValueError(f"num_processes: expected a positive integer, got {num_processes}")
        if not math.isfinite(failure_score):
            raise ValueError(f"failure_score: expected a finite float, got {failure_score}")
        names = (reward_types,) if isinstance(reward_types, str) else tuple(reward_types)
        if not names or len(set(names)) != len(names):
            raise ValueError(
                f"reward_types: expected one reward name or several distinct ones, got {names}"
            )
        load_extensions(where="reward pool")
        self.reward_types = names
        # Each reward's function, ``module.qualname`` (`function_name`), by name.
        self.functions = {name: function_name(get_reward(name)) for name in names}
        self.timeout_s = float(timeout_s)
        self.num_processes = num_processes
        self.failure_score = float(failure_score)
        self.start_timeout_s = start_timeout_s
        self.memory_mb = memory_mb
        self.isolation = isolation
        starter = _starter(names, memory_mb, isolation)
        self._pool = ProcessPool(
            starter,
            num_processes,
            timeout_s=self.timeout_s,
            owner=f"reward pool for {self._label()}",
            error=RewardPoolError,
            start_timeout_s=start_timeout_s,
        )

    def __repr__(self) -> str:
        state = "closed" if self._pool.closed else f"{self._pool.size} processes"
        names = self.reward_types[0] if len(self.reward_types) == 1 else list(self.reward_types)
        return f"RewardPool({names!r}, timeout_s={self.timeout_s}, {state})"

    @property
    def closed(self) -> bool:
        return self._pool.closed

    @property
    def pids(self) -> list[int]:
        """The reward processes' pids (a replaced one's successor in its place)."""
        return self._pool.pids

    @property
    def reward_type(self) -> str:
        """The reward of a one-reward pool (a ValueError for a pool of several)."""
        return self._only()

    @property
    def function(self) -> str:
        """The function (``module.qualname``) of a one-reward pool's reward."""
        return self.functions[self._only()]

    def score(self, responses: Sequence[str], answers: Sequence[str]) -> RewardResult:
        """Score ``responses[i]`` against ``answers[i]`` for every i with a one-reward pool's
        reward; failures are counted."""
        name = self._only()
        return self.score_each(responses, answers)[name]

    def score_each(
        self,
        responses: Sequence[str],
        answers: Sequence[str],
        reward_types: Sequence[str] | None = None,
    ) -> dict[str, RewardResult]:
        """Score ``responses[i]`` against ``answers[i]`` for every i with each of
        ``reward_types`` (the pool's rewards, or some of them), in that order; each reward's
        failures are counted in its own result."""
        if len(responses) != len(answers):
            raise ValueError(
                f"responses and answers must pair up: got {len(responses)} responses "
                f"and {len(answers)} answers"
            )
        names = self.reward_types if reward_types is None else tuple(reward_types)
        unknown = [name for name in names if name not in self.functions]
        if unknown or len(set(names)) != len(names):
            raise ValueError(
                f"reward_types: expected distinct rewards of this pool "
                f"({', '.join(self.reward_types)}), got {list(names)}"
            )
        if self._pool.closed:
            raise RuntimeError(f"this RewardPool for {self._label()} is closed")
        start = time.perf_counter()
        slots = [self.reward_types.index(name) for name in names]
        batch = _Batch(responses, answers, slots, self.failure_score, self)
        self._pool.run(batch, range(batch.calls), max_chunk=_MAX_CHUNK)
        seconds = time.perf_counter() - start
        return {name: batch.result(position, seconds) for position, name in enumerate(names)}

    def close(self) -> None:
        """Stop every process (idempotent)."""
        self._pool.close()

    def _only(self) -> str:
        if len(self.reward_types) != 1:
            raise ValueError(
                f"this RewardPool scores {len(self.reward_types)} rewards "
                f"({', '.join(self.reward_types)}); use score_each and functions"
            )
        return self.reward_types[0]

    def _label(self) -> str:
        return ", ".join(f"'{name}'" for name in self.reward_types)

    def _fail_call(self, batch: _Batch, index: int, reason: str, *, timed_out: bool) -> None:
        """Fail call ``index``, which was killed (``timed_out``) or whose process died."""
        function = self.functions[self.reward_types[batch.slot(index)]]
        if timed_out:
            details = (
                f"{function} did not return within reward.timeout_s = {self.timeout_s:g} s; "
                "its process was killed (SIGKILL) and replaced"
            )
            batch.failed(index, reason, TIMEOUT, details, timed_out=True)
        else:
            details = (
                f"{reason} while {function} was scoring this sample (a crash, os._exit or "
                "a signal ends a process this way; there is no traceback to show); it was "
                "replaced"
            )
            batch.failed(index, reason, CRASH, details)


class _Batch:
    """The calls of one `RewardPool.score_each`, filled in as reports arrive.

    With n samples and the pool's rewards at ``slots`` (positions in
    ``RewardPool.reward_types``), call c is reward ``slots[c // n]`` on sample
    ``c % n``: reward-major, so each reward's calls are one range.
    """

    def __init__(
        self,
        responses: Sequence[str],
        answers: Sequence[str],
        slots: Sequence[int],
        failure_score: float,
        pool: RewardPool | None = None,
    ) -> None:
        self.pool = pool
        self.responses, self.answers, self.slots = responses, answers, tuple(slots)
        self.samples = len(responses)
        self.calls = self.samples * len(self.slots)
        self.scores: list[float] = [failure_score] * self.calls
        self.remaining = self.calls
        self.failure_score = failure_score
        self.timed_out: set[int] = set()
        self.messages: dict[int, str] = {}
        self.kinds: dict[int, tuple[str, str]] = {}  # call -> (kind, details)

    def slot(self, index: int) -> int:
        """The pool's reward (its position in ``reward_types``) of call ``index``."""
        return self.slots[index // self.samples]

    def request(self, indices: list[int]) -> list[Any]:
        """What a reward process is sent for calls ``indices``: for each, its number, its
        reward and its sample's texts."""
        return [
            "score",
            [
                [index, self.slot(index), self.responses[i], self.answers[i]]
                for index, i in ((index, index % self.samples) for index in indices)
            ],
        ]

    def answered(self, index: int, answer: list[Any]) -> None:
        """``[index, "ok", score]`` or ``[index, "error", message, kind, details]``."""
        match answer:
            case [int() as number, "ok", float() | int() as score] if number == index:
                self.scores[index] = float(score)
                self.remaining -= 1
            case [int() as number, "error", str() as text, str() as kind, str() as details] if (
                number == index
            ):
                self.failed(index, text, kind, details)
            case _:
                raise ProtocolError(f"call {index}: an answer of another shape: {answer!r:.80}")

    def lost(self, index: int, reason: str, *, timed_out: bool, seconds: float) -> None:
        assert self.pool is not None
        self.pool._fail_call(self, index, reason, timed_out=timed_out)

    def scored(self, index: int, score: float) -> None:
        self.scores[index] = score
        self.remaining -= 1

    def failed(
        self, index: int, message: str, kind: str, details: str, *, timed_out: bool = False
    ) -> None:
        self.scores[index] = self.failure_score
        self.remaining -= 1
        if timed_out:
            self.timed_out.add(index)
        self.messages[index] = message
        self.kinds[index] = (kind, details)

    def result(self, position: int, seconds: float) -> RewardResult:
        """The result of the ``position``-th reward asked for: its calls, as samples."""
        first = position * self.samples
        failed_calls = [first + i for i in range(self.samples) if first + i in self.messages]
        timeouts = sum(index in self.timed_out for index in failed_calls)
        return RewardResult(
            scores=tuple(self.scores[first : first + self.samples]),
            timeouts=timeouts,
            errors=len(failed_calls) - timeouts,
            seconds=seconds,
            failed=tuple(index - first for index in failed_calls),
            error_examples=tuple(
                f"sample {index - first}: {self.messages[index]}"
                for index in failed_calls[:_ERROR_EXAMPLES]
            ),
            failures=self._first_of_each_kind(failed_calls, first),
        )

    def _first_of_each_kind(self, failed_calls: list[int], first: int) -> tuple[RewardFailure, ...]:
        counts: dict[str, int] = {}
        first_call: dict[str, int] = {}
        for index in failed_calls:
            kind = self.kinds[index][0]
            counts[kind] = counts.get(kind, 0) + 1
            first_call.setdefault(kind, index)
        return tuple(
            RewardFailure(
                kind=kind,
                index=index - first,
                response=_shorten(self.responses[index - first], _SAMPLE_CHARS),
                answer=_shorten(self.answers[index - first], _SAMPLE_CHARS),
                details=self.kinds[index][1],
                count=counts[kind],
            )
            for kind, index in first_call.items()
        )


# -- the reward process


_checked_hosts: list[list[str]] = []  # this host's isolation problems, once found


def _starter(names: tuple[str, ...], memory_mb: int | None, isolation: str) -> Starter:
    """Reward processes in a sandbox of their own each (`rlshell.isolation`: a fresh
    unprivileged uid, no capability, no network, a read-only file system but for an
    in-memory ``/tmp``, the caller's environment cleared but for extension modules), or
    forked by a fork server as this process's user (``isolation='weak'``)."""
    name, label = f"reward:{','.join(names)}", "reward process"
    if isolation == "weak":
        context = multiprocessing.get_context("forkserver")
        # Imported once, by the fork server, when it starts (the first pool of a process).
        context.set_forkserver_preload([__name__, *_PRELOAD])
        return Starter(
            context=context,
            target=_serve,
            args=(names, os.getpid(), memory_mb, dict(os.environ)),
            name=name,
            label=label,
        )
    if not _checked_hosts:
        _checked_hosts.append(isolation_problems())
    if _checked_hosts[0]:
        raise RewardPoolError(
            "reward processes cannot start in their sandbox on this host: "
            + "; ".join(_checked_hosts[0])
            + ". Allow those parts, or opt out with reward.isolation='weak' "
            "(RewardPool(isolation='weak')), which runs reward functions as this process's "
            "user (docs/security.md)"
        )
    return Starter(
        context=SandboxContext(Confinement(single_identity=True)),  # type: ignore[arg-type]
        target=_serve,
        args=(list(names), 0, memory_mb, None),
        name=name,
        label=label,
    )


def _serve(
    conn: Connection,
    reward_types: tuple[str, ...],
    parent_pid: int,
    memory_mb: int | None = None,
    environ: dict[str, str] | None = None,
) -> None:
    """Score chunks of ``(call, reward slot, response, answer)`` sent on ``conn`` until it
    closes; the slot is the reward's position in ``reward_types``. ``memory_mb`` caps how
    far the process may grow once its rewards are loaded. ``environ``: the pool's
    environment when it started this process (a fork server's children have the server's,
    which may be older), extension modules and objects included. ``parent_pid`` 0: in a
    sandbox, which ends with the pool's process (bubblewrap's ``--die-with-parent``)."""
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if parent_pid:
        threading.Thread(target=exit_when_orphaned, args=(parent_pid,), daemon=True).start()
    try:
        load_extensions(where="reward process")
        rewards = [get_reward(name) for name in reward_types]
    except Exception as error:
        hint = (
            f"; a reward must be registered by a module named in {ENV_VAR} "
            "to exist in reward processes"
            if isinstance(error, KeyError)
            else ""
        )
        send_message(conn, ["failed", _describe(error) + hint])
        return
    for module in _PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    _hide_math_verify_timeout_notice()
    if memory_mb is not None:
        limit_address_space(memory_mb)
    try:
        send_message(conn, ["ready"])
        while True:
            _, calls = receive_message(conn)
            for index, slot, response, answer in calls:
                send_message(conn, ["answer", index, *_call(rewards[slot], response, answer)])
    except (EOFError, OSError):
        return  # the pool closed its end, or its process is gone


def _call(reward: RewardFn, response: str, answer: str) -> list[Any]:
    """``["ok", score]``, or ``["error", message, kind, details]``."""
    try:
        value: object = reward(response, answer)
    except Exception as error:
        kind, details = _traceback_of(error)
        return ["error", _describe(error), kind, details]
    try:
        score = float(value) if isinstance(value, numbers.Real) else math.nan
    except OverflowError:  # an int beyond float range
        score = math.nan
    if not math.isfinite(score):
        message = f"returned {_short_repr(value)}, expected a finite float"
        return ["error", message, NON_FINITE, f"{function_name(reward)} {message}"]
    return ["ok", score]


def _traceback_of(error: Exception) -> tuple[str, str]:
    """The kind of a reward's exception (its type and innermost line) and its traceback,
    without the frame of `_call` and cut to its last `_TRACEBACK_CHARS` characters."""
    below_call = error.__traceback__.tb_next if error.__traceback__ is not None else None
    frames = traceback.extract_tb(below_call)
    kind = type(error).__name__
    if frames:
        innermost = frames[-1]
        kind += f" at {os.path.basename(innermost.filename)}:{innermost.lineno} in {innermost.name}"
    text = "".join(traceback.format_exception(type(error), error, below_call)).rstrip()
    if len(text) > _TRACEBACK_CHARS:
        text = "... (the start is cut)\n" + text[-_TRACEBACK_CHARS:]
    return kind, text


def _hide_math_verify_timeout_notice() -> None:
    """math-verify warns once per process that its own timeouts are off; here the pool's count."""

    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(keep)


def _describe(error: BaseException) -> str:
    text = error.args[0] if isinstance(error, KeyError) and error.args else error
    return _shorten(f"{type(error).__name__}: {text}", 500)


def _short_repr(value: object) -> str:
    return _shorten(repr(value), 80)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."

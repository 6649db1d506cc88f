"""Warm processes serving numbered calls under deadlines: the one pool behind the reward
pool (`rlshell.rewards.pool`) and the tool sandbox (`rlshell.tools.sandbox`).

    pool = ProcessPool(starter, count=4, timeout_s=5.0, owner="reward pool for 'math'",
                       error=RewardPoolError)
    pool.run(batch, range(batch.calls), max_chunk=64)    # batch: a `PoolBatch`
    pool.close()

A `ProcessPool` starts ``count`` processes (`Starter`: a multiprocessing context, the
process's function and its arguments) and returns once every one has reported ready. A
batch is a queue of numbered calls: each idle, ready process is sent a chunk of them (the
batch writes the request, `PoolBatch.request`), and answers them in order, one message
per call (`PoolBatch.answered`). Every call has a deadline of its own: ``timeout_s`` (plus
``grace_s``) after it started, which is when its process answered the call before it. A
process past a deadline is killed (SIGKILL: a sleep, a spin loop and a C loop all stop)
and a fresh one started in its place while the others go on; its current call is lost
(`PoolBatch.lost`, timed out), the unstarted rest of its chunk goes back to the queue. A
process that dies mid-call, or answers out of protocol, loses that call the same way.

What a process sends back is JSON (`send_message` / `receive_message`), never a pickle: the
processes run code the pool's caller does not trust (a reward function running the
model's answer, a tool running the model's code), and reading their messages must run
nothing of theirs. A message that is not the protocol's counts as the process failing.
Only what the caller hands a process when it starts (`Starter.args`) goes through
multiprocessing's pickle, from the trusted side to the other.

What raises (the ``error`` class the owner names): a process that reports it could not
start, or does not report within ``start_timeout_s``, or dies before it is ready. A run
interrupted (Ctrl-C) closes the pool: answers to its batch may still be on their way.
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import signal
import sys
import threading
import time
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from typing import Any, Protocol, Self

from attrs import frozen

__all__ = [
    "MAX_MESSAGE_BYTES",
    "ClosedOnExit",
    "PoolBatch",
    "PooledProcess",
    "ProcessPool",
    "ProtocolError",
    "Starter",
    "exit_when_orphaned",
    "main_script_left_out",
    "receive_message",
    "send_message",
]

MAX_MESSAGE_BYTES = 64 * 2**20
"""The largest message either side reads; a longer one ends the connection."""
_ORPHAN_CHECK_S = 1.0


class ProtocolError(ValueError):
    """A message that is not JSON, or not of the protocol's shape."""


def send_message(conn: Connection, message: list[Any]) -> None:
    """Send ``message`` (JSON values only) on ``conn``."""
    conn.send_bytes(json.dumps(message, allow_nan=True).encode())


def receive_message(conn: Connection) -> list[Any]:
    """The next message on ``conn``, a JSON list: a `ProtocolError` for anything else (EOFError
    and OSError when the connection has closed, or the message passes `MAX_MESSAGE_BYTES`)."""
    data = conn.recv_bytes(MAX_MESSAGE_BYTES)
    try:
        message = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ProtocolError(f"a message that is not JSON ({error})") from None
    if not isinstance(message, list) or not message or not isinstance(message[0], str):
        raise ProtocolError(f"a message that is not [kind, ...]: {str(message)[:80]!r}")
    return message


@frozen
class Starter:
    """How to start one process of a pool: ``target(conn, *args)`` in a process of
    ``context``, named ``name``. ``label`` is what errors call it ("reward process")."""

    context: BaseContext
    target: Callable[..., None]
    args: tuple[Any, ...]
    name: str
    label: str


class PooledProcess:
    """One process as its pool sees it: its connection, whether it is ready, and the calls
    it was sent and has not answered (in order)."""

    def __init__(self, starter: Starter, start_timeout_s: float) -> None:
        parent_end, child_end = starter.context.Pipe(duplex=True)
        self.label = starter.label
        self.process = starter.context.Process(  # type: ignore[attr-defined]
            target=starter.target,
            args=(child_end, *starter.args),
            name=starter.name,
            daemon=True,
        )
        with main_script_left_out():
            self.process.start()
        child_end.close()  # so that the child's exit reads as EOF here
        assert self.process.pid is not None
        self.pid: int = self.process.pid
        self.conn: Connection = parent_end
        self.ready = False
        self.start_deadline = time.monotonic() + start_timeout_s
        self.in_flight: deque[int] = deque()
        self.call_started = 0.0

    def deadline(self, timeout_s: float) -> float | None:
        """When this process must have spoken: start-up, or its current call's end."""
        if not self.ready:
            return self.start_deadline
        return self.call_started + timeout_s if self.in_flight else None

    def death(self, error: Exception | None = None) -> str:
        """Why the process ended, once its connection has closed (``error``: what reading it
        raised, named when the process is still alive: a message past the size limit)."""
        self.process.join(1.0)
        code = self.process.exitcode
        if code is None:
            return f"{self.label} (pid {self.pid}) broke its connection ({error}) and was killed"
        if code is not None and code < 0:
            return f"{self.label} (pid {self.pid}) died of {signal.Signals(-code).name}"
        return f"{self.label} (pid {self.pid}) exited with code {code}"

    def kill(self) -> None:
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join(5.0)
        self.conn.close()


class PoolBatch(Protocol):
    """A batch of numbered calls, as `ProcessPool.run` drives it."""

    def request(self, indices: list[int]) -> list[Any]:
        """The message (JSON values) asking a process for calls ``indices``, in that order."""
        ...

    def answered(self, index: int, answer: list[Any]) -> None:
        """Call ``index``'s answer (the message after its ``"answer"`` kind); a
        `ProtocolError` when it is not an answer's shape."""
        ...

    def lost(self, index: int, reason: str, *, timed_out: bool, seconds: float) -> None:
        """Call ``index`` got no answer: its process was killed past the deadline
        (``timed_out``) or died, or broke the protocol (``reason`` says which)."""
        ...


class ClosedOnExit(abc.ABC):
    """An owner of pooled processes as a context manager: `close` on leaving the block."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop every process (idempotent)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        self.close()


class ProcessPool:
    """``count`` warm processes started by ``starter``, serving batches of calls.

    ``timeout_s`` (+ ``grace_s``) bounds each call, ``start_timeout_s`` each start-up.
    ``owner`` names the pool in errors ("reward pool for 'math'"); ``error`` is the
    exception class they raise. One `run` at a time (a lock).
    """

    def __init__(
        self,
        starter: Starter,
        count: int,
        *,
        timeout_s: float,
        owner: str,
        error: type[RuntimeError],
        grace_s: float = 0.0,
        start_timeout_s: float = 120.0,
    ) -> None:
        if count < 1:
            raise ValueError(f"count: expected a positive integer, got {count}")
        self.starter = starter
        self.timeout_s = float(timeout_s)
        self.grace_s = float(grace_s)
        self.start_timeout_s = float(start_timeout_s)
        self.owner = owner
        self.error = error
        self._lock = threading.Lock()
        self._closed = False
        self._processes: list[PooledProcess] = []
        self._remaining = 0
        try:
            for _ in range(count):
                self._processes.append(PooledProcess(starter, self.start_timeout_s))
            idle: deque[int] = deque()
            while not all(process.ready for process in self._processes):
                self._wait_and_read(None, idle)
                self._enforce_deadlines(None, idle)
        except BaseException:
            self._close_now()
            raise

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def size(self) -> int:
        return len(self._processes)

    @property
    def pids(self) -> list[int]:
        """The processes' pids, in slot order (a replaced one's successor in its place)."""
        return [process.pid for process in self._processes]

    def run(self, batch: PoolBatch, calls: Iterable[int], max_chunk: int = 1) -> None:
        """Every call of ``calls`` answered or lost; chunks of at most ``max_chunk`` calls."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"this {self.owner} is closed")
            queue = deque(calls)
            self._remaining = len(queue)
            try:
                while self._remaining:
                    self._dispatch(batch, queue, max_chunk)
                    self._wait_and_read(batch, queue)
                    self._enforce_deadlines(batch, queue)
            except BaseException:
                self._close_now()
                raise

    def close(self) -> None:
        """Stop every process (idempotent)."""
        with self._lock:
            self._close_now()

    def _dispatch(self, batch: PoolBatch, queue: deque[int], max_chunk: int) -> None:
        """Send each idle, ready process its next chunk of calls."""
        for process in self._processes:
            if not queue:
                return
            if process.ready and not process.in_flight:
                # Chunks shrink as the queue does, so that the processes finish together.
                size = max(1, min(max_chunk, len(queue) // (2 * len(self._processes))))
                indices = [queue.popleft() for _ in range(size)]
                try:
                    send_message(process.conn, batch.request(indices))
                except OSError:
                    queue.extendleft(reversed(indices))
                    continue  # it died; reading its connection finds out
                process.in_flight.extend(indices)
                process.call_started = time.monotonic()

    def _wait_and_read(self, batch: PoolBatch | None, queue: deque[int]) -> None:
        """Wait until a process speaks or the nearest deadline; read every message."""
        now = time.monotonic()
        deadlines = [process.deadline(self.timeout_s + self.grace_s) for process in self._processes]
        timeout = max(0.0, min((d for d in deadlines if d is not None), default=now + 1.0) - now)
        ready = wait([process.conn for process in self._processes], timeout)
        for slot, process in enumerate(list(self._processes)):
            if process.conn not in ready:
                continue
            try:
                while process.conn.poll():
                    self._handle(process, receive_message(process.conn), batch)
            except (EOFError, OSError) as error:
                self._replace(slot, batch, queue, process.death(error), timed_out=False)
            except ProtocolError as error:
                reason = f"{process.label} (pid {process.pid}) broke the protocol: {error}"
                self._replace(slot, batch, queue, reason, timed_out=False)

    def _handle(self, process: PooledProcess, message: list[Any], batch: PoolBatch | None) -> None:
        kind = message[0]
        if kind == "ready" and not process.ready:
            process.ready = True
        elif kind == "failed" and not process.ready:
            raise self.error(
                f"{process.label} (pid {process.pid}) for {self.owner} failed to start: "
                f"{str(message[1])[:1000] if len(message) > 1 else 'no reason given'}"
            )
        elif kind == "answer" and process.in_flight and batch is not None:
            index = process.in_flight[0]
            batch.answered(index, message[1:])  # a ProtocolError leaves it in flight: lost
            process.in_flight.popleft()
            self._remaining -= 1
            process.call_started = time.monotonic()
        else:
            raise ProtocolError(f"an unexpected {kind!r} message")

    def _enforce_deadlines(self, batch: PoolBatch | None, queue: deque[int]) -> None:
        now = time.monotonic()
        for slot, process in enumerate(list(self._processes)):
            deadline = process.deadline(self.timeout_s + self.grace_s)
            if deadline is None or now < deadline or process.conn.poll():
                continue  # a message waiting to be read is read first
            if not process.ready:
                raise self.error(
                    f"{process.label} (pid {process.pid}) for {self.owner} did not start "
                    f"within {self.start_timeout_s:g} s"
                )
            if self.grace_s:
                reason = (
                    f"{process.label} did not answer within {self.timeout_s:g} s "
                    f"+ {self.grace_s:g} s and was killed"
                )
            else:
                reason = f"timed out after {self.timeout_s:g} s"
            self._replace(slot, batch, queue, reason, timed_out=True)

    def _replace(
        self,
        slot: int,
        batch: PoolBatch | None,
        queue: deque[int],
        reason: str,
        *,
        timed_out: bool,
    ) -> None:
        """Kill the process in ``slot``, lose its current call, requeue the rest, start another."""
        process = self._processes[slot]
        process.kill()
        if not process.ready:
            raise self.error(f"{self.owner}: {reason} before it was ready (see its stderr)")
        if process.in_flight and batch is not None:
            index = process.in_flight.popleft()
            seconds = time.monotonic() - process.call_started
            batch.lost(index, reason, timed_out=timed_out, seconds=seconds)
            self._remaining -= 1
            queue.extendleft(reversed(process.in_flight))
        self._processes[slot] = PooledProcess(self.starter, self.start_timeout_s)

    def _close_now(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Killed, not asked to exit: a pooled process holds nothing to save.
        for process in self._processes:
            process.kill()
        self._processes = []


@contextlib.contextmanager
def main_script_left_out() -> Iterator[None]:
    """While a process starts: a new process would run this process's main script again (as
    ``__mp_main__``), and a script or notebook export without an ``if __name__ ==
    "__main__":`` guard would train a second time there. A pooled process needs nothing of
    it: what it serves comes by name from registries (built-ins, ``RLSHELL_EXT_MODULE``,
    and the objects `rlshell.api` ships in ``RLSHELL_EXT_OBJECTS``)."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def exit_when_orphaned(pool_pid: int) -> None:
    """In a pooled process (a thread of its own): end it when the pool's process is gone,
    even in the middle of a hung call, or when its parent changes (a fork server's child
    whose server ended)."""
    parent = os.getppid()
    while True:
        time.sleep(_ORPHAN_CHECK_S)
        if os.getppid() != parent:
            os._exit(1)
        try:
            os.kill(pool_pid, 0)
        except ProcessLookupError:
            os._exit(1)
        except PermissionError:  # a process of another user holds the pid: ours is gone
            os._exit(1)

"""Tool calls run in sandbox processes, each call under limits, a batch at a time.

    calls = [parse_tool_call(turn, fmt) for turn in turns]     # ToolCall | ParseError | None
    with ToolExecutor(["calculator", "python"], ToolLimits(timeout_s=5.0), num_processes=4) as ex:
        results = ex.run([call for call in calls if call is not None])
        logger.log(step, tool_metrics(results))               # tools/calls, tools/ok_frac, ...
        observations = [format_result(result.observation, fmt) for result in results]

The executor starts ``num_processes`` sandbox processes once (the "spawn"
start method, as the reward pool's: a fresh interpreter, never a fork of a
process that may hold threads, as Ray workers do) and keeps them. Each loads
``RLSHELL_EXT_MODULE`` (and ``RLSHELL_EXT_OBJECTS``) before it looks its
tools up, so tools registered by extension modules work there. A batch is
shared out across the processes, one call per process at a time.

Every call runs in a process of its own, forked by its sandbox process
(`rlshell.tools.sandbox_process` tells how), never in the caller's, under
`ToolLimits`:

- time: past ``timeout_s`` its process group is killed (SIGKILL), status ``timeout``;
- memory: ``memory_mb`` of address space beyond its process's own
  (``RLIMIT_AS``); a call that allocates past it gets status ``memory``;
- network: none (its own network namespace, with no interface up) unless
  ``network=True``; where a namespace cannot be made, the executor refuses to
  start (`SandboxError`, naming why) instead of running with network;
- files: a fresh scratch directory as its working directory and ``TMPDIR``,
  removed after the call; no file over ``max_file_mb``;
- output: what it prints (standard output, then standard error) and returns
  make its observation, cut to ``max_output_chars`` with a note saying how
  much was cut (status ``truncated``); a call that writes more than
  `rlshell.tools.sandbox_process.STOP_AFTER_BYTES` is stopped;
- failures: a crash (a signal, ``os._exit``) gives status ``crashed`` with the
  signal's name or exit code, an exception status ``error`` with its type and
  message. Nothing a tool does raises here.

What it does not limit: the processes a call starts (they are killed with
its process group, unless they leave it), CPU use of other processes, disk
use outside the scratch directory, and what the user it runs as (root here)
may read or write. It guards a run against a model's code, not against an
attacker.

What raises: an unknown tool name at construction (KeyError with close
names), a sandbox process that cannot start or set itself up
(`SandboxError`), and a closed executor.
"""

from __future__ import annotations

import difflib
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
import types
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnContext
from typing import Literal, Self, cast, get_args

from attrs import frozen

from rlshell.extensions import load_extensions
from rlshell.rewards.pool import _main_script_left_out
from rlshell.tools import get_tool
from rlshell.tools.limits import ToolLimits
from rlshell.tools.parsing import ParseError, ToolCall
from rlshell.tools.sandbox_process import serve

__all__ = [
    "STATUSES",
    "SandboxError",
    "Status",
    "ToolExecutor",
    "ToolLimits",
    "ToolResult",
    "tool_metrics",
]

Status = Literal[
    "ok", "error", "timeout", "crashed", "memory", "truncated", "unknown_tool", "parse_error"
]
# Every status, in the order of the Literal (metrics iterate over them).
STATUSES: tuple[Status, ...] = get_args(Status)

# How long past timeout_s a sandbox process may take to answer (fork, reading, cleanup)
# before the executor counts it hung, kills it and starts another.
_ANSWER_GRACE_S = 10.0


@frozen
class ToolResult:
    """The outcome of one call: the ``observation`` the model reads, its ``status`` and
    the ``seconds`` it ran (0.0 for a call that never ran: parse_error, unknown_tool).

    Statuses: ``ok``; ``error`` (the tool raised: its message ends the
    observation); ``timeout``, ``crashed``, ``memory`` (the call was killed or
    died; the observation holds its output so far and says which);
    ``truncated`` (it succeeded but its output was cut); ``unknown_tool``;
    ``parse_error`` (the model's call was malformed; nothing ran). A failure
    of more than one kind takes the first of timeout, crashed, memory,
    error, truncated.
    """

    observation: str
    status: Status
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class SandboxError(RuntimeError):
    """A sandbox process could not start or set itself up (network namespace, an unknown
    tool there, start-up past its time)."""


def tool_metrics(results: Sequence[ToolResult]) -> dict[str, float]:
    """Counts and times of a batch of calls, under ``tools/``.

    ``tools/calls``; ``tools/ok_frac`` (ok calls ÷ calls, 0.0 without
    calls); one count per failing status: ``tools/errors``,
    ``tools/timeouts``, ``tools/crashes``, ``tools/memory``,
    ``tools/truncated``, ``tools/unknown``, ``tools/parse_errors``; and
    ``tools/seconds_mean`` and ``tools/seconds_max`` over the calls that ran
    (not parse errors or unknown tools).
    """
    counts = {status: 0 for status in STATUSES}
    for result in results:
        counts[result.status] += 1
    ran = [r.seconds for r in results if r.status not in ("parse_error", "unknown_tool")]
    return {
        "tools/calls": float(len(results)),
        "tools/ok_frac": counts["ok"] / len(results) if results else 0.0,
        "tools/errors": float(counts["error"]),
        "tools/timeouts": float(counts["timeout"]),
        "tools/crashes": float(counts["crashed"]),
        "tools/memory": float(counts["memory"]),
        "tools/truncated": float(counts["truncated"]),
        "tools/unknown": float(counts["unknown_tool"]),
        "tools/parse_errors": float(counts["parse_error"]),
        "tools/seconds_mean": sum(ran) / len(ran) if ran else 0.0,
        "tools/seconds_max": max(ran, default=0.0),
    }


class ToolExecutor:
    """``num_processes`` sandbox processes serving the tools ``names`` under ``limits``.

    The names are checked here, in this process, after loading
    ``RLSHELL_EXT_MODULE``: a typo raises the registry's KeyError with close
    names before anything starts. The constructor returns once every process
    is ready (``start_timeout_s`` bounds each start: interpreter, imports,
    extensions), or raises `SandboxError`. Use as a context manager or call
    `close`. One `run` at a time; one that is interrupted (Ctrl-C) closes the
    executor.
    """

    def __init__(
        self,
        names: Sequence[str],
        limits: ToolLimits | None = None,
        num_processes: int = 1,
        *,
        start_timeout_s: float = 120.0,
    ) -> None:
        if isinstance(names, str):
            raise TypeError(f"names: expected a sequence of tool names, got the string {names!r}")
        if num_processes < 1:
            raise ValueError(f"num_processes: expected a positive integer, got {num_processes}")
        if not names or len(set(names)) != len(names):
            raise ValueError(f"names: expected distinct tool names, got {list(names)}")
        load_extensions(where="tool executor")
        for name in names:
            get_tool(name)
        self.names = tuple(names)
        self.limits = limits if limits is not None else ToolLimits()
        self.num_processes = num_processes
        self.start_timeout_s = start_timeout_s
        self._context = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._closed = False
        self._scratch_root = tempfile.mkdtemp(prefix="rlshell-tools-")
        self._processes: list[_SandboxProcess] = []
        try:
            for _ in range(num_processes):
                self._processes.append(self._start_process())
            no_results: list[ToolResult | None] = []
            while not all(process.ready for process in self._processes):
                self._wait_and_read(no_results)
                self._enforce_deadlines(no_results)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._processes)} processes"
        return f"ToolExecutor({list(self.names)!r}, {self.limits!r}, {state})"

    @property
    def closed(self) -> bool:
        return self._closed

    def run(self, calls: Sequence[ToolCall | ParseError]) -> list[ToolResult]:
        """The result of each call, in order. A `ParseError` becomes a ``parse_error``
        result whose observation is ``error: <its message>``; a call to a tool this
        executor does not serve an ``unknown_tool`` one; the others run concurrently
        across the processes."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"this ToolExecutor for {list(self.names)} is closed")
            results: list[ToolResult | None] = [None] * len(calls)
            queue: deque[int] = deque()
            for index, call in enumerate(calls):
                if isinstance(call, ParseError):
                    results[index] = ToolResult(f"error: {call.message}", "parse_error", 0.0)
                elif call.name not in self.names:
                    results[index] = ToolResult(self._unknown(call.name), "unknown_tool", 0.0)
                else:
                    queue.append(index)
            try:
                while any(result is None for result in results):
                    self._dispatch(queue, calls)
                    self._wait_and_read(results)
                    self._enforce_deadlines(results)
            except BaseException:
                # Answers to this batch may still be on their way; no later batch may read them.
                self._close_now()
                raise
            return [result for result in results if result is not None]

    def close(self) -> None:
        """Stop every process and remove the scratch directories (idempotent)."""
        with self._lock:
            self._close_now()

    def _unknown(self, name: str) -> str:
        close = difflib.get_close_matches(name, self.names, n=2, cutoff=0.5)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        return f"error: unknown tool {name!r}{hint}; tools: {', '.join(self.names)}"

    # -- the scheduler: one call per process at a time

    def _start_process(self) -> _SandboxProcess:
        return _SandboxProcess(
            self._context, self.names, self.limits, self._scratch_root, self.start_timeout_s
        )

    def _dispatch(self, queue: deque[int], calls: Sequence[ToolCall | ParseError]) -> None:
        for process in self._processes:
            if not queue:
                return
            if process.ready and process.call is None:
                index = queue.popleft()
                call = cast(ToolCall, calls[index])
                try:
                    process.conn.send((call.name, call.argument))
                except OSError:
                    queue.appendleft(index)
                    continue  # it died; reading its connection finds out
                process.call = index
                process.call_started = time.monotonic()

    def _wait_and_read(self, results: list[ToolResult | None]) -> None:
        """Wait until a process answers or the nearest deadline; read every answer."""
        now = time.monotonic()
        deadlines = [process.deadline(self.limits.timeout_s) for process in self._processes]
        timeout = max(0.0, min((d for d in deadlines if d is not None), default=now + 1.0) - now)
        ready = wait([process.conn for process in self._processes], timeout)
        for slot, process in enumerate(list(self._processes)):
            if process.conn not in ready:
                continue
            try:
                message = process.conn.recv()
            except (EOFError, OSError):
                self._replace(slot, results, process.death())
                continue
            if message[0] == "ready":
                process.ready = True
            elif message[0] == "failed":
                raise SandboxError(
                    f"tool sandbox process (pid {process.pid}) for {list(self.names)} could "
                    f"not start: {message[1]}"
                )
            else:
                status, observation, seconds = message
                assert process.call is not None
                results[process.call] = ToolResult(observation, status, seconds)
                process.call = None

    def _enforce_deadlines(self, results: list[ToolResult | None]) -> None:
        now = time.monotonic()
        for slot, process in enumerate(list(self._processes)):
            deadline = process.deadline(self.limits.timeout_s)
            if deadline is None or now < deadline:
                continue
            if not process.ready:
                raise SandboxError(
                    f"tool sandbox process (pid {process.pid}) for {list(self.names)} did "
                    f"not start within {self.start_timeout_s:g} s"
                )
            self._replace(
                slot,
                results,
                f"its sandbox process did not answer within {self.limits.timeout_s:g} s "
                f"+ {_ANSWER_GRACE_S:g} s and was killed",
                timed_out=True,
            )

    def _replace(
        self, slot: int, results: list[ToolResult | None], reason: str, *, timed_out: bool = False
    ) -> None:
        """Kill the process in ``slot``, fail its call with ``reason``, start another."""
        process = self._processes[slot]
        process.kill()
        if not process.ready:
            raise SandboxError(
                f"tool sandbox process for {list(self.names)}: {reason} before it was ready "
                "(see its stderr)"
            )
        if process.call is not None:
            seconds = time.monotonic() - process.call_started
            status: Status = "timeout" if timed_out else "crashed"
            results[process.call] = ToolResult(f"error: the call failed: {reason}", status, seconds)
        self._processes[slot] = self._start_process()

    def _close_now(self) -> None:
        if self._closed:
            return
        self._closed = True
        for process in self._processes:
            process.kill()
        self._processes = []
        shutil.rmtree(self._scratch_root, ignore_errors=True)


class _SandboxProcess:
    """One sandbox process as the executor sees it: its connection and its call."""

    def __init__(
        self,
        context: SpawnContext,
        names: tuple[str, ...],
        limits: ToolLimits,
        scratch_root: str,
        start_timeout_s: float,
    ) -> None:
        parent_end, child_end = context.Pipe(duplex=True)
        self.process = context.Process(
            target=serve,
            args=(child_end, names, limits, scratch_root, os.getpid()),
            name=f"tools:{','.join(names)}",
            daemon=True,
        )
        with _main_script_left_out():
            self.process.start()
        child_end.close()  # so that the child's exit reads as EOF here
        assert self.process.pid is not None
        self.pid = self.process.pid
        self.conn: Connection = parent_end
        self.ready = False
        self.start_deadline = time.monotonic() + start_timeout_s
        self.call: int | None = None
        self.call_started = 0.0

    def deadline(self, timeout_s: float) -> float | None:
        """When this process must have answered: start-up, or its call's end plus grace."""
        if not self.ready:
            return self.start_deadline
        if self.call is None:
            return None
        return self.call_started + timeout_s + _ANSWER_GRACE_S

    def death(self) -> str:
        """Why the process ended, once its connection has closed."""
        self.process.join(1.0)
        code = self.process.exitcode
        if code is not None and code < 0:
            return f"its sandbox process (pid {self.pid}) died of {signal.Signals(-code).name}"
        return f"its sandbox process (pid {self.pid}) exited with code {code}"

    def kill(self) -> None:
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join(5.0)
        self.conn.close()

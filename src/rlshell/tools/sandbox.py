"""Tool calls run in sandbox processes, each call under limits, a batch at a time.

    calls = [parse_tool_call(turn, fmt) for turn in turns]     # ToolCall | ParseError | None
    with ToolExecutor(["calculator", "python"], ToolLimits(timeout_s=5.0), num_processes=4) as ex:
        results = ex.run([call for call in calls if call is not None])
        logger.log(step, tool_metrics(results))               # tools/calls, tools/ok_frac, ...
        observations = [format_result(result.observation, fmt) for result in results]

The executor starts ``num_processes`` sandbox processes once (the "spawn"
start method: a fresh interpreter, never a fork of a process that may hold
threads, as Ray workers do) and keeps them; starting, deadlines and
replacement are `rlshell.process_pool.ProcessPool`'s, shared with the reward
pool, and what a sandbox process sends back is JSON, never a pickle. Each loads
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
import secrets
import shutil
import sys
import tempfile
from collections.abc import Sequence
from typing import Any, Literal, cast, get_args

import attrs
from attrs import frozen

from rlshell.extensions import load_extensions
from rlshell.isolation import Confinement, SandboxContext, isolation_problems
from rlshell.process_pool import ClosedOnExit, ProcessPool, ProtocolError, Starter
from rlshell.tools import get_tool
from rlshell.tools.limits import ToolLimits
from rlshell.tools.parsing import ParseError, ToolCall
from rlshell.tools.sandbox_process import serve, serve_sandboxed

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


class ToolExecutor(ClosedOnExit):
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
        self._scratch_root = tempfile.mkdtemp(prefix="rlshell-tools-")
        starter = _starter(self.names, self.limits, self._scratch_root)
        try:
            self._pool = ProcessPool(
                starter,
                num_processes,
                timeout_s=self.limits.timeout_s,
                grace_s=_ANSWER_GRACE_S,
                owner=f"tool executor for {list(self.names)}",
                error=SandboxError,
                start_timeout_s=start_timeout_s,
            )
        except BaseException:
            shutil.rmtree(self._scratch_root, ignore_errors=True)
            raise

    def __repr__(self) -> str:
        state = "closed" if self._pool.closed else f"{self._pool.size} processes"
        return f"ToolExecutor({list(self.names)!r}, {self.limits!r}, {state})"

    @property
    def closed(self) -> bool:
        return self._pool.closed

    @property
    def pids(self) -> list[int]:
        """The sandbox processes' pids (a replaced one's successor in its place)."""
        return self._pool.pids

    def run(self, calls: Sequence[ToolCall | ParseError]) -> list[ToolResult]:
        """The result of each call, in order. A `ParseError` becomes a ``parse_error``
        result whose observation is ``error: <its message>``; a call to a tool this
        executor does not serve an ``unknown_tool`` one; the others run concurrently
        across the processes."""
        if self._pool.closed:
            raise RuntimeError(f"this ToolExecutor for {list(self.names)} is closed")
        batch = _ToolBatch(calls)
        queue: list[int] = []
        for index, call in enumerate(calls):
            if isinstance(call, ParseError):
                batch.results[index] = ToolResult(f"error: {call.message}", "parse_error", 0.0)
            elif call.name not in self.names:
                batch.results[index] = ToolResult(self._unknown(call.name), "unknown_tool", 0.0)
            else:
                queue.append(index)
        self._pool.run(batch, queue)
        return [result for result in batch.results if result is not None]

    def close(self) -> None:
        """Stop every process and remove the scratch directories (idempotent)."""
        self._pool.close()
        shutil.rmtree(self._scratch_root, ignore_errors=True)

    def _unknown(self, name: str) -> str:
        close = difflib.get_close_matches(name, self.names, n=2, cutoff=0.5)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        return f"error: unknown tool {name!r}{hint}; tools: {', '.join(self.names)}"


_checked_hosts: dict[bool, list[str]] = {}  # network → this host's isolation problems


def _starter(names: tuple[str, ...], limits: ToolLimits, scratch_root: str) -> Starter:
    """How a sandbox process starts: inside bubblewrap (``isolation='sandbox'``, once this
    host is found to allow every part of it), or a spawned interpreter (``'weak'``)."""
    name, label = f"tools:{','.join(names)}", "tool sandbox process"
    if limits.isolation == "weak":
        print(
            f"warning: tool calls ({', '.join(names)}) run with weak isolation "
            "(ToolLimits(isolation='weak'), agent.tool_isolation='weak'): as this process's "
            "user, without a sandbox; see docs/security.md",
            file=sys.stderr,
            flush=True,
        )
        return Starter(
            context=multiprocessing.get_context("spawn"),
            target=serve,
            args=(names, limits, scratch_root, os.getpid()),
            name=name,
            label=label,
        )
    if limits.network not in _checked_hosts:
        _checked_hosts[limits.network] = isolation_problems(limits.network)
    problems = _checked_hosts[limits.network]
    if problems:
        raise SandboxError(
            "the tool sandbox cannot start on this host: "
            + "; ".join(problems)
            + ". Allow those parts, or opt out with ToolLimits(isolation='weak') "
            "(agent.tool_isolation='weak'), which runs tool calls as this process's user "
            "with weaker isolation (docs/security.md)"
        )
    fields = attrs.asdict(limits)
    return Starter(
        context=SandboxContext(Confinement(network=limits.network)),  # type: ignore[arg-type]
        target=serve_sandboxed,
        args=(list(names), fields, secrets.randbelow(4096)),
        name=name,
        label=label,
    )


class _ToolBatch:
    """The calls of one `ToolExecutor.run`, one per request, their results filled in."""

    def __init__(self, calls: Sequence[ToolCall | ParseError]) -> None:
        self.calls = calls
        self.results: list[ToolResult | None] = [None] * len(calls)

    def request(self, indices: list[int]) -> list[Any]:
        (index,) = indices
        call = cast(ToolCall, self.calls[index])
        return ["call", call.name, call.argument]

    def answered(self, index: int, answer: list[Any]) -> None:
        """``[status, observation, seconds]``."""
        match answer:
            case [str() as status, str() as observation, float() | int() as seconds] if (
                status in STATUSES
            ):
                self.results[index] = ToolResult(observation, status, float(seconds))
            case _:
                raise ProtocolError(f"call {index}: an answer of another shape: {answer!r:.80}")

    def lost(self, index: int, reason: str, *, timed_out: bool, seconds: float) -> None:
        status: Status = "timeout" if timed_out else "crashed"
        self.results[index] = ToolResult(f"error: the call failed: {reason}", status, seconds)

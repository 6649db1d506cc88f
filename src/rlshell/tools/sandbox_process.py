"""What runs inside a tool sandbox process: the warm server and the runners it forks.

`rlshell.tools.sandbox.ToolExecutor` spawns each sandbox process once (a
fresh interpreter, never a fork of the caller). There `serve` moves the
process into a network namespace of its own (no interface but a loopback
that is down), drops the capabilities that could undo the limits
(``CAP_SYS_ADMIN``: setns, unshare, mount; ``CAP_SYS_RESOURCE``: raising a
limit; ``CAP_SYS_PTRACE``: entering another process), loads the extension
modules and looks the tools up. Then it answers calls one at a time, on one
Python thread (library thread pools aside, such as OpenBLAS's, which
handle forks), so forking it is safe.

A call runs in a runner, a process forked from the server (cheap: the
server is single-threaded and already warm), in a process group of its own,
with the memory limit (``RLIMIT_AS``: its address space at the fork plus
``memory_mb``), a file-size limit, no core dumps, standard input from
/dev/null, its standard output and error on pipes the server reads, and a
fresh scratch directory (also ``TMPDIR``) as its working directory, removed
after the call. A tool registered ``pure=True`` runs in one runner call after
call, replaced after any call that fails in a way that may leave it broken
(timeout, crash, memory, flooded output); every other tool gets a new runner
per call, killed with its whole process group afterwards.

The server reads a call's output as it comes (``poll``), keeping at most
four bytes per character of the output cap of each stream, counting the rest,
and kills the runner once it wrote `STOP_AFTER_BYTES`; past the call's
deadline it kills the runner's process group (SIGKILL). So the caller only
ever receives a short observation, whatever the tool does.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import io
import json
import os
import resource
import select
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

from rlshell.extensions import ENV_VAR, OBJECTS_ENV_VAR, load_extensions
from rlshell.isolation import (
    CallCgroup,
    SeccompProgram,
    become_call_identity,
    call_uid,
    enter_call_namespaces,
    fork_into_call_pid_namespace,
)
from rlshell.limits import limit_address_space
from rlshell.process_pool import receive_message, send_message
from rlshell.tools import ToolError, ToolFn, get_tool, tool_is_pure
from rlshell.tools.limits import ToolLimits

__all__ = [
    "STOP_AFTER_BYTES",
    "SandboxSetupError",
    "compose_observation",
    "drop_capabilities",
    "isolate_network",
    "serve",
    "serve_sandboxed",
]

# A call that writes more than this (all streams) is stopped: its output was cut long before.
STOP_AFTER_BYTES = 64 * 2**20
_READ_CHUNK = 2**16
_ORPHAN_CHECK_S = 1.0
# While runners killed are still ending, how often the idle server looks again.
_TIDY_AGAIN_S = 0.005
# After a runner is killed or its result is in: how long output still in flight is awaited.
_DRAIN_S = 0.2
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP = 24
_CAP_SETPCAP = 8
_CAPS_DROPPED = {"CAP_SYS_PTRACE": 19, "CAP_SYS_ADMIN": 21, "CAP_SYS_RESOURCE": 24}
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
# The runner's file descriptors: stdin, stdout, stderr, then these two.
_COMMAND_FD, _RESULT_FD = 3, 4
# A runner that could not run its loop (its own code failed) exits with this code.
_RUNNER_BROKEN = 70
# What a runner's result message starts with: kind (ok, error, memory) and payload length.
_HEADER = struct.Struct(">cQ")
_OK, _ERROR, _MEMORY = b"o", b"e", b"m"


class SandboxSetupError(RuntimeError):
    """A sandbox process could not set itself up (network namespace, capabilities)."""


# ---------------------------------------------------------------------------- the server


def serve_sandboxed(
    conn: Connection, names: list[str], limit_fields: dict[str, Any], server_slot: int
) -> None:
    """`serve` inside bubblewrap (`rlshell.isolation.SandboxedProcess`): the limits come as
    JSON; calls work in the sandbox's private ``/scratch``, each as a uid of its own and in a
    cgroup of its own (`rlshell.isolation.become_call_identity`, `CallCgroup`)."""
    limits = ToolLimits(**limit_fields)
    serve(conn, tuple(names), limits, "/scratch", os.getppid(), sandbox_slot=server_slot)


def serve(
    conn: Connection,
    names: tuple[str, ...],
    limits: ToolLimits,
    scratch_root: str,
    parent_pid: int,
    sandbox_slot: int | None = None,
) -> None:
    """Answer ``(name, argument)`` requests on ``conn`` with ``(status, observation, seconds)``
    until it closes, after reporting ``("ready",)`` or ``("failed", message)``.
    ``sandbox_slot``: this server runs in a sandbox (`serve_sandboxed`), its calls' uids
    numbered from this slot; None: the ``weak`` isolation, which confines itself here."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle
    try:
        if sandbox_slot is None:
            # Off the network first: extension modules are imported inside the namespace too.
            if not limits.network:
                isolate_network()
            drop_capabilities()
        load_extensions(where="tool sandbox process")
        tools = {name: get_tool(name) for name in names}
        pure = {name: tool_is_pure(name) for name in names}
    except Exception as error:
        send_message(conn, ["failed", _setup_failure(error)])
        return
    server = _Server(tools, pure, limits, scratch_root, sandbox_slot)
    try:
        send_message(conn, ["ready"])
        while True:
            try:
                if not conn.poll(_TIDY_AGAIN_S if server.retired else _ORPHAN_CHECK_S):
                    server.tidy()
                    if os.getppid() != parent_pid:
                        return  # the caller is gone
                    continue
                _, name, argument = receive_message(conn)
            except (EOFError, OSError):
                return  # the executor closed its end, or its process is gone
            status, observation, seconds = server.call(name, argument)
            try:
                send_message(conn, ["answer", status, observation, seconds])
            except OSError:
                return
            server.tidy()  # after the answer: the caller does not wait for it
    finally:
        server.close()


def _setup_failure(error: Exception) -> str:
    if isinstance(error, SandboxSetupError):
        return str(error)
    text = error.args[0] if isinstance(error, KeyError) and error.args else error
    message = f"{type(error).__name__}: {text}"
    if isinstance(error, KeyError):
        message += (
            f"; a tool must be registered by a module named in {ENV_VAR} (or an object "
            f"shipped in {OBJECTS_ENV_VAR}) to exist in the sandbox processes"
        )
    return message


def isolate_network() -> None:
    """Move this process (and all it will fork) into a new network namespace: no interface
    but a loopback that is down, so every connection fails. A `SandboxSetupError` saying why
    where that is not allowed."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise SandboxSetupError(
            f"the tool sandbox cannot take its processes off the network: "
            f"unshare(CLONE_NEWNET) failed with {errno.errorcode.get(code, code)} "
            f"({os.strerror(code)}) in pid {os.getpid()} (uid {os.getuid()}); a new network "
            "namespace needs root or CAP_SYS_ADMIN (containers often withhold it). Run where "
            "that is allowed, or pass ToolLimits(network=True) to let tool calls use this "
            "machine's network"
        )


def drop_capabilities() -> None:
    """Drop `_CAPS_DROPPED` from this process's effective, permitted and inheritable sets,
    and from its bounding set where it may (so no exec'd program regains them)."""
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    # The kernel's layout: two {effective, permitted, inheritable} records, the first for
    # capabilities 0-31, the second for 32-63, i.e. [eff_lo, prm_lo, inh_lo, eff_hi, ...].
    data = (ctypes.c_uint32 * 6)()
    if libc.capget(ctypes.byref(header), ctypes.byref(data)) != 0:
        code = ctypes.get_errno()
        raise SandboxSetupError(f"capget failed: {os.strerror(code)}")
    can_drop_bounding = bool(data[0] & (1 << _CAP_SETPCAP))
    for bit in _CAPS_DROPPED.values():  # each below 32: the first record's three words
        for word in range(3):
            data[word] &= ~(1 << bit) & 0xFFFFFFFF
    if can_drop_bounding:
        for name, bit in _CAPS_DROPPED.items():
            if libc.prctl(_PR_CAPBSET_DROP, bit, 0, 0, 0) != 0:
                code = ctypes.get_errno()
                raise SandboxSetupError(
                    f"prctl(PR_CAPBSET_DROP, {name}) failed: {os.strerror(code)}"
                )
    if libc.capset(ctypes.byref(header), ctypes.byref(data)) != 0:
        code = ctypes.get_errno()
        raise SandboxSetupError(
            f"capset (dropping {', '.join(_CAPS_DROPPED)}) failed: {os.strerror(code)}"
        )


class _Server:
    """The calls of one sandbox process: runners forked, read, killed, their scratch removed."""

    def __init__(
        self,
        tools: Mapping[str, ToolFn],
        pure: Mapping[str, bool],
        limits: ToolLimits,
        scratch_root: str,
        sandbox_slot: int | None = None,
    ) -> None:
        self.tools, self.pure, self.limits = tools, pure, limits
        self.scratch_root = scratch_root
        self.sandbox_slot = sandbox_slot
        self.runners_made = 0
        self.closing = False
        self.pure_runner: _Runner | None = None
        self.spare: _Runner | None = None  # a runner forked ahead, for the next call
        self.answered: list[_Runner] = []  # runners whose call is answered, to kill (`tidy`)
        self.retired: list[_Runner] = []  # killed, not yet reaped and removed (`tidy`)
        self.free_cgroups: list[CallCgroup] = []  # emptied by `tidy`, for the next runners
        self.scratch_left: list[str] = []  # scratch directories of answered calls
        self.seccomp_filter: SeccompProgram | None = None  # what each call loads last

    def call(self, name: str, argument: str) -> tuple[str, str, float]:
        """Run one call: ``(status, observation, seconds)``."""
        start = time.perf_counter()
        pure = self.pure[name]
        scratch = tempfile.mkdtemp(prefix="call-", dir=self.scratch_root)
        try:
            runner = self._runner_for(pure)
            if not self._send(runner, name, argument, scratch):
                self._retire(runner)  # it died waiting (the pure runner, or the spare)
                runner = self._runner_for(pure)
                if not self._send(runner, name, argument, scratch):
                    reading = runner.died_before_reading()
                    self._retire(runner)
                    return reading.outcome(self.limits, time.perf_counter() - start)
            deadline = time.monotonic() + self.limits.timeout_s
            if not pure and self.spare is None:
                # The next call's runner is forked while this one runs (a fork of a process
                # that imported torch takes ~10-30 ms); this call's output waits in its pipes.
                self.spare = self._new_runner()
            reading = runner.read(deadline)
            if reading.broke_runner:
                self._retire(runner)
            elif not pure:
                # Its result is in: killed after the answer is sent (`tidy`), not before.
                self.answered.append(runner)
            return reading.outcome(self.limits, time.perf_counter() - start)
        finally:
            self.scratch_left.append(scratch)

    def _runner_for(self, pure: bool) -> _Runner:
        """The pure tools' runner, or a fresh one (the spare, if one is forked)."""
        if pure and self.pure_runner is not None:
            return self.pure_runner
        runner, self.spare = self.spare or self._new_runner(), None
        if pure:
            self.pure_runner = runner
        return runner

    def _new_runner(self) -> _Runner:
        """A runner; in a sandbox, as a uid of its own in a cgroup of its own."""
        self.runners_made += 1
        confinement = None
        if self.sandbox_slot is not None:
            cgroup = self.free_cgroups.pop() if self.free_cgroups else None
            if cgroup is None:
                cgroup = CallCgroup(
                    f"call-{self.runners_made}",
                    memory_bytes=self.limits.memory_mb * 2**20 + _resident_bytes() + 2**25,
                    max_processes=self.limits.max_processes,
                    cpus=self.limits.cpus,
                )
            if self.seccomp_filter is None:
                self.seccomp_filter = SeccompProgram()
            confinement = _Confinement(
                call_uid(self.sandbox_slot, self.runners_made),
                cgroup,
                self.seccomp_filter,
                network=self.limits.network,
            )
        return _Runner(self.tools, self.limits, confinement)

    @staticmethod
    def _send(runner: _Runner, name: str, argument: str, scratch: str) -> bool:
        if runner.confinement is not None:  # the call's own uid owns its scratch directory
            os.chown(scratch, runner.confinement.uid, runner.confinement.uid)
        return runner.send(name, argument, scratch)

    def _retire(self, runner: _Runner) -> None:
        runner.close()
        if runner not in self.retired:
            self.retired.append(runner)
        if runner is self.pure_runner:
            self.pure_runner = None

    def tidy(self, block: bool = False) -> None:
        """Kill the runners whose calls were answered, reap the retired runners that have
        ended (killed, they end within a few ms; with ``block``, wait for each), free or
        remove their cgroups, and remove the answered calls' scratch directories. The
        server tidies after each answer and again while it waits for the next call, so
        that no call waits for another one's end."""
        for runner in self.answered:
            self._retire(runner)
        self.answered = []
        ending = []
        for runner in self.retired:
            if not runner.reap(block):
                ending.append(runner)
                continue
            if runner.confinement is not None:
                cgroup = runner.confinement.cgroup
                if not self.closing and cgroup.reuse():
                    self.free_cgroups.append(cgroup)
                else:
                    cgroup.remove()
        self.retired = ending
        for scratch in self.scratch_left:
            shutil.rmtree(scratch, ignore_errors=True)
        self.scratch_left = []

    def close(self) -> None:
        for runner in (self.pure_runner, self.spare):
            if runner is not None:
                self._retire(runner)
        self.spare = None
        self.closing = True
        self.tidy(block=True)
        for cgroup in self.free_cgroups:
            cgroup.remove()
        self.free_cgroups = []


class _Capture:
    """One output stream of a call: the first ``keep`` bytes, and how many more came."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.data = bytearray()
        self.cut = 0

    def add(self, chunk: bytes) -> None:
        room = self.keep - len(self.data)
        self.data += chunk[: max(room, 0)]
        self.cut += max(len(chunk) - max(room, 0), 0)

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


class _ResultCapture(_Capture):
    """The runner's result message: a `_HEADER` (kind, payload length), then the payload."""

    def __init__(self, keep: int) -> None:
        super().__init__(keep)
        self.header = bytearray()
        self.kind: bytes | None = None
        self.expected = 0
        self.received = 0

    def add(self, chunk: bytes) -> None:
        if self.kind is None:
            needed = _HEADER.size - len(self.header)
            self.header += chunk[:needed]
            chunk = chunk[needed:]
            if len(self.header) < _HEADER.size:
                return
            self.kind, self.expected = _HEADER.unpack(bytes(self.header))
        self.received += len(chunk)
        super().add(chunk)

    @property
    def complete(self) -> bool:
        return self.kind is not None and self.received >= self.expected


class _Reading:
    """What the server read of one call, and how the call ended."""

    def __init__(self, keep: int) -> None:
        self.stdout, self.stderr, self.result = _Capture(keep), _Capture(keep), _ResultCapture(keep)
        self.timed_out = False
        self.stopped = False  # the call wrote past STOP_AFTER_BYTES and was killed
        self.death = ""  # how the runner ended, when it died before its result was in
        self.out_of_memory = False  # it died at its cgroup's memory limit

    @property
    def total_bytes(self) -> int:
        captures = (self.stdout, self.stderr, self.result)
        return sum(len(capture.data) + capture.cut for capture in captures)

    @property
    def broke_runner(self) -> bool:
        """Whether the runner must not serve another call."""
        return (
            self.timed_out
            or self.stopped
            or bool(self.death)
            or not self.result.complete
            or self.result.kind == _MEMORY
        )

    def outcome(self, limits: ToolLimits, seconds: float) -> tuple[str, str, float]:
        """``(status, observation, seconds)``: output first, then what went wrong."""
        result = self.result
        returned = result.text() if result.complete and result.kind == _OK else ""
        if self.timed_out:
            status = "timeout"
            failure = f"the call did not finish within {limits.timeout_s:g} s and was killed"
        elif self.stopped:
            status, failure = "truncated", None
        elif not result.complete and self.out_of_memory:
            status = "memory"
            failure = (
                f"the call ran out of memory and was killed (limit: {limits.memory_mb} MB "
                "beyond its process's own)"
            )
        elif not result.complete:
            status = "crashed"
            failure = f"the call crashed: {self.death or 'its process ended before returning'}"
        elif result.kind == _MEMORY:
            status = "memory"
            failure = (
                f"the call ran out of memory (limit: {limits.memory_mb} MB beyond its "
                "process's own)"
            )
        elif result.kind == _ERROR:
            status, failure = "error", result.text()
        else:
            status, failure = "ok", None
        cut = self.stdout.cut + self.stderr.cut + (result.cut if result.kind == _OK else 0)
        observation, truncated = compose_observation(
            [self.stdout.text(), self.stderr.text(), returned],
            failure,
            limits.max_output_chars,
            cut_bytes=cut,
            stopped=self.stopped,
        )
        if status == "ok" and truncated:
            status = "truncated"
        return status, observation, seconds


def compose_observation(
    parts: list[str],
    failure: str | None,
    max_chars: int,
    *,
    cut_bytes: int = 0,
    stopped: bool = False,
) -> tuple[str, bool]:
    """A call's observation and whether it was cut.

    The non-empty ``parts`` (standard output, standard error, the returned
    text) joined, each ending with a newline where another follows; then
    ``error: <failure>`` when the call failed. At most ``max_chars``
    characters of output are kept: the failure line is always kept (its last
    half of ``max_chars`` if longer), the output's head takes the rest, and a
    note says how much was cut (``cut_bytes``: output dropped unread, counted
    in bytes) or that the call was ``stopped`` for writing too much.
    """
    texts = [part for part in parts if part]
    output = "".join(
        text if index == len(texts) - 1 or text.endswith("\n") else text + "\n"
        for index, text in enumerate(texts)
    )
    tail = ""
    if failure is not None:
        if len(failure) > max_chars // 2:
            # A traceback's end says what went wrong; its start is the least of it.
            failure = "... " + failure[len(failure) - max_chars // 2 :]
        tail = f"error: {failure}"
    room = max(max_chars - len(tail), 0)
    truncated = len(output) > room or cut_bytes > 0 or stopped
    if truncated:
        cut = len(output) - room if len(output) > room else 0
        output = output[:room]
        if stopped:
            note = (
                f"[output cut at {room:,} characters: the call wrote more than "
                f"{STOP_AFTER_BYTES // 2**20} MiB and was stopped]"
            )
        elif cut_bytes:
            note = f"[output cut: about {cut + cut_bytes:,} more characters not shown]"
        else:
            note = f"[output cut: {cut:,} more characters not shown]"
        output = (output if output.endswith("\n") or not output else output + "\n") + note
    if tail:
        output = (output if output.endswith("\n") or not output else output + "\n") + tail
    return output, truncated


# ---------------------------------------------------------------------------- a runner


class _Confinement:
    """A sandboxed runner's uid, cgroup and seccomp filter."""

    def __init__(
        self, uid: int, cgroup: CallCgroup, seccomp_filter: SeccompProgram, network: bool
    ) -> None:
        self.uid, self.cgroup, self.seccomp_filter = uid, cgroup, seccomp_filter
        self.network = network

    def enter(self) -> None:
        """In the forked runner, before anything else: into the cgroup and namespaces of its
        own (where it is pid 1), then the uid; the whole seccomp filter last."""
        self.cgroup.join()
        enter_call_namespaces(self.network)
        become_call_identity(self.uid)
        self.seccomp_filter.load()


def _resident_bytes() -> int:
    """This process's resident memory: what a fork may copy (and be charged for) at most."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Runner:
    """A process forked from the server that runs calls sent on its command pipe."""

    def __init__(
        self,
        tools: Mapping[str, ToolFn],
        limits: ToolLimits,
        confinement: _Confinement | None = None,
    ) -> None:
        self.limits = limits
        self.confinement = confinement
        command_read, self.command = os.pipe()
        self.result, result_write = os.pipe()
        self.stdout, stdout_write = os.pipe()
        self.stderr, stderr_write = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()  # else the runner would print what this process buffered
        server_pid = os.getpid()
        pid = os.fork() if confinement is None else fork_into_call_pid_namespace()
        if pid == 0:
            try:
                _run_calls(
                    command_read,
                    result_write,
                    stdout_write,
                    stderr_write,
                    tools,
                    limits,
                    server_pid,
                    confinement,
                )
            except BaseException:
                # To the runner's stderr (the call's, once it is set up), then the exit code.
                with contextlib.suppress(BaseException):
                    traceback.print_exc()
            finally:
                os._exit(_RUNNER_BROKEN)
        for fd in (command_read, result_write, stdout_write, stderr_write):
            os.close(fd)
        with contextlib.suppress(OSError):  # the runner does it too; whichever runs first
            os.setpgid(pid, pid)
        for fd in (self.result, self.stdout, self.stderr):
            os.set_blocking(fd, False)
        self.pid = pid
        self.exit_status: int | None = None
        self.closed = False

    def send(self, name: str, argument: str, scratch: str) -> bool:
        """Send a call; False when the runner is gone (its command pipe is broken)."""
        message = json.dumps([name, argument, scratch]).encode()
        try:
            _write_all(self.command, struct.pack(">Q", len(message)) + message)
        except BrokenPipeError:
            return False
        return True

    def read(self, deadline: float) -> _Reading:
        """Read the call's output until its result is in, the runner dies, the deadline
        passes (the runner is then killed) or it writes past `STOP_AFTER_BYTES` (killed)."""
        reading = _Reading(4 * self.limits.max_output_chars)
        captures = {
            self.stdout: reading.stdout,
            self.stderr: reading.stderr,
            self.result: reading.result,
        }
        poller = select.poll()
        for fd in captures:
            poller.register(fd, select.POLLIN)
        open_fds = set(captures)
        while not reading.result.complete:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reading.timed_out = True
                break
            if self.result not in open_fds:
                break  # the result pipe closed before a whole result: the runner died
            for fd, _ in poller.poll(remaining * 1000):
                if not self._read_some(fd, captures[fd]):
                    poller.unregister(fd)
                    open_fds.discard(fd)
            if reading.total_bytes > STOP_AFTER_BYTES:
                reading.stopped = True
                break
        if reading.result.complete:
            # The runner flushed its output before writing its result: what is left is in
            # the pipes now.
            for fd in open_fds - {self.result}:
                self._drain(fd, captures[fd], until=time.monotonic())
            return reading
        self.kill()
        for fd in open_fds:
            self._drain(fd, captures[fd], until=time.monotonic() + _DRAIN_S)
        if not (reading.timed_out or reading.stopped):
            reading.death = self._death()
            confinement = self.confinement
            reading.out_of_memory = confinement is not None and confinement.cgroup.memory_hit()
        return reading

    def died_before_reading(self) -> _Reading:
        """The reading of a call whose fresh runner would not even take it."""
        reading = _Reading(4 * self.limits.max_output_chars)
        self.kill()
        reading.death = self._death()
        return reading

    def _read_some(self, fd: int, capture: _Capture) -> bool:
        """Read what ``fd`` holds into ``capture``; False at end of file."""
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        capture.add(chunk)
        return True

    def _drain(self, fd: int, capture: _Capture, until: float) -> None:
        """Read what is in ``fd`` (waiting for more until ``until``), within the stop bound."""
        read = 0
        while read <= STOP_AFTER_BYTES:
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except BlockingIOError:
                remaining = until - time.monotonic()
                if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                    return
                continue
            if not chunk:
                return
            read += len(chunk)
            capture.add(chunk)

    def _death(self) -> str:
        """How the runner ended (it has, or was killed): reaped here."""
        if self.exit_status is None:
            try:
                _, self.exit_status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                return "its process ended (exit status unknown)"
        status = self.exit_status
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            try:
                name = signal.Signals(number).name
            except ValueError:
                name = "an unnamed signal"
            return f"its process died of {name} (signal {number})"
        code = os.WEXITSTATUS(status)
        if code == _RUNNER_BROKEN:
            return f"its process failed outside the tool (exit code {code})"
        return f"its process exited with code {code} before returning"

    def kill(self) -> None:
        """SIGKILL the runner and its process group, and in a sandbox every process of its
        cgroup (idempotent; not yet reaped). A sandbox's runner is pid 1 of its namespace:
        the kernel kills everything else in it as it dies, and `reap` returns once all of
        it is gone, so nothing waits here for its cgroup to empty."""
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(self.pid, signal.SIGKILL)
        if self.confinement is not None:
            self.confinement.cgroup.kill(wait=False)

    def close(self) -> None:
        """Kill the runner and close its pipes (idempotent)."""
        self.kill()
        if not self.closed:
            self.closed = True
            for fd in (self.command, self.result, self.stdout, self.stderr):
                os.close(fd)

    def reap(self, block: bool = True) -> bool:
        """Once killed: collect its exit status (no zombie); whether it has ended (without
        ``block``, it may not have yet: a sandbox's pid 1 takes its namespaces down first)."""
        if self.exit_status is None:
            try:
                pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return False
            self.exit_status = status
        return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


# ---------------------------------------------------------------------------- inside a runner


def _run_calls(
    command_read: int,
    result_write: int,
    stdout_write: int,
    stderr_write: int,
    tools: Mapping[str, ToolFn],
    limits: ToolLimits,
    server_pid: int,
    confinement: _Confinement | None = None,
) -> None:
    """The runner's loop: it ends with its command pipe, or is killed."""
    if confinement is not None:
        # Pid 1 of its own PID namespace: its parent is out of sight (getppid() is 0), and
        # when the server dies the sandbox's namespace ends, and every call's nested in it.
        confinement.enter()  # before the death signal below: a change of uid clears it
    os.setpgid(0, 0)
    # A runner dies with its server (killed by the executor), even in the middle of a call.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if confinement is None and os.getppid() != server_pid:
        os._exit(_RUNNER_BROKEN)  # the server died before the line above
    devnull = os.open(os.devnull, os.O_RDONLY)
    # Lift every descriptor above the targets first, so that no dup2 overwrites a source.
    sources = [
        fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
        for fd in (devnull, stdout_write, stderr_write, command_read, result_write)
    ]
    for target, fd in enumerate(sources):
        # The command and result pipes stay out of the programs a call may exec.
        os.dup2(fd, target, inheritable=target <= 2)
    # Nothing else of the server's stays open here: its connection to the caller, other pipes.
    os.closerange(_RESULT_FD + 1, os.sysconf("SC_OPEN_MAX"))
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )
    # Flushed after each call, even if the call replaced sys.stdout or sys.stderr.
    streams = (sys.stdout, sys.stderr)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # Past the file-size limit a write fails (EFBIG) instead of killing the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _limit_resources(limits)
    while True:
        command = _read_command()
        if command is None:
            os._exit(0)
        name, argument, scratch = command
        os.chdir(scratch)
        os.environ["TMPDIR"] = scratch
        tempfile.tempdir = None
        kind, text = _call(tools[name], argument)
        for stream in streams:
            with contextlib.suppress(Exception):
                stream.flush()
        payload = text.encode("utf-8", errors="replace")
        _write_all(_RESULT_FD, _HEADER.pack(kind, len(payload)) + payload)


def _limit_resources(limits: ToolLimits) -> None:
    limit_address_space(limits.memory_mb)
    file_size = limits.max_file_mb * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))


def _read_command() -> tuple[str, str, str] | None:
    header = _read_exact(_COMMAND_FD, 8)
    if header is None:
        return None
    body = _read_exact(_COMMAND_FD, struct.unpack(">Q", header)[0])
    if body is None:
        return None
    name, argument, scratch = json.loads(body)
    return str(name), str(argument), str(scratch)


def _read_exact(fd: int, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _call(tool: ToolFn, argument: str) -> tuple[bytes, str]:
    """``(kind, text)``: the returned text, or an error's message, or an out-of-memory mark."""
    out_of_memory = False
    try:
        value: object = tool(argument)
    except ToolError as error:
        return _ERROR, str(error) or "ToolError"
    except MemoryError:
        # Leaving this block drops the traceback, and with it what the call had allocated.
        out_of_memory = True
    except BaseException as error:  # SystemExit and KeyboardInterrupt raised by a tool too
        message = str(error)
        return _ERROR, f"{type(error).__name__}: {message}" if message else type(error).__name__
    if out_of_memory:
        return _MEMORY, ""
    if not isinstance(value, str):
        return _ERROR, f"the tool returned {type(value).__name__}, expected str"
    return _OK, value

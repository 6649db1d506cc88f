"""Errors of worker groups: what the driver raises when a worker fails, and how it is built.

- `WorkerError`: a worker of a group failed; names component, rank, node, pid
  and method. A worker's own exception comes back as an instance of both
  `WorkerError` and the exception's type (``pytest.raises(ValueError)`` still
  works), with the exception's fields and the worker's traceback as text;
- `WorkerDiedError`: the worker's process died before answering;
- `WorkerTimeoutError`: a group call did not finish in time.

Each carries one `WorkerFailure`, the record of which worker failed in which
call and with what; ``error.rank`` and the other attributes read from it. It
is built once, where the driver translates a Ray failure, and pickles with
the error. `WorkerError.extend_message` lets the driver add what it knows to
the message.

The rest turns Ray's failure text into those: the worker's traceback without
Ray's plumbing or the start-up hooks' frames, the pid and IP Ray names, and
Ray's one-line reason. Nothing here imports Ray or the rest of rlshell:
`rlshell.cluster.group` translates Ray's exceptions with these pieces.
"""

from __future__ import annotations

import contextlib
import re
import threading
import types
from typing import Any, cast

from attrs import field, frozen

__all__ = ["WorkerDiedError", "WorkerError", "WorkerFailure", "WorkerTimeoutError"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RAY_PID_IP = re.compile(r"\(pid=(\d+), ip=([^,)\s]+)")
_RAY_HEADER_LINE = re.compile(r"^\s*ray::\S+ \(pid=\d+")
_CARETS = re.compile(r"^\s*[\^~]+\s*$")
_FRAME = re.compile(r'^(\s*)File "([^"]+)", line \d+, in (\S+)')


@frozen(kw_only=True)
class WorkerFailure:
    """Which worker failed, in which call, and with what: the facts a `WorkerError` carries.

    Built once, where the driver translates a Ray failure
    (`rlshell.cluster.group.WorkerGroup._translate`), and read through the
    error's attributes (``error.rank`` is ``error.failure.rank``). A failure of
    a whole call, such as a time-out, names no rank, node or pid.
    ``remote_traceback`` is the worker's traceback when it raised; ``cause`` is
    the worker's exception, or Ray's when the process died.
    """

    component: str = ""
    rank: int | None = None
    node: str = ""
    pid: int | None = None
    method: str = ""
    remote_traceback: str = ""
    # Exceptions compare by identity: left out so that a record equals its pickled copy.
    cause: BaseException | None = field(default=None, eq=False)

    @property
    def where(self) -> str:
        """``component 'actor' rank 1 (node 10.0.0.2, pid 4242)``: the place messages name."""
        pid_text = "" if self.pid is None else f", pid {self.pid}"
        return f"component '{self.component}' rank {self.rank} (node {self.node or '?'}{pid_text})"


class WorkerError(Exception):
    """A worker of a group failed. Names component, rank, node, pid and method.

    The same facts are attributes: ``component``, ``rank``, ``node``, ``pid``,
    ``method``, read from ``failure``, the `WorkerFailure` record. When the
    worker raised an exception, the error raised on the driver is an instance
    of both `WorkerError` and that exception's type, with its fields
    (``errno``, custom attributes, an ExceptionGroup's ``exceptions``);
    ``cause`` is the worker's exception and ``remote_traceback`` its traceback
    as text. Only a cause type that refuses subclassing yields a plain
    `WorkerError`.
    """

    def __init__(self, message: str = "", failure: WorkerFailure | None = None) -> None:
        super().__init__(message)
        self._fill(message, WorkerFailure() if failure is None else failure)

    def _fill(self, message: str, failure: WorkerFailure) -> None:
        # Not `message`: ExceptionGroup has a read-only field of that name.
        self._text = message
        self.failure = failure

    def __str__(self) -> str:
        return self._text

    def extend_message(self, text: str) -> None:
        """Append ``text`` to the message: to ``str(error)``, which the CLI prints.

        For what the driver knows and the worker could not say (what a dead
        worker was doing, which other ranks failed too). Unlike
        `BaseException.add_note`, whose notes a printed traceback shows after
        the message but ``str(error)`` leaves out.
        """
        self._text += text

    @property
    def component(self) -> str:
        return self.failure.component

    @property
    def rank(self) -> int | None:
        return self.failure.rank

    @property
    def node(self) -> str:
        return self.failure.node

    @property
    def pid(self) -> int | None:
        return self.failure.pid

    @property
    def method(self) -> str:
        return self.failure.method

    @property
    def remote_traceback(self) -> str:
        return self.failure.remote_traceback

    @property
    def cause(self) -> BaseException | None:
        return self.failure.cause


class WorkerDiedError(WorkerError):
    """A worker process died (killed, out of memory, crashed) before answering a call."""


class WorkerTimeoutError(WorkerError, TimeoutError):
    """A group call did not finish in time; `pending_ranks` are the ranks still running it."""

    def __init__(
        self,
        message: str = "",
        failure: WorkerFailure | None = None,
        *,
        pending_ranks: tuple[int, ...] = (),
        timeout_s: float = 0.0,
    ) -> None:
        super().__init__(message, failure)
        self.pending_ranks = pending_ranks
        self.timeout_s = timeout_s


def worker_error_for(failure: WorkerFailure, message: str) -> WorkerError:
    """The driver-side error for the exception a worker raised (``failure.cause``).

    An instance of both `WorkerError` and the cause's type, with the cause's
    fields; a plain `WorkerError` when that type cannot be subclassed or
    rebuilt from its ``args``.
    """
    cause = failure.cause
    if cause is not None and (dual := _dual_class(type(cause))) is not None:
        try:
            error = dual.__new__(dual, *cause.args)
        except Exception:  # a __new__ that wants something else: fall back below
            pass
        else:
            # Built-in fields (errno, filename, ...) live in C slots, custom ones
            # in __dict__ (with any __notes__); our fields go last so that the
            # message stays ours.
            _copy_builtin_fields(cause, error)
            error.__dict__.update(getattr(cause, "__dict__", {}))
            error._fill(message, failure)
            return error
    return WorkerError(message, failure)


_DUAL_CLASSES: dict[type[BaseException], type[WorkerError] | None] = {}
_DUAL_LOCK = threading.Lock()


def _dual_class(cause_type: type[BaseException]) -> type[WorkerError] | None:
    """A class deriving from WorkerError and ``cause_type``; None if it cannot be made."""
    if issubclass(cause_type, WorkerError):
        # A worker that called another group re-raised its WorkerError: that
        # class already is both, and nesting it again could not be ordered.
        return cause_type
    with _DUAL_LOCK:
        if cause_type in _DUAL_CLASSES:
            return _DUAL_CLASSES[cause_type]
        name = f"WorkerError({cause_type.__name__})"

        def __getattr__(self: WorkerError, attribute: str) -> Any:
            # Attributes of the worker's exception (errno, a custom field) read
            # through; the guard keeps unpickling and copying from recursing
            # before `failure` exists.
            if attribute.startswith("__") or "failure" not in self.__dict__:
                raise AttributeError(attribute)
            return getattr(self.failure.cause, attribute)

        def __reduce__(self: WorkerError) -> tuple[Any, ...]:
            return (worker_error_for, (self.failure, self._text))

        dual: type[WorkerError] | None
        try:
            dual = cast(
                type[WorkerError],
                type(
                    name,
                    (WorkerError, cause_type),
                    {
                        "__module__": __name__,
                        "__qualname__": name,
                        "__getattr__": __getattr__,
                        "__reduce__": __reduce__,
                    },
                ),
            )
        except Exception:  # final types, layout conflicts, an __init_subclass__ refusing
            dual = None
        _DUAL_CLASSES[cause_type] = dual
        return dual


def _copy_builtin_fields(source: BaseException, target: BaseException) -> None:
    """Copy the C-level fields of built-in exception types (OSError.filename, ...)."""
    for cls in type(source).__mro__:
        if cls.__module__ != "builtins" or not issubclass(cls, BaseException):
            continue
        for name, descriptor in vars(cls).items():
            # args is already in place; dunder slots (__class__, __traceback__,
            # __cause__, ...) are the exception's plumbing, not its data.
            if name == "args" or name.startswith("_"):
                continue
            if not isinstance(descriptor, types.MemberDescriptorType | types.GetSetDescriptorType):
                continue
            # Unset fields raise on read, read-only ones on write: both stay as they are.
            with contextlib.suppress(AttributeError, TypeError):
                setattr(target, name, getattr(source, name))


# ---------------------------------------------------------------- reading Ray's failure text


def remote_traceback(
    ray_text: str, hook_file: str, hook_frames: frozenset[str]
) -> tuple[str, int | None, str]:
    """The worker's traceback from a RayTaskError's text, and the pid and IP Ray names.

    Frames of the functions ``hook_frames`` in the file ending ``hook_file``
    (the worker's start-up hooks) are dropped, as `clean_traceback` says.
    """
    text = _ANSI.sub("", ray_text)
    match = _RAY_PID_IP.search(text)
    pid = int(match.group(1)) if match else None
    ip = match.group(2) if match else ""
    return clean_traceback(text, hook_file, hook_frames), pid, ip


def clean_traceback(text: str, hook_file: str, hook_frames: frozenset[str]) -> str:
    """Ray's traceback text as Python would print it, without Ray's or our plumbing.

    Ray writes a ``ray::Class.method() (pid=..., ip=...)`` header where it cut
    its own frames, leaving their caret lines behind; the worker's start-up
    hooks (the functions ``hook_frames`` of the file ending ``hook_file``) add
    two frames to every constructor error. All of those go.
    """
    kept: list[str] = []
    skip_deeper_than: int | None = None
    for line in text.strip().splitlines():
        if _RAY_HEADER_LINE.match(line) or _CARETS.match(line):
            continue
        indent = len(line) - len(line.lstrip())
        if skip_deeper_than is not None and indent > skip_deeper_than:
            continue  # source lines of a frame being dropped
        skip_deeper_than = None
        frame = _FRAME.match(line)
        if frame and frame.group(2).endswith(hook_file) and frame.group(3) in hook_frames:
            skip_deeper_than = indent
            continue
        kept.append(line)
    lines: list[str] = []
    for line in kept:
        previous = next((seen for seen in reversed(lines) if seen.strip()), "")
        starts_chunk = not lines or previous.startswith(("The above exception", "During handling"))
        if starts_chunk and _FRAME.match(line):
            lines.append("Traceback (most recent call last):")
        if lines or _FRAME.match(line) or line.startswith("Traceback"):
            lines.append(line)  # anything before the first frame is Ray's preamble
    return "\n".join(lines) if lines else text.strip()


_EXIT_DETAIL = re.compile(r"Worker exit detail: (.*?\.)(?:\s|$)")


def ray_reason(error: object, limit: int = 600) -> str:
    """Ray's explanation of ``error`` on one line: its exit detail if it gave one, else the
    text, capped."""
    reason = " ".join(_ANSI.sub("", str(error)).split())
    detail = _EXIT_DETAIL.search(reason)
    if detail:
        return detail.group(1)
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."

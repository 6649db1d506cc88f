"""Resource limits: the address space a child process sets on itself (tool sandboxes, reward
processes), and a time limit on a call in this process's main thread (an env's step)."""

from __future__ import annotations

import os
import resource
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["CallTimeout", "limit_address_space", "time_limit"]


class CallTimeout(TimeoutError):
    """A call under `time_limit` ran past its limit (raised inside the call)."""


def limit_address_space(memory_mb: int) -> None:
    """Let this process's address space grow by at most ``memory_mb`` MiB from its size now
    (``RLIMIT_AS``): an allocation past it fails (MemoryError in Python) instead of taking
    the machine's memory; no core dumps either (``RLIMIT_CORE`` 0)."""
    page = os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/statm") as statm:
        address_space = int(statm.read().split()[0]) * page
    memory = address_space + memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@contextmanager
def time_limit(seconds: float | None, what: str) -> Iterator[None]:
    """Raise `CallTimeout` inside the block once it has run ``seconds`` (None: no limit).

    A real-time timer (``SIGALRM``) interrupts the block where the interpreter
    next runs: Python code, ``time.sleep`` and waits on pipes or sockets (an
    ``AsyncVectorEnv`` waiting on its processes) are interrupted; a C call
    that never returns to the interpreter is not. Only the main thread
    receives signals, so a limit set in another thread is refused (ValueError).
    The previous ``SIGALRM`` handler is restored afterwards.
    """
    if seconds is None:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        raise ValueError(
            f"a time limit on {what} needs the call in the process's main thread "
            f"(it runs in thread {threading.current_thread().name!r})"
        )

    def expired(signum: int, frame: FrameType | None) -> None:
        raise CallTimeout(f"{what} did not return within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

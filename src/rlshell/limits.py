"""Resource limits a child process sets on itself (tool sandboxes, reward processes)."""

from __future__ import annotations

import os
import resource

__all__ = ["limit_address_space"]


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

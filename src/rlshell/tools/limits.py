"""`ToolLimits`: the limits every tool call runs under, read by the executor and its servers."""

from __future__ import annotations

import math
from typing import Literal

from attrs import field, frozen

__all__ = ["ToolLimits"]


def _positive(instance: object, attribute: object, value: float) -> None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):
        name = getattr(attribute, "name", "value")
        raise ValueError(f"ToolLimits.{name}: expected a positive number, got {value!r}")


def _positive_int(instance: object, attribute: object, value: int) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        name = getattr(attribute, "name", "value")
        raise ValueError(f"ToolLimits.{name}: expected a positive integer, got {value!r}")


@frozen
class ToolLimits:
    """The limits every tool call runs under (module docstring: what each one does).

    ``timeout_s``: wall-clock seconds per call; ``memory_mb``: address space
    a call may add to its process's own (the interpreter and the imports of
    the tools, torch included, are not counted); ``max_output_chars``: the
    longest observation (plus a note when cut); ``network``: whether calls
    may use this machine's network; ``max_file_mb``: the largest file a
    call may write; ``max_processes``: the processes a call may run at once
    (itself included); ``cpus``: the CPU time a call may use per second of
    wall clock. ``isolation``: ``"sandbox"`` (bubblewrap, seccomp, a uid and
    a cgroup per call: `rlshell.isolation`), or ``"weak"``, the documented
    opt-out for hosts that withhold namespaces or cgroups (calls run as the
    trainer's user, with only a network namespace and per-process limits;
    every executor started so says so on standard error).
    """

    timeout_s: float = field(default=5.0, validator=_positive)
    memory_mb: int = field(default=512, validator=_positive_int)
    max_output_chars: int = field(default=4096, validator=_positive_int)
    network: bool = False
    max_file_mb: int = field(default=64, validator=_positive_int)
    max_processes: int = field(default=32, validator=_positive_int)
    cpus: float = field(default=1.0, validator=_positive)
    isolation: Literal["sandbox", "weak"] = field(default="sandbox")

    @isolation.validator
    def _check_isolation(self, attribute: object, value: str) -> None:
        if value not in ("sandbox", "weak"):
            raise ValueError(f"ToolLimits.isolation: expected 'sandbox' or 'weak', got {value!r}")

"""What a tool is and how it reports a failure: imported by the registry and by every tool."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ToolError", "ToolFn"]

ToolFn = Callable[[str], str]
"""A tool: the argument text of one call in, the observation text out."""


class ToolError(Exception):
    """Raised by a tool for a failure the model should read: the observation is
    ``error: <message>``, without a traceback, and the call's status ``error``."""

"""An extension module for the tool tests: tools registered where the sandbox processes look.

``RLSHELL_EXT_MODULE=tool_ext`` (with this directory on the path) registers
them in every process: ``shout`` (the argument upper-cased), ``not_text``
(returns an int, which is an error), and ``runner_pid``, a pure tool that
answers which process it ran in (its PID namespace and its pid there: in a
sandbox each runner is pid 1 of a namespace of its own), or hangs on
``hang``, to tell whether calls shared a process.
"""

from __future__ import annotations

import os
import time
from typing import cast

from rlshell.tools import register_tool


def shout(argument: str) -> str:
    return argument.upper() + "!"


def not_text(argument: str) -> str:
    return cast(str, 42)


def runner_pid(argument: str) -> str:
    if argument == "hang":
        time.sleep(10_000)
    return process_identity()


def process_identity() -> str:
    return f"{os.readlink('/proc/self/ns/pid')}/{os.getpid()}"


def register() -> None:
    register_tool("shout", shout)
    register_tool("not_text", not_text)
    register_tool("runner_pid", runner_pid, pure=True)

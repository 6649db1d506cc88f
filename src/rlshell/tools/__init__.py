"""Tool registry: ``register_tool(name, fn)`` and ``get_tool(name)``.

A tool is ``fn(argument) -> str``: the argument text of one call in (what a
model wrote after the tool's name, `rlshell.tools.parsing`), the observation
text out. A tool reports a failure the model should see by raising
`ToolError` (``raise ToolError("division by zero")`` reads ``error: division
by zero``); any other exception reads ``error: ValueError: ...``. The
built-ins are ``calculator`` (arithmetic, `rlshell.tools.calculator`) and
``python`` (a program's printed output, `rlshell.tools.python_tool`).

Tools run in sandbox processes, never in the caller's:
`rlshell.tools.sandbox.ToolExecutor` runs each call in a process of its own,
under a time limit, a memory limit, an output cap, without network and in a
scratch directory. Those processes look tools up here after loading
``RLSHELL_EXT_MODULE`` (and the objects ``RLSHELL_EXT_OBJECTS`` carries), so
a tool registered by an extension module's ``register()`` exists there too::

    # my_tools.py, named by RLSHELL_EXT_MODULE=my_tools
    from rlshell.tools import ToolError, register_tool

    def word_count(argument: str) -> str:
        if not argument.strip():
            raise ToolError("nothing to count")
        return str(len(argument.split()))

    def register() -> None:
        register_tool("word_count", word_count)
"""

from __future__ import annotations

from rlcore.registry import Registry
from rlshell.tools.errors import ToolError, ToolFn

__all__ = ["TOOLS", "ToolError", "ToolFn", "get_tool", "register_tool", "tool_is_pure"]

TOOLS: Registry[ToolFn] = Registry("tool")
# The tools registered with pure=True (see `register_tool`).
_PURE: set[str] = set()


def register_tool(name: str, fn: ToolFn, force: bool = False, *, pure: bool = False) -> ToolFn:
    """Register ``fn`` under ``name``; ``force=True`` replaces an existing entry.

    A name is one word (no whitespace): the plain call format writes it
    before the argument (``<call>name argument</call>``).

    ``pure=True`` declares that ``fn`` changes nothing in its process (no
    module state, threads, child processes, signal handlers, limits): a pure
    function of its argument, as the calculator is. The sandbox then runs
    its calls one after another in one process (replaced after any call that
    times out, crashes or runs out of memory) instead of forking a process
    per call, which costs ~10 ms where torch is imported. Leave it False for
    anything that runs code it was given.
    """
    if not isinstance(name, str) or not name or any(character.isspace() for character in name):
        raise ValueError(f"tool names are single words without whitespace, got {name!r}")
    if name in TOOLS and not force and (name in _PURE) != pure:
        raise KeyError(
            f"tool '{name}' is already registered with pure={name in _PURE}; "
            "pass force=True to replace it"
        )
    TOOLS.register(name, fn, force=force)
    if pure:
        _PURE.add(name)
    else:
        _PURE.discard(name)
    return fn


def tool_is_pure(name: str) -> bool:
    """Whether the tool ``name`` was registered with ``pure=True`` (KeyError if unknown)."""
    get_tool(name)
    return name in _PURE


def get_tool(name: str) -> ToolFn:
    """The tool registered under ``name`` (a KeyError with close names otherwise)."""
    return TOOLS.get(name)


def _register_builtins() -> None:
    from rlshell.tools.calculator import calculator_tool
    from rlshell.tools.python_tool import run_python

    register_tool("calculator", calculator_tool, pure=True)
    register_tool("python", run_python)


_register_builtins()

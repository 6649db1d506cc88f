"""The ``python`` tool: the argument runs as a Python program, like a notebook cell.

    run_python("x = 6 * 7\\nprint(x)")   # prints 42, returns ''
    run_python("x = 6 * 7\\nx + 1")      # returns '43' (the last line is an expression)
    run_python("1/0")                  # raises ToolError('Traceback ... ZeroDivisionError: ...')

The program runs as ``__main__`` in a fresh namespace of this process and
prints to this process's standard output and error. In a sandbox (`rlshell.
tools.sandbox`) those are captured: the call's observation is what the
program printed (standard output, then standard error), then the value of a
last line that is an expression (its ``repr``, unless None), as a notebook
shows it. So a call outside a sandbox prints here; the sandbox is where this
tool is meant to run (its limits stop a program that hangs, floods its
output or allocates without bound).

A program that raises ends with `ToolError` carrying its traceback as
``python program.py`` prints it (source lines included), less the frames of
library code it called; ``sys.exit(0)`` (or ``sys.exit()``) is a normal end and any other
exit status is an error. A MemoryError is raised as is, for the sandbox to
report as an out-of-memory call.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import linecache
import sys
import traceback

from rlshell.tools.errors import ToolError

__all__ = ["PROGRAM_FILENAME", "run_python"]

# The file name the program's frames carry in tracebacks.
PROGRAM_FILENAME = "<python>"


def run_python(code: str) -> str:
    """Run ``code``; return the ``repr`` of its last line's value where that line is an
    expression with a value other than None, else ''. What it prints goes to this process's
    standard output and error (the sandbox captures them)."""
    try:
        module = ast.parse(code, filename=PROGRAM_FILENAME, mode="exec")
    except SyntaxError as error:
        raise ToolError(_format_syntax_error(error)) from None
    except (RecursionError, MemoryError):
        raise ToolError("the program is nested too deeply to parse") from None
    last: ast.expr | None = None
    if module.body and isinstance(module.body[-1], ast.Expr):
        last = module.body[-1].value
        del module.body[-1]
    # Source lines for the program's frames in tracebacks (the file exists nowhere else).
    linecache.cache[PROGRAM_FILENAME] = (len(code), None, code.splitlines(True), PROGRAM_FILENAME)
    namespace: dict[str, object] = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(module, PROGRAM_FILENAME, "exec"), namespace)
        value = (
            None
            if last is None
            else eval(compile(ast.Expression(last), PROGRAM_FILENAME, "eval"), namespace)
        )
    except SystemExit as exit:
        if exit.code is None or exit.code == 0:
            return ""
        raise ToolError(f"the program exited with status {exit.code!r}") from None
    except MemoryError:
        raise
    except Exception as error:
        raise ToolError(_format_program_error(error)) from None
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # the program may have replaced or closed it
                stream.flush()
    return "" if value is None else repr(value)


def _format_program_error(error: Exception) -> str:
    """The traceback ``python program.py`` would print, with the program's own frames only
    (those of the libraries it called are noise to a model)."""
    frames = traceback.StackSummary.from_list(
        [
            frame
            for frame in traceback.extract_tb(error.__traceback__)
            if frame.filename == PROGRAM_FILENAME
        ]
    )
    lines = ["Traceback (most recent call last):\n"] if frames else []
    lines += frames.format()
    lines += traceback.format_exception_only(type(error), error)
    return "".join(lines).rstrip("\n")


def _format_syntax_error(error: SyntaxError) -> str:
    return "".join(traceback.format_exception_only(type(error), error)).rstrip("\n")

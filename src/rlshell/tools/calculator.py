"""The ``calculator`` tool: arithmetic on integers and floats, evaluated by walking Python's AST.

    calculate("347*829")          # 287663
    calculator_tool("(2+3)/4")    # '1.25'
    calculator_tool("6/3")        # '2' (an integral result is written as an integer)
    calculator_tool("1/0")        # raises ToolError('division by zero')

The expression is parsed with Python's own grammar (so precedence is
Python's: ``-2**2 == -4``, ``2**3**2 == 512``) and evaluated node by node;
nothing is ever passed to ``eval``. Allowed: integer and float literals,
``+ - * / // % **``, unary ``+``/``-`` and parentheses. Anything else (a
name, a call, ``^``, a comparison) is refused with a message saying what is
allowed. Results follow Python's arithmetic exactly, with three refusals:
an integer result (final or intermediate) of more than `MAX_RESULT_DIGITS`
digits (a power is refused before it is computed, so ``9**9**9`` costs
nothing), a float that overflows or is not finite, and a complex result
(``(-8)**0.5``). Float results are written with ``repr`` (the shortest text
that reads back as the same float), except integral ones below 2⁵³, which
are written as integers.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

from rlshell.tools.errors import ToolError

__all__ = ["MAX_RESULT_DIGITS", "calculate", "calculator_tool", "format_number"]

# Integers of up to this many decimal digits; beyond, the expression is refused.
MAX_RESULT_DIGITS = 1000
_TOO_LARGE = 10**MAX_RESULT_DIGITS
_MAX_BITS = _TOO_LARGE.bit_length()
# Floats whose integral value is written as an integer: exactly representable integers.
_EXACT_FLOAT_INTEGERS = 2.0**53
_MAX_EXPRESSION_CHARS = 10_000

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_ALLOWED = "numbers, + - * / // % ** and parentheses"


def calculator_tool(argument: str) -> str:
    """The registered ``calculator``: ``argument`` evaluated (`calculate`) and written
    (`format_number`); a refused or failing expression raises `ToolError` saying why."""
    return format_number(calculate(argument))


def calculate(expression: str) -> Number:
    """The value of the arithmetic ``expression`` (see the module docstring for what is allowed).

    Raises `ToolError` for an expression that is empty, does not parse, uses
    anything but numbers and the allowed operators, divides by zero, or whose
    result is too large, not finite or complex.
    """
    text = expression.strip()
    if not text:
        raise ToolError(f"empty expression; expected {_ALLOWED}")
    if len(text) > _MAX_EXPRESSION_CHARS:
        raise ToolError(
            f"expression of {len(text):,} characters; at most {_MAX_EXPRESSION_CHARS:,}"
        )
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as error:
        raise ToolError(f"invalid expression {_quote(text)}: {error.msg}") from None
    except (RecursionError, MemoryError):
        raise ToolError("expression nested too deeply") from None
    try:
        value = _evaluate(tree.body)
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except OverflowError:
        raise ToolError("the result is too large for a float") from None
    except RecursionError:
        raise ToolError("expression nested too deeply") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError(f"the result is not a finite number ({value})")
    return value


def format_number(value: Number) -> str:
    """``value`` as the calculator writes it: integers as integers, integral floats below
    2⁵³ as integers too, other floats by ``repr``."""
    if isinstance(value, float) and value.is_integer() and abs(value) < _EXACT_FLOAT_INTEGERS:
        return str(int(value))
    return repr(value)


def _evaluate(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        value = node.value
        # bool is an int subclass; ``True + 1`` is not arithmetic on numbers.
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
        raise ToolError(f"unsupported literal {value!r}; only {_ALLOWED}")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _checked(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        raise ToolError("'^' is not a power here; write ** (2**10)")
    raise ToolError(f"unsupported {_describe(node)}; only {_ALLOWED}")


def _check_power(base: Number, exponent: Number) -> None:
    """Refuse an integer power whose result would pass `MAX_RESULT_DIGITS`, before computing it."""
    # |base|**exponent ≥ 2**((bit_length - 1) * exponent), beyond _TOO_LARGE when that
    # exponent passes _MAX_BITS; the cases this misses cost little to compute.
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and exponent > 0
        and (abs(base).bit_length() - 1) * exponent > _MAX_BITS
    ):
        raise ToolError(f"the result would have more than {MAX_RESULT_DIGITS} digits")


def _checked(value: object) -> Number:
    if isinstance(value, complex):
        raise ToolError("the result is not a real number (a fractional power of a negative)")
    if isinstance(value, int) and abs(value) >= _TOO_LARGE:
        raise ToolError(f"the result would have more than {MAX_RESULT_DIGITS} digits")
    assert isinstance(value, int | float)
    return value


def _describe(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return f"name {node.id!r}"
    if isinstance(node, ast.Call):
        return "function call"
    if isinstance(node, ast.BinOp | ast.UnaryOp):
        return f"operator {type(node.op).__name__}"
    return f"syntax ({type(node).__name__})"


def _quote(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")

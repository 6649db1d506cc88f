"""Which arguments of a twin are static under `jax.jit`, and a jit that knows.

A parameter is static when its annotation admits no array: Python floats
(``gamma``, ``clip_low``), strings and literals (``agg``, ``kind``), ints
(``chunk_size``, ``horizon``, ``axis``) and bools. Arguments that may be arrays
(``normalizer``, ``alpha``, an optional ``mask``) are traced.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import jax

__all__ = ["jit", "static_argnames"]

F = TypeVar("F", bound=Callable[..., Any])


def _admits_array(hint: Any) -> bool:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_admits_array(arg) for arg in typing.get_args(hint))
    if hint is jax.Array or hasattr(hint, "dim_str"):
        return True
    # Records of arrays (RunningStats) are pytrees: traced.
    return isinstance(hint, type) and hasattr(hint, "__attrs_attrs__")


def static_argnames(fn: Callable[..., Any]) -> tuple[str, ...]:
    """Names of ``fn``'s parameters that must be static under `jax.jit`."""
    hints = typing.get_type_hints(inspect.unwrap(fn), include_extras=True)
    return tuple(
        name
        for name in inspect.signature(fn).parameters
        if name in hints and not _admits_array(hints[name])
    )


def jit(fn: F, **options: Any) -> F:
    """``jax.jit(fn, static_argnames=static_argnames(fn), **options)``."""
    return typing.cast(F, jax.jit(fn, static_argnames=static_argnames(fn), **options))

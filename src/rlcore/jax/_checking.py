"""Run-time checking and mask conversion for the JAX twins.

`typecheck` applies ``jaxtyped(typechecker=beartype)`` as `rlcore.typecheck`
does, on the same switch (``RLCORE_TYPECHECK``). Under `jax.jit` the checks run
once, at trace time, on the abstract shapes and dtypes: they cost nothing per
call. Checks of values (a float mask holding only 0 and 1) need concrete
arrays and are skipped while tracing.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import torch
from jax import Array
from jaxtyping import TypeCheckError, jaxtyped

from rlcore._checking import _BEARTYPE, _SUSPENDED, typecheck_enabled
from rlcore._checking import _explain as explain_torch

__all__ = ["as_bool_mask", "is_concrete", "typecheck"]

F = TypeVar("F", bound=Callable[..., Any])


def typecheck(fn: F) -> F:
    """Check shapes and dtypes of ``fn``'s arguments and result (at trace time under jit).

    A failed check is explained first as `rlcore.typecheck` explains it (which
    argument, which dimension, the closest valid choice), then jaxtyping's report.
    Inside `rlcore.unchecked` the checks are skipped, as for the torch functions.
    """
    if not typecheck_enabled():
        return fn
    checked = jaxtyped(typechecker=_BEARTYPE)(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _SUSPENDED.depth:  # inside rlcore.unchecked()
            return fn(*args, **kwargs)
        try:
            return checked(*args, **kwargs)
        except TypeCheckError as error:
            explanation = _explain(fn, args, kwargs)
            if explanation is None:
                raise
            raise TypeCheckError(f"{explanation}\n\n{error}") from None

    wrapper.__rlcore_checked__ = True  # type: ignore[attr-defined]
    return typing.cast(F, wrapper)


def _explain(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """`rlcore._checking`'s explanation, run on shape-and-dtype stand-ins of the arrays.

    Each `jax.Array` (a tracer too) becomes a torch tensor on the ``meta`` device
    (shape and dtype, no data), so the torch explainer binds dimensions as for torch.
    """
    stand_in = functools.partial(jax.tree_util.tree_map, _meta_tensor)
    explanation = explain_torch(fn, stand_in(args), stand_in(kwargs))
    if explanation is None:
        return None
    return explanation.replace("must be a torch.Tensor", "must be a jax.Array")


def _meta_tensor(value: Any) -> Any:
    if not isinstance(value, jax.Array):
        return value
    dtype = getattr(torch, str(value.dtype), None)
    if not isinstance(dtype, torch.dtype):
        return value
    return torch.empty(value.shape, dtype=dtype, device="meta")


def is_concrete(array: Array) -> bool:
    """Whether ``array`` holds values now (not an abstract tracer inside jit or grad)."""
    return not isinstance(array, jax.core.Tracer)


def as_bool_mask(mask: Array, name: str = "mask") -> Array:
    """``mask`` as a bool array; a concrete non-bool mask must hold only 0 and 1.

    While tracing, values cannot be inspected: any non-zero entry counts as valid.
    """
    if mask.dtype == jnp.bool_:
        return mask
    if typecheck_enabled() and is_concrete(mask):
        stray = (mask != 0) & (mask != 1)
        if bool(stray.any()):
            bad = mask[stray].ravel()[:3].tolist()
            raise ValueError(f"{name}: a {mask.dtype} mask must hold only 0 and 1, found {bad}")
    return mask != 0

"""Run-time shape and dtype checking for every public rlcore function.

`typecheck` applies ``jaxtyped(typechecker=beartype)``: jaxtyping binds the
named dimensions across all arguments of one call (so ``values`` and
``rewards`` annotated ``"*batch time"`` must agree), beartype checks dtypes and
plain Python types. Setting ``RLCORE_TYPECHECK=0`` before rlcore is imported
turns the checks off (the decorator then returns the function unchanged).

When a check fails, the error is rewritten to say which argument and which
dimension were wrong before jaxtyping's full report, e.g.::

    rlcore.advantages.gae: argument 'values' has shape (4, 7): dimension 'time'
    is 7 but 'rewards' bound it to 5
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
import os
import re
import threading
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import jaxtyping._decorator as _jaxtyping_decorator
import torch
from beartype import BeartypeConf, beartype
from jaxtyping import TypeCheckError, jaxtyped

__all__ = ["TypeCheckError", "typecheck", "typecheck_enabled", "unchecked"]

F = TypeVar("F", bound=Callable[..., Any])

# jaxtyping's first `jaxtyped` call imports jax, when installed, only to hide its
# own frames from jax tracebacks. rlcore must not import jax (the dependency
# rule, and 1.5 s of start-up), so that registration is skipped.
if hasattr(_jaxtyping_decorator, "_tb_flag"):
    _jaxtyping_decorator._tb_flag = False

# int is accepted where float is annotated (gamma=1 is a float to a reader).
_BEARTYPE = beartype(conf=BeartypeConf(is_pep484_tower=True))


_ENABLED = os.environ.get("RLCORE_TYPECHECK", "1").strip().lower() not in {"0", "false", "off"}


def typecheck_enabled() -> bool:
    """Whether run-time checking is on: ``RLCORE_TYPECHECK`` as it was when rlcore was imported.

    Read once, so every check (the decorator and the value checks it guards,
    such as token-id ranges) is on or off together.
    """
    return _ENABLED


class _Suspension(threading.local):
    depth = 0


_SUSPENDED = _Suspension()


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """Skip the checks of rlcore calls made inside, in this thread.

    For a hot loop that repeats calls whose shapes and dtypes were checked
    once already (the embodied runner checks its first update and runs the
    rest inside this): the checks cost more than the maths on small tensors.
    Nests; other threads keep checking.
    """
    _SUSPENDED.depth += 1
    try:
        yield
    finally:
        _SUSPENDED.depth -= 1


def typecheck(fn: F) -> F:
    """Check shapes and dtypes of ``fn``'s arguments and result on every call
    (except inside `unchecked`)."""
    if not typecheck_enabled():
        return fn
    checked = jaxtyped(typechecker=_BEARTYPE)(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _SUSPENDED.depth:
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


# ---------------------------------------------------------------------------
# Explaining a failed check: re-walk the arguments in order, binding dimension
# names exactly as jaxtyping does, and report the first conflict found.

_DIM_TOKEN = re.compile(
    r"^(?P<star>\*)?(?P<broadcast>#)?(?P<name>[A-Za-z_][A-Za-z0-9_]*|\d+|\.\.\.)$"
)


def _explain(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    where = f"{fn.__module__}.{fn.__qualname__}"
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as error:
        return f"{where}: {error}"
    bound.apply_defaults()
    hints = typing.get_type_hints(fn, include_extras=True)
    bindings: dict[str, tuple[tuple[int, ...], str]] = {}
    for name, value in bound.arguments.items():
        hint = hints.get(name)
        if hint is None:
            continue
        choices = _literal_choices(hint)
        if choices and value not in choices:
            shown = ", ".join(repr(c) for c in choices)
            close = difflib.get_close_matches(
                str(value), [str(c) for c in choices], n=1, cutoff=0.5
            )
            hint_text = f" (did you mean '{close[0]}'?)" if close else ""
            return f"{where}: argument '{name}' is {value!r}{hint_text}; expected one of {shown}"
        candidates = [h for h in _flatten_union(hint) if hasattr(h, "dim_str")]
        if not candidates:
            continue
        if value is None and type(None) in typing.get_args(hint):
            continue
        if not isinstance(value, torch.Tensor):
            expected = " or ".join(_describe(c) for c in candidates)
            got = type(value).__name__
            return f"{where}: argument '{name}' must be a torch.Tensor ({expected}), got {got}"
        problems = []
        for candidate in candidates:
            trial = dict(bindings)
            problem = _check_one(name, value, candidate, trial)
            if problem is None:
                bindings = trial
                break
            problems.append(problem)
        else:
            return f"{where}: {problems[0]}"
    return None


def _literal_choices(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    return ()


def _flatten_union(hint: Any) -> list[Any]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [h for arg in typing.get_args(hint) for h in _flatten_union(arg)]
    return [hint]


def _describe(annotation: Any) -> str:
    return str(annotation.__name__)


def _dims(annotation: Any) -> list[tuple[str, str]]:
    """Parse a jaxtyping dimension string into (kind, name) pairs."""
    out: list[tuple[str, str]] = []
    for token in str(annotation.dim_str).split():
        match = _DIM_TOKEN.match(token)
        if match is None:
            out.append(("other", token))
        elif match["name"] == "...":
            out.append(("anon_variadic", "..."))
        elif match["broadcast"]:
            out.append(("broadcast_variadic" if match["star"] else "broadcast", match["name"]))
        elif match["star"]:
            out.append(("variadic", match["name"]))
        elif match["name"].isdigit():
            out.append(("fixed", match["name"]))
        else:
            out.append(("named", match["name"]))
    return out


def _check_one(
    name: str,
    value: torch.Tensor,
    annotation: Any,
    bindings: dict[str, tuple[tuple[int, ...], str]],
) -> str | None:
    dtype_name = str(value.dtype).removeprefix("torch.")
    if dtype_name not in annotation.dtypes:
        allowed = ", ".join(annotation.dtypes)
        return f"argument '{name}' has dtype {dtype_name}; expected one of: {allowed}"
    dims = _dims(annotation)
    if any(kind == "other" for kind, _ in dims):
        return None
    shape = tuple(value.shape)
    variadic = [i for i, (kind, _) in enumerate(dims) if kind in _VARIADIC]
    fixed_count = len(dims) - len(variadic)
    if (variadic and len(shape) < fixed_count) or (not variadic and len(shape) != len(dims)):
        need = f"at least {fixed_count}" if variadic else str(len(dims))
        return (
            f"argument '{name}' has shape {shape} ({len(shape)} dims) but "
            f"'{annotation.dim_str}' needs {need} dims"
        )
    split = variadic[0] if variadic else len(dims)
    tail = len(dims) - split - (1 if variadic else 0)
    parts: list[tuple[tuple[str, str], tuple[int, ...]]] = []
    for i, dim in enumerate(dims[:split]):
        parts.append((dim, (shape[i],)))
    if variadic:
        parts.append((dims[split], shape[split : len(shape) - tail]))
    for j, dim in enumerate(dims[split + 1 :] if variadic else []):
        parts.append((dim, (shape[len(shape) - tail + j],)))
    for (kind, dim_name), size in parts:
        if kind == "fixed" and size != (int(dim_name),):
            return (
                f"argument '{name}' has shape {shape}: a dimension must be {dim_name}, "
                f"got {size[0]}"
            )
        if kind in ("named", "variadic"):
            previous = bindings.get(dim_name)
            if previous is not None and previous[0] != size:
                seen, by = previous
                shown = seen[0] if kind == "named" else seen
                got = size[0] if kind == "named" else size
                return (
                    f"argument '{name}' has shape {shape}: dimension '{dim_name}' is {got} "
                    f"but '{by}' bound it to {shown}"
                )
            bindings[dim_name] = (size, name)
        if kind in ("broadcast", "broadcast_variadic"):
            # '#name' may be 1 where 'name' is bound, '*#name' any shape that broadcasts to
            # it; neither binds a size of its own.
            previous = bindings.get(dim_name)
            if previous is not None and not _broadcasts(size, previous[0]):
                seen, by = previous
                shown = seen[0] if kind == "broadcast" else seen
                got = size[0] if kind == "broadcast" else size
                return (
                    f"argument '{name}' has shape {shape}: dimension '{dim_name}' is {got}, "
                    f"which does not broadcast to {shown}, bound by '{by}'"
                )
    return None


_VARIADIC = ("variadic", "anon_variadic", "broadcast_variadic")


def _broadcasts(size: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether a ``size`` array broadcasts to ``target`` (right-aligned, each dim 1 or equal)."""
    if len(size) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(size), reversed(target), strict=False))

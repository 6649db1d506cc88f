"""Result records of the JAX twins, registered as JAX pytrees.

They mirror `rlcore.types.Advantages` and `rlcore.types.LossOutput` field for
field, hold `jax.Array` s, and can be returned from (and passed into) jitted,
vmapped or differentiated functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import attrs
import jax
from jax import Array
from jaxtyping import Float

__all__ = ["Advantages", "LossOutput", "register_pytree"]

R = TypeVar("R")


def register_pytree(cls: type[R]) -> type[R]:
    """Register an attrs class as a pytree whose children are its fields, in order.

    Leaves are keyed by field name (``.loss``, ``.metrics['clipfrac']``) in
    `jax.tree_util.tree_flatten_with_path` and in JAX's error messages.
    """
    names = tuple(field.name for field in attrs.fields(cls))  # type: ignore[arg-type]
    keys = tuple(jax.tree_util.GetAttrKey(name) for name in names)

    def flatten(record: Any) -> tuple[tuple[Any, ...], None]:
        return tuple(getattr(record, name) for name in names), None

    def flatten_with_keys(record: Any) -> tuple[tuple[tuple[Any, Any], ...], None]:
        return tuple(zip(keys, flatten(record)[0], strict=True)), None

    def unflatten(_: None, children: Any) -> R:
        return cls(*children)

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
    return cls


def _as_dict(metrics: Mapping[str, Any]) -> dict[str, Any]:
    return dict(metrics)


# eq=False as in rlcore.types: == on arrays is elementwise.
@register_pytree
@attrs.frozen(eq=False)
class Advantages:
    """Advantages and the value targets (returns) they imply, both ``[*batch, time]``."""

    advantages: Float[Array, "*batch time"]
    returns: Float[Array, "*batch time"]


@register_pytree
@attrs.frozen(eq=False)
class LossOutput:
    """A scalar loss to minimise and scalar diagnostics (no gradient flows through them)."""

    loss: Float[Array, ""]
    metrics: Mapping[str, Array] = attrs.field(factory=dict, converter=_as_dict)

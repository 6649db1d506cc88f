"""Typed name → object registries.

One `Registry` type serves every pluggable piece of the stack: advantage
estimators and policy losses here, models, environments and rewards in the
shell. A registry refuses to silently replace an entry (``force=True`` does it
on purpose) and answers an unknown name with the closest registered ones:
``ADVANTAGES.get("gpro")`` raises ``KeyError: unknown advantage estimator
'gpro' (did you mean 'grpo'?); registered: ...``.

`ADVANTAGES` holds ``(AdvantageBatch, AdvantageConfig) -> Advantages``
callables and `POLICY_LOSSES` ``(PolicyLossBatch, PolicyLossConfig) ->
LossOutput`` callables; the built-ins are registered when `rlcore` is imported.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Generic, TypeVar, overload

if TYPE_CHECKING:
    from rlcore.advantages import AdvantageEstimator
    from rlcore.losses import PolicyLoss

__all__ = ["ADVANTAGES", "POLICY_LOSSES", "Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from names to ``T`` with explicit replacement and helpful misses."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    @overload
    def register(self, name: str, entry: T, force: bool = False) -> T: ...

    @overload
    def register(self, name: str, entry: None = None, force: bool = False) -> Callable[[T], T]: ...

    def register(
        self, name: str, entry: T | None = None, force: bool = False
    ) -> T | Callable[[T], T]:
        """Register ``entry`` under ``name``; without ``entry``, return a decorator."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{self.kind} names must be non-empty strings, got {name!r}")
        if entry is None:

            def decorator(item: T) -> T:
                return self.register(name, item, force=force)

            return decorator
        # Registering an equal entry again (an extension loaded twice) is not a replacement.
        if name in self._entries and not force and self._entries[name] != entry:
            raise KeyError(
                f"{self.kind} '{name}' is already registered "
                f"({_describe(self._entries[name])}); pass force=True to replace it"
            )
        self._entries[name] = entry
        return entry

    def get(self, name: str) -> T:
        """The entry registered under ``name``, or a KeyError suggesting close names."""
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self._entries), n=3, cutoff=0.5)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        return (
            f"unknown {self.kind} '{name}'{hint}; registered: {', '.join(self.names()) or 'none'}"
        )

    def names(self) -> list[str]:
        return sorted(self._entries)

    def unregister(self, name: str) -> T:
        """Remove and return an entry (for tests and hot-reloading extensions)."""
        entry = self.get(name)
        del self._entries[name]
        return entry

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"


def _describe(entry: object) -> str:
    module = getattr(entry, "__module__", None)
    name = getattr(entry, "__qualname__", None) or type(entry).__name__
    return f"{module}.{name}" if module else str(name)


ADVANTAGES: Registry[AdvantageEstimator] = Registry("advantage estimator")
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")

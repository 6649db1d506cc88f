"""Typed name → object registries.

One `Registry` type serves every pluggable piece of the stack: advantage
estimators and policy losses here, models, environments and rewards in the
shell. A registry refuses to silently replace an entry (``force=True`` does it
on purpose) and answers an unknown name with the closest registered ones:
``ADVANTAGES.get("gpro")`` raises ``KeyError: unknown advantage estimator
'gpro' (did you mean 'grpo'?); registered: ...``.

`ADVANTAGES` holds ``(AdvantageBatch, AdvantageConfig) -> Advantages``
callables and `POLICY_LOSSES` ``(PolicyLossBatch, PolicyLossConfig) ->
LossOutput`` callables. Their built-ins are registered by `rlcore.advantages` and
`rlcore.losses`, which each registry imports before it is first read or written
(``builtins``): this module itself imports no torch.

An entry may say which hyperparameters (fields of its config record) it
reads, so that a caller can refuse the others instead of passing them to an
entry that ignores them:

    ADVANTAGES.register("grpo", _grpo_estimator, reads=("eps",))
    ADVANTAGES.ignores("grpo")   # frozenset({'gamma', 'lam', 'whiten', 'baseline_form'})

An entry registered without ``reads`` is taken to read every hyperparameter.

An entry may also say which optional inputs (fields of the batch record it is called
with that default to None) it needs, so that a caller fills them for it and for no
other, by the entry's word rather than by its name:

    POLICY_LOSSES.register("decoupled_ppo", fn, needs=("proximal_logprobs",))
    POLICY_LOSSES.needs("decoupled_ppo")   # frozenset({'proximal_logprobs'})
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Generic, TypeVar, overload

if TYPE_CHECKING:
    from rlcore.advantages import AdvantageEstimator
    from rlcore.losses import PolicyLoss

__all__ = ["ADVANTAGES", "POLICY_LOSSES", "Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from names to ``T`` with explicit replacement and helpful misses.

    ``hyperparameters``: the names of the fields of the config record every
    entry is called with (`rlcore.advantages.AdvantageConfig` for
    `ADVANTAGES`); an entry's ``reads`` must be among them. ``builtins``: the
    module that registers the built-in entries, imported before the registry is
    first used (so a name looked up, or registered by an extension, always
    meets them).
    """

    def __init__(
        self,
        kind: str,
        hyperparameters: Iterable[str] = (),
        builtins: str | None = None,
        optional_inputs: Iterable[str] = (),
    ) -> None:
        self.kind = kind
        self.hyperparameters = frozenset(hyperparameters)
        self.optional_inputs = frozenset(optional_inputs)
        self._entries: dict[str, T] = {}
        self._reads: dict[str, frozenset[str] | None] = {}
        self._needs: dict[str, frozenset[str]] = {}
        self._builtins = builtins

    def _with_builtins(self) -> dict[str, T]:
        """The entries, once the built-ins' module was imported. That module registers into
        this registry as it is imported; its own calls land here mid-import, where Python's
        import returns the module being initialised (as for any circular import), and another
        thread's call waits for the import to finish."""
        if self._builtins is not None:
            importlib.import_module(self._builtins)
            self._builtins = None
        return self._entries

    @overload
    def register(
        self,
        name: str,
        entry: T,
        force: bool = False,
        *,
        reads: Iterable[str] | None = None,
        needs: Iterable[str] = (),
    ) -> T: ...

    @overload
    def register(
        self,
        name: str,
        entry: None = None,
        force: bool = False,
        *,
        reads: Iterable[str] | None = None,
        needs: Iterable[str] = (),
    ) -> Callable[[T], T]: ...

    def register(
        self,
        name: str,
        entry: T | None = None,
        force: bool = False,
        *,
        reads: Iterable[str] | None = None,
        needs: Iterable[str] = (),
    ) -> T | Callable[[T], T]:
        """Register ``entry`` under ``name``; without ``entry``, return a decorator.

        ``reads``: the hyperparameters the entry uses (None: any of them). ``needs``: the
        optional inputs it must be given (``optional_inputs``; none by default).
        """
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{self.kind} names must be non-empty strings, got {name!r}")
        if entry is None:

            def decorator(item: T) -> T:
                return self.register(name, item, force=force, reads=reads, needs=needs)

            return decorator
        self._with_builtins()
        declared = None if reads is None else self._checked_reads(name, reads)
        needed = self._checked_needs(name, needs)
        # Registering an equal entry again (an extension loaded twice) is not a replacement.
        if (
            name in self._entries
            and not force
            and (
                self._entries[name] != entry
                or self._reads[name] != declared
                or self._needs[name] != needed
            )
        ):
            raise KeyError(
                f"{self.kind} '{name}' is already registered "
                f"({_describe(self._entries[name])}); pass force=True to replace it"
            )
        self._entries[name] = entry
        self._reads[name] = declared
        self._needs[name] = needed
        return entry

    def _checked_reads(self, name: str, reads: Iterable[str]) -> frozenset[str]:
        return self._checked(name, "reads", reads, self.hyperparameters, "hyperparameters")

    def _checked_needs(self, name: str, needs: Iterable[str]) -> frozenset[str]:
        return self._checked(name, "needs", needs, self.optional_inputs, "optional inputs")

    def _checked(
        self, name: str, verb: str, given: Iterable[str], known: frozenset[str], what: str
    ) -> frozenset[str]:
        """``given`` as a set, each one of ``known`` (``verb``: the argument's name)."""
        if isinstance(given, str):
            raise TypeError(f"{self.kind} '{name}': {verb} is a collection of names, got {given!r}")
        declared = frozenset(given)
        unknown = sorted(declared - known)
        if unknown:
            listed = ", ".join(sorted(known)) or "none"
            raise ValueError(
                f"{self.kind} '{name}' {verb} unknown {what} {unknown}; known: {listed}"
            )
        return declared

    def needs(self, name: str) -> frozenset[str]:
        """The optional inputs the entry ``name`` must be given (empty when it said none)."""
        self.get(name)
        return self._needs[name]

    def reads(self, name: str) -> frozenset[str] | None:
        """The hyperparameters the entry ``name`` uses; None when it did not say (any of them)."""
        self.get(name)
        return self._reads[name]

    def ignores(self, name: str) -> frozenset[str]:
        """The hyperparameters the entry ``name`` never uses (none when it did not say)."""
        reads = self.reads(name)
        return frozenset() if reads is None else self.hyperparameters - reads

    def get(self, name: str) -> T:
        """The entry registered under ``name``, or a KeyError suggesting close names."""
        try:
            return self._with_builtins()[name]
        except KeyError:
            raise KeyError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self._with_builtins()), n=3, cutoff=0.5)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        return (
            f"unknown {self.kind} '{name}'{hint}; registered: {', '.join(self.names()) or 'none'}"
        )

    def names(self) -> list[str]:
        return sorted(self._with_builtins())

    def unregister(self, name: str) -> T:
        """Remove and return an entry (for tests and hot-reloading extensions)."""
        entry = self.get(name)
        del self._entries[name]
        del self._reads[name]
        del self._needs[name]
        return entry

    def __contains__(self, name: object) -> bool:
        return name in self._with_builtins()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._with_builtins())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"


def _describe(entry: object) -> str:
    module = getattr(entry, "__module__", None)
    name = getattr(entry, "__qualname__", None) or type(entry).__name__
    return f"{module}.{name}" if module else str(name)


# The fields of `rlcore.advantages.AdvantageConfig` and `rlcore.losses.PolicyLossConfig`
# (defined there, after this module is imported; tests/core/test_registry.py checks).
ADVANTAGES: Registry[AdvantageEstimator] = Registry(
    "advantage estimator",
    hyperparameters=("gamma", "lam", "eps", "whiten", "baseline_form"),
    builtins="rlcore.advantages",
)
POLICY_LOSSES: Registry[PolicyLoss] = Registry(
    "policy loss",
    hyperparameters=("clip_low", "clip_high", "dual_clip", "behavior_weight_cap", "agg"),
    builtins="rlcore.losses",
    optional_inputs=("proximal_logprobs",),
)

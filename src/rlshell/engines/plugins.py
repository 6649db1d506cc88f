"""What an engine package says about itself: its packages, its rules, its options.

A rollout engine (`rlshell.engines.rollout.register_rollout_engine`) and a training
backend (`rlshell.engines.training.register_training_backend`) are registered with
an entry that carries, besides how to build it:

- ``packages``: the `Package` records it needs installed (a run naming the engine
  where one is missing is refused with how to install it);
- ``problems``: a `ConfigRule`, what it refuses before start in a config that
  names it (with the placement plan when one is known: where it runs);
- ``unread``: an `UnreadRule`, the keys of its own section it does not read in
  some settings of others, each with the reason (refused when set);
- ``run_problems``: what it refuses only when the run really starts (the
  installation cannot run it, a mode that can be planned but not run);
- ``options``: an attrs record of its own options, given in the config's
  ``engine_options`` mapping of its section and checked against that record
  (`options_problems`, `structure_options`).

Validation (`rlshell.runners.validation`) asks the entry the config names; it knows
no engine by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import cattrs
from attrs import frozen

from rlshell.config import Config
from rlshell.config.schema import field_problems

if TYPE_CHECKING:
    from rlshell.cluster.placement import PlacementPlan

__all__ = [
    "ConfigRule",
    "EngineEntry",
    "Package",
    "UnreadRule",
    "checked_reads",
    "missing_packages",
    "no_problems",
    "nothing_unread",
    "options_problems",
    "structure_options",
]

ConfigRule = Callable[[Config, "PlacementPlan | None"], list[str]]
"""``(config, plan) -> problems``: each a line starting with the key it concerns."""

UnreadRule = Callable[[Config, "PlacementPlan | None"], dict[str, str]]
"""``(config, plan) -> {key: why it is not read}``."""

OptionsT = TypeVar("OptionsT")


@frozen
class Package:
    """A package an engine imports: the ``module`` looked up, the ``distribution`` that
    provides it and ``install``, how to install it (a sentence)."""

    module: str
    distribution: str
    install: str


def no_problems(config: Config, plan: PlacementPlan | None) -> list[str]:
    """The rule of an engine that refuses nothing."""
    return []


def nothing_unread(config: Config, plan: PlacementPlan | None) -> dict[str, str]:
    """The rule of an engine that reads its whole section whenever it runs."""
    return {}


@frozen(kw_only=True)
class EngineEntry:
    """What every registered engine (rollout engine, training backend) says about itself:
    the ``packages`` it imports, which of its registry's optional keys it ``reads``, what
    it refuses before start (``problems``) and which keys it leaves unread in some settings
    (``unread``)."""

    packages: tuple[Package, ...] = ()
    reads: frozenset[str] = frozenset()
    problems: ConfigRule = no_problems
    unread: UnreadRule = nothing_unread

    def reads_key(self, key: str) -> bool:
        """Whether this engine reads ``key`` (one of its registry's optional keys) at all."""
        return key in self.reads


def checked_reads(what: str, reads: tuple[str, ...], known: Mapping[str, str]) -> frozenset[str]:
    """``reads`` as a set, each one of the ``known`` engine keys (a ValueError naming
    ``what``, e.g. "rollout engine 'mine'", otherwise)."""
    unknown = sorted(set(reads) - set(known))
    if unknown:
        raise ValueError(f"{what} reads unknown keys {unknown}; engine keys: {sorted(known)}")
    return frozenset(reads)


def missing_packages(packages: tuple[Package, ...]) -> list[Package]:
    """The ``packages`` this Python cannot import (looked up without importing them)."""
    import importlib.util

    def importable(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package missing, or a broken __spec__
            return False

    return [package for package in packages if not importable(package.module)]


_CONVERTER = cattrs.Converter(forbid_extra_keys=True)


def options_problems(
    options: type | None, values: Mapping[str, Any], key: str, engine: str
) -> list[str]:
    """Why ``values`` (the config's ``key``, e.g. ``rollout.engine_options``) are not options
    of ``engine``, whose record is ``options`` (None: it takes none)."""
    if options is None and not values:
        return []
    if options is None:
        return [f"{key}: the '{engine}' engine takes no options; got {sorted(values)}"]
    names = [item.name for item in attrs.fields(options)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        return [f"{key}: the '{engine}' engine has no option {unknown}; its options: {names}"]
    try:
        record: object = _CONVERTER.structure(dict(values), options)
    except (cattrs.BaseValidationError, TypeError, ValueError) as error:
        causes = (
            cattrs.transform_error(error)
            if isinstance(error, cattrs.BaseValidationError)
            else [str(error)]
        )
        return [f"{key}: {cause}" for cause in causes]
    return list(field_problems(record, key))


def structure_options(options: type[OptionsT], values: Mapping[str, Any]) -> OptionsT:
    """``values`` as the engine's ``options`` record (`options_problems` found none)."""
    return _CONVERTER.structure(dict(values), options)

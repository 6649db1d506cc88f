"""Typed reads of ``actor.model.model_kwargs`` for one model type, with errors naming the key.

``model_kwargs`` maps names to `rlshell.config.schema.ModelOption` values
(numbers, strings, booleans, null, lists and mappings, as JSON and YAML have
them); a list of numbers may also be written as a comma-separated string. A
`KwargsReader` turns its entries into typed values and every bad entry into a
ValueError such as ``actor.model.model_kwargs.image_size: expected a positive
int, got 'big'``; `KwargsReader.reject_unknown` names a misspelt key and its
closest valid spelling, and `KwargsReader.variant` reads a choice that decides
which other keys a model reads (``action_type``).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Mapping, Sequence
from typing import TypeVar

from attrs import frozen

from rlshell.config.schema import ModelOption

__all__ = ["PREFIX", "KwargsReader", "ModelOption", "Scalar"]

PREFIX = "actor.model.model_kwargs"
Scalar = int | float | str | bool
V = TypeVar("V", bound=str)


@frozen
class KwargsReader:
    """Reads ``kwargs`` for the model type ``model_type`` (named in the errors)."""

    kwargs: Mapping[str, ModelOption]
    model_type: str

    def reject_unknown(self, allowed: Collection[str]) -> None:
        """A ValueError for the first key not in ``allowed``, with the closest allowed one."""
        for key in self.kwargs:
            if key in allowed:
                continue
            close = difflib.get_close_matches(key, list(allowed), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ValueError(
                f"unknown key '{PREFIX}.{key}'{hint}; {self.model_type} reads "
                f"{', '.join(sorted(allowed))}"
            )

    def variant(
        self, key: str, keys_by_variant: Mapping[V, Sequence[str]], default: V | None = None
    ) -> V:
        """``key``'s value, one of ``keys_by_variant`` (read as `choice` reads it; ``default``
        when absent, else it is required), once every entry is one that value reads.

        A key that only other values read gets ``not read with {key} '{value}' (only with
        ...)``; any other is unknown, with the closest key of any variant.
        """
        chosen = self.choice(key, tuple(keys_by_variant), default)
        value = next(variant for variant in keys_by_variant if variant == chosen)
        allowed = keys_by_variant[value]
        every = sorted({name for names in keys_by_variant.values() for name in names})
        for name in self.kwargs:
            if name in allowed:
                continue
            if name in every:
                users = [v for v, names in keys_by_variant.items() if name in names]
                raise ValueError(
                    f"{PREFIX}.{name}: not read with {key} '{value}' "
                    f"(only with {', '.join(repr(v) for v in users)})"
                )
            close = difflib.get_close_matches(name, every, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ValueError(
                f"unknown key '{PREFIX}.{name}'{hint}; {self.model_type} reads {', '.join(allowed)}"
            )
        return value

    def positive_int(self, key: str, default: int | None = None) -> int:
        value = self._get(key, default, "a positive int")
        parsed = _as_int(value)
        if parsed is None or parsed <= 0:
            raise ValueError(f"{PREFIX}.{key}: expected a positive int, got {value!r}")
        return parsed

    def non_negative_int(self, key: str, default: int) -> int:
        value = self._get(key, default, "a non-negative int")
        parsed = _as_int(value)
        if parsed is None or parsed < 0:
            raise ValueError(f"{PREFIX}.{key}: expected a non-negative int, got {value!r}")
        return parsed

    def float_(self, key: str, default: float) -> float:
        value = self._get(key, default, "a float")
        parsed = _as_float(value)
        if parsed is None or not math.isfinite(parsed):
            raise ValueError(f"{PREFIX}.{key}: expected a finite float, got {value!r}")
        return parsed

    def positive_float(self, key: str, default: float) -> float:
        parsed = self.float_(key, default)
        if parsed <= 0:
            raise ValueError(f"{PREFIX}.{key}: expected a positive float, got {parsed!r}")
        return parsed

    def bool_(self, key: str, default: bool) -> bool:
        value = self._get(key, default, "true or false")
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError(f"{PREFIX}.{key}: expected true or false, got {value!r}")

    def string(self, key: str, default: str | None = None) -> str | None:
        value = self.kwargs.get(key, default)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValueError(f"{PREFIX}.{key}: expected a string, got {value!r}")
        return value

    def choice(self, key: str, choices: Sequence[str], default: str | None = None) -> str:
        shown = ", ".join(f"'{c}'" for c in choices)
        value = self.kwargs.get(key, default)
        if value is None:
            raise ValueError(f"{PREFIX}.{key}: missing; {self.model_type} needs one of {shown}")
        if value not in choices:
            close = difflib.get_close_matches(str(value), choices, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ValueError(f"{PREFIX}.{key}: got {value!r}{hint}; expected one of {shown}")
        return str(value)

    def int_list(self, key: str, default: str) -> tuple[int, ...]:
        """Positive ints, as a list or comma-separated, e.g. ``"32,64,64"`` (errors show
        ``default`` as the example)."""
        value = self.kwargs.get(key, default)
        parts: list[ModelOption]
        if isinstance(value, list):
            parts = list(value)
        elif isinstance(value, bool | dict) or value is None:
            parts = []
        else:
            parts = [p.strip() for p in str(value).split(",")]
        parsed = [_as_int(p) for p in parts if p != ""]
        if not parsed or any(p is None or p <= 0 for p in parsed):
            raise ValueError(
                f"{PREFIX}.{key}: expected comma-separated positive ints like '{default}', "
                f"got {value!r}"
            )
        return tuple(p for p in parsed if p is not None)

    def action_bounds(self, action_dim: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """``(action_low, action_high)``: each one finite float for every dimension or
        ``action_dim`` comma-separated ones (defaults −1 and 1), every low below its high."""
        low = self._bounds("action_low", -1.0, action_dim)
        high = self._bounds("action_high", 1.0, action_dim)
        for i, (lo, hi) in enumerate(zip(low, high, strict=True)):
            if not lo < hi:
                raise ValueError(
                    f"{PREFIX}.action_low: dimension {i} has low {lo} >= high {hi}; "
                    "each low must be below its high"
                )
        return low, high

    def _bounds(self, key: str, default: float, action_dim: int) -> tuple[float, ...]:
        value = self.kwargs.get(key, default)
        parts: list[ModelOption]
        if isinstance(value, str):
            parts = list(value.split(","))
        else:
            parts = list(value) if isinstance(value, list) else [value]
        parsed = [_as_float(p.strip() if isinstance(p, str) else p) for p in parts]
        floats = [p for p in parsed if p is not None and math.isfinite(p)]
        if len(floats) != len(parsed):
            raise ValueError(
                f"{PREFIX}.{key}: expected a finite float, or a list or comma-separated "
                f"string of them, got {value!r}"
            )
        if len(floats) == 1:
            return tuple(floats) * action_dim
        if len(floats) != action_dim:
            raise ValueError(
                f"{PREFIX}.{key}: {len(floats)} bounds for action_dim {action_dim}; "
                "give one bound for all dimensions or one per dimension"
            )
        return tuple(floats)

    def _get(self, key: str, default: Scalar | None, what: str) -> ModelOption:
        value = self.kwargs.get(key, default)
        if value is None:
            raise ValueError(f"{PREFIX}.{key}: missing; {self.model_type} needs {what}")
        return value


def _as_int(value: ModelOption) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _as_float(value: ModelOption) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None

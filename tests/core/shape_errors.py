"""Shared assertion for the wrong-shape tests of every rlcore module."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from jaxtyping import TypeCheckError


def assert_shape_error(
    module: str, name: str, call: Callable[[], object], fragments: Sequence[str]
) -> None:
    """``call`` raises a TypeCheckError whose first line names the function and the fragments."""
    with pytest.raises(TypeCheckError) as error:
        call()
    first_line = str(error.value).splitlines()[0]
    assert first_line.startswith(f"{module}.{name}: argument "), first_line
    for fragment in fragments:
        assert fragment in first_line, f"{fragment!r} missing from {first_line!r}"

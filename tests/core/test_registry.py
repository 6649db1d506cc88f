"""Registry: explicit replacement, did-you-mean misses, built-ins under their usual names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlcore.registry import ADVANTAGES, POLICY_LOSSES, Registry


def test_builtin_estimators_and_losses_are_registered_under_their_usual_names() -> None:
    assert set(ADVANTAGES.names()) >= {
        "gae",
        "grpo",
        "dr_grpo",
        "rloo",
        "reinforce_pp",
        "reinforce_pp_baseline",
        "opd",
    }
    assert set(POLICY_LOSSES.names()) >= {"ppo", "gspo", "decoupled_ppo", "vanilla"}


def test_duplicate_names_are_refused_unless_forced() -> None:
    registry: Registry[int] = Registry("number")
    registry.register("one", 1)
    with pytest.raises(KeyError, match=r"number 'one' is already registered.*force=True"):
        registry.register("one", 2)
    assert registry.get("one") == 1
    registry.register("one", 2, force=True)
    assert registry.get("one") == 2
    registry.register("one", 2)  # re-registering the same object is harmless


def test_unknown_names_suggest_the_closest_registered_ones() -> None:
    with pytest.raises(KeyError, match=r"unknown advantage estimator 'gpro' \(did you mean 'grpo'"):
        ADVANTAGES.get("gpro")
    with pytest.raises(KeyError, match=r"unknown policy loss 'xyz'; registered: decoupled_ppo"):
        POLICY_LOSSES.get("xyz")


def test_register_works_as_a_decorator_and_unregister_removes() -> None:
    registry: Registry[object] = Registry("thing")

    @registry.register("double")
    def double(x: int) -> int:
        return 2 * x

    assert registry.get("double") is double
    assert "double" in registry
    assert list(registry) == ["double"]
    assert registry.unregister("double") is double
    assert "double" not in registry


@pytest.mark.parametrize("name", ["", "   "])
def test_empty_names_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="non-empty strings"):
        Registry[int]("number").register(name, 1)


@given(names=st.lists(st.text(min_size=1, max_size=8).filter(str.strip), unique=True, max_size=8))
def test_every_registered_name_is_retrievable_and_listed_sorted(names: list[str]) -> None:
    registry: Registry[int] = Registry("number")
    for i, name in enumerate(names):
        registry.register(name, i)
    assert registry.names() == sorted(names)
    assert [registry.get(n) for n in names] == list(range(len(names)))

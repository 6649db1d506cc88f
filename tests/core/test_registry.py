"""Registry: explicit replacement, did-you-mean misses, built-ins under their usual names."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import attrs
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rlcore
from rlcore.advantages import AdvantageBatch, AdvantageConfig
from rlcore.losses import PolicyLossBatch, PolicyLossConfig
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


# --- which hyperparameters an entry reads ---------------------------------------------------


def test_the_registries_know_the_fields_of_their_config_records() -> None:
    assert ADVANTAGES.hyperparameters == {f.name for f in attrs.fields(AdvantageConfig)}
    assert POLICY_LOSSES.hyperparameters == {f.name for f in attrs.fields(PolicyLossConfig)}


def test_an_entry_says_what_it_reads_and_one_that_does_not_say_reads_everything() -> None:
    registry: Registry[int] = Registry("number", hyperparameters=("a", "b"))
    registry.register("plain", 1)
    registry.register("picky", 2, reads=("a",))
    assert registry.reads("plain") is None
    assert registry.ignores("plain") == frozenset()
    assert registry.reads("picky") == {"a"}
    assert registry.ignores("picky") == {"b"}
    with pytest.raises(ValueError, match=r"number 'bad' reads unknown hyperparameters \['c'\]"):
        registry.register("bad", 3, reads=("a", "c"))
    with pytest.raises(TypeError, match="collection of names"):
        registry.register("bad", 3, reads="a")
    with pytest.raises(KeyError, match="already registered"):
        registry.register("picky", 2, reads=("a", "b"))  # the same entry, other reads
    registry.register("picky", 2, reads=("a",))  # the same again is harmless
    with pytest.raises(KeyError, match="unknown number 'none'"):
        registry.reads("none")


def test_builtins_ignore_what_their_maths_does_not_use() -> None:
    assert ADVANTAGES.ignores("grpo") == {"gamma", "lam", "whiten", "baseline_form"}
    assert ADVANTAGES.ignores("gae") == {"eps", "baseline_form"}
    assert ADVANTAGES.reads("reinforce_pp") == {"gamma"}
    assert ADVANTAGES.reads("reinforce_pp_baseline") == {"gamma", "baseline_form"}
    assert POLICY_LOSSES.ignores("vanilla") == {
        "clip_low",
        "clip_high",
        "dual_clip",
        "behavior_weight_cap",
    }
    assert POLICY_LOSSES.ignores("gspo") == {"dual_clip", "behavior_weight_cap"}


_IGNORED_VALUES = {
    "gamma": 0.5,
    "lam": 0.25,
    "eps": 0.1,
    "whiten": False,
    "baseline_form": "score",
    "clip_low": 0.05,
    "clip_high": 0.5,
    "dual_clip": 1.5,
    "behavior_weight_cap": 0.9,
    "agg": "seq-mean-token-sum",
}


@given(seed=st.integers(0, 2**16))
def test_changing_what_an_estimator_ignores_changes_nothing(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    rows, time = 6, 5
    mask = torch.rand(rows, time, generator=generator) > 0.3
    mask[:, 0] = True
    batch = AdvantageBatch(
        token_rewards=torch.randn(rows, time, generator=generator) * mask,
        mask=mask,
        group_size=3,
        values=torch.randn(rows, time, generator=generator),
        logprobs=-torch.rand(rows, time, generator=generator),
        teacher_logprobs=-torch.rand(rows, time, generator=generator),
    )
    for name in ADVANTAGES.names():
        ignored = ADVANTAGES.ignores(name)
        changed = AdvantageConfig(**{k: v for k, v in _IGNORED_VALUES.items() if k in ignored})
        base = ADVANTAGES.get(name)(batch, AdvantageConfig())
        other = ADVANTAGES.get(name)(batch, changed)
        assert torch.equal(base.advantages, other.advantages), name
        assert torch.equal(base.returns, other.returns), name


@given(seed=st.integers(0, 2**16))
def test_changing_what_a_policy_loss_ignores_changes_nothing(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    rows, time = 4, 6
    mask = torch.rand(rows, time, generator=generator) > 0.3
    mask[:, 0] = True
    old = -torch.rand(rows, time, generator=generator)
    batch = PolicyLossBatch(
        logprobs=old + 0.3 * torch.randn(rows, time, generator=generator),
        old_logprobs=old,
        advantages=torch.randn(rows, time, generator=generator),
        mask=mask,
        proximal_logprobs=old + 0.1 * torch.randn(rows, time, generator=generator),
    )
    for name in POLICY_LOSSES.names():
        ignored = POLICY_LOSSES.ignores(name)
        changed = PolicyLossConfig(**{k: v for k, v in _IGNORED_VALUES.items() if k in ignored})
        base = POLICY_LOSSES.get(name)(batch, PolicyLossConfig())
        other = POLICY_LOSSES.get(name)(batch, changed)
        assert torch.equal(base.loss, other.loss), name


def _fresh_python(code: str) -> str:
    """``code`` run by a new interpreter (nothing of rlcore imported yet); its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_registry_and_the_reward_processes_import_no_torch_and_builtins_load_on_use() -> None:
    """rlcore imports its modules on first use: a reward process (rlshell.rewards.pool, which
    needs `Registry` only) starts without torch, and a registry's built-ins are there the
    first time it is read, or written by an extension (a clash is still refused)."""
    out = _fresh_python(
        """
        import sys
        import rlcore.registry, rlshell.rewards.pool
        print("torch" in sys.modules)
        from rlcore.registry import ADVANTAGES, POLICY_LOSSES
        ADVANTAGES.register("mine", lambda batch, config: None)
        print("torch" in sys.modules, "grpo" in ADVANTAGES, "mine" in ADVANTAGES)
        try:
            POLICY_LOSSES.register("vanilla", lambda batch, config: None)
        except KeyError as error:
            print("refused:", error)
        """
    )
    lines = out.splitlines()
    assert lines[0] == "False"
    assert lines[1] == "True True True"
    assert lines[2].startswith("refused: \"policy loss 'vanilla' is already registered")


def test_threads_that_read_a_registry_first_at_once_all_meet_its_builtins() -> None:
    out = _fresh_python(
        """
        import threading
        from rlcore.registry import ADVANTAGES
        barrier, seen = threading.Barrier(8), []

        def look():
            barrier.wait()
            seen.append("grpo" in ADVANTAGES and "gae" in ADVANTAGES)

        threads = [threading.Thread(target=look) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print(seen)
        """
    )
    assert out.strip() == str([True] * 8)


def test_the_package_names_resolve_on_first_use_and_unknown_ones_are_attribute_errors() -> None:
    out = _fresh_python(
        """
        import sys
        import rlcore
        print("torch" in sys.modules)
        print(sorted(rlcore.__all__) == sorted(n for n in dir(rlcore) if not n.startswith("_")))
        print(rlcore.masked.__name__, rlcore.Mask is rlcore.types.Mask, rlcore.typecheck_enabled())
        from rlcore import losses, unchecked
        print(losses is rlcore.losses, callable(unchecked))
        try:
            rlcore.gae
        except AttributeError as error:
            print(error)
        """
    )
    assert out.splitlines() == [
        "False",
        "True",
        "rlcore.masked True True",
        "True True",
        "module 'rlcore' has no attribute 'gae'",
    ]
    for name in rlcore.__all__:
        assert getattr(rlcore, name) is not None


def test_an_entry_says_which_optional_inputs_it_needs() -> None:
    registry: Registry[int] = Registry("number", optional_inputs=("extra",))
    registry.register("one", 1)
    registry.register("two", 2, needs=("extra",))
    assert registry.needs("one") == frozenset()
    assert registry.needs("two") == frozenset({"extra"})
    with pytest.raises(ValueError, match=r"needs unknown optional inputs \['other'\]"):
        registry.register("three", 3, needs=("other",))
    with pytest.raises(TypeError, match="collection of names"):
        registry.register("four", 4, needs="extra")
    with pytest.raises(KeyError, match="already registered"):
        registry.register("two", 2)  # the same entry, saying otherwise
    registry.register("two", 2, needs=("extra",))  # the same registration again
    registry.unregister("two")
    assert "two" not in registry
    assert POLICY_LOSSES.needs("decoupled_ppo") == frozenset({"proximal_logprobs"})
    assert POLICY_LOSSES.needs("ppo") == frozenset()

"""Reward registry: ``register_reward(name, fn)`` and ``get_reward(name)``.

A rule-based reward is ``fn(response, answer) -> float``: the decoded
response text and the reference answer in, a score out. The built-ins are
``math`` (answer equivalence checked by the math-verify library),
``exact_match`` and ``format`` (the response states a final answer in a
recognised format, right or wrong). Runners call them in worker processes
under a timeout: `rlshell.rewards.pool.RewardPool`, which a
`rlshell.workers.reward.RewardWorker` owns.
"""

from __future__ import annotations

from collections.abc import Callable

from rlcore.registry import Registry

__all__ = ["REWARDS", "RewardFn", "get_reward", "register_reward"]

RewardFn = Callable[[str, str], float]

REWARDS: Registry[RewardFn] = Registry("reward type")


def register_reward(name: str, fn: RewardFn, force: bool = False) -> RewardFn:
    """Register ``fn`` under ``name``; ``force=True`` replaces an existing entry."""
    return REWARDS.register(name, fn, force=force)


def get_reward(name: str) -> RewardFn:
    """The reward registered under ``name`` (a KeyError with close names otherwise)."""
    return REWARDS.get(name)


def _register_builtins() -> None:
    from rlshell.rewards.rule_based import exact_match_reward, format_reward, math_reward

    register_reward("math", math_reward)
    register_reward("exact_match", exact_match_reward)
    register_reward("format", format_reward)


_register_builtins()

"""Environment registry: ``register_env(env_type, builder)`` and ``make_env(cfg, seed)``.

A builder is ``builder(cfg, seed) -> gymnasium.vector.VectorEnv`` making
``cfg.num_envs`` copies. The built-in ``gymnasium`` type makes any
registered gymnasium id (``env.env_id``) with ``gymnasium.make_vec``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rlcore.registry import Registry
from rlshell.config import EnvConfig

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

__all__ = ["ENVS", "EnvBuilder", "make_env", "register_env"]

EnvBuilder = Callable[[EnvConfig, int], "VectorEnv"]

ENVS: Registry[EnvBuilder] = Registry("env type")


def register_env(env_type: str, builder: EnvBuilder, force: bool = False) -> EnvBuilder:
    """Register ``builder`` under ``env_type``; ``force=True`` replaces an existing entry."""
    return ENVS.register(env_type, builder, force=force)


def make_env(cfg: EnvConfig, seed: int = 0) -> VectorEnv:
    """Build the vector env ``cfg.env_type`` names."""
    if cfg.env_type is None:
        raise ValueError("env.env_type is not set: name a registered env type")
    return ENVS.get(cfg.env_type)(cfg, seed)


def _gymnasium_env(cfg: EnvConfig, seed: int) -> VectorEnv:
    import gymnasium

    if cfg.env_id is None:
        raise ValueError("env.env_id: the gymnasium env type needs an id, e.g. 'CartPole-v1'")
    env = gymnasium.make_vec(
        cfg.env_id, num_envs=cfg.num_envs, max_episode_steps=cfg.max_episode_steps
    )
    env.reset(seed=seed)
    return env


register_env("gymnasium", _gymnasium_env)

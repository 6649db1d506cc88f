"""Environment registry: ``register_env(env_type, builder)`` and ``make_env(cfg, seed)``.

A builder is ``builder(cfg, seed) -> gymnasium.vector.VectorEnv`` making
``cfg.num_envs`` copies. Built-in types:

- ``gymnasium``: any registered gymnasium id (``env.env_id``; ``"module:Id"``
  imports ``module`` first, e.g. ``"gymnasium_robotics:FetchReach-v4"``), as
  a synchronous vector env that resets a finished copy in the same step
  (gymnasium's ``SAME_STEP`` autoreset: the finished episode's last
  observation is in ``info["final_obs"]``); with ``env.isolate`` each copy
  steps in a process of its own (gymnasium's ``AsyncVectorEnv``), so a copy
  that crashes takes only its process, which ``env.on_failure='reset'``
  replaces.
- ``maniskill``: ManiSkill 3 tasks (`rlshell.envs.maniskill`): one env per
  process on a CPU (with the software Vulkan driver ``make install`` fetches),
  or ManiSkill's batched GPU simulation with ``env.uses_gpus``; state or
  camera observations (``env.obs_mode``).
- ``gymnasium_pixels``: a gymnasium id observed as 64×64 RGB images with a
  task description (`rlshell.envs.pixels`), for image and VLA policies on a CPU.
- ``metaworld``: MetaWorld's Sawyer-arm tasks (`rlshell.envs.metaworld`), one
  task (``reach-v3``) or a task set (``MT10``, ``MT50``) spread over the
  copies, from state or a camera (drawn by OSMesa on a CPU).

`rlshell.envs.stepper.EnvStepper` drives either one for an env worker.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from rlcore.registry import Registry
from rlshell.config import EnvConfig
from rlshell.envs.gym_ids import check_gymnasium_id

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

__all__ = [
    "ENVS",
    "EnvBuilder",
    "check_gymnasium_id",
    "get_env_cls",
    "make_env",
    "register_env",
]

EnvBuilder = Callable[[EnvConfig, int], "VectorEnv"]

# What to simulate and how to observe it: the EnvConfig fields ManiSkill's builder reads.
_TASK_KEYS = (
    "env_id",
    "max_episode_steps",
    "control_mode",
    "obs_mode",
    "image_size",
    "ignore_terminations",
)
# The EnvConfig fields a builder may read (the runner reads num_envs and the rest itself).
ENVS: Registry[EnvBuilder] = Registry(
    "env type", hyperparameters=(*_TASK_KEYS, "isolate", "memory_mb")
)


def register_env(
    env_type: str,
    builder: EnvBuilder,
    force: bool = False,
    *,
    reads: Iterable[str] | None = None,
) -> EnvBuilder:
    """Register ``builder`` under ``env_type``; ``force=True`` replaces an existing entry.

    ``reads``: which of ``env.env_id``, ``env.max_episode_steps``,
    ``env.control_mode``, ``env.obs_mode``, ``env.image_size``,
    ``env.ignore_terminations``, ``env.isolate`` and ``env.memory_mb`` the
    builder reads (None: all of them);
    validation refuses the others set for this env type.
    """
    return ENVS.register(env_type, builder, force=force, reads=reads)


def get_env_cls(env_type: str) -> EnvBuilder:
    """The builder registered under ``env_type`` (a KeyError naming close types if none)."""
    return ENVS.get(env_type)


def make_env(cfg: EnvConfig, seed: int = 0) -> VectorEnv:
    """Build the vector env ``cfg.env_type`` names."""
    if cfg.env_type is None:
        raise ValueError("env.env_type is not set: name a registered env type")
    return get_env_cls(cfg.env_type)(cfg, seed)


def _gymnasium_env(cfg: EnvConfig, seed: int) -> VectorEnv:
    import gymnasium

    env_id = check_gymnasium_id(cfg.env_id)
    make_kwargs: dict[str, Any] = {}
    if cfg.max_episode_steps is not None:
        make_kwargs["max_episode_steps"] = cfg.max_episode_steps
    vector_kwargs: dict[str, Any] = {"autoreset_mode": gymnasium.vector.AutoresetMode.SAME_STEP}
    if cfg.isolate:
        # Spawned, not forked: the worker's torch holds threads a fork would copy mid-use.
        vector_kwargs["context"] = "spawn"
    wrappers = None
    if cfg.memory_mb is not None:
        if not cfg.isolate:
            raise ValueError(
                "env.memory_mb limits each env copy's own process: set env.isolate=true (in "
                "the worker's process the limit would bound torch's memory too)"
            )
        from rlshell.envs.memory import MemoryLimited

        # Built in each copy's process (make_vec's wrappers run there), and once in this
        # process to read the spaces: the limit is set at the first reset (MemoryLimited).
        wrappers = [functools.partial(MemoryLimited, memory_mb=cfg.memory_mb)]
    env = gymnasium.make_vec(
        env_id,
        num_envs=cfg.num_envs,
        vectorization_mode="async" if cfg.isolate else "sync",
        vector_kwargs=vector_kwargs,
        wrappers=wrappers,
        **make_kwargs,
    )
    env.reset(seed=seed)
    return env


def _maniskill_env(cfg: EnvConfig, seed: int) -> VectorEnv:
    from rlshell.envs.maniskill import make_maniskill_env

    return make_maniskill_env(cfg, seed)


register_env(
    "gymnasium", _gymnasium_env, reads=("env_id", "max_episode_steps", "isolate", "memory_mb")
)
# ManiSkill's CPU envs are in processes of their own already (two or more per worker).
register_env("maniskill", _maniskill_env, reads=_TASK_KEYS)


def _pixel_env(cfg: EnvConfig, seed: int) -> VectorEnv:
    from rlshell.envs.pixels import make_pixel_env

    return make_pixel_env(cfg, seed)


register_env("gymnasium_pixels", _pixel_env, reads=("env_id", "max_episode_steps", "control_mode"))


def _metaworld_env(cfg: EnvConfig, seed: int) -> VectorEnv:
    from rlshell.envs.metaworld import make_metaworld_env

    return make_metaworld_env(cfg, seed)


register_env(
    "metaworld", _metaworld_env, reads=("env_id", "max_episode_steps", "obs_mode", "image_size")
)

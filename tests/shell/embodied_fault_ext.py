"""An extension module for embodied fault tests: a gymnasium env that fails on purpose.

``register()`` adds the env type ``faulty_gymnasium``: the gymnasium id
``env.env_id`` (e.g. CartPole-v1) as the built-in ``gymnasium`` type makes it,
with env copy 0 wrapped so that its N-th step (``RLSHELL_TEST_ENV_FAULT_AT``,
counted from the process start) fails as ``RLSHELL_TEST_ENV_FAULT`` says:

- ``raise``: the env's step raises ``RuntimeError("injected env fault ...")``;
- ``exit``: the process ends at once with ``os._exit(3)`` (no traceback, as a
  simulator crash);
- ``nan``: the observation it returns is NaN;
- ``hang``: the step never returns (it sleeps for an hour);
- ``segv``: the process is killed by a segmentation fault (``SIGSEGV``, as a
  simulator's bad pointer);
- ``oom``: the step asks numpy for 4 TiB, more than the machine has, and
  raises the ``MemoryError`` that allocation fails with.

It fails once: it first writes the marker file ``RLSHELL_TEST_ENV_FAULT_MARKER``
and never fails while that file exists, so a resumed run trains normally;
with ``RLSHELL_TEST_ENV_FAULT_REPEAT=1`` it fails at its ``at``-th step and at
every step after (an env rebuilt anew fails again at its own ``at``-th step).
``RLSHELL_TEST_ENV_ASYNC=1`` steps the copies in processes of their own
(gymnasium's ``AsyncVectorEnv``, as ManiSkill's CPU envs are), so ``exit``
ends copy 0's process and not the worker's.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv

from rlshell.config import EnvConfig
from rlshell.envs import check_gymnasium_id, register_env


class FaultAtStep(gymnasium.Wrapper[Any, Any, Any, Any]):
    """Fails once, at this process's ``at``-th step of the wrapped env."""

    def __init__(self, env: gymnasium.Env[Any, Any]) -> None:
        super().__init__(env)
        self.fault = os.environ.get("RLSHELL_TEST_ENV_FAULT", "")
        self.at = int(os.environ.get("RLSHELL_TEST_ENV_FAULT_AT", "0"))
        self.marker = Path(os.environ.get("RLSHELL_TEST_ENV_FAULT_MARKER", "/nonexistent/marker"))
        self.repeat = os.environ.get("RLSHELL_TEST_ENV_FAULT_REPEAT") == "1"
        self.steps = 0

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        self.steps += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        due = self.steps >= self.at if self.repeat else self.steps == self.at
        if not due or not self.fault or (self.marker.exists() and not self.repeat):
            return obs, reward, terminated, truncated, info
        self.marker.write_text(f"{self.fault} at step {self.steps}\n")
        if self.fault == "raise":
            raise RuntimeError(f"injected env fault at step {self.steps}")
        if self.fault == "exit":
            os._exit(3)
        if self.fault == "nan":
            obs = np.full_like(obs, np.nan)
        if self.fault == "hang":
            time.sleep(3600)
        if self.fault == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if self.fault == "oom":
            np.ones(2**42, dtype=np.uint8)
        return obs, reward, terminated, truncated, info


def make_faulty_env(cfg: EnvConfig, seed: int) -> VectorEnv:
    """``cfg.num_envs`` copies of ``cfg.env_id``, copy 0 wrapped in `FaultAtStep`."""
    env_id = check_gymnasium_id(cfg.env_id)

    def copy(index: int) -> gymnasium.Env[Any, Any]:
        env = gymnasium.make(env_id)
        return FaultAtStep(env) if index == 0 else env

    fns = [lambda i=i: copy(i) for i in range(cfg.num_envs)]
    vector = AsyncVectorEnv if os.environ.get("RLSHELL_TEST_ENV_ASYNC") == "1" else SyncVectorEnv
    env = vector(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    env.reset(seed=seed)
    return env


class Allocating(gymnasium.Env[np.ndarray, np.int64]):
    """Each step allocates and touches ``RLSHELL_TEST_ENV_ALLOC_MB`` MiB (unset: none), then
    frees them: a simulator whose memory jumps, for ``env.memory_mb``."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        size = int(os.environ.get("RLSHELL_TEST_ENV_ALLOC_MB", "0")) * 2**20
        if size:
            block = np.ones(size, np.uint8)  # every page written
            del block
        return np.zeros(1, np.float32), 0.0, False, False, {}


# A gymnasium id with its module, as env.env_id takes it: a spawned env process imports it.
ALLOCATING_ID = f"{__name__}:RlshellAllocating-v0"
gymnasium.register("RlshellAllocating-v0", entry_point=f"{__name__}:Allocating")


def register() -> None:
    register_env("faulty_gymnasium", make_faulty_env, force=True)

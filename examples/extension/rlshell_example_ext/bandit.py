"""A two-armed bandit as a gymnasium environment, vectorised for rlshell's env registry."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv

from rlshell.config import EnvConfig


class TwoArmedBandit(gymnasium.Env[np.ndarray, int]):
    """Arm 1 pays 1 with probability 0.8, arm 0 with probability 0.2; episodes last one step."""

    observation_space = spaces.Box(low=0.0, high=1.0, shape=(1,), dtype=np.float32)
    action_space = spaces.Discrete(2)
    payout = (0.2, 0.8)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.ones(1, dtype=np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward = float(self.np_random.random() < self.payout[int(action)])
        return np.ones(1, dtype=np.float32), reward, True, False, {}


def make_bandit_env(cfg: EnvConfig, seed: int) -> VectorEnv:
    """The registry builder: ``builder(cfg, seed)`` → ``cfg.num_envs`` bandits."""
    # Same-step autoreset: what rlshell.envs.stepper.EnvStepper (env workers) expects.
    env = SyncVectorEnv(
        [TwoArmedBandit for _ in range(cfg.num_envs)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    env.reset(seed=seed)
    return env

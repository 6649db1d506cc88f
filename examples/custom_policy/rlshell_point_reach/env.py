"""A 2-D point-mass reach task as a gymnasium environment, vectorised for rlshell's env registry.

A point starts somewhere in the square [−1, 1]² and must reach a goal drawn in
the same square. Each step moves it by ``max_move · clip(a, −1, 1)`` (the
action is a 2-D velocity command) and pays the dense reward

    rₜ = −‖g − pₜ₊₁‖

so an episode's return is the summed distance left after each move: about
−20 for a random walk over a 20-step episode, about −2 for a policy that
heads straight for the goal. Reaching within ``goal_radius`` ends the
episode (terminated) with ``info["is_success"] = True``; the time limit
truncates it. Observations are ``[pₓ, p_y, gₓ − pₓ, g_y − p_y]``.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.wrappers import TimeLimit

from rlshell.config import EnvConfig

__all__ = ["PointReach", "make_point_reach_env"]

DEFAULT_EPISODE_STEPS = 20


class PointReach(gymnasium.Env[np.ndarray, np.ndarray]):
    """Move a point to a goal in [−1, 1]²; dense reward −distance, success within the radius."""

    def __init__(self, max_move: float = 0.2, goal_radius: float = 0.1) -> None:
        self.max_move = max_move
        self.goal_radius = goal_radius
        bound = np.array([1.0, 1.0, 2.0, 2.0], dtype=np.float32)
        self.observation_space = spaces.Box(low=-bound, high=bound, dtype=np.float32)
        self.action_space = spaces.Box(low=-1.0, high=1.0, shape=(2,), dtype=np.float32)
        self.position = np.zeros(2)
        self.goal = np.zeros(2)

    def _obs(self) -> np.ndarray:
        # Annotated: numpy 2.3's stubs type this expression as Any (2.4's as an ndarray).
        obs: np.ndarray = np.concatenate([self.position, self.goal - self.position])
        return obs.astype(np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.position = self.np_random.uniform(-1.0, 1.0, size=2)
        self.goal = self.np_random.uniform(-1.0, 1.0, size=2)
        return self._obs(), {"is_success": False}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        move = self.max_move * np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        self.position = np.clip(self.position + move, -1.0, 1.0)
        distance = float(np.linalg.norm(self.goal - self.position))
        success = distance < self.goal_radius
        return self._obs(), -distance, success, False, {"is_success": success}


def make_point_reach_env(cfg: EnvConfig, seed: int) -> VectorEnv:
    """The registry builder: ``builder(cfg, seed)`` → ``cfg.num_envs`` point-reach tasks.

    Episodes last at most ``cfg.max_episode_steps`` (20 when unset).
    ``cfg.env_id`` is only the name shown in logs and errors.
    """
    limit = cfg.max_episode_steps or DEFAULT_EPISODE_STEPS

    def one() -> gymnasium.Env[np.ndarray, np.ndarray]:
        return TimeLimit(PointReach(), max_episode_steps=limit)

    # Same-step autoreset: what rlshell.envs.stepper.EnvStepper (env workers) expects.
    env = SyncVectorEnv([one for _ in range(cfg.num_envs)], autoreset_mode=AutoresetMode.SAME_STEP)
    env.reset(seed=seed)
    return env

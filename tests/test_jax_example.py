"""examples/jax_ppo_cartpole.py: the JAX custom trainer runs, learns, and bootstraps right.

The full run (PPO to a mean return of 475, 20–60k env steps, 10–20 s with start-up)
is a measurement, not a test: its figures are in docs/jax.md. Here:

- ``--quick`` (4,096 env steps) runs end to end, prints its JSON summary, and
  its training return on seed 0 is well above a random policy's (about 22),
  which a broken update (a wrong sign, advantages not reaching the loss, a
  jitted update that does not carry its new parameters forward) would miss;
- a truncated step keeps the episode's final observation as ``next_obs`` (its
  value bootstrap), not the observation the env reset to.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "jax_ppo_cartpole.py"
RANDOM_POLICY_RETURN = 22.0  # CartPole-v1's mean episode return under uniform actions


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("jax_ppo_cartpole", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_quick_run_learns_and_prints_its_summary() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--quick", "--seed", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("CartPole-v1: 9,155 parameters, 8 envs × 32 steps")
    assert any(line.startswith("steps   4,096  return(last 20)") for line in lines)
    summary = json.loads(lines[-1])
    assert summary["example"] == "jax_ppo_cartpole"
    assert summary["quick"] is True
    assert summary["env_steps"] == 4096
    assert summary["reached"] is False  # 475 takes 20k+ steps
    assert summary["compile_s"] > 0
    metrics = summary["final_metrics"]
    assert {"loss", "pg_loss", "value_loss", "entropy", "clipfrac", "grad_norm"} <= set(metrics)
    assert all(math.isfinite(value) for value in metrics.values()), metrics
    # Seed 0 ends the quick run near 75; a policy that did not learn stays near 22.
    assert summary["mean_return"] > 2 * RANDOM_POLICY_RETURN, summary
    assert len(summary["greedy_eval_returns"]) == 2


def test_a_truncated_step_bootstraps_from_the_final_observation() -> None:
    import gymnasium as gym
    import jax
    import jax.numpy as jnp

    example = load_example()
    # Episodes cut at 5 steps: pushing right 5 times never drops the pole, so every
    # episode ends truncated, at t = 4 of an 8-step rollout.
    env = gym.make_vec(
        "CartPole-v1",
        num_envs=2,
        vectorization_mode="sync",
        max_episode_steps=5,
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    collector = example.Collector(env, steps=8, seed=0, window=4)

    def push_right(params: Any, obs: Any, key: Any) -> tuple[Any, Any]:
        return jnp.ones(obs.shape[0], jnp.int32), key

    rollout, _ = collector.collect(push_right, None, jax.random.key(0))
    obs, next_obs = np.asarray(rollout.obs), np.asarray(rollout.next_obs)
    truncated = np.asarray(rollout.truncated)
    assert not np.asarray(rollout.terminated).any()
    assert truncated[4].all()
    assert truncated.sum() == 2
    # Inside an episode sₜ₊₁ is the next step's observation...
    for t in (0, 1, 2, 3, 5, 6):
        np.testing.assert_array_equal(next_obs[t], obs[t + 1])
    # ...at the truncation it is the episode's last one, not the new episode's first.
    assert not np.allclose(next_obs[4], obs[5])
    assert np.all(next_obs[4][:, 1] > 0.5)  # the cart is still moving right at the cut
    assert collector.episodes == 2
    assert list(collector.recent) == [5.0, 5.0]

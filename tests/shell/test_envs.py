"""The env registry and `EnvStepper` on gymnasium's CartPole and Pendulum and tiny scripted envs."""

from __future__ import annotations

import functools
import os
import resource
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
from attrs import evolve
from gymnasium import spaces

from rlshell.config import EnvConfig
from rlshell.envs import ENVS, get_env_cls, make_env
from rlshell.envs.stepper import EnvStepError, EnvStepper, StepResult, group_seeds

SAME_STEP = gymnasium.vector.AutoresetMode.SAME_STEP
TINY_ID = "RlshellTinyScripted-v0"


class TinyEnv(gymnasium.Env[Any, np.int64]):
    """Counts steps: observation and reward carry the step count t, episodes end at ``length``.

    ``obs_kind`` picks a Box, a Fetch-like Dict or an image observation;
    ``nan_at`` puts NaN in the observation (or the reward) at that step;
    ``success_at`` reports ``info["is_success"]`` true at those steps.
    """

    def __init__(
        self,
        obs_kind: str = "box",
        length: int = 3,
        nan_at: int | None = None,
        nan_in: str = "obs",
        success_at: tuple[int, ...] | None = None,
    ) -> None:
        self.obs_kind, self.length, self.nan_at, self.nan_in = obs_kind, length, nan_at, nan_in
        self.success_at = success_at
        self.action_space = spaces.Discrete(2)
        box = functools.partial(spaces.Box, low=-np.inf, high=np.inf, dtype=np.float32)
        if obs_kind == "dict":
            self.observation_space: spaces.Space[Any] = spaces.Dict(
                {
                    "observation": box(shape=(3,)),
                    "achieved_goal": box(shape=(2,)),
                    "desired_goal": box(shape=(2,)),
                }
            )
        elif obs_kind == "image":
            self.observation_space = spaces.Box(0, 255, shape=(4, 5, 3), dtype=np.uint8)
        else:
            self.observation_space = box(shape=(2,))
        self.t = 0

    def _obs(self) -> Any:
        t = float(self.t)
        if self.obs_kind == "dict":
            return {
                "observation": np.full(3, t, np.float32),
                "achieved_goal": np.full(2, 10 + t, np.float32),
                "desired_goal": np.full(2, 20 + t, np.float32),
            }
        if self.obs_kind == "image":
            return np.full((4, 5, 3), self.t, np.uint8)
        nan = self.nan_at == self.t and self.nan_in == "obs"
        return np.array([np.nan if nan else t, 1.0], np.float32)

    def _info(self) -> dict[str, Any]:
        return {} if self.success_at is None else {"is_success": self.t in self.success_at}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), self._info()

    def step(self, action: np.int64) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.t += 1
        reward = np.nan if self.nan_at == self.t and self.nan_in == "reward" else float(self.t)
        return self._obs(), reward, self.t >= self.length, False, self._info()


def make_tiny(**kwargs: Any) -> TinyEnv:
    return TinyEnv(**kwargs)


gymnasium.register(TINY_ID, entry_point=make_tiny, disable_env_checker=True)


def tiny_stepper(*configs: dict[str, Any]) -> EnvStepper:
    """One TinyEnv per config, as a same-step-autoreset vector env."""
    fns = [functools.partial(gymnasium.make, TINY_ID, **config) for config in configs]
    return EnvStepper(gymnasium.vector.SyncVectorEnv(fns, autoreset_mode=SAME_STEP), TINY_ID)


def gym_config(env_id: str, num_envs: int = 3, max_steps: int | None = None) -> EnvConfig:
    return EnvConfig(
        env_type="gymnasium", env_id=env_id, num_envs=num_envs, max_episode_steps=max_steps
    )


# --- registry ---------------------------------------------------------------------------


def test_registry_has_builtin_types_and_suggests_close_names() -> None:
    assert {"gymnasium", "maniskill"} <= set(ENVS.names())
    assert get_env_cls("gymnasium") is ENVS.get("gymnasium")
    with pytest.raises(KeyError, match=r"unknown env type 'gymnasum' \(did you mean 'gymnasium'"):
        get_env_cls("gymnasum")
    with pytest.raises(KeyError, match="did you mean 'maniskill'"):
        make_env(EnvConfig(env_type="maniskil", env_id="PushCube-v1"))


def test_unknown_gymnasium_id_suggests_the_registered_one() -> None:
    with pytest.raises(ValueError, match=r"env\.env_id.*'CartPole-v2'.*did you mean 'CartPole-v1'"):
        make_env(gym_config("CartPole-v2"))
    with pytest.raises(ValueError, match=r"env\.env_id"):
        make_env(EnvConfig(env_type="gymnasium"))


# --- observations, autoreset and the bootstrap observation -------------------------------


@pytest.mark.parametrize(("env_id", "actions"), [("CartPole-v1", [0, 1]), ("Pendulum-v1", [[0.0]])])
def test_time_limit_truncates_and_next_obs_is_the_final_obs(
    env_id: str, actions: list[Any]
) -> None:
    """With max_episode_steps=5, step 5 truncates; next_obs = final_obs, obs = a fresh reset."""
    stepper = EnvStepper.from_config(gym_config(env_id, max_steps=5))
    raw = make_env(gym_config(env_id, max_steps=5))  # the same env, stepped by hand
    obs = stepper.reset(seed=7)
    raw_obs, _ = raw.reset(seed=group_seeds(7, 3))  # type: ignore[arg-type]
    torch.testing.assert_close(obs["states"], torch.as_tensor(raw_obs))
    for t in range(1, 6):
        action = np.array([actions[t % len(actions)]] * 3)
        result = stepper.step(torch.as_tensor(action))
        raw_obs, _, _, raw_truncated, info = raw.step(action)
        assert result.rewards.dtype == torch.float32
        assert result.rewards.shape == (3,)
        assert not result.terminated.any()
        assert bool(result.truncated.all()) == (t == 5) == bool(raw_truncated.all())
        torch.testing.assert_close(result.obs["states"], torch.as_tensor(raw_obs))
        if t < 5:
            torch.testing.assert_close(result.next_obs["states"], result.obs["states"])
    final = torch.as_tensor(np.stack(info["final_obs"]))
    torch.testing.assert_close(result.next_obs["states"], final)
    assert not torch.equal(result.obs["states"], final)
    stepper.close()
    raw.close()


def test_cartpole_fall_terminates_without_truncating() -> None:
    stepper = EnvStepper.from_config(gym_config("CartPole-v1", num_envs=2, max_steps=200))
    stepper.reset(seed=0)
    ended = torch.zeros(2, dtype=torch.bool)
    for _ in range(60):  # pushing right always drops the pole within a few dozen steps
        result = stepper.step(torch.ones(2, dtype=torch.int64))
        assert not (result.terminated & result.truncated).any()
        assert not result.truncated.any()
        ended |= result.terminated
    assert ended.all()


def test_bootstrapped_at_done_counts_every_ended_episode_as_truncated() -> None:
    obs = {"states": torch.arange(6.0).reshape(3, 2)}
    result = StepResult(
        obs=obs,
        rewards=torch.tensor([1.0, 2.0, 3.0]),
        terminated=torch.tensor([True, False, False]),
        truncated=torch.tensor([False, True, False]),
        next_obs={"states": -obs["states"]},
    )
    bootstrapped = result.bootstrapped_at_done()
    assert bootstrapped.terminated.tolist() == [False, False, False]
    assert bootstrapped.truncated.tolist() == [True, True, False]
    assert torch.equal(bootstrapped.dones, result.dones)
    assert bootstrapped.rewards is result.rewards
    assert bootstrapped.next_obs is result.next_obs


def test_final_obs_of_an_ended_episode_for_box_dict_and_image_observations() -> None:
    for kind in ("box", "dict", "image"):
        stepper = tiny_stepper({"obs_kind": kind, "length": 2}, {"obs_kind": kind, "length": 3})
        obs = stepper.reset(seed=0)
        stepper.step(torch.zeros(2, dtype=torch.int64))
        result = stepper.step(torch.zeros(2, dtype=torch.int64))  # env 0 ends at t=2
        assert result.terminated.tolist() == [True, False]
        if kind == "image":
            assert obs["main_images"].dtype == torch.uint8
            assert result.obs["main_images"].shape == (2, 4, 5, 3)
            assert result.obs["main_images"][:, 0, 0, 0].tolist() == [0, 2]
            assert result.next_obs["main_images"][:, 0, 0, 0].tolist() == [2, 2]
            continue
        states, next_states = result.obs["states"], result.next_obs["states"]
        assert states.dtype == torch.float32
        if kind == "box":
            assert states[:, 0].tolist() == [0.0, 2.0]
            assert next_states[:, 0].tolist() == [2.0, 2.0]
        else:  # sorted keys: achieved_goal (2), desired_goal (2), observation (3)
            assert states.shape == (2, 7)
            assert next_states[0].tolist() == [12, 12, 22, 22, 2, 2, 2]
            assert states[0].tolist() == [10, 10, 20, 20, 0, 0, 0]
            assert states[1].tolist() == [12, 12, 22, 22, 2, 2, 2]


def test_group_seeding_repeats_first_observations_within_groups_only() -> None:
    stepper = EnvStepper.from_config(gym_config("CartPole-v1", num_envs=6))
    states = stepper.reset(seed=3, group_size=3)["states"]
    assert torch.equal(states[0], states[1])
    assert torch.equal(states[0], states[2])
    assert torch.equal(states[3], states[5])
    assert not torch.equal(states[0], states[3])
    assert not torch.equal(stepper.reset(seed=4, group_size=3)["states"][0], states[0])
    distinct = stepper.reset(seed=3)["states"]
    assert len({tuple(row.tolist()) for row in distinct}) == 6
    with pytest.raises(ValueError, match="num_envs=6"):
        stepper.reset(seed=3, group_size=4)


# --- episode statistics ----------------------------------------------------------------


def test_isolated_copies_step_in_processes_of_their_own_as_the_sync_ones_do() -> None:
    """``env.isolate``: an `AsyncVectorEnv` whose copies run in child processes; seeded
    alike, it steps exactly as the in-process vector env (episodes ending included)."""
    from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

    config = gym_config("CartPole-v1", num_envs=2, max_steps=20)
    isolated = EnvStepper.from_config(evolve(config, isolate=True), seed=3)
    in_process = EnvStepper.from_config(config, seed=3)
    assert isinstance(isolated.env, AsyncVectorEnv)
    assert isinstance(in_process.env, SyncVectorEnv)
    assert {p.pid for p in isolated.env.processes}.isdisjoint({os.getpid()})
    torch.testing.assert_close(isolated.reset(seed=3), in_process.reset(seed=3))
    rng = np.random.default_rng(0)
    for _ in range(30):
        actions = torch.as_tensor(rng.integers(0, 2, size=2))
        a, b = isolated.step(actions), in_process.step(actions)
        torch.testing.assert_close(a.next_obs, b.next_obs)
        torch.testing.assert_close(a.obs, b.obs)
        assert torch.equal(a.dones, b.dones)
    assert isolated.pop_metrics() == in_process.pop_metrics()
    isolated.close()
    assert "isolate" not in ENVS.ignores("gymnasium")
    assert "isolate" in ENVS.ignores("maniskill")


def test_memory_mb_limits_the_address_space_of_each_isolated_env_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``env.memory_mb``: an isolated copy whose step allocates past the limit fails that step
    with a MemoryError (an env failure); the same step under the limit, or without one, runs."""
    from tests.shell.embodied_fault_ext import ALLOCATING_ID

    config = EnvConfig(env_type="gymnasium", env_id=ALLOCATING_ID, num_envs=2, isolate=True)
    actions = torch.zeros(2, dtype=torch.int64)

    def one_step(cfg: EnvConfig, alloc_mb: int) -> None:
        monkeypatch.setenv("RLSHELL_TEST_ENV_ALLOC_MB", str(alloc_mb))  # spawned processes
        limit_here = resource.getrlimit(resource.RLIMIT_AS)
        stepper = EnvStepper.from_config(cfg)
        # AsyncVectorEnv builds a copy here too (for its spaces): this process stays unbound.
        assert resource.getrlimit(resource.RLIMIT_AS) == limit_here
        try:
            stepper.reset(seed=0)
            stepper.step(actions)
        finally:
            stepper.env.close(terminate=True)

    one_step(config, 512)  # no limit
    one_step(evolve(config, memory_mb=256), 64)
    with pytest.raises(
        EnvStepError,
        match=r"at env step 1: MemoryError: Unable to allocate 512\. MiB .* "
        r"\(past env\.memory_mb=256 MiB of growth\)",
    ):
        one_step(evolve(config, memory_mb=256), 512)
    with pytest.raises(ValueError, match=r"env\.memory_mb limits each env copy's own process"):
        EnvStepper.from_config(evolve(config, isolate=False, memory_mb=256))
    assert "memory_mb" not in ENVS.ignores("gymnasium")
    assert "memory_mb" in ENVS.ignores("maniskill")


def test_episode_stats_match_a_hand_count_on_cartpole() -> None:
    stepper = EnvStepper.from_config(gym_config("CartPole-v1", num_envs=4))
    stepper.reset(seed=1)
    rng = np.random.default_rng(0)
    running, lengths = np.zeros(4), np.zeros(4, dtype=int)
    returns_seen, lengths_seen = [], []
    for _ in range(120):
        result = stepper.step(torch.as_tensor(rng.integers(0, 2, size=4)))
        running += result.rewards.numpy()
        lengths += 1
        for i in np.flatnonzero(result.dones.numpy()):
            returns_seen.append(running[i])
            lengths_seen.append(lengths[i])
            running[i], lengths[i] = 0.0, 0
    metrics = stepper.pop_metrics()
    assert metrics["env/episodes"] == len(returns_seen) > 4
    assert metrics["env/episode_return"] == pytest.approx(np.mean(returns_seen))
    assert metrics["env/episode_length"] == pytest.approx(np.mean(lengths_seen))
    assert "env/success" not in metrics
    assert stepper.pop_metrics() == {"env/episodes": 0.0}


def test_episode_stats_and_success_on_scripted_episodes() -> None:
    # Env 0 succeeds only mid-episode, env 1 at its last step: both count for success_once.
    stepper = tiny_stepper({"length": 3, "success_at": (2,)}, {"length": 3, "success_at": (3,)})
    stepper.reset(seed=0)
    for _ in range(7):  # two full episodes each, and one step of a third
        stepper.step(torch.zeros(2, dtype=torch.int64))
    assert stepper.pop_metrics() == {
        "env/episodes": 4.0,
        "env/episode_return": 6.0,  # 1 + 2 + 3
        "env/episode_length": 3.0,
        "env/success": 0.5,
        "env/success_once": 1.0,
    }


def test_a_chunk_of_actions_is_one_policy_step_that_ends_where_its_episode_does() -> None:
    # Observation and reward carry the step count t; env 0's episodes last 4 steps, env 1's 3.
    stepper = tiny_stepper({"length": 4}, {"length": 3})
    stepper.reset(seed=0)
    chunk = torch.zeros(2, 3, dtype=torch.int64)
    first = stepper.step(chunk, chunk=3)
    # Env 0 plays t = 1, 2, 3; env 1 ends its episode on the chunk's last action.
    assert first.rewards.tolist() == [6.0, 6.0]
    assert first.terminated.tolist() == [False, True]
    assert first.obs["states"][:, 0].tolist() == [3.0, 0.0]  # env 1 reset
    assert first.next_obs["states"][:, 0].tolist() == [3.0, 3.0]  # its final observation
    second = stepper.step(chunk, chunk=3)
    # Env 0 ends at the chunk's first action (t = 4): the rest of the chunk's rewards are the
    # new episode's, not counted; the policy next sees the new episode two steps in.
    assert second.rewards.tolist() == [4.0, 6.0]
    assert second.terminated.tolist() == [True, True]
    assert second.truncated.tolist() == [False, False]
    assert second.next_obs["states"][:, 0].tolist() == [4.0, 3.0]
    assert second.obs["states"][:, 0].tolist() == [2.0, 0.0]
    metrics = stepper.pop_metrics()  # episodes are the env's, counted per env step
    assert metrics["env/episodes"] == 3.0
    assert metrics["env/episode_length"] == pytest.approx((4 + 3 + 3) / 3)
    with pytest.raises(ValueError, match=r"action chunks of shape \(2, 2\), expected \(2, 3\)"):
        stepper.step(torch.zeros(2, 2, dtype=torch.int64), chunk=3)


# --- errors ----------------------------------------------------------------------------


def test_bad_actions_raise_naming_env_and_shapes() -> None:
    stepper = EnvStepper.from_config(gym_config("CartPole-v1", num_envs=3))
    with pytest.raises(RuntimeError, match="reset"):
        stepper.step(torch.zeros(3, dtype=torch.int64))
    stepper.reset(seed=0)
    with pytest.raises(ValueError, match=r"CartPole-v1.*\(3, 1\).*expected \(3,\)"):
        stepper.step(torch.zeros(3, 1, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"CartPole-v1.*integer actions.*float32"):
        stepper.step(torch.zeros(3))
    with pytest.raises(ValueError, match=r"CartPole-v1.*\[0, 1\].*\[0, 2\]"):
        stepper.step(torch.tensor([0, 1, 2]))
    pendulum = EnvStepper.from_config(gym_config("Pendulum-v1", num_envs=2))
    pendulum.reset(seed=0)
    with pytest.raises(ValueError, match=r"Pendulum-v1.*\(2,\).*expected \(2, 1\)"):
        pendulum.step(torch.zeros(2))


def test_a_vector_env_without_same_step_autoreset_is_refused() -> None:
    env = gymnasium.vector.SyncVectorEnv([functools.partial(gymnasium.make, TINY_ID)])
    with pytest.raises(ValueError, match=f"{TINY_ID}.*NextStep.*SAME_STEP"):
        EnvStepper(env, TINY_ID)


@pytest.mark.parametrize("nan_in", ["obs", "reward"])
def test_non_finite_values_raise_naming_env_and_index(nan_in: str) -> None:
    stepper = tiny_stepper({}, {"nan_at": 2, "nan_in": nan_in}, {})
    stepper.reset(seed=0)
    stepper.step(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(FloatingPointError, match=f"{TINY_ID}.*env index 1"):
        stepper.step(torch.zeros(3, dtype=torch.int64))


class _TwoCameraEnv(gymnasium.Env[Any, np.ndarray]):
    """A scene camera, a wrist camera and the robot's state, as ManiSkill's rgb mode gives them."""

    def __init__(self) -> None:
        image = spaces.Box(0, 255, (4, 4, 3), np.uint8)
        self.observation_space = spaces.Dict(
            {
                "main_images": image,
                "wrist_images": image,
                "states": spaces.Box(-1, 1, (2,), np.float32),
            }
        )
        self.action_space = spaces.Box(-1, 1, (1,), np.float32)

    def _obs(self, value: int) -> dict[str, np.ndarray]:
        return {
            "main_images": np.full((4, 4, 3), value, np.uint8),
            "wrist_images": np.full((4, 4, 3), 100 + value, np.uint8),
            "states": np.full(2, value / 10, np.float32),
        }

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        return self._obs(0), {}

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return self._obs(1), 0.0, False, False, {}


def test_a_wrist_camera_keeps_its_key_beside_the_main_one() -> None:
    stepper = EnvStepper(
        gymnasium.vector.SyncVectorEnv([_TwoCameraEnv] * 2, autoreset_mode=SAME_STEP), "two"
    )
    obs = stepper.reset(seed=0)
    assert set(obs) == {"main_images", "wrist_images", "states"}
    assert obs["wrist_images"].shape == (2, 4, 4, 3)
    assert int(obs["wrist_images"][0, 0, 0, 0]) == 100
    step = stepper.step(torch.zeros(2, 1))
    assert int(step.obs["main_images"][1, 0, 0, 0]) == 1
    assert int(step.obs["wrist_images"][1, 0, 0, 0]) == 101

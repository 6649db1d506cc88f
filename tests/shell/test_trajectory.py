"""The embodied rollout buffer: what it stores, the GAE it asks rlcore for, PPO's minibatches."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlcore.advantages import gae
from rlshell.rollout.trajectory import TrajectoryBuffer


def _fill(buffer: TrajectoryBuffer, steps: int, seed: int) -> dict[str, torch.Tensor]:
    """Random steps; returns the [T, N] columns that went in."""
    g = torch.Generator().manual_seed(seed)
    n = buffer.num_envs
    cols = {
        "obs": torch.randn(steps, n, 3, generator=g),
        "logprobs": torch.randn(steps, n, generator=g),
        "values": torch.randn(steps, n, generator=g),
        "rewards": torch.randn(steps, n, generator=g),
        "terminated": torch.rand(steps, n, generator=g) < 0.2,
        "truncated": torch.rand(steps, n, generator=g) < 0.1,
        "next_values": torch.randn(steps, n, generator=g),
    }
    for t in range(steps):
        buffer.add(
            {"states": cols["obs"][t], "action": torch.arange(n) + t * n},
            cols["logprobs"][t],
            cols["values"][t],
            cols["rewards"][t],
            cols["terminated"][t],
            cols["truncated"][t],
            cols["next_values"][t],
        )
    return cols


@given(st.integers(1, 6), st.integers(1, 12), st.integers(0, 2**16))
def test_samples_are_the_window_flattened_time_major_with_rlcores_gae(
    num_envs: int, steps: int, seed: int
) -> None:
    buffer = TrajectoryBuffer(num_envs)
    cols = _fill(buffer, steps, seed)
    samples = buffer.finish(gamma=0.98, lam=0.8)
    assert len(buffer) == 0
    assert samples.size == steps * num_envs
    expected = gae(
        cols["rewards"].T,
        cols["values"].T,
        cols["next_values"].T,
        cols["terminated"].T,
        cols["truncated"].T,
        gamma=0.98,
        lam=0.8,
    )
    torch.testing.assert_close(samples.advantages, expected.advantages.T.reshape(-1))
    torch.testing.assert_close(samples.returns, expected.returns.T.reshape(-1))
    # Row t·N + i is step t of env i, in every field.
    assert torch.equal(samples.forward_inputs["action"], torch.arange(steps * num_envs))
    assert torch.equal(samples.forward_inputs["states"], cols["obs"].reshape(-1, 3))
    assert torch.equal(samples.logprobs, cols["logprobs"].reshape(-1))


@given(st.integers(1, 40), st.integers(1, 8), st.integers(0, 2**16))
def test_minibatches_partition_the_samples(size: int, count: int, seed: int) -> None:
    buffer = TrajectoryBuffer(1)
    _fill(buffer, size, seed)
    samples = buffer.finish(gamma=1.0, lam=1.0)
    if count > size:
        with pytest.raises(ValueError, match=f"num_minibatches: expected 1 to {size}"):
            next(samples.minibatches(count, torch.Generator()))
        return
    parts = list(samples.minibatches(count, torch.Generator().manual_seed(seed)))
    assert len(parts) == count
    assert max(p.size for p in parts) - min(p.size for p in parts) <= 1
    seen = torch.cat([p.forward_inputs["action"] for p in parts]).sort().values
    assert torch.equal(seen, torch.arange(size))


def test_one_minibatch_is_the_samples_in_order_without_a_draw() -> None:
    buffer = TrajectoryBuffer(2)
    _fill(buffer, 5, 0)
    samples = buffer.finish(gamma=1.0, lam=1.0)
    generator = torch.Generator().manual_seed(3)
    state = generator.get_state()
    (part,) = samples.minibatches(1, generator)
    assert part is samples
    assert torch.equal(generator.get_state(), state)


def test_bad_steps_are_refused_naming_the_field() -> None:
    buffer = TrajectoryBuffer(2)
    ones, flags = torch.ones(2), torch.zeros(2, dtype=torch.bool)
    with pytest.raises(ValueError, match="'rewards' has shape \\(3,\\); expected 2 rows"):
        buffer.add({"states": torch.ones(2, 1)}, ones, ones, torch.ones(3), flags, flags, ones)
    buffer.add({"states": torch.ones(2, 1)}, ones, ones, ones, flags, flags, ones)
    with pytest.raises(ValueError, match="forward_inputs keys \\['obs'\\] differ"):
        buffer.add({"obs": torch.ones(2, 1)}, ones, ones, ones, flags, flags, ones)
    with pytest.raises(ValueError, match="holds no steps"):
        TrajectoryBuffer(2).finish(1.0, 1.0)
    with pytest.raises(ValueError, match="num_envs"):
        TrajectoryBuffer(0)


# ---------------------------------------------------------------------------
# Reward scaling (algorithm.norm_reward).


@given(
    envs=st.integers(1, 4),
    steps=st.integers(1, 60),
    gamma=st.floats(0.0, 0.999),
    seed=st.integers(0, 2**16),
)
def test_reward_scaler_divides_by_the_std_of_every_discounted_return_so_far(
    envs: int, steps: int, gamma: float, seed: int
) -> None:
    from rlshell.rollout.trajectory import RewardScaler

    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(steps, envs, generator=g) * 3.0
    dones = torch.rand(steps, envs, generator=g) < 0.1
    scaler = RewardScaler(envs, gamma)
    running = torch.zeros(envs, dtype=torch.float64)
    seen: list[torch.Tensor] = []
    for t in range(steps):
        running = running * gamma + rewards[t].double()
        seen.append(running.clone())
        std = torch.cat(seen).var(unbiased=False).sqrt()
        want = (rewards[t].double() / torch.sqrt(std**2 + 1e-8)).clamp(-10, 10)
        got = scaler(rewards[t], dones[t])
        torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-6)
        assert torch.equal(torch.sign(got), torch.sign(rewards[t]))
        running = torch.where(dones[t], 0.0, running)


def test_reward_scaler_agrees_with_gymnasiums_running_statistics() -> None:
    from gymnasium.wrappers.utils import RunningMeanStd

    from rlshell.rollout.trajectory import RewardScaler

    g = torch.Generator().manual_seed(0)
    scaler, reference = RewardScaler(3, 0.99), RunningMeanStd(shape=())
    running = torch.zeros(3, dtype=torch.float64)
    for _ in range(2000):
        rewards = torch.randn(3, generator=g) + 1.0
        dones = torch.rand(3, generator=g) < 0.01
        got = scaler(rewards, dones)
        running = running * 0.99 + rewards.double()
        reference.update(running.numpy())
        running = torch.where(dones, 0.0, running)
    want = rewards.double() / (reference.var + 1e-8) ** 0.5
    torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=0.0)


def test_reward_scaler_state_round_trips_and_refuses_another_env_count() -> None:
    from rlshell.rollout.trajectory import RewardScaler

    first, second = RewardScaler(2, 0.9), RewardScaler(2, 0.9)
    for t in range(5):
        first(torch.tensor([1.0 + t, -2.0]), torch.tensor([False, t == 2]))
    second.load_state_dict(first.state_dict())
    step = torch.tensor([0.5, 4.0]), torch.tensor([False, False])
    torch.testing.assert_close(first(*step), second(*step))
    with pytest.raises(ValueError, match="2 envs saved, this scaler has 3"):
        RewardScaler(3, 0.9).load_state_dict(first.state_dict())

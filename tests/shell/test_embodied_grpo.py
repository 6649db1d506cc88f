"""Embodied GRPO: groups of envs reset alike, episode returns normalised within the group."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rlcore.advantages import group_normalized
from rlshell.config import EnvConfig, ModelConfig
from rlshell.envs.stepper import EnvStepper
from rlshell.metrics import read_metrics
from rlshell.models import BasePolicy, get_model
from rlshell.workers.embodied_grpo import EpisodeWindow, collect_group_episodes, group_samples
from rlshell.workers.embodied_update import PPOSettings, ppo_update
from tests.shell.test_run import cli_env, train


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _cartpole(num_envs: int) -> tuple[BasePolicy, EnvStepper]:
    torch.manual_seed(0)
    policy = get_model(
        ModelConfig(
            model_type="mlp_policy",
            category="embodied",
            model_kwargs={"obs_dim": 4, "action_dim": 2, "action_type": "discrete"},
        )
    )
    assert isinstance(policy, BasePolicy)
    config = EnvConfig(env_type="gymnasium", env_id="CartPole-v1", num_envs=num_envs)
    return policy, EnvStepper.from_config(config, 0)


def test_group_samples_spread_each_groups_normalised_return_over_its_valid_steps() -> None:
    # 4 envs in 2 groups; episodes of 3, 1, 2 and 3 steps.
    valid = torch.tensor(
        [[True, True, True, True], [True, False, True, True], [True, False, False, True]]
    )
    rewards = torch.tensor([[1.0, 5.0, 2.0, 0.0], [1.0, 9.0, 2.0, 1.0], [1.0, 9.0, 9.0, 0.0]])
    window = EpisodeWindow(
        forward_inputs={"states": torch.arange(12.0).reshape(3, 4, 1)},
        logprobs=-torch.arange(12.0).reshape(3, 4),
        rewards=rewards,
        valid=valid,
    )
    assert window.returns.tolist() == [3.0, 5.0, 4.0, 1.0]
    samples = group_samples(window, "grpo", group_size=2)
    want = group_normalized(window.returns.reshape(2, 2), eps=1e-6).reshape(-1)
    rows = valid.reshape(-1).nonzero().flatten()
    assert samples.size == int(valid.sum()) == 9
    env_of_row = rows % 4
    torch.testing.assert_close(samples.advantages, want[env_of_row])
    torch.testing.assert_close(samples.forward_inputs["states"][:, 0], rows.float())
    torch.testing.assert_close(samples.logprobs, -rows.float())
    assert torch.equal(samples.values, torch.zeros(9))


def test_envs_of_a_group_start_alike_and_groups_differ() -> None:
    policy, stepper = _cartpole(num_envs=6)
    window, _ = collect_group_episodes(policy, stepper, seed=5, group_size=3, max_steps=500)
    first = window.forward_inputs["states"][0]
    assert torch.equal(first[0], first[1])
    assert torch.equal(first[1], first[2])
    assert torch.equal(first[3], first[5])
    assert not torch.equal(first[0], first[3])
    # Each env's valid steps are a prefix ending with its episode's end.
    assert bool(window.valid[0].all())
    assert bool((window.valid[1:] <= window.valid[:-1]).all())
    assert not bool(window.valid[-1].all()) or window.valid.shape[0] == 500


def test_a_group_size_that_does_not_divide_the_envs_is_refused() -> None:
    policy, stepper = _cartpole(num_envs=4)
    with pytest.raises(ValueError, match="group_size: 3 does not divide this worker's 4 envs"):
        collect_group_episodes(policy, stepper, seed=0, group_size=3, max_steps=10)


def test_embodied_grpo_learns_cartpole_without_a_critic() -> None:
    policy, stepper = _cartpole(num_envs=16)
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    settings = PPOSettings(ppo_epochs=4, num_minibatches=4, vf_coef=0.0, norm_adv=False)
    generator = torch.Generator().manual_seed(0)
    returns = []
    for window_index in range(14):
        window, _ = collect_group_episodes(policy, stepper, 1000 + window_index, 4, 500)
        returns.append(float(window.returns.mean()))
        ppo_update(policy, optimizer, group_samples(window, "grpo", 4), settings, generator)
    # Random play lasts about 22 steps; the last windows should last several times longer.
    assert sum(returns[-3:]) / 3 > 2.5 * returns[0], returns


@pytest.mark.slow
def test_the_runner_trains_embodied_grpo_from_the_cli(tmp_path: Path) -> None:
    env = cli_env(Path(tempfile.mkdtemp(prefix="rg", dir="/tmp")))
    result = train(
        "configs/ppo_cartpole.py",
        "algorithm.adv_type=grpo",
        "algorithm.group_size=4",
        # What docs/embodied.md's command sets back: GRPO reads no γ, λ or value weight.
        "algorithm.gamma=1",
        "algorithm.lam=1",
        "algorithm.vf_coef=0.5",
        "runner.rollout_steps=200",
        "runner.max_steps=3",
        "algorithm.ppo_epochs=2",
        f"runner.output_dir={tmp_path}",
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = read_metrics(tmp_path / "ppo_cartpole" / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [1, 2, 3]
    for record in records:
        # Every env ended one episode per window; only the steps inside it were trained on.
        assert record["env/episodes"] >= 8
        assert 0 < record["train/samples"] <= record["env/steps"]
        assert record["train/value_loss"] >= 0

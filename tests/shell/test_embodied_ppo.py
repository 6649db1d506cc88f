"""PPO on an embodied policy in one process: the value bootstrap, and learning CartPole."""

from __future__ import annotations

import pytest
import torch

from rlshell.config import EnvConfig, ModelConfig
from rlshell.envs.stepper import EnvStepper
from rlshell.models import BasePolicy, get_model
from rlshell.rollout.trajectory import TrajectoryBuffer
from rlshell.workers.embodied_update import PPOSettings, collect_rollout, ppo_update

CARTPOLE = {"obs_dim": 4, "action_dim": 2, "action_type": "discrete"}


def _policy(seed: int) -> BasePolicy:
    torch.manual_seed(seed)
    model = get_model(
        ModelConfig(model_type="mlp_policy", category="embodied", model_kwargs=CARTPOLE)
    )
    assert isinstance(model, BasePolicy)
    return model


def _stepper(num_envs: int, seed: int, max_episode_steps: int | None = None) -> EnvStepper:
    cfg = EnvConfig(
        env_type="gymnasium",
        env_id="CartPole-v1",
        num_envs=num_envs,
        max_episode_steps=max_episode_steps,
    )
    return EnvStepper.from_config(cfg, seed)


def test_truncated_steps_bootstrap_from_the_final_observation() -> None:
    """With a 5-step limit every episode is cut: its V(s') is the final observation's value."""
    policy, stepper = _policy(0), _stepper(4, 0, max_episode_steps=5)
    buffer = TrajectoryBuffer(4)
    obs = stepper.reset(0)
    finals: list[torch.Tensor] = []
    original_step = stepper.step

    def recording_step(actions: torch.Tensor, **kwargs: str | None):  # type: ignore[no-untyped-def]
        result = original_step(actions, **kwargs)
        finals.append(result.next_obs["states"].clone())
        return result

    stepper.step = recording_step  # type: ignore[method-assign]
    collect_rollout(policy, stepper, buffer, obs, steps=10)
    cols = buffer._columns
    truncated = torch.stack(cols["truncated"])
    assert truncated.any()
    next_values = torch.stack(cols["next_values"])
    values = torch.stack(cols["values"])
    for t in range(10):
        expected = policy.predict_action_batch({"states": finals[t]}, mode="eval")[1]["prev_values"]
        ended = torch.stack(cols["terminated"])[t] | truncated[t]
        # Truncated rows: V(final obs); continuing rows: the next step's value.
        torch.testing.assert_close(next_values[t][truncated[t]], expected[truncated[t]])
        if t + 1 < 10:
            torch.testing.assert_close(next_values[t][~ended], values[t + 1][~ended])


@pytest.mark.parametrize("bootstrap_at_done", [False, True])
def test_a_terminated_step_bootstraps_only_with_bootstrap_at_done(bootstrap_at_done: bool) -> None:
    """CartPole pushed one way falls (terminates): its V(s') is 0 to gae, or with
    ``bootstrap_at_done`` (ManiSkill's baselines) the final observation's value."""
    policy, stepper = _policy(0), _stepper(3, 0)
    buffer = TrajectoryBuffer(3)
    finals: list[torch.Tensor] = []
    ended: list[torch.Tensor] = []
    original_step = stepper.step

    def pushing_right(actions: torch.Tensor, **kwargs: str | None):  # type: ignore[no-untyped-def]
        result = original_step(torch.ones_like(actions), **kwargs)
        finals.append(result.next_obs["states"].clone())
        ended.append(result.terminated.clone())
        return result

    stepper.step = pushing_right  # type: ignore[method-assign]
    collect_rollout(
        policy, stepper, buffer, stepper.reset(0), steps=40, bootstrap_at_done=bootstrap_at_done
    )
    cols = buffer._columns
    terminated, truncated = torch.stack(cols["terminated"]), torch.stack(cols["truncated"])
    fell = torch.stack(ended)
    assert fell.any()
    if not bootstrap_at_done:
        assert torch.equal(terminated, fell)
        assert not truncated.any()
        return
    assert not terminated.any()
    assert torch.equal(truncated, fell)
    next_values = torch.stack(cols["next_values"])
    for t in range(40):
        if fell[t].any():
            expected = policy.predict_action_batch({"states": finals[t]}, mode="eval")[1]
            torch.testing.assert_close(next_values[t][fell[t]], expected["prev_values"][fell[t]])


def _steps_to_475(seed: int) -> tuple[int | None, float]:
    """rl-zoo's CartPole settings (8 envs × 32 steps, 20 epochs of one 256-sample batch, λ 0.8,
    γ 0.98, lr 1e-3 decaying linearly over 40,000 env steps): the env steps after which the
    mean return of the last 5 rollouts first reaches 475 (None: not within 40,000), and the
    best such mean seen."""
    torch.manual_seed(seed)
    policy, stepper = _policy(seed), _stepper(8, seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3, eps=1e-5)
    settings = PPOSettings(ppo_epochs=20, num_minibatches=1, ent_coef=0.0)
    buffer, generator = TrajectoryBuffer(8), torch.Generator().manual_seed(seed)
    obs = stepper.reset(seed)
    iterations, recent, best = 40_000 // 256, [], 0.0
    for iteration in range(iterations):
        for group in optimizer.param_groups:
            group["lr"] = 1e-3 * (1 - iteration / iterations)
        obs = collect_rollout(policy, stepper, buffer, obs, steps=32)
        metrics = ppo_update(
            policy, optimizer, buffer.finish(gamma=0.98, lam=0.8), settings, generator
        )
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
        env = stepper.pop_metrics()
        if "env/episode_return" in env:
            recent = [*recent, env["env/episode_return"]][-5:]
        if len(recent) == 5:
            best = max(best, sum(recent) / 5)
            if best >= 475:
                return (iteration + 1) * 256, best
    return None, best


@pytest.mark.slow
def test_ppo_learns_cartpole_to_475_on_most_seeds() -> None:
    """A learning claim over 3 seeds: the median seed reaches a mean return of 475 within
    40,000 env steps (SB3 with these settings needs about 25,000). Each seed alone is a
    chaotic function of the float arithmetic, which differs between CPUs: measured on one
    machine, seeds 0 to 4 reached it after 35,072, never (best 470.8), 14,592, 15,616 and
    18,944 steps; on another, seed 1 reached it too. So the claim is the median's, not each
    seed's. The seeds stop as soon as the outcome is known."""
    outcomes: dict[int, tuple[int | None, float]] = {}
    for seed in (0, 1, 2):
        outcomes[seed] = _steps_to_475(seed)
        reached = sum(steps is not None for steps, _ in outcomes.values())
        if reached == 2 or len(outcomes) - reached == 2:
            break
    reached = sum(steps is not None for steps, _ in outcomes.values())
    assert reached >= 2, f"fewer than 2 of 3 seeds reached 475 (seed: (steps, best)): {outcomes}"

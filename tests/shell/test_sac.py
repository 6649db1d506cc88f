"""SAC in one process: the replay buffer, the update's wiring, and learning Pendulum."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from rlcore import typecheck_enabled
from rlcore.losses import sac_critic_target
from rlshell.config import EnvConfig, ModelConfig
from rlshell.envs.stepper import EnvStepper, StepResult
from rlshell.models import BasePolicy, ForwardType, get_model
from rlshell.rollout.replay import ReplayBatch, ReplayBuffer
from rlshell.runners.validation import load_config
from rlshell.workers.sac_update import SACLearner, SACSettings, collect_sac_steps, polyak_update
from rlshell.workers.sac_workers import SACLearnerWorker
from tests.shell.rlcore_checks import rlcore_checks_run


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    # Small MLPs: one thread is faster than two, and steady on a shared machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _policy(seed: int, hidden: str = "64,64") -> BasePolicy:
    torch.manual_seed(seed)
    kwargs: dict[str, int | float | str | bool] = {
        "obs_dim": 3,
        "action_dim": 1,
        "action_type": "tanh_gaussian",
        "action_low": -2.0,
        "action_high": 2.0,
        "hidden_sizes": hidden,
        "activation": "relu",
    }
    model = get_model(
        ModelConfig(model_type="mlp_policy", category="embodied", model_kwargs=kwargs)
    )
    assert isinstance(model, BasePolicy)
    return model


def _pendulum(num_envs: int = 1, seed: int = 0, max_episode_steps: int | None = None) -> EnvStepper:
    cfg = EnvConfig(
        env_type="gymnasium",
        env_id="Pendulum-v1",
        num_envs=num_envs,
        max_episode_steps=max_episode_steps,
    )
    return EnvStepper.from_config(cfg, seed)


def _fill(buffer: ReplayBuffer, steps: int, envs: int, start: int = 0) -> None:
    """Step k of env i gets the value start + k·envs + i in every field."""
    for k in range(steps):
        v = torch.arange(envs, dtype=torch.float32) + start + k * envs
        buffer.add(
            v[:, None].expand(envs, buffer.obs_dim),
            v[:, None].expand(envs, buffer.action_dim),
            v,
            v[:, None].expand(envs, buffer.obs_dim) + 0.5,
            v.long() % 2 == 1,
        )


# ---------------------------------------------------------------------------
# The replay buffer.


def test_replay_buffer_keeps_the_newest_capacity_rows_when_it_wraps() -> None:
    buffer = ReplayBuffer(capacity=5, obs_dim=3, action_dim=2)
    _fill(buffer, steps=3, envs=2)  # values 0…5: the oldest, 0, is overwritten by 5
    assert len(buffer) == 5
    state = buffer.state_dict()
    assert state["position"] == 1
    assert state["rewards"].tolist() == [5.0, 1.0, 2.0, 3.0, 4.0]
    torch.testing.assert_close(state["next_states"][:, 0], state["rewards"] + 0.5)
    assert state["terminated"].tolist() == [True, True, False, True, False]
    batch = buffer.sample(5, torch.Generator().manual_seed(0))
    assert set(batch.rewards.tolist()) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    torch.testing.assert_close(batch.states, batch.rewards[:, None].expand(5, 3))
    torch.testing.assert_close(batch.actions, batch.rewards[:, None].expand(5, 2))
    assert batch.terminated.tolist() == [int(r) % 2 == 1 for r in batch.rewards.tolist()]


def test_replay_buffer_with_more_envs_than_capacity_keeps_the_last_rows() -> None:
    buffer = ReplayBuffer(capacity=3, obs_dim=1, action_dim=1)
    _fill(buffer, steps=1, envs=5)
    assert sorted(buffer.state_dict()["rewards"].tolist()) == [2.0, 3.0, 4.0]


@pytest.mark.parametrize("steps", [2, 7])  # before and after wrapping around
def test_replay_buffer_state_dict_round_trips(steps: int) -> None:
    buffer = ReplayBuffer(capacity=10, obs_dim=3, action_dim=2)
    _fill(buffer, steps=steps, envs=3)
    restored = ReplayBuffer(capacity=10, obs_dim=3, action_dim=2)
    restored.load_state_dict(copy.deepcopy(buffer.state_dict()))
    assert len(restored) == len(buffer)
    # The same draws, and the same rows overwritten next.
    for each in (buffer, restored):
        _fill(each, steps=2, envs=3, start=100)
    for name in ("states", "actions", "rewards", "next_states", "terminated"):
        torch.testing.assert_close(
            getattr(buffer.sample(8, torch.Generator().manual_seed(1)), name),
            getattr(restored.sample(8, torch.Generator().manual_seed(1)), name),
        )
        torch.testing.assert_close(buffer.state_dict()[name], restored.state_dict()[name])


def _zeros(actions: int = 1, next_obs: int = 3) -> tuple[torch.Tensor, ...]:
    """Two envs' step for a buffer with obs_dim 3, action_dim 1, unless told otherwise."""
    return (
        torch.zeros(2, 3),
        torch.zeros(2, actions),
        torch.zeros(2),
        torch.zeros(2, next_obs),
        torch.zeros(2, dtype=torch.bool),
    )


def test_replay_buffer_errors_name_the_problem() -> None:
    buffer = ReplayBuffer(capacity=10, obs_dim=3, action_dim=1)
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="holds 0 transitions, fewer than batch_size=4"):
        buffer.sample(4, generator)
    with pytest.raises(ValueError, match=r"actions has shape \(2, 2\), expected \(2, 1\)"):
        buffer.add(*_zeros(actions=2))
    with pytest.raises(ValueError, match=r"next_states has shape \(2, 4\)"):
        buffer.add(*_zeros(next_obs=4))
    _fill(buffer, steps=1, envs=2)
    with pytest.raises(ValueError, match="holds 2 transitions, fewer than batch_size=3"):
        buffer.sample(3, generator)
    with pytest.raises(ValueError, match="the checkpoint has capacity=10, this buffer 5"):
        ReplayBuffer(capacity=5, obs_dim=3, action_dim=1).load_state_dict(buffer.state_dict())


# ---------------------------------------------------------------------------
# The update's wiring.


def test_polyak_update_is_tau_theta_plus_one_minus_tau_theta_target() -> None:
    torch.manual_seed(0)
    online, target = nn.Linear(3, 2), nn.Linear(3, 2)
    before = [p.detach().clone() for p in target.parameters()]
    polyak_update(target.parameters(), online.parameters(), tau=0.1)
    for new, old, theta in zip(target.parameters(), before, online.parameters(), strict=True):
        torch.testing.assert_close(new, 0.1 * theta + 0.9 * old)


def _random_batch(size: int, seed: int) -> ReplayBatch:
    g = torch.Generator().manual_seed(seed)
    return ReplayBatch(
        states=torch.randn(size, 3, generator=g),
        actions=torch.rand(size, 1, generator=g) * 2 - 1,
        rewards=torch.randn(size, generator=g),
        next_states=torch.randn(size, 3, generator=g),
        terminated=torch.rand(size, generator=g) < 0.3,
    )


def test_learner_polyak_averages_only_the_q_heads_after_the_critic_step() -> None:
    learner = SACLearner(_policy(0), 1, SACSettings(tau=0.25))
    target_before = copy.deepcopy(learner.target.state_dict())
    learner.update(_random_batch(32, 0))
    online, target = learner.policy.state_dict(), learner.target.state_dict()
    for name, value in target.items():
        if name.startswith(("q1.", "q2.")):
            torch.testing.assert_close(value, 0.25 * online[name] + 0.75 * target_before[name])
        else:
            torch.testing.assert_close(value, target_before[name])


@pytest.mark.parametrize(("target_entropy", "rises"), [(10.0, True), (-10.0, False)])
def test_temperature_rises_when_entropy_is_below_target(target_entropy: float, rises: bool) -> None:
    settings = SACSettings(target_entropy=target_entropy, policy_frequency=1)
    learner = SACLearner(_policy(0), 1, settings)
    for seed in range(3):
        metrics = learner.update(_random_batch(64, seed))
    assert -10.0 < metrics["train/entropy"] < 10.0
    assert (learner.alpha > 0.2) is rises
    assert set(metrics) == {
        "train/qf_loss",
        "train/q_mean",
        "train/actor_loss",
        "train/entropy",
        "train/alpha",
        "train/alpha_loss",
    }


def test_critic_target_bootstraps_unless_terminated() -> None:
    learner = SACLearner(_policy(0), 1, SACSettings(gamma=0.9))
    # Let the target differ from the online Q heads and α from 0.2.
    for seed in range(2):
        learner.update(_random_batch(32, seed))
    batch = _random_batch(16, 7)
    torch.manual_seed(3)
    target = learner.critic_target(batch.rewards, batch.next_states, batch.terminated)
    torch.manual_seed(3)
    with torch.no_grad():
        next_actions, next_logprobs = learner.policy(ForwardType.SAC, states=batch.next_states)
        q1, q2 = learner.target(ForwardType.SAC_Q, states=batch.next_states, actions=next_actions)
    alpha = learner.log_alpha.detach().exp()
    expected = sac_critic_target(
        batch.rewards, torch.stack([q1, q2], -1), next_logprobs, batch.terminated, 0.9, alpha
    )
    torch.testing.assert_close(target, expected)
    by_hand = batch.rewards + 0.9 * (torch.minimum(q1, q2) - alpha * next_logprobs)
    term = batch.terminated
    assert term.any()
    assert (~term).any()
    torch.testing.assert_close(target[term], batch.rewards[term])  # no bootstrap
    torch.testing.assert_close(target[~term], by_hand[~term])


@pytest.mark.parametrize("bootstrap_at_done", [False, True])
def test_a_terminated_step_is_stored_terminated_unless_bootstrap_at_done(
    bootstrap_at_done: bool,
) -> None:
    """Pendulum never terminates: its second env's steps are made terminated. The replay keeps
    them terminated (no bootstrap), or with ``bootstrap_at_done`` not (s' bootstraps)."""
    policy, stepper = _policy(0), _pendulum(num_envs=2, max_episode_steps=50)
    original_step = stepper.step

    def second_env_terminates(actions: torch.Tensor, **kwargs: str | None) -> StepResult:
        result = original_step(actions, **kwargs)
        return StepResult(
            obs=result.obs,
            rewards=result.rewards,
            terminated=torch.tensor([False, True]),
            truncated=result.truncated,
            next_obs=result.next_obs,
        )

    stepper.step = second_env_terminates  # type: ignore[method-assign,assignment]
    replay = ReplayBuffer(capacity=100, obs_dim=3, action_dim=1)
    generator = torch.Generator().manual_seed(0)
    collect_sac_steps(
        policy, stepper, replay, stepper.reset(0), 3, generator, False, bootstrap_at_done
    )
    stored = replay.state_dict()["terminated"][:6].reshape(3, 2)
    expected = torch.tensor([[False, not bootstrap_at_done]] * 3)
    assert torch.equal(stored, expected)


def test_collected_truncated_steps_keep_the_final_observation_and_bootstrap() -> None:
    policy, stepper = _policy(0), _pendulum(num_envs=2, max_episode_steps=3)
    replay = ReplayBuffer(capacity=100, obs_dim=3, action_dim=1)
    results: list[StepResult] = []
    sent: list[torch.Tensor] = []
    original_step = stepper.step

    def recording_step(actions: torch.Tensor, **kwargs: str | None) -> StepResult:
        sent.append(actions.clone())
        results.append(original_step(actions, **kwargs))
        return results[-1]

    stepper.step = recording_step  # type: ignore[method-assign,assignment]
    generator = torch.Generator().manual_seed(0)
    obs = collect_sac_steps(policy, stepper, replay, stepper.reset(0), 3, generator, True)
    obs = collect_sac_steps(policy, stepper, replay, obs, 3, generator, False)
    state = replay.state_dict()
    for step in (2, 5):  # the third step of each episode is truncated
        result, rows = results[step], slice(2 * step, 2 * step + 2)
        assert result.truncated.all()
        assert not result.terminated.any()
        assert not torch.equal(result.next_obs["states"], result.obs["states"])
        torch.testing.assert_close(state["next_states"][rows], result.next_obs["states"])
        assert not state["terminated"][rows].any()
    # Buffer actions are the env's mapped back to [−1, 1], for random and policy steps alike.
    actions = torch.cat(sent)
    torch.testing.assert_close(state["actions"], actions / 2.0, atol=1e-6, rtol=0)
    # Truncated, not terminated: the learner's target bootstraps from the final observation.
    learner = SACLearner(policy, 1, SACSettings())
    final = results[2].next_obs["states"]
    target = learner.critic_target(results[2].rewards, final, results[2].terminated)
    assert not torch.allclose(target, results[2].rewards)


@pytest.mark.skipif(not typecheck_enabled(), reason="RLCORE_TYPECHECK=0: nothing is checked")
def test_collect_checks_rlcores_shapes_on_its_first_policy_step_only() -> None:
    """The policy's rlcore calls cost more than its maths on a few envs: checked once a call."""
    policy, stepper = _policy(0), _pendulum(num_envs=2, max_episode_steps=5)
    checked: list[bool] = []
    predict = policy.predict_action_batch

    def recording(*args: Any, **kwargs: Any) -> Any:
        checked.append(rlcore_checks_run())
        return predict(*args, **kwargs)

    policy.predict_action_batch = recording  # type: ignore[method-assign]
    replay = ReplayBuffer(capacity=100, obs_dim=3, action_dim=1)
    generator = torch.Generator().manual_seed(0)
    obs = collect_sac_steps(policy, stepper, replay, stepper.reset(0), 4, generator, False)
    collect_sac_steps(policy, stepper, replay, obs, 2, generator, False)
    assert checked == [True, False, False, False, True, False]
    assert rlcore_checks_run()


def test_learner_state_dict_resumes_exactly() -> None:
    settings = SACSettings(policy_frequency=2)
    learner = SACLearner(_policy(0), 1, settings)
    for seed in range(3):
        learner.update(_random_batch(32, seed))
    state = copy.deepcopy(learner.state_dict())
    resumed = SACLearner(_policy(1), 1, settings)
    resumed.load_state_dict(state)
    assert resumed.step == 3
    for one in (learner, resumed):
        torch.manual_seed(5)
        metrics = one.update(_random_batch(32, 9))
        assert "train/actor_loss" not in metrics  # step 3 is not an actor step
        torch.manual_seed(6)
        one.update(_random_batch(32, 10))
    for name, value in learner.state_dict()["policy"].items():
        torch.testing.assert_close(resumed.state_dict()["policy"][name], value)
    for name, value in learner.state_dict()["target_q"].items():
        torch.testing.assert_close(resumed.state_dict()["target_q"][name], value)
    assert resumed.alpha == learner.alpha


def test_non_finite_loss_stops_before_backward() -> None:
    learner = SACLearner(_policy(0), 1, SACSettings())
    before = copy.deepcopy(learner.policy.state_dict())
    batch = _random_batch(8, 0)
    bad = ReplayBatch(
        states=batch.states,
        actions=batch.actions,
        rewards=torch.full_like(batch.rewards, float("nan")),
        next_states=batch.next_states,
        terminated=batch.terminated,
    )
    with pytest.raises(FloatingPointError, match="the critic loss is nan"):
        learner.update(bad)
    assert all(p.grad is None for p in learner.policy.parameters())
    for name, value in learner.policy.state_dict().items():
        torch.testing.assert_close(value, before[name])


def test_a_nan_gradient_with_a_finite_loss_is_not_applied_and_the_learner_dumps_the_batch(
    tmp_path: Path,
) -> None:
    """A Q head's gradient made NaN (the critic loss finite): the critic's step is skipped,
    the weights stay as they were, and the learner worker writes the sampled batch to
    ``<run dir>/nonfinite/update_1.pt`` and names it."""
    config = load_config(
        Path("configs/sac_pendulum.py"),
        [
            f"runner.output_dir={tmp_path}",
            "algorithm.sac.batch_size=8",
            "algorithm.sac.learning_starts=8",
            "actor.model.model_kwargs.hidden_sizes=16,16",
        ],
    )
    worker = SACLearnerWorker(config)
    worker.rank, worker.world_size = 0, 1
    worker.init_worker(obs_dim=3, action_dim=1)
    assert worker.learner is not None
    q_weight = next(p for name, p in worker.learner.policy.named_parameters() if "q" in name)
    q_weight.register_hook(lambda grad: grad * float("nan"))
    before = copy.deepcopy(worker.learner.policy.state_dict())
    with pytest.raises(FloatingPointError) as caught:
        worker.train([_random_batch(16, 0)])
    dump = tmp_path / config.runner.experiment_name / "nonfinite" / "update_1.pt"
    assert str(caught.value) == (
        "SAC update: the gradient norm of the critic loss is nan; its step was skipped. "
        f"Its batch is in {dump} (torch.load(path, weights_only=False))"
    )
    record = torch.load(dump, weights_only=False)
    assert record["update"] == 1
    assert record["states"].shape == (8, 3)
    assert record["terminated"].shape == (8,)
    assert all(p.grad is None for p in worker.learner.policy.parameters())
    for name, value in worker.learner.policy.state_dict().items():
        torch.testing.assert_close(value, before[name])


# ---------------------------------------------------------------------------
# Learning.


@pytest.mark.slow
def test_sac_learns_pendulum() -> None:
    """CleanRL's SAC settings, but 64-unit layers and 1,000 random steps: the mean return of the
    last 3 episodes rises from about −1200 (random) to better than −600 within 6,000 env steps
    (seed 0 gets there in about 4,400 steps, 20 s on one core; it needs ~10,000 steps and
    256-unit layers with CleanRL's 5,000 random steps)."""
    seed, starts = 0, 1000
    policy, stepper = _policy(seed), _pendulum(seed=seed)
    settings = SACSettings(learning_starts=starts)
    learner = SACLearner(policy, 1, settings)
    replay = ReplayBuffer(capacity=10_000, obs_dim=3, action_dim=1)
    generator = torch.Generator().manual_seed(seed)
    obs = collect_sac_steps(policy, stepper, replay, stepper.reset(seed), starts, generator, True)
    random_returns = stepper.pop_metrics()["env/episode_return"]
    assert random_returns < -900
    recent: list[float] = []
    for _ in range(6000 - starts):
        obs = collect_sac_steps(policy, stepper, replay, obs, 1, generator, False)
        metrics = learner.update(replay.sample(settings.batch_size, generator))
        env = stepper.pop_metrics()
        if "env/episode_return" in env:
            recent = [*recent, env["env/episode_return"]][-3:]
            if len(recent) == 3 and sum(recent) / 3 > -600:
                assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
                return
    pytest.fail(f"no mean return above −600 within 6,000 steps; last returns {recent}")

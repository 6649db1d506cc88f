"""The built-in ``cnn_policy``: the policy contract on images, its errors, and PPO on pixels."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rlshell.config import EnvConfig, ModelConfig
from rlshell.envs.stepper import EnvStepper
from rlshell.models import BasePolicy, ForwardType, get_model
from rlshell.models.base import MissingInputError
from rlshell.models.cnn_policy import CNNPolicy
from rlshell.rollout.trajectory import TrajectoryBuffer
from rlshell.workers.embodied_update import PPOSettings, collect_rollout, ppo_update

SMALL = {"conv_channels": "8,16,16", "feature_dim": 32, "hidden_size": 32}


def make_policy(action_type: str = "discrete", action_dim: int = 2, **extra: Any) -> CNNPolicy:
    kwargs = {"action_dim": action_dim, "action_type": action_type, **SMALL, **extra}
    model = get_model(
        ModelConfig(model_type="cnn_policy", category="embodied", model_kwargs=kwargs)
    )
    assert isinstance(model, CNNPolicy)
    return model


def observation(
    batch: int, seed: int, size: int = 64, **extra_dims: int
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    obs = {"main_images": torch.randint(0, 256, (batch, size, size, 3), generator=gen).byte()}
    if "wrist" in extra_dims:
        obs["wrist_images"] = torch.randint(0, 256, (batch, size, size, 3), generator=gen).byte()
    if "states" in extra_dims:
        obs["states"] = torch.randn(batch, extra_dims["states"], generator=gen)
    return obs


@pytest.mark.parametrize(
    ("action_type", "extra", "dims"),
    [
        ("discrete", {}, {}),
        ("gaussian", {"init_log_std": -0.5, "action_dim": 3}, {}),
        ("discrete", {"wrist_images": True, "state_dim": 5}, {"wrist": 1, "states": 5}),
        ("gaussian", {"image_size": 36, "state_dim": 2}, {"states": 2}),
    ],
)
def test_default_forward_recomputes_the_rollout_logprobs_and_values(
    action_type: str, extra: dict[str, Any], dims: dict[str, int]
) -> None:
    torch.manual_seed(0)
    policy = make_policy(action_type, **extra)
    obs = observation(6, seed=1, size=extra.get("image_size", 64), **dims)
    _, info = policy.predict_action_batch(obs)
    assert set(info["forward_inputs"]) == {*obs, "action"}
    out = policy(ForwardType.DEFAULT, forward_inputs=info["forward_inputs"])
    assert info["prev_logprobs"].shape == out["logprobs"].shape == (6,)
    torch.testing.assert_close(out["logprobs"], info["prev_logprobs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(out["values"], info["prev_values"], atol=1e-5, rtol=0)
    assert out["entropy"].shape == (6,)


@pytest.mark.parametrize("action_type", ["discrete", "gaussian"])
def test_actions_are_env_ready_and_eval_is_deterministic(action_type: str) -> None:
    torch.manual_seed(0)
    extra = {} if action_type == "discrete" else {"action_low": "-2,0.5", "action_high": "1,3"}
    if action_type == "gaussian":
        extra["init_log_std"] = 1.5  # raw samples leave the box
    policy = make_policy(action_type, **extra)
    obs = observation(64, seed=2)
    actions, _ = policy.predict_action_batch(obs, mode="train")
    if action_type == "discrete":
        assert actions.dtype == torch.int64
        assert actions.shape == (64,)
        assert ((actions >= 0) & (actions < 2)).all()
    else:
        assert actions.shape == (64, 2)
        low, high = torch.tensor([-2.0, 0.5]), torch.tensor([1.0, 3.0])
        assert ((actions >= low) & (actions <= high)).all()
    first, _ = policy.predict_action_batch(obs, mode="eval")
    second, _ = policy.predict_action_batch(obs, mode="eval")
    assert torch.equal(first, second)


def test_missing_and_malformed_inputs_name_the_key() -> None:
    policy = make_policy(state_dim=3)
    obs = observation(2, seed=0, states=3)
    with pytest.raises(MissingInputError, match=r"CNNPolicy needs env_obs\['states'\]"):
        policy.predict_action_batch({"main_images": obs["main_images"]})
    with pytest.raises(MissingInputError, match=r"env_obs\['main_images'\].*'states'"):
        policy.predict_action_batch({"states": obs["states"]})
    _, info = policy.predict_action_batch(obs)
    inputs = {k: v for k, v in info["forward_inputs"].items() if k != "action"}
    with pytest.raises(MissingInputError, match=r"forward_inputs\['action'\]"):
        policy(forward_inputs=inputs)
    with pytest.raises(ValueError, match=r"main_images'\] must be uint8 \[batch, 64, 64, 3\]"):
        policy.predict_action_batch({**obs, "main_images": obs["main_images"][:, :32]})
    with pytest.raises(ValueError, match=r"states'\] must be \[batch, 3\]"):
        policy.predict_action_batch({**obs, "states": obs["states"][:, :2]})


def test_model_kwargs_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"image_size: 32 is too small.*at least 36"):
        make_policy(image_size=32)
    with pytest.raises(ValueError, match=r"unknown key.*feature_dims.*did you mean 'feature_dim'"):
        make_policy(feature_dims=8)
    with pytest.raises(ValueError, match=r"action_low: not read with action_type 'discrete'"):
        make_policy(action_low=-1.0)
    with pytest.raises(ValueError, match=r"conv_channels: expected 3"):
        make_policy(conv_channels="8,8")
    with pytest.raises(ValueError, match=r"action_type: got 'gausian'.*did you mean 'gaussian'"):
        make_policy("gausian")


@pytest.mark.parametrize(
    ("action_type", "control_mode"), [("discrete", None), ("gaussian", "continuous")]
)
def test_ppo_trains_on_pixel_cartpole(action_type: str, control_mode: str | None) -> None:
    """Two PPO iterations on 64×64 CartPole frames, episodes cut at 6 steps (the bootstrap)."""
    torch.manual_seed(0)
    policy: BasePolicy = make_policy(action_type, action_dim=2 if control_mode is None else 1)
    cfg = EnvConfig(
        env_type="gymnasium_pixels",
        env_id="CartPole-v1",
        num_envs=4,
        max_episode_steps=6,
        control_mode=control_mode,
    )
    stepper = EnvStepper.from_config(cfg, seed=0)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    buffer, generator = TrajectoryBuffer(4), torch.Generator().manual_seed(0)
    obs = stepper.reset(seed=0)
    for _ in range(2):
        obs = collect_rollout(policy, stepper, buffer, obs, steps=8)
        metrics = ppo_update(
            policy,
            optimizer,
            buffer.finish(gamma=0.99, lam=0.95),
            PPOSettings(ppo_epochs=2, num_minibatches=2),
            generator,
        )
        assert all(torch.isfinite(torch.tensor(value)) for value in metrics.values())
    assert stepper.pop_metrics()["env/episodes"] > 0
    changed = [name for name, p in policy.named_parameters() if not torch.equal(before[name], p)]
    assert changed == list(before)

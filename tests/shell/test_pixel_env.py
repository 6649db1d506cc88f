"""The ``gymnasium_pixels`` env type and task descriptions through `EnvStepper`."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given
from hypothesis import strategies as st

from rlshell.config import EnvConfig
from rlshell.envs import make_env
from rlshell.envs.pixels import draw_cartpole, make_pixel_env
from rlshell.envs.stepper import EnvStepper
from rlshell.envs.text import decode_texts, encode_texts, texts_of

RENDERED_ID = "RlshellRenderedScripted-v0"


class RenderedEnv(gymnasium.Env[np.ndarray, np.int64]):
    """A state env without a built-in drawing: its render() is one flat colour, 40 × 60."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"]}

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(2, np.float32), float(action), False, False, {}

    def render(self) -> np.ndarray:
        return np.broadcast_to(np.array([10, 200, 30], np.uint8), (40, 60, 3)).copy()


gymnasium.register(RENDERED_ID, entry_point=RenderedEnv, disable_env_checker=True)


def pixel_stepper(num_envs: int = 3, **config: Any) -> EnvStepper:
    cfg = EnvConfig(env_type="gymnasium_pixels", env_id="CartPole-v1", num_envs=num_envs, **config)
    return EnvStepper.from_config(cfg, seed=0)


@given(st.lists(st.text(max_size=12).filter(lambda t: "\0" not in t), min_size=1, max_size=5))
def test_task_descriptions_round_trip_through_code_points(texts: list[str]) -> None:
    codes = encode_texts(texts, width=12)
    assert codes.shape == (len(texts), 12)
    assert codes.dtype == torch.int32
    assert decode_texts(codes) == texts
    assert texts_of(codes) == texts_of(texts) == texts


def test_text_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match=r"13 characters, more than the 12"):
        encode_texts(["x" * 13], width=12)
    with pytest.raises(TypeError, match=r"single string"):
        texts_of("balance the pole")
    with pytest.raises(TypeError, match=r"float32 tensor"):
        texts_of(torch.zeros(2, 3))


def test_pixel_cartpole_observes_images_and_its_task() -> None:
    stepper = pixel_stepper()
    obs = stepper.reset(seed=0)
    assert set(obs) == {"main_images", "task_descriptions"}
    assert obs["main_images"].shape == (3, 64, 64, 3)
    assert obs["main_images"].dtype == torch.uint8
    assert texts_of(obs["task_descriptions"]) == ["balance the pole"] * 3
    before = obs["main_images"].clone()
    result = stepper.step(torch.ones(3, dtype=torch.int64))
    assert not torch.equal(result.obs["main_images"], before)  # the cart moved


def test_final_observations_keep_their_task_descriptions() -> None:
    """Every episode is cut at 2 steps: next_obs rows hold the finished episodes' final frames."""
    stepper = pixel_stepper(max_episode_steps=2)
    stepper.reset(seed=0)
    stepper.step(torch.zeros(3, dtype=torch.int64))
    result = stepper.step(torch.zeros(3, dtype=torch.int64))
    assert bool(result.truncated.all())
    assert texts_of(result.next_obs["task_descriptions"]) == ["balance the pole"] * 3
    # The reset frames (cart near the centre) differ from the final ones (pushed left twice).
    assert not torch.equal(result.next_obs["main_images"], result.obs["main_images"])


def test_the_drawing_follows_the_cart_and_the_pole() -> None:
    left = draw_cartpole(np.array([-1.5, 0.0, 0.0, 0.0]), 64)
    right = draw_cartpole(np.array([1.5, 0.0, 0.0, 0.0]), 64)
    cart_columns = lambda image: np.nonzero((image == 0).all(-1).any(0))[0]  # black pixels
    assert cart_columns(left).mean() < 32 < cart_columns(right).mean()
    upright = draw_cartpole(np.array([0.0, 0.0, 0.0, 0.0]), 64)
    leaning = draw_cartpole(np.array([0.0, 0.0, 0.2, 0.0]), 64)
    pole_columns = lambda image: np.nonzero((image == [202, 152, 101]).all(-1).any(0))[0]
    assert pole_columns(leaning).max() > pole_columns(upright).max()


def test_continuous_control_maps_onto_the_discrete_actions() -> None:
    stepper = pixel_stepper(num_envs=2, control_mode="continuous")
    assert isinstance(stepper.action_space, spaces.Box)
    assert stepper.action_space.shape == (1,)
    wrapper = stepper.env.envs[0]  # type: ignore[attr-defined]
    assert [wrapper.action(np.array([a])) for a in (-1.0, -0.01, 0.0, 0.99, 1.0)] == [0, 0, 1, 1, 1]
    stepper.reset(seed=0)
    stepper.step(torch.tensor([[-1.0], [1.0]]))


def test_envs_without_a_drawing_are_rendered_and_resized() -> None:
    env = make_pixel_env(EnvConfig(env_id=RENDERED_ID, num_envs=2), seed=0, image_size=16)
    obs = EnvStepper(env, RENDERED_ID).reset(seed=0)
    assert obs["main_images"].shape == (2, 16, 16, 3)
    assert bool((obs["main_images"] == torch.tensor([10, 200, 30], dtype=torch.uint8)).all())
    assert texts_of(obs["task_descriptions"]) == [f"play {RENDERED_ID}"] * 2


def test_pixel_env_config_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"env.control_mode: gymnasium_pixels takes null"):
        make_env(EnvConfig(env_type="gymnasium_pixels", env_id="CartPole-v1", control_mode="x"))
    with pytest.raises(ValueError, match=r"'continuous' maps a Discrete.*Box"):
        make_env(
            EnvConfig(env_type="gymnasium_pixels", env_id="Pendulum-v1", control_mode="continuous")
        )
    with pytest.raises(ValueError, match=r"env.env_id"):
        make_env(EnvConfig(env_type="gymnasium_pixels", env_id="CartPoel-v1"))

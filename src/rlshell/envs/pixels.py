"""Image observations of gymnasium envs, on a CPU (env type ``gymnasium_pixels``).

Each copy of ``env.env_id`` observes ``{"main_images": uint8 [S, S, 3],
"task_descriptions": Text}`` instead of its state, the layout of RLinf's
ManiSkill and LIBERO wrappers, so image and vision-language-action policies
can be trained and tested without a GPU simulator:

- CartPole (``CartPole-v0``/``-v1``) is drawn from its state by
  `draw_cartpole` at ``S × S`` directly: the cart, the pole and the track in
  gymnasium's geometry, with numpy and no pygame (about 0.2 ms a 64×64 frame).
- Any other id is rendered with ``render_mode="rgb_array"`` (what that env
  needs for it, e.g. pygame or MuJoCo, must be installed) and resized to
  ``S × S`` by area averaging.

The task description is the id's entry in `TASK_DESCRIPTIONS` ("balance the
pole" for CartPole). ``env.control_mode="continuous"`` gives a ``Discrete(n)``
env the action space ``Box(-1, 1, (1,))``: a ∈ [−1, 1] selects action
⌊(a + 1)/2 · n⌋ (the last for a = 1), so policies with continuous heads (a
VLA's de-binned actions) can drive CartPole. The built-in type uses ``S = 64``;
`make_pixel_env` takes another size, for registering a variant:
``register_env("cartpole_32px", functools.partial(make_pixel_env, image_size=32))``.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, UInt8

from rlshell.config import EnvConfig

if TYPE_CHECKING:
    import gymnasium
    from gymnasium.vector import VectorEnv

__all__ = [
    "CONTROL_MODES",
    "PIXEL_RENDERERS",
    "TASK_DESCRIPTIONS",
    "draw_cartpole",
    "make_pixel_env",
]

Image = UInt8[np.ndarray, "size size 3"]
StateRenderer = Callable[[Float[np.ndarray, " state"], int], Image]
WrapperFactory = Callable[["gymnasium.Env[Any, Any]"], "gymnasium.Wrapper[Any, Any, Any, Any]"]

CONTROL_MODES = (None, "continuous")
TASK_DESCRIPTIONS: dict[str, str] = {
    "CartPole-v0": "balance the pole",
    "CartPole-v1": "balance the pole",
    "Pendulum-v1": "swing the pendulum up",
}
_TEXT_CHARSET = string.printable

# gymnasium's CartPole geometry, in world units: the track spans ±2.4, the pole is
# 1.0 long (2 × its half-length), the cart 0.4 × 0.24 (50 × 30 px at 125 px per unit).
_X_LIMIT = 2.4
_POLE_LENGTH = 1.0
_CART_HALF_WIDTH, _CART_HALF_HEIGHT = 0.2, 0.12
_BACKGROUND = np.array([255, 255, 255], dtype=np.uint8)
_CART_COLOUR = np.array([0, 0, 0], dtype=np.uint8)
_POLE_COLOUR = np.array([202, 152, 101], dtype=np.uint8)
_TRACK_COLOUR = np.array([128, 128, 128], dtype=np.uint8)


def draw_cartpole(state: Float[np.ndarray, " state"], size: int) -> Image:
    """CartPole's state (x, ẋ, θ, θ̇) as an RGB image ``[size, size, 3]``.

    The track fills the width (x ∈ [−2.4, 2.4]), the cart's centre sits at
    60% of the height, and the pole leans by θ from the vertical (positive θ:
    to the right), as gymnasium draws it.
    """
    scale = size / (2 * _X_LIMIT)  # pixels per world unit
    centres = (np.arange(size, dtype=np.float64) + 0.5) / scale
    world_x = centres[None, :] - _X_LIMIT
    world_y = 0.6 * size / scale - centres[:, None]  # up is positive; the cart's centre is 0
    x, theta = float(state[0]), float(state[2])
    image = np.broadcast_to(_BACKGROUND, (size, size, 3)).copy()
    line = max(0.5 / scale, 0.02)  # half a pixel: every line stays visible
    image[np.broadcast_to(np.abs(world_y + _CART_HALF_HEIGHT) <= line, (size, size))] = (
        _TRACK_COLOUR
    )
    cart = (np.abs(world_x - x) <= _CART_HALF_WIDTH) & (np.abs(world_y) <= _CART_HALF_HEIGHT)
    image[cart] = _CART_COLOUR
    # The pole: pixels within half its width of the segment from the axle to its tip.
    axle = np.array([x, _CART_HALF_HEIGHT / 2])
    direction = np.array([np.sin(theta), np.cos(theta)])
    dx, dy = world_x - axle[0], world_y - axle[1]
    along = np.clip(dx * direction[0] + dy * direction[1], 0.0, _POLE_LENGTH)
    distance = np.hypot(dx - along * direction[0], dy - along * direction[1])
    image[distance <= max(0.05, 0.75 / scale)] = _POLE_COLOUR
    return image


PIXEL_RENDERERS: dict[str, StateRenderer] = {
    "CartPole-v0": draw_cartpole,
    "CartPole-v1": draw_cartpole,
}


def _resize(frame: np.ndarray[Any, Any], size: int) -> Image:
    """An ``[H, W, 3]`` frame averaged down (or up) to ``[size, size, 3]`` uint8."""
    pixels = torch.as_tensor(np.ascontiguousarray(frame[..., :3])).permute(2, 0, 1)[None].float()
    resized = F.interpolate(pixels, size=(size, size), mode="area")
    out: Image = resized[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()
    return out


def _pixel_wrapper(env_id: str, image_size: int, task: str) -> WrapperFactory:
    import gymnasium
    from gymnasium import spaces

    renderer = PIXEL_RENDERERS.get(env_id)

    class PixelObservation(gymnasium.ObservationWrapper[Any, Any, Any]):
        """``{"main_images", "task_descriptions"}`` in place of the wrapped env's observation."""

        def __init__(self, env: gymnasium.Env[Any, Any]) -> None:
            super().__init__(env)
            self.observation_space = spaces.Dict(
                {
                    "main_images": spaces.Box(0, 255, (image_size, image_size, 3), np.uint8),
                    "task_descriptions": spaces.Text(
                        max_length=max(len(task), 1), min_length=0, charset=_TEXT_CHARSET
                    ),
                }
            )

        def observation(self, observation: Any) -> dict[str, Any]:
            if renderer is not None:
                image = renderer(np.asarray(observation, dtype=np.float64), image_size)
            else:
                frame = self.env.render()
                if not isinstance(frame, np.ndarray) or frame.ndim != 3:
                    raise RuntimeError(
                        f"env {env_id}: render() returned {type(frame).__name__}, not an "
                        "[H, W, 3] array; gymnasium_pixels needs render_mode='rgb_array'"
                    )
                image = _resize(frame, image_size)
            return {"main_images": image, "task_descriptions": task}

    return PixelObservation


def _continuous_wrapper(env_id: str) -> WrapperFactory:
    import gymnasium
    from gymnasium import spaces

    class ContinuousAction(gymnasium.ActionWrapper[Any, Any, Any]):
        """``Box(-1, 1, (1,))`` over a ``Discrete(n)`` env: a ↦ start + min(⌊(a+1)/2·n⌋, n−1)."""

        def __init__(self, env: gymnasium.Env[Any, Any]) -> None:
            super().__init__(env)
            inner = env.action_space
            if not isinstance(inner, spaces.Discrete):
                raise ValueError(
                    f"env.control_mode: 'continuous' maps a Discrete action space onto "
                    f"[-1, 1], but {env_id} has {inner}"
                )
            self.inner_n, self.inner_start = int(inner.n), int(inner.start)
            self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

        def action(self, action: Any) -> int:
            a = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -1.0, 1.0))
            return self.inner_start + min(int((a + 1.0) / 2.0 * self.inner_n), self.inner_n - 1)

    return ContinuousAction


def make_pixel_env(cfg: EnvConfig, seed: int = 0, image_size: int = 64) -> VectorEnv:
    """``cfg.num_envs`` copies of ``cfg.env_id`` observing ``image_size``² RGB images.

    Synchronous, with same-step autoreset (as the ``gymnasium`` type), reset
    with ``seed``. ``cfg.control_mode``: null (the env's own actions) or
    ``"continuous"`` (see the module docstring).
    """
    import gymnasium

    from rlshell.envs.gym_ids import check_gymnasium_id

    if image_size < 1:
        raise ValueError(f"gymnasium_pixels: image_size must be positive, got {image_size}")
    if cfg.control_mode not in CONTROL_MODES:
        raise ValueError(
            f"env.control_mode: gymnasium_pixels takes null or 'continuous', "
            f"got {cfg.control_mode!r}"
        )
    env_id = check_gymnasium_id(cfg.env_id)
    task = TASK_DESCRIPTIONS.get(env_id, f"play {env_id}")
    wrappers = [_pixel_wrapper(env_id, image_size, task)]
    if cfg.control_mode == "continuous":
        wrappers.append(_continuous_wrapper(env_id))
    make_kwargs: dict[str, Any] = {}
    if cfg.max_episode_steps is not None:
        make_kwargs["max_episode_steps"] = cfg.max_episode_steps
    if env_id not in PIXEL_RENDERERS:
        make_kwargs["render_mode"] = "rgb_array"
    env = gymnasium.make_vec(
        env_id,
        num_envs=cfg.num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gymnasium.vector.AutoresetMode.SAME_STEP},
        wrappers=wrappers,
        **make_kwargs,
    )
    env.reset(seed=seed)
    return env

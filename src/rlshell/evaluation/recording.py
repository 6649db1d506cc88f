"""GIFs of a policy's episodes: one single env built to render ``rgb_array`` frames.

`record_task_gifs` plays the policy (``mode="eval"``) on one extra env and
writes one GIF per task: the env id, or for a multi-task env (observations
carrying ``task_descriptions``) each task description met in the first
`MAX_TASK_EPISODES` episodes. An episode is cut at ``max_frames`` frames;
frames whose longer side exceeds ``max_side`` pixels are scaled down, and
small ones (a policy's 64-pixel observations) scaled up by a whole factor.
A policy acting in chunks (`BasePolicy.action_chunk` > 1) gives one frame per chunk.

Where the frames come from: `RECORDING_ENVS` maps an env type to a builder
of a render-capable copy (``make_env`` builds training envs without a render
mode, so each env type that can render says here how), whose
``render()`` frames are recorded. An env type without an entry is made by
``make_env`` and its image observations (``main_images``) are the frames.
An env with neither, or whose renderer is missing a dependency (CartPole's
needs pygame), raises `RecordingUnavailableError`, which the evaluation
reports as a warning.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from attrs import evolve

from rlshell.config import EnvConfig
from rlshell.envs.stepper import EnvObs, EnvStepper
from rlshell.envs.text import texts_of
from rlshell.models.base import BasePolicy

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

__all__ = [
    "MAX_TASK_EPISODES",
    "RECORDING_ENVS",
    "RecordingEnvBuilder",
    "RecordingUnavailableError",
    "gif_name",
    "record_task_gifs",
    "write_gif",
]

RecordingEnvBuilder = Callable[[EnvConfig], "VectorEnv"]
FrameSource = Callable[[EnvStepper, EnvObs], np.ndarray]
MAX_TASK_EPISODES = 8
MIN_SIDE = 160  # smaller frames are scaled up by a whole factor, pixels kept sharp


class RecordingUnavailableError(RuntimeError):
    """The env cannot render frames here: no recording builder, or its renderer is missing."""


def _gymnasium_recording_env(cfg: EnvConfig) -> VectorEnv:
    import gymnasium

    from rlshell.envs import check_gymnasium_id

    env_id = check_gymnasium_id(cfg.env_id)
    entry_point = gymnasium.spec(env_id).entry_point
    creator = (
        gymnasium.envs.registration.load_env_creator(entry_point)
        if isinstance(entry_point, str)
        else entry_point
    )
    modes = list(getattr(creator, "metadata", {}).get("render_modes", []))
    if "rgb_array" not in modes:
        raise RecordingUnavailableError(
            f"env {env_id} does not render rgb_array frames (its render modes: "
            f"{', '.join(modes) or 'none'})"
        )
    # rgb_array rendering draws off-screen: pygame-based renderers need no display.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    kwargs: dict[str, Any] = {}
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    return gymnasium.make_vec(
        env_id,
        num_envs=1,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gymnasium.vector.AutoresetMode.SAME_STEP},
        render_mode="rgb_array",
        **kwargs,
    )


def _maniskill_recording_env(cfg: EnvConfig) -> VectorEnv:
    from rlshell.envs.maniskill import make_maniskill_env

    # ManiSkill's own renderer: its human-view camera, not the policy's observation cameras.
    return make_maniskill_env(evolve(cfg, num_envs=1), render_mode="rgb_array")


def _metaworld_recording_env(cfg: EnvConfig) -> VectorEnv:
    from rlshell.envs.metaworld import make_metaworld_env, task_names

    # One copy per task (a task set takes no fewer); frames are the first copy's, of its camera.
    copies = len(task_names(cfg.env_id))
    return make_metaworld_env(evolve(cfg, num_envs=copies), render_mode="rgb_array")


RECORDING_ENVS: dict[str, RecordingEnvBuilder] = {
    "gymnasium": _gymnasium_recording_env,
    "maniskill": _maniskill_recording_env,
    "metaworld": _metaworld_recording_env,
}


def gif_name(env_id: str, task: str | None = None) -> str:
    """A file name for a task's GIF: the env id (and the task), unsafe characters replaced."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", env_id)
    if task is not None:
        slug = re.sub(r"[^a-z0-9]+", "-", task.lower()).strip("-")[:60]
        stem = f"{stem}-{slug or 'task'}"
    return f"{stem}.gif"


def write_gif(frames: Sequence[np.ndarray], path: Path, fps: float, max_side: int = 320) -> Path:
    """Write RGB ``frames`` (``[H, W, 3]`` uint8) as a looping GIF at ``fps``, atomically."""
    from PIL import Image

    if not frames:
        raise ValueError(f"write_gif({path}): no frames")
    images = []
    for frame in frames:
        image = Image.fromarray(np.ascontiguousarray(frame)).convert("RGB")
        scale = max_side / max(image.size)
        if scale < 1.0:
            size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
            image = image.resize(size, Image.Resampling.BILINEAR)
        elif max(image.size) < MIN_SIDE:
            factor = min(-(-MIN_SIDE // max(image.size)), max_side // max(image.size))
            size = (image.width * factor, image.height * factor)
            image = image.resize(size, Image.Resampling.NEAREST)
        images.append(image)
    # Viewers slow frames shorter than 20 ms down to 100 ms: never ask for less.
    duration = max(20, round(1000.0 / fps))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    images[0].save(
        partial, format="GIF", save_all=True, append_images=images[1:], duration=duration, loop=0
    )
    os.replace(partial, path)
    return path


def _as_frame(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    frame = np.asarray(value)
    if frame.ndim == 4:  # a batch: [num_envs, H, W, C]
        frame = frame[0]
    return frame[..., :3].astype(np.uint8, copy=False)


def _rendered_frame(stepper: EnvStepper, obs: EnvObs) -> np.ndarray:
    """The first env's ``render()`` frame as a ``[H, W, 3]`` uint8 array."""
    rendered: Any = stepper.env.render()
    if isinstance(rendered, tuple | list):
        rendered = rendered[0] if rendered else None
    if rendered is None:
        raise RecordingUnavailableError("the env rendered no rgb_array frame")
    return _as_frame(rendered)


def _observed_frame(stepper: EnvStepper, obs: EnvObs) -> np.ndarray:
    """The first env's image observation (what an image policy sees) as the frame."""
    return _as_frame(obs["main_images"][0])


def _task_of(obs: EnvObs) -> str | None:
    descriptions = obs.get("task_descriptions")
    return texts_of(descriptions)[0] if descriptions is not None else None


def _play(
    policy: BasePolicy,
    stepper: EnvStepper,
    obs: EnvObs,
    frame_of: FrameSource,
    max_frames: int,
) -> list[np.ndarray]:
    """Frames of one episode from ``obs``, until it ends or ``max_frames`` are taken."""
    frames = [frame_of(stepper, obs)]
    while len(frames) < max_frames:
        actions, _ = policy.predict_action_batch(obs, mode="eval", compute_values=False)
        result = stepper.step(actions, chunk=policy.action_chunk)
        if bool(result.dones[0]):  # the env has already reset: its frame is the next episode's
            break
        obs = result.obs
        frames.append(frame_of(stepper, obs))
    return frames


def _recording_env(cfg: EnvConfig, seed: int) -> tuple[EnvStepper, FrameSource]:
    import gymnasium

    env_id = cfg.env_id or str(cfg.env_type)
    builder = RECORDING_ENVS.get(str(cfg.env_type))
    if builder is not None:
        try:
            env = builder(cfg)
        except (gymnasium.error.DependencyNotInstalled, ImportError) as error:
            raise RecordingUnavailableError(f"env {env_id} cannot render here: {error}") from None
        return EnvStepper(env, cfg.env_id, step_timeout_s=cfg.step_timeout_s), _rendered_frame
    from rlshell.envs import make_env

    stepper = EnvStepper(
        make_env(evolve(cfg, num_envs=1), seed), cfg.env_id, step_timeout_s=cfg.step_timeout_s
    )
    if "main_images" not in stepper.reset(seed):
        stepper.close()
        raise RecordingUnavailableError(
            f"env type {cfg.env_type!r} observes no images and has no render-capable env for "
            f"GIFs (rlshell.evaluation.recording.RECORDING_ENVS has: {', '.join(RECORDING_ENVS)})"
        )
    return stepper, _observed_frame


def record_task_gifs(
    policy: BasePolicy,
    cfg: EnvConfig,
    seed: int,
    out_dir: Path,
    *,
    max_frames: int = 200,
    max_side: int = 320,
) -> dict[str, Path]:
    """Play ``policy`` on one render-capable env and write a GIF per task; ``{task: path}``.

    Episode k starts from ``EnvStepper.reset(seed + k)``, so the first one is
    the episode an evaluation's env 0 starts with from ``seed``.
    """
    import gymnasium

    env_id = cfg.env_id or str(cfg.env_type)
    stepper, frame_of = _recording_env(cfg, seed)
    fps = float(getattr(stepper.env, "metadata", {}).get("render_fps") or 30)
    gifs: dict[str, Path] = {}
    try:
        with torch.no_grad():
            for episode in range(MAX_TASK_EPISODES):
                obs = stepper.reset(seed + episode)
                task = _task_of(obs)
                key = task if task is not None else env_id
                if key not in gifs:
                    try:
                        frames = _play(policy, stepper, obs, frame_of, max_frames)
                    except gymnasium.error.DependencyNotInstalled as error:
                        raise RecordingUnavailableError(
                            f"env {env_id} cannot render here: {error}"
                        ) from None
                    gifs[key] = write_gif(frames, out_dir / gif_name(env_id, task), fps, max_side)
                if task is None:
                    break  # a single-task env: its first episode is the recording
    finally:
        stepper.close()
    return gifs

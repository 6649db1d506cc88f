"""ManiSkill 3 environments on a CPU or a GPU (env type ``maniskill``).

Two simulation backends behind one registry name, chosen by ``env.uses_gpus``:

- **CPU** (``uses_gpus=False``, the default): ManiSkill's CPU backend
  simulates one env per scene, so ``env.num_envs`` copies are one env per
  process, stepped in parallel by gymnasium's ``AsyncVectorEnv`` over
  ManiSkill's ``CPUGymWrapper`` (one copy: in the worker's own process).
  Actions and observations are numpy on the host.
- **GPU** (``uses_gpus=True``): all copies in one batched GPU scene
  (SAPIEN/PhysX on CUDA) wrapped in ManiSkill's ``ManiSkillVectorEnv``;
  tensors stay on the GPU.

Both reset a finished copy in the same step. SAPIEN needs a Vulkan device
even for state observations; `rlshell.envs.vulkan.use_vulkan_driver` selects
one in every process that builds an env (on a CPU machine the lavapipe that
``make install`` fetched), and a machine with none gets one sentence
(`ManiSkillUnavailableError`) before SAPIEN can fail with its own stack of
errors.

Observations (``env.obs_mode``, default ``state``):

- ``state``: ManiSkill's flat state vector, as ``states``.
- ``rgb`` / ``rgbd``: the robot's proprioception and the task's extra state
  (not the object poses the cameras show) flattened as ``states``; the task's
  camera as ``main_images`` (uint8 ``[H, W, C]``) and a wrist camera
  (``hand_camera``) as ``wrist_images`` when the task has one. ``rgbd``
  appends depth as a fourth uint8 channel in centimetres (0–2.55 m, farther
  clipped). ``env.image_size`` sets the cameras' side (null: the task's own,
  128 for PushCube). On the CPU backend camera observations also carry
  ``task_descriptions`` (`task_description`), for language-conditioned
  policies such as ``tiny_vla``.

A task that ends an episode on success (PushCube does) runs on to its time
limit with ``env.ignore_terminations`` (ManiSkill's option): the policy is
then rewarded for staying successful, not for ending the episode.
Success comes from ManiSkill's ``info["success"]``; evaluation GIFs come from
ManiSkill's own renderer (``render_mode="rgb_array"``, its human-view camera).
``mani_skill`` is imported only here, and only when an env is built.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
import string
import warnings
from typing import TYPE_CHECKING, Any

import gymnasium
import torch

from rlshell.config import EnvConfig
from rlshell.envs.vulkan import use_vulkan_driver

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

__all__ = [
    "DEPTH_CM_MAX",
    "OBS_MODES",
    "TASK_DESCRIPTIONS",
    "WRIST_CAMERAS",
    "ManiSkillUnavailableError",
    "make_maniskill_env",
    "maniskill_available",
    "maniskill_unavailable_reason",
    "task_description",
]

OBS_MODES = ("state", "rgb", "rgbd")
WRIST_CAMERAS = ("hand_camera",)
DEPTH_CM_MAX = 255  # depth channel: centimetres, one per uint8 level
# What the camera observations carry as task_descriptions (for language-conditioned policies).
TASK_DESCRIPTIONS: dict[str, str] = {
    "PushCube-v1": "push the cube to the goal region",
    "PickCube-v1": "pick up the cube and move it to the goal",
    "StackCube-v1": "stack the red cube on the green cube",
    "PullCube-v1": "pull the cube to the goal region",
    "PokeCube-v1": "poke the cube with the peg to the goal",
}


class ManiSkillUnavailableError(RuntimeError):
    """ManiSkill cannot run on this machine (no mani_skill, Vulkan driver or CUDA GPU)."""


def maniskill_unavailable_reason(uses_gpus: bool = False) -> str | None:
    """Why ManiSkill envs cannot run here (on the GPU backend if ``uses_gpus``), or None.

    Selects the Vulkan driver for this process as a side effect (`use_vulkan_driver`).
    """
    if importlib.util.find_spec("mani_skill") is None:
        return "mani_skill is not installed (pip install -e '.[maniskill]')"
    if uses_gpus and not torch.cuda.is_available():
        return "no CUDA GPU is visible for its GPU simulation (env.uses_gpus=true)"
    choice = use_vulkan_driver()
    if choice.kind == "none":
        return choice.detail
    return None


def maniskill_available(uses_gpus: bool = False) -> bool:
    """Whether `make_maniskill_env` can be expected to build an env here."""
    return maniskill_unavailable_reason(uses_gpus) is None


def _unavailable(cfg: EnvConfig, reason: str) -> ManiSkillUnavailableError:
    backend = "GPU" if cfg.uses_gpus else "CPU"
    return ManiSkillUnavailableError(
        f"env type 'maniskill' ({cfg.env_id or 'no env.env_id'}, {backend} simulation) "
        f"cannot run on this machine: {reason}"
    )


def make_maniskill_env(cfg: EnvConfig, seed: int = 0, render_mode: str | None = None) -> VectorEnv:
    """``cfg.num_envs`` copies of ManiSkill task ``cfg.env_id``, reset with ``seed``.

    ``render_mode="rgb_array"`` makes ``render()`` return ManiSkill's
    human-view frames (for GIFs). A Dict action space is flattened.
    """
    from rlshell.envs.gym_ids import check_gymnasium_id

    if cfg.obs_mode is not None and cfg.obs_mode not in OBS_MODES:
        raise ValueError(f"env.obs_mode: expected one of {OBS_MODES}, got {cfg.obs_mode!r}")
    reason = maniskill_unavailable_reason(cfg.uses_gpus)
    if reason is not None:
        raise _unavailable(cfg, reason)
    _import_maniskill()
    env_id = check_gymnasium_id(cfg.env_id, example="PushCube-v1")
    build = _gpu_vector_env if cfg.uses_gpus else _cpu_vector_env
    env = build(cfg, env_id, render_mode)
    env.reset(seed=seed)  # copy i gets seed + i
    return env


def _import_maniskill() -> None:
    """Import ``mani_skill.envs`` (which registers its ids with gymnasium)."""
    with warnings.catch_warnings():
        # SAPIEN falls back to the Vulkan loader it ships, which is the one meant here.
        warnings.filterwarnings("ignore", message="Failed to find system libvulkan")
        importlib.import_module("mani_skill.envs")


def _task_env(
    cfg: EnvConfig, env_id: str, num_envs: int, backend: str, render_mode: str | None
) -> Any:
    """One ManiSkill task (``num_envs`` copies in its scene), observations and actions adapted."""
    kwargs: dict[str, Any] = {
        "num_envs": num_envs,
        "sim_backend": backend,
        "obs_mode": cfg.obs_mode or "state",
        # Every episode's start drawn from the env's own seeded generator, not from torch's
        # global one (which rendering and the policy also draw from): a seed gives the same
        # episodes in every observation mode, which recording a camera in lockstep needs.
        "enhanced_determinism": True,
    }
    if not torch.cuda.is_available():
        kwargs["render_backend"] = "cpu"  # cameras rendered by the software Vulkan driver
    if cfg.control_mode is not None:
        kwargs["control_mode"] = cfg.control_mode
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    if cfg.image_size is not None:
        kwargs["sensor_configs"] = {"width": cfg.image_size, "height": cfg.image_size}
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    try:
        env = gymnasium.make(env_id, **kwargs)
    except RuntimeError as err:
        message = str(err).strip()
        if "vk::" in message or "vulkan" in message.lower() or "physical device" in message:
            first_line = message.splitlines()[0] if message else type(err).__name__
            raise _unavailable(cfg, f"SAPIEN's Vulkan renderer failed ({first_line})") from None
        raise
    if isinstance(env.action_space, gymnasium.spaces.Dict):
        flatten = importlib.import_module("mani_skill.utils.wrappers.flatten")
        env = flatten.FlattenActionSpaceWrapper(env)
    if cfg.obs_mode in ("rgb", "rgbd"):
        env = CameraObservations(env, depth=cfg.obs_mode == "rgbd")
    return env


def _cpu_task_env(
    cfg: EnvConfig, env_id: str, render_mode: str | None, own_process: bool
) -> gymnasium.Env[Any, Any]:
    """One CPU env as a plain gymnasium env (numpy, unbatched): what each process steps."""
    if own_process:
        # One of several env processes sharing the cores: one torch thread each.
        torch.set_num_threads(1)
    choice = use_vulkan_driver()
    if choice.kind == "none":
        raise _unavailable(cfg, choice.detail)
    _import_maniskill()
    wrappers = importlib.import_module("mani_skill.utils.wrappers.gymnasium")
    env: gymnasium.Env[Any, Any] = wrappers.CPUGymWrapper(
        _task_env(cfg, env_id, 1, "cpu", render_mode),
        ignore_terminations=cfg.ignore_terminations,
    )
    if cfg.obs_mode in ("rgb", "rgbd"):
        env = WithTaskDescription(env, task_description(env_id))
    return env


def _cpu_vector_env(cfg: EnvConfig, env_id: str, render_mode: str | None) -> VectorEnv:
    same_step = gymnasium.vector.AutoresetMode.SAME_STEP
    if cfg.num_envs == 1:
        make_here = functools.partial(_cpu_task_env, cfg, env_id, render_mode, False)
        return gymnasium.vector.SyncVectorEnv([make_here], autoreset_mode=same_step)
    make_one = functools.partial(_cpu_task_env, cfg, env_id, render_mode, True)
    # Spawned, not forked: SAPIEN and torch hold threads a fork would copy mid-use. Camera
    # observations go through pipes: gymnasium 1.x's shared memory garbles Text entries.
    return gymnasium.vector.AsyncVectorEnv(
        [make_one] * cfg.num_envs,
        autoreset_mode=same_step,
        context="spawn",
        shared_memory=cfg.obs_mode in (None, "state"),
    )


def _gpu_vector_env(cfg: EnvConfig, env_id: str, render_mode: str | None) -> VectorEnv:
    env = _task_env(cfg, env_id, cfg.num_envs, "gpu", render_mode)
    vector = importlib.import_module("mani_skill.vector.wrappers.gymnasium")
    vector_env: VectorEnv = vector.ManiSkillVectorEnv(
        env,
        cfg.num_envs,
        auto_reset=True,
        ignore_terminations=cfg.ignore_terminations,
        record_metrics=False,
    )
    return vector_env


def task_description(env_id: str) -> str:
    """The task in words: `TASK_DESCRIPTIONS`, else the id's words (``PushCube-v1``: push cube)."""
    if env_id in TASK_DESCRIPTIONS:
        return TASK_DESCRIPTIONS[env_id]
    name = env_id.rsplit("-v", 1)[0]
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name).lower()


class WithTaskDescription(gymnasium.ObservationWrapper):
    """A single CPU env's camera observation with ``task_descriptions`` (the task in words)."""

    def __init__(self, env: gymnasium.Env[Any, Any], task: str) -> None:
        super().__init__(env)
        self.task = task
        inner = env.observation_space
        assert isinstance(inner, gymnasium.spaces.Dict)
        self.observation_space = gymnasium.spaces.Dict(
            {
                **inner.spaces,
                "task_descriptions": gymnasium.spaces.Text(
                    max_length=max(len(task), 1), min_length=0, charset=string.printable
                ),
            }
        )

    def observation(self, observation: dict[str, Any]) -> dict[str, Any]:
        return {**observation, "task_descriptions": self.task}


class CameraObservations(gymnasium.ObservationWrapper):
    """ManiSkill's ``rgbd`` observation as ``{"states", "main_images"[, "wrist_images"]}``.

    Batched torch in, batched torch out (under ``CPUGymWrapper`` on the CPU
    backend, under ``ManiSkillVectorEnv`` on the GPU one). The observation
    space is regenerated from the adapted first observation
    (``BaseEnv.update_obs_space``), as ManiSkill's own flattening wrappers do.
    """

    def __init__(self, env: Any, depth: bool) -> None:
        super().__init__(env)
        self.depth = depth
        cameras = list(env.unwrapped._init_raw_obs["sensor_data"])
        wrist = [name for name in cameras if name in WRIST_CAMERAS]
        main = [name for name in cameras if name not in WRIST_CAMERAS]
        if len(main) != 1 or len(wrist) > 1:
            raise ValueError(
                f"env {env.unwrapped.spec.id}: cameras {cameras}; env.obs_mode "
                f"'{'rgbd' if depth else 'rgb'}' maps one scene camera to main_images and "
                f"one of {WRIST_CAMERAS} to wrist_images"
            )
        self.main_camera = main[0]
        self.wrist_camera = wrist[0] if wrist else None
        env.unwrapped.update_obs_space(self.observation(env.unwrapped._init_raw_obs))

    def observation(self, observation: dict[str, Any]) -> dict[str, torch.Tensor]:
        common = importlib.import_module("mani_skill.utils.common")
        sensors = observation["sensor_data"]
        proprio = {k: v for k, v in observation.items() if k not in ("sensor_data", "sensor_param")}
        out = {
            "states": common.flatten_state_dict(proprio, use_torch=True),
            "main_images": self._image(sensors[self.main_camera]),
        }
        if self.wrist_camera is not None:
            out["wrist_images"] = self._image(sensors[self.wrist_camera])
        return out

    def _image(self, camera: dict[str, torch.Tensor]) -> torch.Tensor:
        rgb = camera["rgb"]
        if not self.depth:
            return rgb
        # ManiSkill's depth is int16 millimetres.
        depth_cm = (camera["depth"].float() / 10.0).round().clamp(0, DEPTH_CM_MAX)
        return torch.cat([rgb, depth_cm.to(torch.uint8)], dim=-1)

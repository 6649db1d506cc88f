"""ManiSkill 3 batched GPU environments (env type ``maniskill``).

ManiSkill simulates all ``num_envs`` copies in one GPU scene (SAPIEN/PhysX on
CUDA) and returns torch tensors on the GPU; `ManiSkillVectorEnv` wraps it as a
gymnasium VectorEnv that resets finished copies in the same step. SAPIEN needs
a Vulkan device even for state observations, so on a machine without one the
builder stops with one sentence (`ManiSkillUnavailableError`) before SAPIEN
can fail with its own stack of errors. ``mani_skill`` is imported only here,
and only when an env is built.
"""

from __future__ import annotations

import ctypes.util
import glob
import importlib
import importlib.util
import os
from typing import TYPE_CHECKING, Any

import torch

from rlshell.config import EnvConfig

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

__all__ = [
    "ManiSkillUnavailableError",
    "make_maniskill_env",
    "maniskill_available",
    "maniskill_unavailable_reason",
]

_ICD_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d")


class ManiSkillUnavailableError(RuntimeError):
    """ManiSkill cannot run on this machine (no mani_skill, CUDA GPU or Vulkan driver)."""


def maniskill_unavailable_reason() -> str | None:
    """Why ManiSkill's GPU envs cannot run here, or None when they should."""
    if importlib.util.find_spec("mani_skill") is None:
        return "mani_skill is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    if ctypes.util.find_library("vulkan") is None:
        return "no Vulkan loader (libvulkan.so.1) is installed"
    icd_files = os.environ.get("VK_ICD_FILENAMES") or os.environ.get("VK_DRIVER_FILES")
    if not icd_files and not any(glob.glob(f"{d}/*.json") for d in _ICD_DIRS):
        return "no Vulkan driver (ICD json) is installed"
    return None


def maniskill_available() -> bool:
    """Whether `make_maniskill_env` can be expected to build an env here."""
    return maniskill_unavailable_reason() is None


def _unavailable(env_id: str | None, reason: str) -> ManiSkillUnavailableError:
    return ManiSkillUnavailableError(
        f"env type 'maniskill' ({env_id or 'no env.env_id'}) needs a Vulkan-capable GPU and "
        f"mani-skill (pip install -e .[maniskill]), but {reason} on this machine"
    )


def make_maniskill_env(cfg: EnvConfig, seed: int = 0) -> VectorEnv:
    """``cfg.num_envs`` copies of ManiSkill task ``cfg.env_id`` with state observations.

    Builds ``gymnasium.make(env_id, num_envs=..., obs_mode="state",
    sim_backend="gpu")`` (plus ``control_mode`` and ``max_episode_steps`` when
    set), flattens a Dict action space, wraps it in ``ManiSkillVectorEnv``
    (same-step autoreset, terminations kept) and resets it with ``seed``.
    """
    reason = maniskill_unavailable_reason()
    if reason is not None:
        raise _unavailable(cfg.env_id, reason)

    import gymnasium

    from rlshell.envs import check_gymnasium_id

    importlib.import_module("mani_skill.envs")  # registers the ManiSkill ids with gymnasium
    env_id = check_gymnasium_id(cfg.env_id, example="PushCube-v1")
    kwargs: dict[str, Any] = {"num_envs": cfg.num_envs, "obs_mode": "state", "sim_backend": "gpu"}
    control_mode = cfg.control_mode
    if control_mode is not None:
        kwargs["control_mode"] = control_mode
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    try:
        env = gymnasium.make(env_id, **kwargs)
    except RuntimeError as err:
        message = str(err)
        if "vk::" in message or "vulkan" in message.lower():
            first_line = message.strip().splitlines()[0] if message.strip() else type(err).__name__
            raise _unavailable(
                cfg.env_id, f"SAPIEN's Vulkan renderer failed ({first_line})"
            ) from None
        raise
    if isinstance(env.action_space, gymnasium.spaces.Dict):
        flatten = importlib.import_module("mani_skill.utils.wrappers.flatten")
        env = flatten.FlattenActionSpaceWrapper(env)
    vector = importlib.import_module("mani_skill.vector.wrappers.gymnasium")
    vector_env: VectorEnv = vector.ManiSkillVectorEnv(
        env, cfg.num_envs, auto_reset=True, ignore_terminations=False, record_metrics=False
    )
    vector_env.reset(seed=seed)
    return vector_env

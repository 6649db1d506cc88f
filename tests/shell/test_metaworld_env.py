"""MetaWorld (env type ``metaworld``) on this machine's CPU: state and camera observations,
success, same-step resets, task sets, the OSMesa the cameras need, and evaluation GIFs.

The env tests need metaworld (``make install`` installs it); the camera tests also need
OpenGL for MuJoCo: the OSMesa ``make install`` fetches (`rlshell.envs.osmesa`), the
system's, or a ``MUJOCO_GL`` of the user's. Each is skipped, saying which is missing,
only where that install step could not run.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
from gymnasium import spaces
from PIL import Image

from rlshell.config import ConfigError, EnvConfig
from rlshell.envs import make_env
from rlshell.envs.metaworld import (
    TASK_DESCRIPTIONS,
    MetaWorldUnavailableError,
    metaworld_unavailable_reason,
    task_description,
    task_names,
)
from rlshell.envs.osmesa import (
    InstallError,
    install_osmesa,
    installed_osmesa,
    main,
    system_osmesa,
    use_osmesa,
)
from rlshell.envs.stepper import EnvStepper
from rlshell.envs.text import texts_of
from rlshell.evaluation.recording import record_task_gifs
from rlshell.models.base import BasePolicy
from rlshell.runners.validation import load_config
from tests.shell.test_vla import make_vla

ROOT = Path(__file__).resolve().parents[2]
METAWORLD_REASON = metaworld_unavailable_reason()  # without cameras: no side effect
needs_metaworld = pytest.mark.skipif(
    METAWORLD_REASON is not None,
    reason=f"needs metaworld (`make install` installs it): {METAWORLD_REASON}",
)
HAS_OPENGL = bool(os.environ.get("MUJOCO_GL") or installed_osmesa() or system_osmesa())
needs_camera = pytest.mark.skipif(
    METAWORLD_REASON is not None or not HAS_OPENGL,
    reason="needs metaworld and OpenGL for MuJoCo's cameras (`make install` fetches OSMesa, "
    f"`python -m rlshell.envs.osmesa install`): {METAWORLD_REASON or 'no OSMesa, no MUJOCO_GL'}",
)
pytestmark = pytest.mark.xdist_group("metaworld")
_GL_VARIABLES = ("MUJOCO_GL", "PYOPENGL_PLATFORM", "LD_LIBRARY_PATH")


@pytest.fixture(autouse=True)
def _gl_variables_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `use_osmesa` sets in this process's environment is undone after each test."""
    for variable in _GL_VARIABLES:
        if variable in os.environ:
            monkeypatch.setenv(variable, os.environ[variable])
        else:
            monkeypatch.delenv(variable, raising=False)


def metaworld(**fields: object) -> EnvConfig:
    values: dict[str, object] = {"env_type": "metaworld", "env_id": "reach-v3"}
    values.update(fields)
    return EnvConfig(**values)  # type: ignore[arg-type]


def scripted(task: str) -> Any:
    """MetaWorld's scripted expert for ``task`` (``reach-v3``: ``SawyerReachV3Policy``)."""
    policies = importlib.import_module("metaworld.policies")
    words = task.removesuffix("-v3").split("-")
    return getattr(policies, f"Sawyer{''.join(w.capitalize() for w in words)}V3Policy")()


# --- from state --------------------------------------------------------------------------------


@needs_metaworld
def test_state_observations_are_metaworlds_39_numbers_and_a_seed_fixes_the_start() -> None:
    stepper = EnvStepper.from_config(metaworld(num_envs=4))
    try:
        states = stepper.reset(seed=0, group_size=2)["states"]
        assert states.dtype == torch.float32
        assert states.shape == (4, 39)
        assert torch.equal(states[0], states[1])  # one seed per group: the same goal
        assert torch.equal(states[2], states[3])
        assert not torch.equal(states[0, 36:], states[2, 36:])  # another seed, another goal
        assert torch.equal(stepper.reset(seed=0, group_size=2)["states"], states)
        space = stepper.action_space
        assert isinstance(space, spaces.Box)
        assert space.shape == (4,)
        assert (space.low == -1).all()
        assert (space.high == 1).all()
    finally:
        stepper.close()


@needs_metaworld
def test_the_scripted_expert_reaches_the_goal_and_the_stepper_counts_the_success() -> None:
    stepper = EnvStepper.from_config(metaworld(num_envs=1, max_episode_steps=100))
    expert = scripted("reach-v3")
    try:
        obs = stepper.reset(seed=3)
        for step in range(1, 101):
            action = expert.get_action(obs["states"][0].double().numpy())
            result = stepper.step(torch.as_tensor(action, dtype=torch.float32)[None])
            assert bool(result.truncated[0]) == (step == 100)
            obs = result.obs
        assert not result.terminated.any()  # a success does not end the episode
        metrics = stepper.pop_metrics()
        assert metrics["env/episodes"] == 1.0
        assert metrics["env/episode_length"] == 100.0
        assert metrics["env/success"] == 1.0
        assert metrics["env/success_once"] == 1.0
    finally:
        stepper.close()


@needs_metaworld
def test_a_finished_episode_resets_in_the_same_step_and_keeps_its_final_observation() -> None:
    stepper = EnvStepper.from_config(metaworld(num_envs=2, max_episode_steps=3))
    try:
        start = stepper.reset(seed=0)["states"]
        push = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
        for _ in range(3):
            result = stepper.step(push)
        assert result.truncated.all()
        # The hand moved during the episode: the final observation is kept apart from the
        # new episode's first, where the hand is back at its start.
        hand = slice(0, 3)
        assert not torch.allclose(result.next_obs["states"][:, hand], start[:, hand])
        assert torch.allclose(result.obs["states"][:, hand], start[:, hand], atol=1e-3)
        result = stepper.step(push)  # MetaWorld refuses a step past its end: it was reset
        assert not result.truncated.any()
        assert stepper.pop_metrics()["env/episode_length"] == 3.0
    finally:
        stepper.close()


# --- task sets and names -----------------------------------------------------------------------


@needs_camera
def test_mt10_spreads_its_copies_over_its_tasks_in_blocks() -> None:
    names = task_names("MT10")
    assert names[:3] == ("reach-v3", "push-v3", "pick-place-v3")
    assert len(set(names)) == 10
    assert task_names("Meta-World/MT10") == names
    assert set(task_names("MT50")) == set(TASK_DESCRIPTIONS)
    env_dict = importlib.import_module("metaworld.env_dict")
    stepper = EnvStepper.from_config(metaworld(env_id="MT10", num_envs=20))
    try:
        # Two consecutive copies per task, in MetaWorld's order.
        tasks = [type(copy.unwrapped) for copy in stepper.env.envs]  # type: ignore[attr-defined]
        assert tasks == [env_dict.ALL_V3_ENVIRONMENTS[name] for name in names for _ in range(2)]
        assert stepper.reset(seed=0)["states"].shape == (20, 39)
    finally:
        stepper.close()
    stepper = EnvStepper.from_config(
        metaworld(env_id="MT10", num_envs=10, obs_mode="rgb", image_size=16)
    )
    try:
        obs = stepper.reset(seed=0)
        # Each copy is told its own task, in a text space the set's copies share.
        assert texts_of(obs["task_descriptions"]) == [TASK_DESCRIPTIONS[name] for name in names]
        assert obs["main_images"].shape == (10, 16, 16, 3)
    finally:
        stepper.close()
    with pytest.raises(ValueError, match=r"^env\.num_envs: MT10 spreads its copies evenly over"):
        make_env(metaworld(env_id="MT10", num_envs=4))


@needs_metaworld
def test_an_unknown_task_names_the_closest_ones() -> None:
    assert task_names("reach-v3") == task_names("Meta-World/MT1/reach-v3") == ("reach-v3",)
    with pytest.raises(ValueError, match=r"unknown MetaWorld task 'reach-v2' \(did you mean "):
        make_env(metaworld(env_id="reach-v2"))
    with pytest.raises(ValueError, match=r"did you mean 'MT10'"):
        task_names("MT11")
    with pytest.raises(ValueError, match=r"^env\.obs_mode: the 'metaworld' env type observes"):
        make_env(metaworld(obs_mode="rgbd"))
    assert task_description("reach-v3") == "reach a goal position"
    assert task_description("lift-mug-v4") == "lift mug"


def test_keys_the_builder_does_not_read_are_refused() -> None:
    overrides = ["env.env_type=metaworld", "env.env_id=reach-v3"]
    config = load_config(ROOT / "configs/ppo_cartpole.py", [*overrides, "env.obs_mode=rgb"])
    assert config.env.obs_mode == "rgb"
    with pytest.raises(ConfigError) as caught:
        load_config(
            ROOT / "configs/ppo_cartpole.py",
            [*overrides, "env.control_mode=pd_ee_delta_pos", "env.ignore_terminations=true"],
        )
    assert caught.value.problems == [
        f"env.{key}: the 'metaworld' env type (env.env_type) does not read it"
        for key in ("control_mode", "ignore_terminations")
    ]


def test_without_metaworld_the_env_says_so_in_one_sentence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "metaworld" else real_find_spec(name, *args),
    )
    with pytest.raises(MetaWorldUnavailableError) as caught:
        make_env(metaworld())
    assert str(caught.value) == (
        "env type 'metaworld' (reach-v3) cannot run on this machine: metaworld is not "
        "installed (`make install` installs it: pip install --no-deps metaworld==3.1.1)"
    )


# --- the camera --------------------------------------------------------------------------------


@needs_camera
def test_camera_observations_show_the_scene_follow_the_arm_and_reach_the_tiny_vla() -> None:
    stepper = EnvStepper.from_config(metaworld(num_envs=2, obs_mode="rgb", image_size=48))
    try:
        obs = stepper.reset(seed=0)
        images = obs["main_images"]
        assert images.dtype == torch.uint8
        assert images.shape == (2, 48, 48, 3)
        assert images.float().std() > 20  # the arm and the table, not a blank frame
        assert obs["states"].shape == (2, 8)  # the hand and the gripper, now and a step before
        assert texts_of(obs["task_descriptions"]) == ["reach a goal position"] * 2
        for _ in range(10):
            result = stepper.step(torch.tensor([[0.0, 0.0, 1.0, 0.0]] * 2))
        moved = (result.obs["main_images"].float() - images.float()).abs().mean()
        assert moved > 1  # the arm rose: the picture changed
        vla = make_vla(4, image_size=48, image_channels=3, prompt_length=96)
        actions, _ = vla.predict_action_batch(result.obs, mode="train")
        assert actions.shape == (2, 4)
        stepper.step(actions.clamp(-1, 1))
    finally:
        stepper.close()


@needs_camera
def test_an_evaluation_gif_shows_the_camera(tmp_path: Path) -> None:
    class Expert:
        """The scripted reach policy, as a policy the recorder can drive."""

        action_chunk = 1

        def __init__(self) -> None:
            self.expert = scripted("reach-v3")

        def predict_action_batch(self, obs: Any, **_: Any) -> tuple[torch.Tensor, dict[str, Any]]:
            actions = [self.expert.get_action(row.double().numpy()) for row in obs["states"]]
            return torch.as_tensor(np.stack(actions), dtype=torch.float32), {}

    gifs = record_task_gifs(
        cast(BasePolicy, Expert()),
        metaworld(max_episode_steps=6),
        seed=0,
        out_dir=tmp_path,
        max_frames=10,
    )
    assert list(gifs) == ["reach-v3"]
    with Image.open(gifs["reach-v3"]) as gif:
        assert gif.size == (256, 256)
        assert gif.n_frames == 6  # the episode's 6 observations until its reset


# --- OSMesa ------------------------------------------------------------------------------------


def test_a_users_mujoco_gl_is_kept_and_a_missing_osmesa_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MUJOCO_GL", "egl")
    assert use_osmesa(tmp_path).kind == "user"
    assert os.environ["MUJOCO_GL"] == "egl"
    monkeypatch.delenv("MUJOCO_GL")
    choice = use_osmesa(tmp_path / "not_installed")
    if system_osmesa() is not None:
        assert choice.kind == "system"
        return
    assert choice.kind == "none"
    assert choice.detail.startswith("no OpenGL for MuJoCo's cameras: no MUJOCO_GL set and no ")
    assert "MUJOCO_GL" not in os.environ


def test_installing_osmesa_without_apt_says_why_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty_path"))
    target = tmp_path / "osmesa"
    with pytest.raises(InstallError, match=r"^apt-get is not on PATH"):
        install_osmesa(target)
    assert not target.exists()
    if system_osmesa() is not None:
        return  # `install` then fetches nothing
    assert main(["install", "--dir", str(target)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("osmesa: OSMesa not installed: apt-get is not on PATH")
    assert "MetaWorld's camera observations will not render" in err


@pytest.mark.skipif(
    installed_osmesa() is None and system_osmesa() is None,
    reason="needs OSMesa (`make install` fetches it: `python -m rlshell.envs.osmesa install`)",
)
def test_a_new_process_draws_with_osmesa_without_the_user_setting_anything() -> None:
    """The selection and what a process started after it inherits: MuJoCo imports there."""
    script = (
        "import os, subprocess, sys\n"
        "from rlshell.envs.osmesa import use_osmesa\n"
        "print(use_osmesa().kind)\n"
        "child = 'import mujoco, os; from mujoco import osmesa; print(os.environ[\"MUJOCO_GL\"])'\n"
        "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True,"
        " check=True).stdout.strip())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in _GL_VARIABLES}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["osmesa" if installed_osmesa() else "system", "osmesa"]

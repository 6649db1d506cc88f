"""ManiSkill 3 on this machine's CPU: the software Vulkan driver, the env, PPO and evaluation.

The CPU tests need mani-skill and the lavapipe driver `make install` fetches
(`rlshell.envs.vulkan`); they are skipped, saying which is missing, only where
that install step could not run. The GPU test needs an NVIDIA GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from gymnasium import spaces

from rlshell.config import EnvConfig
from rlshell.envs import make_env
from rlshell.envs.maniskill import (
    ManiSkillUnavailableError,
    maniskill_available,
    maniskill_unavailable_reason,
    task_description,
)
from rlshell.envs.stepper import EnvStepper
from rlshell.envs.text import texts_of
from rlshell.envs.vulkan import DIR_ENV_VAR, InstallError, install_lavapipe, main, use_vulkan_driver
from rlshell.metrics import read_metrics
from tests import launcher
from tests.shell.test_cnn_policy import make_policy
from tests.shell.test_run import cli_env, train
from tests.shell.test_vla import make_vla

CPU_REASON = maniskill_unavailable_reason()
needs_cpu_maniskill = pytest.mark.skipif(
    CPU_REASON is not None,
    reason=f"needs mani-skill and a Vulkan driver (`make install` fetches one): {CPU_REASON}",
)
pytestmark = pytest.mark.xdist_group("maniskill")


def pushcube(**fields: object) -> EnvConfig:
    values: dict[str, object] = {"env_type": "maniskill", "env_id": "PushCube-v1"}
    values.update(fields)
    return EnvConfig(**values)  # type: ignore[arg-type]


@needs_cpu_maniskill
def test_a_seed_gives_the_same_episodes_from_state_and_from_the_camera() -> None:
    """Episodes after the first start alike in both modes (ManiSkill's enhanced_determinism):
    drawn from torch's global generator, which rendering also uses, they parted at the first
    reset, so a camera could not be recorded in lockstep with an expert reading the state."""
    state = EnvStepper.from_config(pushcube(num_envs=1, max_episode_steps=2))
    camera = EnvStepper.from_config(
        pushcube(num_envs=1, max_episode_steps=2, obs_mode="rgb", image_size=16)
    )
    try:
        state.reset(seed=0)
        camera.reset(seed=0)
        actions = torch.rand(6, 1, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
        for step, action in enumerate(actions):  # three episodes
            acting, seen = state.step(action), camera.step(action)
            assert torch.equal(acting.dones, seen.dones)
            assert torch.equal(acting.rewards, seen.rewards), f"step {step}"
            assert torch.equal(acting.obs["states"][:, :25], seen.obs["states"])
    finally:
        state.close()
        camera.close()


# --- the driver ------------------------------------------------------------------------------


def test_without_a_driver_the_env_names_what_is_missing_in_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mani_skill", reason="the message for a missing driver needs mani-skill")
    monkeypatch.setenv(DIR_ENV_VAR, str(tmp_path / "no_driver"))
    for variable in ("VK_ICD_FILENAMES", "VK_DRIVER_FILES"):
        monkeypatch.delenv(variable, raising=False)
    choice = use_vulkan_driver()
    assert choice.kind == "none"
    with pytest.raises(ManiSkillUnavailableError) as caught:
        make_env(pushcube(num_envs=2))
    message = str(caught.value)
    assert message.startswith(
        "env type 'maniskill' (PushCube-v1, CPU simulation) cannot run on this machine: "
        "no Vulkan GPU driver and no software Vulkan driver (run `make install`"
    )
    assert "\n" not in message
    assert caught.value.__cause__ is None


def test_installing_lavapipe_without_apt_says_why_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty_path"))
    target = tmp_path / "vulkan"
    with pytest.raises(InstallError, match=r"^apt-get is not on PATH"):
        install_lavapipe(target)
    assert not target.exists()
    monkeypatch.setenv(DIR_ENV_VAR, str(target))
    assert main(["install"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vulkan: lavapipe not installed: apt-get is not on PATH")
    assert "ManiSkill envs will not run on this machine's CPU" in err


@needs_cpu_maniskill
def test_the_installed_driver_is_selected_without_the_user_setting_anything() -> None:
    status = subprocess.run(
        [sys.executable, "-m", "rlshell.envs.vulkan", "status"],
        capture_output=True,
        text=True,
        env={k: v for k, v in cli_env(Path("/tmp")).items() if not k.startswith("VK_")},
        check=False,
    )
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(("lavapipe: ", "gpu: "))


# --- the env ---------------------------------------------------------------------------------


@needs_cpu_maniskill
def test_pushcube_from_state_steps_one_env_per_process_with_success_metrics() -> None:
    stepper = EnvStepper.from_config(pushcube(num_envs=2, max_episode_steps=3))
    try:
        assert type(stepper.env).__name__ == "AsyncVectorEnv"
        obs = stepper.reset(seed=0, group_size=2)
        states = obs["states"]
        assert states.dtype == torch.float32
        assert states.shape == (2, 35)
        assert torch.equal(states[0], states[1])  # one seed per group: the same start
        space = stepper.action_space
        assert isinstance(space, spaces.Box)
        assert space.shape == (8,)
        for _ in range(3):
            result = stepper.step(torch.rand(2, 8) * 2 - 1)
            assert result.rewards.shape == (2,)
        assert result.truncated.all()
        assert not result.terminated.any()
        # The truncated episodes' last observation is kept apart from the reset one.
        assert not torch.equal(result.next_obs["states"], result.obs["states"])
        metrics = stepper.pop_metrics()
        assert metrics["env/episodes"] == 2.0
        assert metrics["env/episode_length"] == 3.0
        assert {"env/success", "env/success_once"} <= set(metrics)
        assert stepper.reset(seed=1, group_size=1)["states"][0].ne(states[0]).any()
    finally:
        stepper.close()


@needs_cpu_maniskill
def test_a_camera_observation_reaches_the_cnn_policy_and_the_tiny_vla() -> None:
    cfg = pushcube(
        num_envs=1, obs_mode="rgbd", image_size=40, max_episode_steps=4, ignore_terminations=True
    )
    stepper = EnvStepper.from_config(cfg)
    try:
        # One copy steps in this process; ManiSkill's wrapper got the termination setting.
        wrapper = stepper.env.envs[0]  # type: ignore[attr-defined]
        while type(wrapper).__name__ != "CPUGymWrapper":
            wrapper = wrapper.env
        assert wrapper.ignore_terminations is True
        obs = stepper.reset(seed=0)
        images = obs["main_images"]
        assert images.dtype == torch.uint8
        assert images.shape == (1, 40, 40, 4)
        assert images[..., :3].float().std() > 10  # a rendered scene, not a blank frame
        depth_cm = images[..., 3].float()
        assert 20 < depth_cm.mean() < 255  # the table and the arm, a metre or two away
        assert obs["states"].shape == (1, 25)  # proprioception + TCP pose, no object poses
        assert texts_of(obs["task_descriptions"]) == [task_description("PushCube-v1")]

        cnn = make_policy("gaussian", 8, image_size=40, image_channels=4, state_dim=25)
        vla = make_vla(8, image_size=40, image_channels=4, prompt_length=96)
        for policy in (cnn, vla):
            actions, info = policy.predict_action_batch(obs, mode="train")
            assert actions.shape == (1, 8)
            assert torch.isfinite(info["prev_logprobs"]).all()
            result = stepper.step(actions.clamp(-1, 1))
            assert result.obs["main_images"].shape == (1, 40, 40, 4)
            obs = result.obs
    finally:
        stepper.close()


def test_the_gpu_simulation_is_refused_without_cuda_in_one_sentence() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: the GPU simulation applies")
    with pytest.raises(ManiSkillUnavailableError) as caught:
        make_env(pushcube(num_envs=4, uses_gpus=True))
    message = str(caught.value)
    assert "(PushCube-v1, GPU simulation) cannot run on this machine: " in message
    assert message.endswith(
        "no CUDA GPU is visible for its GPU simulation (env.uses_gpus=true)"
    ) or message.endswith("mani_skill is not installed (pip install -e '.[maniskill]')")


@pytest.mark.skipif(
    not maniskill_available(uses_gpus=True),
    reason="needs an NVIDIA GPU with CUDA, a Vulkan driver and mani-skill "
    "(ManiSkill's batched GPU simulation)",
)
def test_pushcube_steps_in_the_batched_gpu_simulation() -> None:
    stepper = EnvStepper.from_config(pushcube(num_envs=4, max_episode_steps=3, uses_gpus=True))
    try:
        states = stepper.reset(seed=0, group_size=2)["states"]
        assert states.is_cuda
        assert states.shape == (4, 35)
        for _ in range(3):
            result = stepper.step(torch.rand(4, 8, device=states.device) * 2 - 1)
            assert result.rewards.is_cuda
        assert result.truncated.all()
        assert stepper.pop_metrics()["env/episodes"] == 4.0
    finally:
        stepper.close()


# --- PPO and evaluation ------------------------------------------------------------------------


def train_config(config: str, out: Path, *overrides: str) -> None:
    """``python -m rlshell.train CONFIG OVERRIDES`` into ``out``, with a Ray temp dir of its own."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="ms", dir="/tmp"))
    try:
        result = train(
            config, *overrides, f"runner.output_dir={out}", env=cli_env(ray_tmp), timeout=420
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@needs_cpu_maniskill
@pytest.mark.slow
def test_a_short_ppo_run_on_pushcube_trains_and_evaluates_with_a_gif(tmp_path: Path) -> None:
    train_config(
        "configs/ppo_pushcube_cpu.py",
        tmp_path,
        "runner.max_steps=2",
        "runner.rollout_steps=10",
        "env.num_envs=1",  # in the worker's process (the env processes: tested above)
        "env.max_episode_steps=10",
        "algorithm.num_minibatches=2",
        "checkpoint.interval=2",
    )
    run_dir = tmp_path / "ppo_pushcube_cpu"
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [1, 2]
    assert records[-1]["env/total_steps"] == 2 * 1 * 10
    assert all(r["env/episodes"] == 1.0 for r in records)  # 10-step episodes, 10-step rollouts
    assert all(0.0 <= r["env/success"] <= 1.0 for r in records)
    assert all(torch.isfinite(torch.tensor(r["train/loss"])) for r in records)

    evaluated = launcher.run(
        [
            sys.executable,
            "-m",
            "rlshell.evaluate",
            str(run_dir / "checkpoints" / "global_step_2"),
            "--episodes",
            "2",
            "--num-envs",
            "1",
        ],
        env=dict(os.environ),
        timeout=300,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert report["env_id"] == "PushCube-v1"
    assert report["eval/episodes"] == 2
    assert report["episode_lengths"] == [10, 10]
    assert report["eval/success"] is not None
    gif = Path(report["gifs"]["PushCube-v1"])
    assert gif.is_file()
    assert gif.read_bytes()[:6] == b"GIF89a"
    from PIL import Image

    with Image.open(gif) as frames:
        assert frames.n_frames >= 5  # ManiSkill's renderer drew the episode
        assert max(frames.size) >= 160


@needs_cpu_maniskill
@pytest.mark.slow
@pytest.mark.parametrize("name", ["ppo_pushcube_rgb_cpu", "ppo_flow_pushcube_rgb_cpu"])
def test_the_camera_configs_train_a_step(tmp_path: Path, name: str) -> None:
    """The camera configs: images, the task's words and the robot's state reach the CNN and
    the flow policy's vision-language encoder."""
    train_config(
        f"configs/{name}.py",
        tmp_path,
        "runner.max_steps=1",
        "runner.rollout_steps=4",
        "env.num_envs=1",
        "algorithm.num_minibatches=1",
        "checkpoint.interval=0",
    )
    (record,) = read_metrics(tmp_path / name / "metrics.jsonl")
    assert record["env/total_steps"] == 4
    assert record["train/samples"] == 4

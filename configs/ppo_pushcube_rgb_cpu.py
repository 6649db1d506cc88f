"""PPO on ManiSkill's PushCube-v1 from its camera, on 2 CPU cores (no GPU).

``configs/ppo_pushcube_cpu.py`` with the policy seeing what ManiSkill's RGB
baseline sees: the task's camera (64×64 RGB here, rendered by the software
Vulkan driver) and the robot's own state (joint positions and velocities,
the gripper's pose: 25 numbers, no cube or goal position), through
``cnn_policy`` (a Nature-CNN trunk). Rendering makes each env step several
times slower than from state: docs/embodied.md reports how far a 30-minute
run gets.
"""

from pathlib import Path

from attrs import evolve

from rlshell.config import read_config

STATE = read_config(Path(__file__).with_name("ppo_pushcube_cpu.py"))

config = evolve(
    STATE,
    actor=evolve(
        STATE.actor,
        model=evolve(
            STATE.actor.model,
            model_type="cnn_policy",
            model_kwargs={
                "action_dim": 8,
                "action_type": "gaussian",
                "action_low": -1.0,
                "action_high": 1.0,
                "init_log_std": -0.5,
                "image_size": 64,
                "image_channels": 3,
                "state_dim": 25,
                "conv_channels": "32,64,64",
                "feature_dim": 256,
                "hidden_size": 256,
            },
        ),
    ),
    # Episodes end at success, which bootstraps (algorithm.bootstrap_at_done='always', from
    # the state config) as the state run does.
    env=evolve(STATE.env, obs_mode="rgb", image_size=64),
    # 1,000 updates × 200 env steps = 200,000 env steps.
    runner=evolve(STATE.runner, experiment_name="ppo_pushcube_rgb_cpu", max_steps=1000),
    checkpoint=evolve(STATE.checkpoint, interval=25),
)

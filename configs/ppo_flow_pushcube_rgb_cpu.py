"""configs/ppo_flow_pushcube_cpu.py from ManiSkill's camera: the flow policy's own
vision-language encoder reads PushCube's 64×64 RGB camera, the task in words ("push the
cube to the goal region") and the robot's own 25 numbers (joints and gripper pose; no
cube or goal position: those are in the image only), as ManiSkill's RGB baseline sees.

From scratch at PushCube's learning rate; each env step renders the camera with the
software Vulkan driver, several times slower than from state. docs/embodied.md reports
how far a run of 100 updates (20,000 env steps) gets, and why this config has no
behaviour-cloning start yet.
"""

from pathlib import Path

from attrs import evolve

from rlshell.config import read_config

STATE = read_config(Path(__file__).with_name("ppo_flow_pushcube_cpu.py"))
MODEL = STATE.actor.model

config = evolve(
    STATE,
    actor=evolve(
        STATE.actor,
        model=evolve(
            MODEL,
            model_kwargs={
                **MODEL.model_kwargs,
                "encoder": "vision_language",
                "obs_dim": 25,
                "image_size": 64,
            },
        ),
    ),
    env=evolve(STATE.env, obs_mode="rgb", image_size=64),
    runner=evolve(STATE.runner, experiment_name="ppo_flow_pushcube_rgb_cpu", max_steps=100),
    checkpoint=evolve(STATE.checkpoint, interval=25),
)

"""configs/ppo_flow_metaworld_reach.py from MetaWorld's camera: the flow policy's own
vision-language encoder reads a 64×64 image, the task in words and the hand's 8 numbers.

Start it from behaviour cloning (configs/sft_flow_metaworld_reach_rgb.py, whose
demonstrations record the camera while MetaWorld's scripted policy reads the state) with
``actor.model.checkpoint=runs/sft_flow_metaworld_reach_rgb/checkpoints/global_step_300``.
docs/embodied.md has the figures.
"""

from pathlib import Path

from attrs import evolve

from rlshell.config import read_config

STATE = read_config(Path(__file__).with_name("ppo_flow_metaworld_reach.py"))
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
                "obs_dim": 8,  # the hand's position and gripper, now and one step before
                "image_size": 64,
            },
        ),
    ),
    env=evolve(STATE.env, obs_mode="rgb", image_size=64),
    runner=evolve(STATE.runner, experiment_name="ppo_flow_metaworld_reach_rgb"),
)

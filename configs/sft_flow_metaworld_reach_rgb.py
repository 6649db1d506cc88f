"""Behaviour cloning from MetaWorld's camera: configs/sft_flow_metaworld_reach.py for the
camera policy of configs/ppo_flow_metaworld_reach_rgb.py.

The scripted policy reads the state while the same envs, seeded alike and given the same
actions, are recorded through the camera (``--observe``, in lockstep):

    python -m rlshell.record configs/ppo_flow_metaworld_reach.py --expert metaworld \
        --episodes 40 --observe env.obs_mode=rgb env.image_size=64 \
        --out runs/demos/reach_rgb_train.safetensors
    python -m rlshell.record configs/ppo_flow_metaworld_reach.py --expert metaworld \
        --episodes 8 --seed 1 --observe env.obs_mode=rgb env.image_size=64 \
        --out runs/demos/reach_rgb_val.safetensors
"""

from pathlib import Path

from attrs import evolve

from rlshell.config import read_config

STATE = read_config(Path(__file__).with_name("sft_flow_metaworld_reach.py"))
RL = read_config(Path(__file__).with_name("ppo_flow_metaworld_reach_rgb.py"))

config = evolve(
    STATE,
    actor=evolve(STATE.actor, model=RL.actor.model),
    data=evolve(
        STATE.data,
        train_path="runs/demos/reach_rgb_train.safetensors",
        val_path="runs/demos/reach_rgb_val.safetensors",
    ),
    runner=evolve(STATE.runner, experiment_name="sft_flow_metaworld_reach_rgb"),
)

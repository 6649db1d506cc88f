"""Behaviour cloning of the trained PushCube expert into the camera flow policy of
configs/ppo_flow_pushcube_rgb_cpu.py: configs/sft_flow_pushcube_cpu.py from the camera.

The expert (the Gaussian MLP of a configs/ppo_pushcube_cpu.py run) reads the state of one
set of envs while a second set, reset with the same seed and given the same actions, is
recorded through its camera (``--observe``, in lockstep):

    python -m rlshell.record configs/ppo_pushcube_cpu.py --only-success --episodes 100 \\
        --expert checkpoint:runs/ppo_pushcube_cpu/checkpoints/global_step_1500 \\
        --observe env.obs_mode=rgb env.image_size=64 \\
        --out runs/demos/pushcube_rgb_train.safetensors
    python -m rlshell.record configs/ppo_pushcube_cpu.py --only-success --episodes 20 \\
        --seed 1 --expert checkpoint:runs/ppo_pushcube_cpu/checkpoints/global_step_1500 \\
        --observe env.obs_mode=rgb env.image_size=64 \\
        --out runs/demos/pushcube_rgb_val.safetensors

A checkpoint of this run starts configs/ppo_flow_pushcube_rgb_cpu.py's PPO
(``actor.model.checkpoint=runs/sft_flow_pushcube_rgb_cpu/checkpoints/global_step_500
actor.optim.lr=3e-5``). docs/embodied.md has the figures.
"""

from pathlib import Path

from attrs import evolve

from rlshell.config import read_config

STATE = read_config(Path(__file__).with_name("sft_flow_pushcube_cpu.py"))
RL = read_config(Path(__file__).with_name("ppo_flow_pushcube_rgb_cpu.py"))

config = evolve(
    STATE,
    actor=evolve(STATE.actor, model=RL.actor.model),
    data=evolve(
        STATE.data,
        train_path="runs/demos/pushcube_rgb_train.safetensors",
        val_path="runs/demos/pushcube_rgb_val.safetensors",
    ),
    runner=evolve(STATE.runner, experiment_name="sft_flow_pushcube_rgb_cpu"),
)

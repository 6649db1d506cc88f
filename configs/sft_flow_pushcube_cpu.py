"""Behaviour cloning of a trained PushCube expert into the flow policy, the stage before RL.

The expert is the Gaussian MLP of a configs/ppo_pushcube_cpu.py run (success 0.92 over
three seeds; docs/embodied.md), acting deterministically; its successful episodes are
recorded first:

    python -m rlshell.record configs/ppo_pushcube_cpu.py --only-success --episodes 100 \
        --expert checkpoint:runs/ppo_pushcube_cpu/checkpoints/global_step_1500 \
        --out runs/demos/pushcube_train.safetensors
    python -m rlshell.record configs/ppo_pushcube_cpu.py --only-success --episodes 20 \
        --seed 1 --expert checkpoint:runs/ppo_pushcube_cpu/checkpoints/global_step_1500 \
        --out runs/demos/pushcube_val.safetensors

The model is configs/ppo_flow_pushcube_cpu.py's, so a checkpoint of this run starts that
config's PPO (``actor.model.checkpoint=runs/sft_flow_pushcube_cpu/checkpoints/global_step_500
actor.optim.lr=3e-5``). docs/embodied.md has the figures.
"""

from pathlib import Path

from attrs import evolve

from rlshell.config import (
    ClusterConfig,
    Config,
    DataConfig,
    OptimConfig,
    RunnerConfig,
    read_config,
)

RL = read_config(Path(__file__).with_name("ppo_flow_pushcube_cpu.py"))

config = Config(
    cluster=ClusterConfig(component_placement={"actor": "0:0"}),
    actor=evolve(RL.actor, optim=OptimConfig(lr=1e-3, lr_scheduler="cosine", min_lr_ratio=0.1)),
    data=DataConfig(
        task="demonstrations",
        train_path="runs/demos/pushcube_train.safetensors",
        val_path="runs/demos/pushcube_val.safetensors",
    ),
    runner=RunnerConfig(
        runner_type="sft",
        experiment_name="sft_flow_pushcube_cpu",
        max_steps=500,
        prompts_per_step=256,
        eval_interval=100,
    ),
    checkpoint=evolve(RL.checkpoint, interval=500),
)

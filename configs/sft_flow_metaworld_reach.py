"""Behaviour cloning of MetaWorld's scripted reach policy into a flow policy, the stage before RL.

RLinf's recipe for a VLA, at CPU size: supervised fine-tuning on demonstrations, then PPO
from the result (configs/ppo_flow_metaworld_reach.py with
``actor.model.checkpoint=runs/sft_flow_metaworld_reach/checkpoints/global_step_300``).
The demonstrations are MetaWorld's own scripted policy on MT1 ``reach-v3`` (state
observations), recorded first:

    python -m rlshell.record configs/ppo_flow_metaworld_reach.py \
        --expert metaworld --episodes 40 --out runs/demos/reach_train.safetensors
    python -m rlshell.record configs/ppo_flow_metaworld_reach.py \
        --expert metaworld --episodes 8 --seed 1 --out runs/demos/reach_val.safetensors

The model is configs/ppo_flow_metaworld_reach.py's, so its checkpoints start that run.
See docs/embodied.md ("Behaviour cloning before RL").
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

RL = read_config(Path(__file__).with_name("ppo_flow_metaworld_reach.py"))

config = Config(
    # One process: the policy is small, the demonstrations a few megabytes.
    cluster=ClusterConfig(component_placement={"actor": "0:0"}),
    actor=evolve(RL.actor, optim=OptimConfig(lr=1e-3, lr_scheduler="cosine", min_lr_ratio=0.1)),
    data=DataConfig(
        task="demonstrations",
        train_path="runs/demos/reach_train.safetensors",
        val_path="runs/demos/reach_val.safetensors",
    ),
    runner=RunnerConfig(
        runner_type="sft",
        experiment_name="sft_flow_metaworld_reach",
        max_steps=300,
        prompts_per_step=256,
        eval_interval=50,
    ),
    checkpoint=evolve(RL.checkpoint, interval=100),
)

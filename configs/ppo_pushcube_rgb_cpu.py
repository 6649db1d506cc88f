"""PPO on ManiSkill's PushCube-v1 from its camera, on 2 CPU cores (no GPU).

The policy sees what ManiSkill's RGB baseline sees: the task's camera (64×64
RGB here, rendered by the software Vulkan driver) and the robot's own state
(joint positions and velocities, the gripper's pose: 25 numbers, no cube or
goal position), through ``cnn_policy`` (a Nature-CNN trunk). The PPO
settings are ``configs/ppo_pushcube_cpu.py``'s. Rendering makes each env step
about ten times slower than from state: docs/embodied.md reports how far a
30-minute run gets.
"""

from rlshell.config import (
    ActorConfig,
    AlgorithmConfig,
    CheckpointConfig,
    ClusterConfig,
    Config,
    EnvConfig,
    ModelConfig,
    OptimConfig,
    RunnerConfig,
)

config = Config(
    cluster=ClusterConfig(component_placement={"actor,rollout,env": "0:0"}),
    actor=ActorConfig(
        model=ModelConfig(
            model_type="cnn_policy",
            category="embodied",
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
        optim=OptimConfig(lr=3e-4, adam_eps=1e-5, clip_grad=0.5, lr_scheduler="constant"),
    ),
    env=EnvConfig(
        env_type="maniskill",
        env_id="PushCube-v1",
        num_envs=4,
        max_episode_steps=50,
        control_mode="pd_joint_delta_pos",
        obs_mode="rgb",
        image_size=64,
    ),
    algorithm=AlgorithmConfig(
        adv_type="gae",
        loss_type="ppo",
        gamma=0.8,
        lam=0.9,
        clip_low=0.2,
        ppo_epochs=8,
        num_minibatches=4,
        vf_coef=0.5,
        entropy_coef=0.0,
    ),
    # 4 envs × 50 steps = 200 env steps per update; 1,000 updates = 200,000 env steps.
    runner=RunnerConfig(
        runner_type="embodied",
        experiment_name="ppo_pushcube_rgb_cpu",
        max_steps=1000,
        rollout_steps=50,
    ),
    checkpoint=CheckpointConfig(interval=25, keep_last=2),
)

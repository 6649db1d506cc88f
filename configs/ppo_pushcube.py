"""PPO on ManiSkill's PushCube-v1 from state, on one GPU (ManiSkill's batched GPU simulation).

ManiSkill needs a Vulkan-capable GPU: on a machine without one this config
validates and plans (``--dry-run``) and a real run stops with a sentence
saying what is missing. The settings are ManiSkill's PPO baseline for
PushCube (512 envs × 50 steps, γ 0.8, λ 0.9, 4 epochs of 32 minibatches, every
ended episode bootstrapped).
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
    # One process on GPU 0 holds the batched envs, the policy and its update.
    cluster=ClusterConfig(component_placement={"actor,rollout,env": "0"}),
    actor=ActorConfig(
        model=ModelConfig(
            model_type="mlp_policy",
            category="embodied",
            # Panda state: qpos 9 + qvel 9, TCP pose 7, goal position 3, cube pose 7.
            model_kwargs={
                "obs_dim": 35,
                "action_dim": 8,
                "action_type": "gaussian",
                "action_low": -1.0,
                "action_high": 1.0,
                "hidden_sizes": "256,256,256",
                "activation": "tanh",
            },
        ),
        optim=OptimConfig(lr=3e-4, adam_eps=1e-5, clip_grad=0.5, lr_scheduler="constant"),
    ),
    env=EnvConfig(
        env_type="maniskill",
        env_id="PushCube-v1",
        num_envs=512,
        max_episode_steps=50,
        control_mode="pd_joint_delta_pos",
        uses_gpus=True,
    ),
    algorithm=AlgorithmConfig(
        adv_type="gae",
        loss_type="ppo",
        gamma=0.8,
        lam=0.9,
        clip_low=0.2,
        ppo_epochs=4,
        num_minibatches=32,
        vf_coef=0.5,
        entropy_coef=0.0,
        # ppo.py bootstraps every ended episode from V(final observation), success too.
        bootstrap_at_done="always",
    ),
    # 512 envs × 50 steps = 25,600 env steps per update; 80 updates ≈ 2M steps.
    runner=RunnerConfig(
        runner_type="embodied", experiment_name="ppo_pushcube", max_steps=80, rollout_steps=50
    ),
    checkpoint=CheckpointConfig(interval=20, keep_last=2),
)

"""PPO on ManiSkill's PushCube-v1 from state, on 2 CPU cores (no GPU).

ManiSkill's CPU simulation holds one env per process: the 8 copies below are
8 processes (gymnasium's AsyncVectorEnv) rendered by the software Vulkan
driver ``make install`` fetched. The PPO settings are ManiSkill's PPO
baseline for PushCube (its ``ppo.py``: γ 0.8, λ 0.9, 3×256 tanh MLP, lr
3e-4, clip 0.2, gradient norm 0.5, no entropy bonus), with far fewer envs:
8 envs × 50 steps give 400 samples per update (the baseline: 2,048 × 20 on
a GPU), so each update takes 4 minibatches instead of 32. docs/embodied.md
reports the run's success rate, wall time and env steps beside the
baseline's.
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
    # One process steps the env processes and trains the policy.
    cluster=ClusterConfig(component_placement={"actor,rollout,env": "0:0"}),
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
                "init_log_std": -0.5,
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
    # 4 envs × 50 steps = 200 env steps per update; 2,000 updates = 400,000 env steps.
    runner=RunnerConfig(
        runner_type="embodied",
        experiment_name="ppo_pushcube_cpu",
        max_steps=2000,
        rollout_steps=50,
    ),
    checkpoint=CheckpointConfig(interval=100, keep_last=2),
)

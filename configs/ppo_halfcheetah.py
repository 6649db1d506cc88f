"""PPO on HalfCheetah-v5 (MuJoCo), 1M env steps, CleanRL's ppo_continuous_action settings."""

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
    # One process steps the envs and trains (a 64×64 policy gains nothing from a second rank).
    cluster=ClusterConfig(component_placement={"actor,rollout,env": "0:0"}),
    actor=ActorConfig(
        model=ModelConfig(
            model_type="mlp_policy",
            category="embodied",
            # Running mean/std observation normalisation inside the policy (saved with it).
            model_kwargs={
                "obs_dim": 17,
                "action_dim": 6,
                "action_type": "gaussian",
                "action_low": -1.0,
                "action_high": 1.0,
                "hidden_sizes": "64,64",
                "activation": "tanh",
                "normalize_obs": True,
            },
        ),
        # CleanRL: lr 3e-4 annealed linearly to 0, Adam eps 1e-5, gradient norm clipped at 0.5.
        optim=OptimConfig(lr=3e-4, adam_eps=1e-5, clip_grad=0.5, lr_scheduler="linear"),
    ),
    # CleanRL steps one env 2,048 times per rollout; 8 envs × 256 steps give the same 2,048
    # samples with an eighth of the per-step Python overhead.
    env=EnvConfig(env_type="gymnasium", env_id="HalfCheetah-v5", num_envs=8),
    # 2,048 samples per rollout, 10 epochs of 32 minibatches, γ 0.99, λ 0.95, clip 0.2 (values too),
    # rewards scaled by the running std of the discounted return.
    algorithm=AlgorithmConfig(
        adv_type="gae",
        loss_type="ppo",
        gamma=0.99,
        lam=0.95,
        clip_low=0.2,
        value_clip=0.2,
        ppo_epochs=10,
        num_minibatches=32,
        vf_coef=0.5,
        entropy_coef=0.0,
        norm_reward=True,
    ),
    # 488 rollouts × 8 envs × 256 steps = 999,424 env steps.
    runner=RunnerConfig(
        runner_type="embodied",
        experiment_name="ppo_halfcheetah",
        max_steps=488,
        rollout_steps=256,
    ),
    checkpoint=CheckpointConfig(interval=100, keep_last=2),
)

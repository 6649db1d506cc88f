"""PPO on CartPole-v1 with rl-zoo's hyperparameters: env, rollout and update in one process."""

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
    # One process steps the 8 envs and trains: for a policy this small, gradient collectives
    # between two ranks (2-3 ms each over gloo, three per PPO step) cost more than they save.
    cluster=ClusterConfig(component_placement={"actor,rollout,env": "0:0"}),
    actor=ActorConfig(
        model=ModelConfig(
            model_type="mlp_policy",
            category="embodied",
            model_kwargs={"obs_dim": 4, "action_dim": 2, "action_type": "discrete"},
        ),
        # rl-zoo: lr 1e-3 decaying linearly to 0 over the run, max_grad_norm 0.5.
        optim=OptimConfig(lr=1e-3, adam_eps=1e-5, clip_grad=0.5, lr_scheduler="linear"),
    ),
    env=EnvConfig(env_type="gymnasium", env_id="CartPole-v1", num_envs=8),
    # rl-zoo's CartPole-v1: 8 envs × 32 steps, 20 epochs of one 256-sample batch, λ 0.8, γ 0.98.
    algorithm=AlgorithmConfig(
        adv_type="gae",
        loss_type="ppo",
        gamma=0.98,
        lam=0.8,
        clip_low=0.2,
        ppo_epochs=20,
        num_minibatches=1,
        entropy_coef=0.0,
        # rlcore's value loss is ½ (V − R)²; SB3 (rl-zoo's 0.5) weights the plain squared error.
        vf_coef=1.0,
    ),
    # 100,000 env steps: rl-zoo's budget (8 envs × 32 steps × 390 rollouts).
    runner=RunnerConfig(
        runner_type="embodied", experiment_name="ppo_cartpole", max_steps=390, rollout_steps=32
    ),
    checkpoint=CheckpointConfig(interval=100, keep_last=2),
)

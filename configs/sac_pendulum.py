"""SAC on Pendulum-v1: env workers and the learner in two processes, overlapping."""

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
    SACConfig,
)

config = Config(
    # The learner in one process, the envs and the policy copy that steps them in another:
    # while the learner trains on one chunk the collector gathers the next.
    cluster=ClusterConfig(component_placement={"actor": "0", "rollout,env": "0"}),
    actor=ActorConfig(
        model=ModelConfig(
            model_type="mlp_policy",
            category="embodied",
            model_kwargs={
                "obs_dim": 3,
                "action_dim": 1,
                "action_type": "tanh_gaussian",
                "action_low": -2.0,
                "action_high": 2.0,
                "hidden_sizes": "256,256",
                "activation": "relu",
            },
        ),
        # The actor's learning rate (SAC's own optimizers; no gradient clipping).
        optim=OptimConfig(lr=1e-3),
    ),
    env=EnvConfig(env_type="gymnasium", env_id="Pendulum-v1", num_envs=4),
    # rl-zoo's Pendulum-v1 SAC: lr 1e-3, 20,000 steps; one update per transition.
    algorithm=AlgorithmConfig(
        loss_type="sac",
        gamma=0.99,
        sac=SACConfig(
            replay_size=100_000,
            batch_size=256,
            learning_starts=1000,
            utd_ratio=1.0,
            q_lr=1e-3,
        ),
    ),
    # 4 envs × 25 steps = 100 transitions per chunk, 200 chunks: 20,000 env steps.
    runner=RunnerConfig(
        runner_type="embodied", experiment_name="sac_pendulum", max_steps=200, rollout_steps=25
    ),
    checkpoint=CheckpointConfig(interval=50, keep_last=2),
)

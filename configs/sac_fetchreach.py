"""SAC on FetchReach (MuJoCo, gymnasium-robotics, dense reward): a Fetch arm reaches a 3-D goal."""

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
    # The learner in one process, the MuJoCo envs and the policy copy that steps them in another.
    cluster=ClusterConfig(component_placement={"actor": "0", "rollout,env": "0"}),
    actor=ActorConfig(
        model=ModelConfig(
            model_type="mlp_policy",
            category="embodied",
            # observation (10) + achieved goal (3) + desired goal (3), concatenated by the stepper.
            model_kwargs={
                "obs_dim": 16,
                "action_dim": 4,
                "action_type": "tanh_gaussian",
                "action_low": -1.0,
                "action_high": 1.0,
                "hidden_sizes": "128,128",
                "activation": "relu",
            },
        ),
        optim=OptimConfig(lr=1e-3),
    ),
    # Dense reward −‖achieved − desired‖; success when the gripper is within 5 cm of the goal.
    env=EnvConfig(env_type="gymnasium", env_id="gymnasium_robotics:FetchReachDense-v4", num_envs=4),
    # rl-zoo's FetchReach settings without hindsight relabelling: γ 0.95, lr 1e-3.
    algorithm=AlgorithmConfig(
        loss_type="sac",
        gamma=0.95,
        sac=SACConfig(
            replay_size=100_000,
            batch_size=256,
            learning_starts=1000,
            utd_ratio=1.0,
            q_lr=1e-3,
        ),
    ),
    # 4 envs × 25 steps = 100 transitions per chunk (two chunks per 50-step episode), 150 chunks.
    runner=RunnerConfig(
        runner_type="embodied", experiment_name="sac_fetchreach", max_steps=150, rollout_steps=25
    ),
    checkpoint=CheckpointConfig(interval=50, keep_last=2),
)

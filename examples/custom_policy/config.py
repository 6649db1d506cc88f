"""PPO with this example's own policy and env: ``linear_gaussian`` on ``point_reach``.

Both names come from the extension package ``rlshell_point_reach`` beside this
file; run with it on the path and named by ``RLSHELL_EXT_MODULE``::

    PYTHONPATH=examples/custom_policy RLSHELL_EXT_MODULE=rlshell_point_reach \\
        python -m rlshell.train examples/custom_policy/config.py

A random walk scores about −18 per episode; after 12 steps (6,144 env steps)
the policy scores about −6 and reaches the goal in most episodes, after 40
(20,480 env steps) about −2.7, reaching it every time.
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
    # One process steps the envs and trains (the embodied runner's layout, as ppo_cartpole).
    cluster=ClusterConfig(component_placement={"actor,rollout,env": "0:0"}),
    actor=ActorConfig(
        model=ModelConfig(
            model_type="linear_gaussian",
            category="embodied",
            model_kwargs={"obs_dim": 4, "action_dim": 2, "hidden": 64, "init_log_std": -0.5},
        ),
        optim=OptimConfig(lr=1e-2, adam_eps=1e-5, clip_grad=0.5),
    ),
    # env_id only names the env in logs and errors; the builder reads num_envs and
    # max_episode_steps.
    env=EnvConfig(env_type="point_reach", env_id="PointReach", num_envs=16, max_episode_steps=20),
    # 16 envs × 32 steps per rollout, 10 epochs of 4 minibatches of 128 samples.
    algorithm=AlgorithmConfig(
        adv_type="gae",
        loss_type="ppo",
        gamma=0.99,
        lam=0.95,
        clip_low=0.2,
        ppo_epochs=10,
        num_minibatches=4,
    ),
    runner=RunnerConfig(
        runner_type="embodied", experiment_name="point_reach", max_steps=40, rollout_steps=32
    ),
    checkpoint=CheckpointConfig(interval=20, keep_last=1),
)

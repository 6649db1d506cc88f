"""PPO with a flow policy (``flow_policy``, Flow-SDE, chunks of 5 actions) on MetaWorld's reach.

MetaWorld MT1 ``reach-v3`` from its 39-number state, 4 envs in one process, episodes cut at
100 steps (MetaWorld's own limit is 500; its scripted policy reaches the goal in under 50),
so an episode is 20 policy steps of 5 actions each. PPO's settings are
configs/ppo_pushcube_cpu.py's (γ 0.8 per policy step, λ 0.9, KL-stopped epochs) with
MetaWorld's dense reward scaled by its running return's spread. Start it from behaviour
cloning (configs/sft_flow_metaworld_reach.py) with
``actor.model.checkpoint=runs/sft_flow_metaworld_reach/checkpoints/global_step_300``;
docs/embodied.md compares the two starts at equal env steps.
"""

from pathlib import Path

from attrs import evolve

from rlshell.config import ClusterConfig, EnvConfig, ModelConfig, read_config

PUSHCUBE = read_config(Path(__file__).with_name("ppo_pushcube_cpu.py"))

config = evolve(
    PUSHCUBE,
    cluster=ClusterConfig(component_placement={"actor,rollout,env": "0:0"}),
    actor=evolve(
        PUSHCUBE.actor,
        # A tenth of PushCube's 3e-4: the cloned flow keeps what it learned (at 3e-4 PPO's
        # first updates undid it: success 0.7 to 0 in 20 updates). From scratch use 3e-4.
        optim=evolve(PUSHCUBE.actor.optim, lr=3e-5),
        model=ModelConfig(
            model_type="flow_policy",
            category="embodied",
            model_kwargs={
                "obs_dim": 39,
                "action_dim": 4,
                "action_low": -1.0,
                "action_high": 1.0,
                "action_chunk": 5,
                "num_steps": 4,
                "noise_method": "flow_sde",
                "noise_level": 0.5,
                "hidden_sizes": "256,256",
                "normalize_obs": True,
            },
        ),
    ),
    env=EnvConfig(
        env_type="metaworld",
        env_id="reach-v3",
        num_envs=4,
        max_episode_steps=100,
    ),
    algorithm=evolve(PUSHCUBE.algorithm, bootstrap_at_done="truncated", norm_reward=True),
    runner=evolve(
        PUSHCUBE.runner, experiment_name="ppo_flow_metaworld_reach", max_steps=200, rollout_steps=20
    ),
    checkpoint=evolve(PUSHCUBE.checkpoint, interval=50),
)

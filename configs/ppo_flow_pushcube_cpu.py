"""PPO with a flow-matching policy (``flow_policy``, Flow-SDE) on PushCube-v1 from state.

``configs/ppo_pushcube_cpu.py`` (4 env processes on 2 CPU cores, γ 0.8, λ 0.9, KL-stopped
updates of 8 epochs × 4 minibatches, success bootstrapped like a time limit) with its
Gaussian MLP replaced by πRL's recipe for flow policies (Chen et al. 2025,
arXiv:2510.25889): a velocity network denoises an action in ``num_steps`` steps, one of
them, drawn per sample, a Gaussian step of the SDE with the flow's marginals (Flow-SDE,
noise level 0.5), whose log-likelihood PPO's ratio uses. States are normalised by running
statistics, as the MLP config does. From scratch it does not learn the task yet (one seed:
success 0.10 over the last 50 of 1,500 updates, 0.26 at best; docs/embodied.md says why).
"""

from pathlib import Path

from attrs import evolve

from rlshell.config import read_config

MLP = read_config(Path(__file__).with_name("ppo_pushcube_cpu.py"))

config = evolve(
    MLP,
    actor=evolve(
        MLP.actor,
        model=evolve(
            MLP.actor.model,
            model_type="flow_policy",
            model_kwargs={
                "obs_dim": 35,
                "action_dim": 8,
                "action_low": -1.0,
                "action_high": 1.0,
                "num_steps": 4,
                "noise_method": "flow_sde",
                "noise_level": 0.5,
                "hidden_sizes": "256,256",
                "normalize_obs": True,
            },
        ),
    ),
    runner=evolve(MLP.runner, experiment_name="ppo_flow_pushcube_cpu"),
)

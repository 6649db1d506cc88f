"""GRPO with the rollout one step ahead of the update: configs/grpo.py, ``runner.mode='async'``.

The actor and the rollout get a process each (an actor rank and a rollout worker, one core
apiece on a 2-core machine) and run at the same time: while the actor trains on step s's
batch, the rollout samples step s+1's with the weights of step s − 1. A batch is at most
``algorithm.max_staleness`` = 1 update older than the weights it trains, so the loss is
decoupled PPO (Hilton et al. 2022; AReaL): the ratio is taken against the weights before the
update (recomputed) and each token weighted by their ratio to the sampler's, capped at 2.
One actor rank in its model's precision is not sharded, so FSDP's wrap policy is left at its
default. See docs/async.md.
"""

from pathlib import Path

from attrs import evolve

from rlshell.config import read_config

base = read_config(Path(__file__).with_name("grpo.py"))
config = evolve(
    base,
    runner=evolve(base.runner, mode="async", experiment_name="grpo_async"),
    algorithm=evolve(
        base.algorithm, max_staleness=1, loss_type="decoupled_ppo", behavior_weight_cap=2.0
    ),
    actor=evolve(
        base.actor,
        fsdp_config=evolve(
            base.actor.fsdp_config,
            wrap_policy=evolve(base.actor.fsdp_config.wrap_policy, min_num_params=0),
        ),
    ),
    cluster=evolve(
        base.cluster, component_placement={"actor": "0:0", "rollout": "0:0", "reward": "0"}
    ),
)

"""PPO with a critic on the quickstart's task: configs/grpo.py with GAE instead of group baselines.

A value model (the actor's transformer with a one-output token head, `hf_value_model`) runs in
two processes of its own on the actor's cores; each step it predicts the value of every response
token, token-level GAE (γ = λ = 1, the reward on the last token) gives the advantages and its
regression targets, and both models take two epochs over mini-batches of 8 prompts. The first
10 steps train the critic only. See docs/reasoning.md.
"""

from pathlib import Path

from attrs import evolve

from rlshell.config import CriticConfig, CriticOptimConfig, read_config

base = read_config(Path(__file__).with_name("grpo.py"))
config = evolve(
    base,
    # The critic defaults to the actor's devices, in processes of its own.
    cluster=evolve(
        base.cluster,
        component_placement={**base.cluster.component_placement, "critic": "0:0-1"},
    ),
    actor=evolve(base.actor, mini_batch_size=8),
    critic=CriticConfig(optim=CriticOptimConfig(lr=1e-3), warmup_steps=10),
    algorithm=evolve(
        base.algorithm, adv_type="gae", gamma=1.0, lam=1.0, ppo_epochs=2, value_clip=0.2
    ),
    runner=evolve(base.runner, experiment_name="ppo_critic"),
)

"""DAPO on the quickstart's task: configs/grpo.py with every DAPO switch on (Yu et al. 2025).

Dynamic sampling (groups whose samples are all right or all wrong are dropped and more prompts
drawn, at most 3 rounds a step), clip-higher (ε_low 0.2, ε_high 0.28), token-level loss
aggregation, the soft overlong penalty, and no KL term. The overlong penalty needs room past
the longest right answer (two digits and the end token): responses may run to 6 tokens, the
last 2 of them penalised, so a right answer is never penalised and rambling past it is.
See docs/reasoning.md.
"""

from pathlib import Path

from attrs import evolve

from rlshell.config import read_config

base = read_config(Path(__file__).with_name("grpo.py"))
config = evolve(
    base,
    algorithm=evolve(
        base.algorithm,
        clip_low=0.2,
        clip_high=0.28,
        loss_agg_mode="token-mean",
        dynamic_sampling=True,
        max_sampling_rounds=3,
        overlong_buffer=2,
        overlong_penalty_factor=1.0,
    ),
    rollout=evolve(base.rollout, max_new_tokens=6),
    runner=evolve(base.runner, experiment_name="dapo"),
)

"""configs/grpo_smollm2.py training LoRA adapters instead of the whole model.

The same task, engine and placement as the full fine-tuning run; the actor trains rank-16
adapters (α = 32, so a scale of 2) on every linear layer of SmolLM2-135M-Instruct's 30
blocks (peft's all-linear: the attention and MLP projections, 4.9M parameters, 3.6% of
the model), and AdamW holds them alone. After every update the collocated vLLM engine
reloads the merged weights W + 2·BA in place. The learning rate is ten times the full run's
(LoRA moves a low-rank slice of the weights and needs a larger step for the same change).
The export merges the adapters into a plain model. docs/real_model.md has the measured
curve beside the full run's.
"""

from pathlib import Path

from attrs import evolve

from rlshell.config import read_config

base = read_config(Path(__file__).with_name("grpo_smollm2.py"))
config = evolve(
    base,
    actor=evolve(
        base.actor,
        model=evolve(base.actor.model, is_lora=True, lora_rank=16, lora_alpha=32),
        optim=evolve(base.actor.optim, lr=5e-5),
    ),
    runner=evolve(base.runner, experiment_name="grpo_smollm2_lora"),
)

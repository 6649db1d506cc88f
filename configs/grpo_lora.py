"""The quickstart's GRPO task (configs/grpo.py) training LoRA adapters (peft), not the weights.

Only the adapters train (AdamW holds them alone) and are checkpointed; the rollout engine holds the
plain model and receives the merged weights W + (α/r)·BA after every update; the export is the
plain model with the adapters merged in. The model is built at random, so besides the attention
and MLP projections (peft's all-linear) the adapters go on the embedding and the output head too:
frozen at their random init (std 0.02), those would bound the logits to about ±1.3. A LoRA run on
a pretrained model (actor.model.path) leaves the default targets. See docs/reasoning.md#lora.
"""

from pathlib import Path

from attrs import evolve

from rlshell.config import OptimConfig, read_config

base = read_config(Path(__file__).with_name("grpo.py"))
config = evolve(
    base,
    actor=evolve(
        base.actor,
        model=evolve(
            base.actor.model,
            is_lora=True,
            lora_rank=16,
            lora_alpha=32,
            lora_target_modules=(
                *("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
                *("embed_tokens", "lm_head"),
            ),
        ),
        optim=OptimConfig(lr=5e-4),
    ),
    runner=evolve(base.runner, experiment_name="grpo_lora"),
)

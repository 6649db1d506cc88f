"""SFT on demonstrations of the arithmetic task: configs/grpo.py's tiny LM learns from answers.

The demonstrations (configs/data/sft_arithmetic_*.jsonl) are conversations of a user's prompt and
the assistant's right answer: 400 prompts of configs/grpo.py's training split, and its 200
held-out prompts to evaluate on (never trained on, here or in the RL run after). The model is
configs/grpo.py's, so a checkpoint of this run starts that config's RL run:
``configs/grpo.py actor.model.checkpoint=runs/sft_arithmetic/checkpoints/global_step_300``.
See docs/agents.md.
"""

from rlshell.config import (
    ActorConfig,
    CheckpointConfig,
    ClusterConfig,
    Config,
    DataConfig,
    FSDPConfig,
    ModelConfig,
    OptimConfig,
    RunnerConfig,
    WrapPolicyConfig,
)

config = Config(
    # Two FSDP ranks on node 0, nothing else: the sft run starts the actor alone.
    cluster=ClusterConfig(component_placement={"actor": "0:0-1"}),
    actor=ActorConfig(
        model=ModelConfig(
            model_type="hf_causal_lm",
            category="reasoning",
            model_kwargs={
                "config_class": "Qwen2Config",
                "hidden_size": 64,
                "intermediate_size": 256,
                "num_hidden_layers": 3,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "max_position_embeddings": 64,
            },
        ),
        optim=OptimConfig(lr=1e-3, lr_scheduler="cosine", min_lr_ratio=0.1),
        # As configs/grpo.py: a model this small is one FSDP unit.
        fsdp_config=FSDPConfig(wrap_policy=WrapPolicyConfig(min_num_params=1_000_000)),
    ),
    data=DataConfig(
        task="conversations",
        train_path="configs/data/sft_arithmetic_train.jsonl",
        val_path="configs/data/sft_arithmetic_val.jsonl",
    ),
    runner=RunnerConfig(
        runner_type="sft",
        experiment_name="sft_arithmetic",
        max_steps=300,
        prompts_per_step=32,
        eval_interval=50,
    ),
    checkpoint=CheckpointConfig(interval=100, keep_last=2, export_hf=True),
)

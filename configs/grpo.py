"""GRPO on a generated arithmetic task: a tiny Qwen2-style LM, trained on this CPU, no downloads."""

from rlshell.config import (
    ActorConfig,
    AlgorithmConfig,
    ClusterConfig,
    Config,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RolloutConfig,
    RunnerConfig,
)

config = Config(
    # Two FSDP ranks and two HF rollout processes time-share node 0; one reward process beside.
    cluster=ClusterConfig(component_placement={"actor,rollout": "0:0-1", "reward": "0"}),
    actor=ActorConfig(
        model=ModelConfig(
            model_type="hf_causal_lm",
            category="reasoning",
            model_kwargs={
                "config_class": "Qwen2Config",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "max_position_embeddings": 64,
            },
        ),
        optim=OptimConfig(lr=3e-4),
    ),
    rollout=RolloutConfig(backend="hf", temperature=1.0, max_new_tokens=8),
    reward=RewardConfig(reward_type="math", timeout_s=5.0),
    algorithm=AlgorithmConfig(adv_type="grpo", loss_type="ppo", group_size=8),
    runner=RunnerConfig(
        runner_type="reasoning", experiment_name="grpo", max_steps=200, prompts_per_step=16
    ),
)

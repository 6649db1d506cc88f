"""The quickstart's GRPO task (configs/grpo.py) trained by Megatron-core with tensor parallelism 2.

The two actor ranks are one model split in two (each holds one of the two key/value head groups,
half of every MLP and half of the vocabulary rows) instead of two FSDP shards; each also runs an
HF rollout engine, synced with the weights gathered back to Hugging Face names. On these CPU
machines Megatron runs over gloo through rlshell's CPU shim. The model and settings are those of
configs/grpo.py until 2026-11-25 (2 layers, 8 samples a prompt, no entropy bonus, a constant rate,
1,500 steps), which docs/megatron.md's figures compare it with. See docs/megatron.md.
"""

from rlshell.config import (
    ActorConfig,
    AlgorithmConfig,
    CheckpointConfig,
    ClusterConfig,
    Config,
    DataConfig,
    MegatronConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RolloutConfig,
    RunnerConfig,
)

config = Config(
    # Two Megatron ranks (one model, tensor parallel 2), each with an HF rollout engine in its
    # process, on node 0; one reward process beside.
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
        backend="megatron",
        megatron=MegatronConfig(tensor_model_parallel_size=2),
        # The shared prompt forward is Hugging Face's KV cache; Megatron's model has none.
        share_prompt_forward=False,
    ),
    # Answers are at most two digits and the end token: 4 new tokens leave room to be wrong.
    rollout=RolloutConfig(backend="hf", temperature=1.0, max_new_tokens=4),
    # Two scoring processes: both cores are free while the rewards are computed.
    reward=RewardConfig(reward_type="math", timeout_s=5.0, num_processes=2),
    algorithm=AlgorithmConfig(adv_type="grpo", loss_type="ppo", group_size=8),
    # Sums of three one-digit numbers: 1,000 prompts, 200 held out (never trained on).
    data=DataConfig(task="arithmetic", num_terms=3, max_operand=9, num_val=200),
    runner=RunnerConfig(
        runner_type="reasoning",
        experiment_name="grpo_megatron",
        max_steps=1500,
        prompts_per_step=16,
        eval_interval=100,
    ),
    checkpoint=CheckpointConfig(interval=500, keep_last=2, export_hf=True),
)

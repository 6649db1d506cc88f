"""The quickstart's GRPO task (configs/grpo.py) with vLLM sampling: vLLM's CPU build, in place.

Each of the two actor processes runs a vLLM engine beside its FSDP rank and reloads the engine's
weights in place after every update (no restart, no disk). vLLM's CPU attention serves head sizes
of 32 and up, so the model has 2 heads of 32 where configs/grpo.py has 4 of 16. The rest is
configs/grpo.py as it was until 2026-11-25 (2 layers, 8 samples a prompt, no entropy bonus, a
constant rate, 1,500 steps), the settings docs/rollout.md's figures were measured with.
"""

from rlshell.config import (
    ActorConfig,
    AlgorithmConfig,
    CheckpointConfig,
    ClusterConfig,
    Config,
    DataConfig,
    FSDPConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RolloutConfig,
    RunnerConfig,
    WrapPolicyConfig,
)

config = Config(
    # Two FSDP ranks, each with a vLLM engine in its process, on node 0; one reward process beside.
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
                "num_attention_heads": 2,  # head size 32: vLLM's CPU attention needs >= 32
                "num_key_value_heads": 2,
                "max_position_embeddings": 64,
            },
        ),
        optim=OptimConfig(lr=3e-4),
        # Layers under a million parameters are not worth an FSDP unit (collectives per
        # pass each): a model this small is sharded as one unit.
        fsdp_config=FSDPConfig(wrap_policy=WrapPolicyConfig(min_num_params=1_000_000)),
    ),
    # Answers are at most two digits and the end token: 4 new tokens leave room to be wrong.
    # 16 MiB of KV cache holds 8,192 tokens: the 128 sequences of a step need under 2,000.
    rollout=RolloutConfig(backend="vllm", temperature=1.0, max_new_tokens=4, cpu_kv_cache_mb=16),
    # Two scoring processes: both cores are free while the rewards are computed.
    reward=RewardConfig(reward_type="math", timeout_s=5.0, num_processes=2),
    algorithm=AlgorithmConfig(adv_type="grpo", loss_type="ppo", group_size=8),
    # Sums of three one-digit numbers: 1,000 prompts, 200 held out (never trained on).
    data=DataConfig(task="arithmetic", num_terms=3, max_operand=9, num_val=200),
    runner=RunnerConfig(
        runner_type="reasoning",
        experiment_name="grpo_vllm",
        max_steps=1500,
        prompts_per_step=16,
        eval_interval=100,
    ),
    checkpoint=CheckpointConfig(interval=500, keep_last=2, export_hf=True),
)

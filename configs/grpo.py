"""GRPO on a generated arithmetic task: a tiny Qwen2-style LM, trained on this CPU, no downloads."""

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
    # Two FSDP ranks and two HF rollout processes time-share node 0; one reward process beside.
    cluster=ClusterConfig(component_placement={"actor,rollout": "0:0-1", "reward": "0"}),
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
        # A cosine decay to 5 % of the rate over the run settles the policy at the end.
        optim=OptimConfig(lr=3e-4, lr_scheduler="cosine", min_lr_ratio=0.05),
        # Layers under a million parameters are not worth an FSDP unit (collectives per
        # pass each): a model this small is sharded as one unit.
        fsdp_config=FSDPConfig(wrap_policy=WrapPolicyConfig(min_num_params=1_000_000)),
    ),
    # Answers are at most two digits and the end token: 4 new tokens leave room to be wrong.
    rollout=RolloutConfig(backend="hf", temperature=1.0, max_new_tokens=4),
    # Two scoring processes: both cores are free while the rewards are computed.
    reward=RewardConfig(reward_type="math", timeout_s=5.0, num_processes=2),
    # 16 samples a prompt and an entropy bonus keep exploring: without them the policy settles
    # on a tens digit of 1 for every two-digit sum and never finds the sums of 20 and more
    # (held-out accuracy stops at 0.86). See docs/quickstart.md.
    algorithm=AlgorithmConfig(adv_type="grpo", loss_type="ppo", group_size=16, entropy_coef=0.05),
    # Sums of three one-digit numbers: 1,000 prompts, 200 held out (never trained on).
    data=DataConfig(task="arithmetic", num_terms=3, max_operand=9, num_val=200),
    runner=RunnerConfig(
        runner_type="reasoning",
        experiment_name="grpo",
        max_steps=4000,
        prompts_per_step=16,
        eval_interval=250,
    ),
    checkpoint=CheckpointConfig(interval=1000, keep_last=2, export_hf=True),
)

"""The quickstart's GRPO task (configs/grpo.py) training LoRA adapters (peft), not the weights.

Only the adapters train (AdamW holds them alone) and are checkpointed; the rollout engine holds the
plain model and receives the merged weights W + (α/r)·BA after every update; the export is the
plain model with the adapters merged in. The model is built at random, so besides the attention
and MLP projections (peft's all-linear) the adapters go on the embedding and the output head too:
frozen at their random init (std 0.02), those would bound the logits to about ±1.3. A LoRA run on
a pretrained model (actor.model.path) leaves the default targets. See docs/reasoning.md#lora.
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
            is_lora=True,
            lora_rank=16,
            lora_alpha=32,
            lora_target_modules=(
                *("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
                *("embed_tokens", "lm_head"),
            ),
        ),
        optim=OptimConfig(lr=5e-4),
        # Layers under a million parameters are not worth an FSDP unit (collectives per
        # pass each): a model this small is sharded as one unit.
        fsdp_config=FSDPConfig(wrap_policy=WrapPolicyConfig(min_num_params=1_000_000)),
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
        experiment_name="grpo_lora",
        max_steps=1500,
        prompts_per_step=16,
        eval_interval=100,
    ),
    checkpoint=CheckpointConfig(interval=500, keep_last=2, export_hf=True),
)

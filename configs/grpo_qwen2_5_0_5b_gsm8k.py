"""GRPO on GSM8K with Qwen2.5-0.5B-Instruct: FSDP2 actor and vLLM rollout sharing one GPU.

Nothing is downloaded: put the model and the data on disk first, e.g.
``models/Qwen2.5-0.5B-Instruct`` (a Hugging Face directory) and
``data/gsm8k/{train,test}.parquet`` with ``prompt`` and ``answer`` columns
(GSM8K's answers end with ``#### <number>``; only that number is compared).
``--dry-run`` validates and plans it on any machine (add ``cluster.simulate=1x1``
to plan for a GPU node from a CPU one).
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
)

config = Config(
    # Actor and rollout time-share GPU 0 (offloading between phases); the reward beside them.
    cluster=ClusterConfig(component_placement={"actor,rollout": "0", "reward": "0"}),
    actor=ActorConfig(
        model=ModelConfig(
            model_type="hf_causal_lm",
            category="reasoning",
            path="models/Qwen2.5-0.5B-Instruct",
            precision="fp32",
            gradient_checkpointing=True,
        ),
        optim=OptimConfig(lr=1e-6, weight_decay=0.01, clip_grad=1.0),
        fsdp_config=FSDPConfig(mixed_precision="bf16"),
        micro_batch_max_tokens=16384,
        logprob_chunk_size=1024,
        cpus_per_worker=1.0,
    ),
    rollout=RolloutConfig(
        backend="vllm",
        precision="bf16",
        temperature=1.0,
        max_new_tokens=512,
        gpu_memory_utilization=0.4,
        weight_sync="bucket",
        bucket_size_mb=256.0,
    ),
    reward=RewardConfig(reward_type="math", timeout_s=10.0, num_processes=4, cpus_per_worker=0.5),
    data=DataConfig(
        task="file",
        train_path="data/gsm8k/train.parquet",
        val_path="data/gsm8k/test.parquet",
    ),
    algorithm=AlgorithmConfig(
        adv_type="grpo", loss_type="ppo", group_size=8, kl_coef=0.001, kl_kind="k3"
    ),
    runner=RunnerConfig(
        runner_type="reasoning",
        experiment_name="grpo_qwen2_5_0_5b_gsm8k",
        max_steps=500,
        prompts_per_step=64,
        eval_interval=25,
    ),
    checkpoint=CheckpointConfig(interval=50, keep_last=3, resume="auto"),
)

"""GRPO on GSM8K with Qwen2.5-0.5B-Instruct: FSDP2 actor, vLLM rollout on one GPU.

vLLM's GPU build runs it on a GPU machine (install the ``gpu`` extra into an
environment of its own: docs/rollout.md); on these CPU machines vLLM's CPU
build serves the same engine (``rollout.backend=vllm``), and
``rollout.backend=hf`` samples with HF ``generate`` instead, more slowly. It has
not been trained end to end here: the real model post-trained end to end on a
CPU is SmolLM2-135M-Instruct, configs/grpo_smollm2.py (docs/real_model.md).

The model and the data are Hub ids, read through the Hugging Face cache
(docs/config.md, "Models and data from the Hugging Face Hub"): fetch them
once with ``hf download Qwen/Qwen2.5-0.5B-Instruct`` and ``hf download
openai/gsm8k --repo-type dataset`` and run with ``HF_HUB_OFFLINE=1``, or let
the run download what the cache lacks. GSM8K's ``main`` folder holds
``train-*.parquet`` and ``test-*.parquet`` with ``question`` and ``answer``
columns (answers end with ``#### <number>``; only that number is compared).
Local paths work too: ``actor.model.path=models/Qwen2.5-0.5B-Instruct``.
``--dry-run`` validates and plans it on any machine without the cache (add
``cluster.simulate=1x1`` to plan for a GPU node from a CPU one).
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
            path="Qwen/Qwen2.5-0.5B-Instruct",
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
        train_path="openai/gsm8k/main",
        val_path="openai/gsm8k/main",
        prompt_key="question",
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

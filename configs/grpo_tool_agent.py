"""GRPO with a calculator tool over multi-turn rollouts, from the SFT warm start.

The model starts from configs/sft_tool_calls.py's last checkpoint (run that
first) and answers products of two numbers up to 999: a turn may call the
calculator (``<call>347*829</call>``), whose answer comes back as an
observation (``<result>287663</result>``) the model reads but is not
trained on; the trajectory ends at a turn without a call. The reward is the
final turn's answer, checked by math-verify. docs/agents.md has the curves
and the same model evaluated without the tool.

    python -m rlshell.train configs/sft_tool_calls.py
    python -m rlshell.train configs/grpo_tool_agent.py
"""

from pathlib import Path

from rlshell.config import (
    ActorConfig,
    AgentConfig,
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
    read_config,
)

# The warm start: configs/sft_tool_calls.py's model, and its last checkpoint.
SFT = read_config(Path(__file__).with_name("sft_tool_calls.py"))
SFT_CHECKPOINT = (
    f"{SFT.runner.output_dir}/{SFT.runner.experiment_name}/checkpoints/"
    f"global_step_{SFT.runner.max_steps}"
)

config = Config(
    cluster=ClusterConfig(component_placement={"actor,rollout": "0:0-1", "reward": "0"}),
    actor=ActorConfig(
        model=ModelConfig(
            model_type="hf_causal_lm",
            category="reasoning",
            # The architecture is the SFT run's; the weights and the tokenizer (with the
            # agent's markers as tokens) come from its checkpoint.
            model_kwargs=SFT.actor.model.model_kwargs,
            checkpoint=SFT_CHECKPOINT,
        ),
        optim=OptimConfig(lr=1e-4),
        fsdp_config=FSDPConfig(wrap_policy=WrapPolicyConfig(min_num_params=1_000_000)),
    ),
    # A turn: a call (9 tokens) or an answer (6 digits and the end token).
    rollout=RolloutConfig(backend="hf", temperature=1.0, max_new_tokens=10),
    agent=AgentConfig(
        tools=("calculator",),
        default_tool="calculator",
        max_turns=3,
        max_total_tokens=40,
        num_tool_processes=1,
    ),
    reward=RewardConfig(reward_type="math", timeout_s=5.0, num_processes=1),
    algorithm=AlgorithmConfig(adv_type="grpo", loss_type="ppo", group_size=8),
    data=DataConfig(
        task="arithmetic",
        num_terms=2,
        max_operand=999,
        num_val=200,
        num_train=4000,
        operator="*",
    ),
    runner=RunnerConfig(
        runner_type="reasoning",
        experiment_name="grpo_tool_agent",
        max_steps=100,
        prompts_per_step=16,
        eval_interval=25,
    ),
    checkpoint=CheckpointConfig(interval=100, keep_last=1, export_hf=True),
)

"""SFT on generated calculator-call demonstrations: the warm start of grpo_tool_agent.py.

The task is products of two numbers up to 999 (``347*829=``): six-digit
answers that a model this small cannot work out in the few tokens it writes,
but can copy from a calculator. Each demonstration is a conversation: the
prompt; the call ``<call>347*829</call>``; the calculator's answer as the
tool's message; the answer again as the final turn. The first time this file
is loaded it writes them to ``runs/data/tool_calls/{train,val}.jsonl`` (the
task's training and held-out prompts; `rlshell.conversation.tool_call_demonstrations`).

    python -m rlshell.train configs/sft_tool_calls.py
    python -m rlshell.train configs/grpo_tool_agent.py     # RL from its last checkpoint
"""

import os
from pathlib import Path

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
    read_config,
)
from rlshell.conversation import tool_call_demonstrations, write_conversations
from rlshell.data import ArithmeticTask, Split, arithmetic_task

# The RL config draws its prompts from the same task: its held-out prompts are never trained on.
TASK = ArithmeticTask(
    num_terms=2, max_operand=999, num_val=200, num_train=4000, seed=0, operator="*"
)
DATA = Path("runs/data/tool_calls")
MAX_STEPS = 300

# configs/grpo.py's tiny Qwen2-style model (its 64 positions hold a whole trajectory).
MODEL_KWARGS = read_config(Path(__file__).with_name("grpo.py")).actor.model.model_kwargs


def demonstrations(split: Split) -> str:
    """The split's demonstrations, written once (atomically) and read by every later run."""
    path = DATA / f"{split}.jsonl"
    if not path.is_file():
        DATA.mkdir(parents=True, exist_ok=True)
        examples = [(e.prompt, e.answer) for e in arithmetic_task(split, TASK)]
        staging = path.with_name(f".{path.name}.{os.getpid()}")
        write_conversations(staging, tool_call_demonstrations(examples, "<call>", "</call>"))
        staging.replace(path)
    return str(path)


config = Config(
    # SFT needs no rollout or reward: the actor's two FSDP ranks alone.
    cluster=ClusterConfig(component_placement={"actor": "0:0-1"}),
    actor=ActorConfig(
        model=ModelConfig(
            model_type="hf_causal_lm", category="reasoning", model_kwargs=MODEL_KWARGS
        ),
        optim=OptimConfig(lr=1e-3, lr_scheduler="cosine", min_lr_ratio=0.1),
        fsdp_config=FSDPConfig(wrap_policy=WrapPolicyConfig(min_num_params=1_000_000)),
    ),
    data=DataConfig(
        task="conversations", train_path=demonstrations("train"), val_path=demonstrations("val")
    ),
    runner=RunnerConfig(
        runner_type="sft",
        experiment_name="sft_tool_calls",
        max_steps=MAX_STEPS,
        prompts_per_step=64,
        eval_interval=50,
    ),
    checkpoint=CheckpointConfig(interval=MAX_STEPS, keep_last=1, export_hf=True),
)

"""GRPO with a calculator tool on a real pretrained model: SmolLM2-135M-Instruct.

The task and the budget of ``configs/grpo_smollm2.py`` (sums of two numbers up to 30 asked
as questions, 200 held out), with the calculator in reach: the system prompt says how to
call it and shows one call. A turn of the model is a whole turn of its chat template (it
ends at ``<|im_end|>``); a turn whose text ends with ``<call>EXPRESSION</call>`` has the
expression computed in the tool sandbox, and the result comes back as the template's
``tool`` turn; the model then writes its answer in a new assistant turn. math-verify reads
the final turn.

Measured (docs/real_model.md#tools-on-the-real-model): the model as it is writes no call
at all (0 of 120 samples at temperature 1 over five system prompts, this one and the
Hermes ``<tool_call>`` format among them), so GRPO has nothing to reinforce: a run of this
config trains the no-tool policy under a longer prompt. It is the agent loop on a real
chat template, run for two steps in CI (tests/shell/test_real_model.py).
"""

from pathlib import Path

from attrs import evolve

from rlshell.config import AgentConfig, read_config

BASE = read_config(Path(__file__).with_name("grpo_smollm2.py"))

SYSTEM_PROMPT = (
    "You are a helpful assistant with a calculator. To use it, write the expression "
    "between <call> and </call> and stop; the result comes back to you. Example:\n"
    "user: What is 12 + 9?\nassistant: <call>12 + 9</call>\ntool: 21\nassistant: 21"
)

config = evolve(
    BASE,
    # A trajectory: up to two turns of 24 tokens, and the tool's short answer between them.
    agent=AgentConfig(
        tools=("calculator",),
        default_tool="calculator",
        max_turns=2,
        max_total_tokens=80,
        num_tool_processes=1,
    ),
    data=evolve(BASE.data, system_prompt=SYSTEM_PROMPT),
    runner=evolve(BASE.runner, experiment_name="grpo_tool_smollm2"),
)

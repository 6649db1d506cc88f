"""GRPO with a calculator tool on a real pretrained model: SmolLM2-135M-Instruct.

The task and the budget of ``configs/grpo_smollm2.py`` (sums of two numbers up to 30 asked
as questions, 200 held out), with the calculator in reach: the system prompt says how to
call it, and one worked example (question, call, the tool's result, answer) comes before
each question as turns of the model's chat template (``data.few_shot``). A turn of the
model is a whole turn of its template (it ends at ``<|im_end|>``); a turn whose text ends
with ``<call>EXPRESSION</call>`` has the expression computed in the tool sandbox, and the
result comes back as the template's ``tool`` turn; the model then writes its answer in a
new assistant turn. math-verify reads the final turn. No training on the task comes first.

Measured before RL (docs/real_model.md#tools-on-the-real-model, benchmarks/tool_call_rate.py):
the system prompt alone draws no call (0 of 96 samples), the example written out in the
system prompt 5 of 96, the example as turns (this config) 27 of 96: enough for GRPO's
groups to disagree. It runs for two steps in CI (tests/shell/test_real_model.py).
"""

from pathlib import Path

from attrs import evolve

from rlshell.config import AgentConfig, read_config

BASE = read_config(Path(__file__).with_name("grpo_smollm2.py"))

SYSTEM_PROMPT = (
    "You are a helpful assistant with a calculator. To use it, write the expression "
    "between <call> and </call> and stop; the result comes back to you."
)
# One worked example, as turns of the model's own template (data.few_shot): the question,
# the call, the tool's result, the answer. The same text inside the system prompt drew no
# call in 96 samples; as turns, 17 of 96 (docs/real_model.md#tools-on-the-real-model).
FEW_SHOT = (
    ("user", "What is 12 + 9? Answer with the number only."),
    ("assistant", "<call>12 + 9</call>"),
    ("tool", "21"),
    ("assistant", "21"),
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
    data=evolve(BASE.data, system_prompt=SYSTEM_PROMPT, few_shot=FEW_SHOT),
    runner=evolve(BASE.runner, experiment_name="grpo_tool_smollm2"),
)

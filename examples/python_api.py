"""rlstack from Python, notebook style: GRPO with a reward function written here.

Run it as a script (``.venv/bin/python examples/python_api.py``, about 40 s on
two CPU cores) or cell by cell (``# %%``) in Jupyter or VS Code. It builds a
config from the typed records, trains the default tiny language model for a
few steps with a reward defined below (sent to the Ray reward workers as a
Python object), evaluates the last checkpoint, exports it as a Hugging Face
directory and loads that back with transformers. Everything is written under
``runs/python_api`` in the current directory; the last line printed is a
JSON summary.
"""

# %% The reward: partial credit for being close, which exact-match rewards lack.
from __future__ import annotations

import json
import re

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlshell.api import evaluate, export, load_config, train
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

FIRST_INTEGER = re.compile(r"-?\d+")


def close_enough(response: str, answer: str) -> float:
    """1 for the right sum, 0.1 less per unit away, 0 past ten away or without a number."""
    found = FIRST_INTEGER.search(response)
    if found is None:
        return 0.0
    return max(0.0, 1.0 - 0.1 * abs(int(found.group()) - int(answer)))


print(f"close_enough('12', '12') = {close_enough('12', '12')}")
print(f"close_enough('9', '12') = {close_enough('9', '12'):.1f}")

# %% The config, built from its typed records (a smaller model than configs/grpo.py's, shortened).
config = Config(
    # One actor process that also generates, one reward process beside it.
    cluster=ClusterConfig(component_placement={"actor,rollout": "0:0", "reward": "0"}),
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
        ),
        optim=OptimConfig(lr=3e-4),
        # A single rank has nothing to shard: FSDP wraps the model whole.
        fsdp_config=FSDPConfig(wrap_policy=WrapPolicyConfig(min_num_params=0)),
    ),
    rollout=RolloutConfig(backend="hf", temperature=1.0, max_new_tokens=4),
    # The config names the reward; train() below is given the function itself.
    reward=RewardConfig(reward_type="close_enough", timeout_s=5.0, num_processes=1),
    algorithm=AlgorithmConfig(adv_type="grpo", loss_type="ppo", group_size=4),
    data=DataConfig(task="arithmetic", num_terms=3, max_operand=9, num_val=16),
    runner=RunnerConfig(
        runner_type="reasoning",
        experiment_name="python_api",
        max_steps=4,
        prompts_per_step=4,
        eval_interval=2,
    ),
    checkpoint=CheckpointConfig(interval=2, keep_last=1, export_hf=True),
)
# Validated now, with the reward registered, so a mistake shows before Ray starts.
config = load_config(config, rewards=close_enough)
print(
    f"config: {config.runner.max_steps} steps of {config.algorithm.adv_type} on "
    f"{config.data.task}, scored by {config.reward.reward_type}"
)

# %% Train: Ray starts, the workers run, Ray stops; the result says what the run left.
result = train(config, rewards=close_enough)
print(f"trained {result.final_step} steps in {result.run_dir}")
print(
    f"last step: reward/mean {result.metrics['reward/mean']:.3f}, "
    f"eval/accuracy {result.metrics['eval/accuracy']:.3f}"
)
print(f"checkpoint: {result.checkpoint.name if result.checkpoint else None}")

# %% Evaluate the last checkpoint on the held-out split, greedily, scored by the same reward.
report = evaluate(result, limit=16, rewards=close_enough)
print(
    f"evaluation: eval/accuracy {report['eval/accuracy']:.3f} "
    f"on {report['eval/examples']:.0f} held-out sums"
)

# %% Export a Hugging Face directory and load it back with transformers.
hf_dir = export(result, result.run_dir / "exported")
model = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True).eval()
tokenizer = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
prompt = "3+4+5="
inputs = tokenizer([prompt], return_tensors="pt")
with torch.no_grad():
    generated = model.generate(**inputs, max_new_tokens=4, do_sample=False)
new_tokens = generated[0, inputs["input_ids"].shape[1] :]
completion = tokenizer.decode(new_tokens, skip_special_tokens=True)
print(f"exported to {hf_dir.name}/; the model answers {prompt!r} with {completion!r}")

# %% One line for scripts and tests.
print(
    json.dumps(
        {
            "example": "python_api",
            "final_step": result.final_step,
            "reward_mean": result.metrics["reward/mean"],
            "eval_accuracy": report["eval/accuracy"],
            "checkpoint": str(result.checkpoint),
            "exported": str(hf_dir),
            "completion": completion,
        }
    )
)

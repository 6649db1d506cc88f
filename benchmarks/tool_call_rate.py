"""How often the real model calls the calculator before any training, by how it is shown the call.

SmolLM2-135M-Instruct (make install's), the held-out prompts of
``configs/grpo_tool_smollm2.py`` rendered by the config's own data path
(`rlshell.data.load_prompts`: the model's chat template, the system prompt, the worked
examples of ``data.few_shot``), sampled at the config's temperature with Hugging Face
``generate`` (``--samples`` per prompt, the config's ``rollout.max_new_tokens``, stopped
at the end of the turn). A sample calls the tool when its first turn holds ``<call>``.
Rows (the baseline of the comparison is the first: the system prompt alone):

- ``system_prompt_only``: ``data.few_shot=()``;
- ``example_in_system_prompt``: no turns, the worked example written out in the system
  prompt instead (``user: ... assistant: <call>...``), the config's earlier form;
- ``one_example_turns``: the config as it is (one worked example as turns);
- ``three_example_turns``: three worked examples as turns.

Prints one JSON object: per row, the samples, the calls, the rate and its Wilson 95%
interval. ``--quick``: 2 prompts × 2 samples (a smoke run).

    .venv/bin/python benchmarks/tool_call_rate.py [--quick] [--prompts 12] [--samples 8]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path
from typing import Any

import torch
from attrs import evolve

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "grpo_tool_smollm2.py"


def shots(pairs: list[tuple[int, int]]) -> tuple[tuple[str, str], ...]:
    turns: list[tuple[str, str]] = []
    for a, b in pairs:
        turns += [
            ("user", f"What is {a} + {b}? Answer with the number only."),
            ("assistant", f"<call>{a} + {b}</call>"),
            ("tool", str(a + b)),
            ("assistant", str(a + b)),
        ]
    return tuple(turns)


def wilson(calls: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 0.0)
    p = calls / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--samples", type=int, default=8)
    args = parser.parse_args()
    prompts, samples = (2, 2) if args.quick else (args.prompts, args.samples)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlshell.data import load_prompts
    from rlshell.hub import pretrained_source
    from rlshell.runners.validation import load_config

    torch.manual_seed(0)
    config = load_config(CONFIG)
    source, options = pretrained_source(str(config.actor.model.path))
    tokenizer = AutoTokenizer.from_pretrained(source, **options)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **options).eval()
    data = config.data
    in_prose = (
        f"{data.system_prompt} Example:\nuser: What is 12 + 9?\nassistant: <call>12 + 9</call>"
        "\ntool: 21\nassistant: 21"
    )
    rows_data = {
        "system_prompt_only": evolve(data, few_shot=()),
        "example_in_system_prompt": evolve(data, few_shot=(), system_prompt=in_prose),
        "one_example_turns": data,
        "three_example_turns": evolve(data, few_shot=shots([(12, 9), (27, 14), (5, 30)])),
    }
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows: dict[str, Any] = {}
    for name, row_data in rows_data.items():
        examples = load_prompts(row_data, "val", lambda: tokenizer)[:prompts]
        started = time.perf_counter()
        calls = n = 0
        example = ""
        for prompt in examples:
            ids = tokenizer(prompt.prompt, return_tensors="pt").input_ids.repeat(samples, 1)
            with torch.no_grad():
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=True,
                    temperature=config.rollout.temperature,
                    max_new_tokens=config.rollout.max_new_tokens,
                    eos_token_id=end,
                    pad_token_id=tokenizer.pad_token_id,
                )
            for row in out[:, ids.shape[1] :]:
                text = tokenizer.decode(row, skip_special_tokens=True)
                n += 1
                calls += "<call>" in text
                example = example or text
        low, high = wilson(calls, n)
        rows[name] = {
            "samples": n,
            "calls": calls,
            "rate": calls / n,
            "rate_95": [low, high],
            "first_sample": example,
            "seconds": time.perf_counter() - started,
        }
    print(
        json.dumps(
            {
                "benchmark": "tool_call_rate",
                "quick": args.quick,
                "config": "configs/grpo_tool_smollm2.py",
                "prompts": prompts,
                "samples_per_prompt": samples,
                "baseline": "system_prompt_only",
                "machine": {"cpus": torch.get_num_threads(), "python": platform.python_version()},
                "rows": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

"""One rank's share of a `grpo_step.py` step: where it goes, and the eager model's floor.

`grpo_step.py` races rlstack against TRL's fastest setup, torchrun's two
processes of one thread, in which each process does what one rlstack rank
does: it samples 64 of the step's 128 completions (8 prompts × 8) and trains
on them. This script times the pieces of that share in one process of one
torch thread, on the same models (``grpo_step.SIZES``), to show how much of
it is the model's arithmetic, which both sides must do, and what the obvious
ways to do it faster give here:

- ``generate``: Transformers' ``generate`` with sampling and a dynamic
  key/value cache, 64 rows × 32 new tokens (the baseline: what both
  `HFRolloutEngine` and TRL call);
- ``decode_forward_only``: the same forward passes with the same cache and a
  multinomial draw per token, without ``generate``'s own loop (its logits
  processors, stopping criteria and bookkeeping): the loop's cost is the
  difference;
- ``generate_static_cache``: ``generate`` with ``cache_implementation="static"``,
  the precondition of compiling the decode step (Transformers compiles it
  only on CUDA: on the CPU it says so and skips compilation);
- ``update_forward``: the forward of the update's 64 rows without gradients,
  with its GFLOP/s (2 · parameters · tokens): the arithmetic rate of the
  eager model on one core;
- ``update_forward_backward``: the update's forward and backward, eager
  (the baseline) and under ``torch.compile`` (Inductor's CPU code), with the
  compilation's own seconds for the first width and for a second width.

Prints one JSON object. ``--quick``: the small model, 2 prompts × 4 rows ×
8 tokens, one repeat, no compilation (its figures mean nothing).

    .venv/bin/python benchmarks/grpo_compute.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grpo_step import SIZES, build_model  # the race's own models

FULL = {"sizes": ["0.5M", "5M"], "prompts": 8, "group_size": 8, "new_tokens": 32, "repeats": 5}
QUICK = {"sizes": ["0.5M"], "prompts": 2, "group_size": 4, "new_tokens": 8, "repeats": 1}


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The median of ``repeats`` timed calls after one untimed call."""
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(size: str, spec: dict[str, Any], compile_update: bool) -> dict[str, Any]:
    import torch
    import transformers

    from rlshell.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.padding_side = "left"
    model = build_model(SIZES[size], tokenizer).eval()
    parameters = sum(p.numel() for p in model.parameters())
    prompts = [f"{10 + i}+{3 + i}=" for i in range(spec["prompts"])]
    encoded = tokenizer(prompts, return_tensors="pt", padding=True)
    rows = spec["prompts"] * spec["group_size"]
    ids = encoded["input_ids"].repeat_interleave(spec["group_size"], 0)
    mask = encoded["attention_mask"].repeat_interleave(spec["group_size"], 0)
    new = spec["new_tokens"]
    repeats = spec["repeats"]

    def generate(**extra: Any) -> Any:
        with torch.inference_mode():
            return model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                return_dict_in_generate=True,
                output_logits=True,
                **extra,
            )

    def decode_forward_only() -> None:
        with torch.inference_mode():
            cache = transformers.DynamicCache()
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                        past_key_values=cache, use_cache=True)  # fmt: skip
            token = torch.multinomial(out.logits[:, -1].softmax(-1), 1)
            seen, position = mask, positions[:, -1:]
            for _ in range(new - 1):
                seen = torch.cat([seen, torch.ones_like(token)], 1)
                position = position + 1
                out = model(input_ids=token, attention_mask=seen, position_ids=position,
                            past_key_values=out.past_key_values, use_cache=True)  # fmt: skip
                token = torch.multinomial(out.logits[:, -1].softmax(-1), 1)

    width = ids.shape[1] + new
    batch = torch.randint(4, len(tokenizer), (rows, width))

    def forward_backward(net: Any, tokens: Any) -> None:
        logits = net(input_ids=tokens).logits
        logits.float().log_softmax(-1).mean().backward()

    def forward() -> None:
        with torch.no_grad():
            model(input_ids=batch)

    report: dict[str, Any] = {"parameters": parameters, "rows": rows, "new_tokens": new}
    gen_s = median_seconds(generate, repeats)
    decode_s = median_seconds(decode_forward_only, repeats)
    static_s = median_seconds(lambda: generate(cache_implementation="static"), repeats)
    report["generate_s"] = {
        "generate": gen_s,
        "decode_forward_only": decode_s,
        "generate_static_cache": static_s,
        "generate_loop_share": (gen_s - decode_s) / gen_s,
        "static_over_dynamic": static_s / gen_s,
    }
    forward_s = median_seconds(forward, repeats)
    report["update_forward"] = {
        "tokens": rows * width,
        "seconds": forward_s,
        "gflop_per_s": 2 * parameters * rows * width / forward_s / 1e9,
    }
    model.train()
    eager_s = median_seconds(lambda: forward_backward(model, batch), repeats)
    update: dict[str, Any] = {"eager_s": eager_s}
    if compile_update:
        compiled = torch.compile(model)
        started = time.perf_counter()
        forward_backward(compiled, batch)
        update["compile_first_width_s"] = time.perf_counter() - started
        update["compiled_s"] = median_seconds(lambda: forward_backward(compiled, batch), repeats)
        wider = torch.randint(4, len(tokenizer), (rows, width + 2))
        started = time.perf_counter()
        forward_backward(compiled, wider)
        update["compile_second_width_s"] = time.perf_counter() - started
        update["eager_over_compiled"] = eager_s / update["compiled_s"]
    else:
        update["compiled"] = "skipped in --quick"
    report["update_forward_backward"] = update
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; figures mean nothing")
    args = parser.parse_args()
    spec = QUICK if args.quick else FULL
    import torch

    torch.set_num_threads(1)  # one rank's share: one process, one thread, as in the race
    started = time.perf_counter()
    sizes = {size: measure(size, spec, compile_update=not args.quick) for size in spec["sizes"]}
    print(
        json.dumps(
            {
                "benchmark": "grpo_compute",
                "quick": args.quick,
                "torch": torch.__version__,
                "machine": platform.machine(),
                "threads": torch.get_num_threads(),
                "baseline": "Transformers' generate (dynamic cache); the eager update",
                "workload": spec,
                "sizes": sizes,
                "load_average": os.getloadavg()[0],
                "wall_s": time.perf_counter() - started,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

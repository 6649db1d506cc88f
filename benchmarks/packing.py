"""The actor's update forward + backward on packed sequences against the padded batch.

One GRPO-shaped batch (``--groups`` prompts of 16–64 tokens, ``--group-size``
samples each, responses of 1 to ``--max-response`` tokens drawn uniformly)
goes through the actor's update passes on a Qwen2 of a few million
parameters built from a config: the rows are split into micro-batches of at
most ``--budgets`` valid tokens (`rlcore.batching.balanced_micro_batches`, as
the actor does with ``actor.micro_batch_max_tokens``), each micro-batch is
trimmed to its widest row (`RolloutBatch.select`) and runs
`rlshell.workers.forward.policy_forward` and a backward of a loss over its
log-probs and entropies, in three layouts:

- ``padded`` (the baseline): the ``[rows, prompt + response]`` batch;
- ``shared_prompts``: the same, each distinct prompt of a micro-batch run
  once (``actor.share_prompt_forward``, the default);
- ``packed``: the valid tokens end to end in one row
  (``actor.pack_sequences``).

tokens/s counts valid prompt and response tokens (what verl counts) over the
seconds of all micro-batches' forwards and backwards: the median of
``--repeats`` runs, the layouts interleaved so that load from other work on
the machine hits them alike, all at ``--threads`` intra-op threads (1: one
actor rank's share of the 2-core default). Both clocks are reported: wall
seconds (``tokens_per_s``, ``packed_vs_padded``) and this process's CPU
seconds (``tokens_per_cpu_s``, ``cpu_packed_vs_padded``), which at one
thread is the compute itself, whatever else the machine runs. The gradients of the three
layouts are compared (``max_abs_grad_diff``): the same update, or the timing
means nothing.

Prints one JSON object. ``--quick`` shrinks everything (a smoke run for the
test suite; its figures mean nothing).

    .venv/bin/python benchmarks/packing.py [--quick] [--threads 1] [--budgets 1024 4096]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Any

import torch
from torch import nn

FULL = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 8192,
    "groups": 2,
    "group_size": 8,
    "prompt_lengths": (16, 64),
    "max_response": 256,
    "budgets": [1024, 4096],
    "repeats": 3,
}
QUICK = {
    **FULL,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "vocab_size": 128,
    "groups": 2,
    "group_size": 2,
    "prompt_lengths": (2, 6),
    "max_response": 16,
    "budgets": [32],
    "repeats": 1,
}
LAYOUTS = {
    "padded": {"share_prompts": False, "pack": False},
    "shared_prompts": {"share_prompts": True, "pack": False},
    "packed": {"share_prompts": False, "pack": True},
}
TEMPERATURE = 1.0


def build_model(sizes: dict[str, Any]) -> nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        **{
            key: sizes[key]
            for key in (
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "vocab_size",
            )
        },
        max_position_embeddings=sizes["prompt_lengths"][1] + sizes["max_response"],
    )
    model: nn.Module = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.train()


def build_batch(sizes: dict[str, Any]) -> Any:
    """GRPO rows: each prompt repeated ``group_size`` times, responses of mixed lengths."""
    from rlshell.rollout import RolloutBatch

    generator = torch.Generator().manual_seed(0)
    groups, group_size, vocab = sizes["groups"], sizes["group_size"], sizes["vocab_size"]
    rows = groups * group_size
    low, high = sizes["prompt_lengths"]
    prompt_lengths = torch.randint(low, high + 1, (groups,), generator=generator)
    prompt_lengths = prompt_lengths.repeat_interleave(group_size)
    response_lengths = torch.randint(1, sizes["max_response"] + 1, (rows,), generator=generator)
    width, span = high, sizes["max_response"]
    prompt_mask = torch.arange(width) >= width - prompt_lengths.unsqueeze(-1)
    response_mask = torch.arange(span) < response_lengths.unsqueeze(-1)
    prompts = torch.randint(1, vocab, (groups, width), generator=generator)
    prompt_ids = prompts.repeat_interleave(group_size, dim=0) * prompt_mask
    response_ids = torch.randint(1, vocab, (rows, span), generator=generator) * response_mask
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        logprobs=torch.zeros(rows, span),
        response_texts=("",) * rows,
        group_size=group_size,
    )


def update_passes(
    model: nn.Module, micro_batches: list[Any], layout: dict[str, bool]
) -> tuple[float, float]:
    """(wall, CPU) seconds of every micro-batch's forward and backward; gradients left in
    ``model``."""
    from rlshell.workers.forward import policy_forward

    model.zero_grad(set_to_none=True)
    started, cpu_started = time.perf_counter(), time.process_time()
    for micro in micro_batches:
        logprobs, entropy = policy_forward(model, micro, TEMPERATURE, None, **layout)
        mask = micro.response_mask
        # A policy-gradient-shaped loss: every log-prob and entropy gets a gradient.
        weights = torch.linspace(-1.0, 1.0, mask.shape[1]).expand_as(logprobs)
        loss = ((logprobs * weights + 0.01 * entropy) * mask).sum() / mask.sum()
        loss.backward()
    return time.perf_counter() - started, time.process_time() - cpu_started


def grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def bench_budget(model: nn.Module, batch: Any, budget: int, repeats: int) -> dict[str, Any]:
    from rlcore.batching import balanced_micro_batches

    lengths = batch.prompt_mask.sum(1) + batch.response_mask.sum(1)
    micro_batches = [batch.select(rows) for rows in balanced_micro_batches(lengths, budget)]
    padded_positions = sum(
        m.rows * (m.prompt_ids.shape[1] + m.response_ids.shape[1]) for m in micro_batches
    )
    tokens = batch.num_tokens
    reference: list[torch.Tensor] | None = None
    grad_diffs: dict[str, float] = {}
    for name, layout in LAYOUTS.items():  # warm-up, and the gradients compared
        update_passes(model, micro_batches, layout)
        current = grads(model)
        if reference is None:
            reference = current
        grad_diffs[name] = max(
            float((a - b).abs().max()) for a, b in zip(current, reference, strict=True)
        )
    walls: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    cpus: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    for _ in range(repeats):
        for name, layout in LAYOUTS.items():
            wall, cpu = update_passes(model, micro_batches, layout)
            walls[name].append(wall)
            cpus[name].append(cpu)
    timings = {
        name: {
            "median_s": statistics.median(walls[name]),
            "tokens_per_s": tokens / statistics.median(walls[name]),
            "median_cpu_s": statistics.median(cpus[name]),
            "tokens_per_cpu_s": tokens / statistics.median(cpus[name]),
        }
        for name in LAYOUTS
    }

    def ratio(key: str, layout: str, baseline: str) -> float:
        return float(timings[layout][key] / timings[baseline][key])

    return {
        "micro_batches": len(micro_batches),
        "padded_positions": padded_positions,
        "padding_share": 1.0 - tokens / padded_positions,
        "largest_packed_row": max(m.num_tokens for m in micro_batches),
        **timings,
        "packed_vs_padded": ratio("tokens_per_s", "packed", "padded"),
        "packed_vs_shared_prompts": ratio("tokens_per_s", "packed", "shared_prompts"),
        "cpu_packed_vs_padded": ratio("tokens_per_cpu_s", "packed", "padded"),
        "cpu_packed_vs_shared_prompts": ratio("tokens_per_cpu_s", "packed", "shared_prompts"),
        "max_abs_grad_diff_vs_padded": grad_diffs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budgets", type=int, nargs="+", default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="tiny shapes, for smoke tests")
    args = parser.parse_args()
    sizes = dict(QUICK if args.quick else FULL)
    if args.budgets is not None:
        sizes["budgets"] = args.budgets
    if args.repeats is not None:
        sizes["repeats"] = args.repeats
    torch.set_num_threads(args.threads)
    model = build_model(sizes)
    batch = build_batch(sizes)
    results = {
        f"budget_{budget}": bench_budget(model, batch, budget, sizes["repeats"])
        for budget in sizes["budgets"]
    }
    import transformers

    report = {
        "benchmark": "packing",
        "quick": args.quick,
        "threads": args.threads,
        "model": {
            "class": "Qwen2ForCausalLM",
            "parameters": sum(p.numel() for p in model.parameters()),
            "attention": model.config._attn_implementation,
            **{key: sizes[key] for key in ("hidden_size", "num_hidden_layers", "vocab_size")},
        },
        "batch": {
            "rows": batch.rows,
            "group_size": batch.group_size,
            "prompt_lengths": list(sizes["prompt_lengths"]),
            "response_lengths": [1, sizes["max_response"]],
            "valid_tokens": batch.num_tokens,
        },
        "baseline": "padded: the actor's [rows, prompt + response] micro-batches, same threads",
        "results": results,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "machine": platform.machine(),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

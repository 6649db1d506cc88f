"""GAE throughput: rlcore's chunked recurrence against a Python loop over time.

Baselines, run in this script on the same inputs:

- ``loop``: the reverse loop over time the way verl and RLinf write it (a few
  tensor ops per step) — for `gae` with terminated/truncated flags, for
  `token_gae` with a response mask whose carry passes over masked tokens;
- ``torchrl_loop`` and ``torchrl_vec``: torchrl's ``generalized_advantage_estimate``
  and ``vec_generalized_advantage_estimate`` (gae only), when torchrl imports.

Prints one JSON object. Timings are medians of ``--repeats`` runs after a
warm-up, at 1 intra-op thread (the meaningful figure on a shared 2-core box)
and at 2 threads. Target: rlcore ≥ 10× the loop baseline.

    python benchmarks/core_advantages.py [--batch 256] [--time 4096] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from rlcore.advantages import gae, token_gae

GAMMA, LAM = 0.99, 0.95
TARGET_SPEEDUP = 10.0


def loop_gae(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Reverse loop over time, one step of the GAE recursion per iteration."""
    steps = rewards.shape[-1]
    not_terminated = (~terminated).to(rewards.dtype)
    not_done = (~(terminated | truncated)).to(rewards.dtype)
    advantages = torch.zeros_like(rewards)
    carry = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(steps)):
        delta = rewards[:, t] + gamma * next_values[:, t] * not_terminated[:, t] - values[:, t]
        carry = delta + gamma * lam * not_done[:, t] * carry
        advantages[:, t] = carry
    return advantages, advantages + values


def loop_token_gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Reverse loop over tokens; at masked tokens the value and advantage carries pass through."""
    steps = rewards.shape[-1]
    valid = mask.to(rewards.dtype)
    next_value = torch.zeros_like(rewards[:, 0])
    carry = torch.zeros_like(rewards[:, 0])
    columns = []
    for t in reversed(range(steps)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam * carry
        next_value = values[:, t] * valid[:, t] + (1 - valid[:, t]) * next_value
        carry = candidate * valid[:, t] + (1 - valid[:, t]) * carry
        columns.append(carry)
    advantages = torch.stack(columns[::-1], dim=1) * valid
    return advantages, (advantages + values) * valid


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(samples)


def make_inputs(batch: int, steps: int, seed: int = 0) -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(seed)

    def normal() -> Tensor:
        return torch.randn(batch, steps, generator=generator)

    def flags(p: float) -> Tensor:
        return torch.rand(batch, steps, generator=generator) < p

    terminated = flags(0.002)
    lengths = torch.randint(steps // 4, steps + 1, (batch, 1), generator=generator)
    # Right-padded responses with 10% masked tokens inside (multi-turn observations).
    mask = (torch.arange(steps) < lengths) & ~flags(0.1)
    return {
        "rewards": normal(),
        "values": normal(),
        "next_values": normal(),
        "terminated": terminated,
        "truncated": flags(0.002) & ~terminated,
        "mask": mask,
    }


def bench_gae(x: dict[str, Tensor], repeats: int) -> dict[str, Any]:
    args = (x["rewards"], x["values"], x["next_values"], x["terminated"], x["truncated"])
    ours = gae(*args, GAMMA, LAM)
    reference, _ = loop_gae(*args, GAMMA, LAM)
    result: dict[str, Any] = {
        "rlcore_ms": median_ms(lambda: gae(*args, GAMMA, LAM), repeats),
        "loop_ms": median_ms(lambda: loop_gae(*args, GAMMA, LAM), repeats),
        "max_abs_diff_vs_loop": float((ours.advantages - reference).abs().max()),
    }
    result["speedup_vs_loop"] = result["loop_ms"] / result["rlcore_ms"]
    result.update(bench_torchrl(x, ours.advantages, result["rlcore_ms"], repeats))
    return result


def bench_torchrl(
    x: dict[str, Tensor], ours: Tensor, rlcore_ms: float, repeats: int
) -> dict[str, Any]:
    try:
        from torchrl.objectives.value.functional import (
            generalized_advantage_estimate,
            vec_generalized_advantage_estimate,
        )
    except Exception as error:  # torchrl is optional; record why it is absent
        return {"torchrl": f"unavailable: {type(error).__name__}: {error}"}
    done = (x["terminated"] | x["truncated"]).unsqueeze(-1)
    args = (
        x["values"].unsqueeze(-1),
        x["next_values"].unsqueeze(-1),
        x["rewards"].unsqueeze(-1),
        done,
        x["terminated"].unsqueeze(-1),
    )
    out: dict[str, Any] = {}
    for name, fn in (
        ("torchrl_loop", generalized_advantage_estimate),
        ("torchrl_vec", vec_generalized_advantage_estimate),
    ):
        advantages, _ = fn(GAMMA, LAM, *args)
        out[f"{name}_ms"] = median_ms(lambda fn=fn: fn(GAMMA, LAM, *args), max(1, repeats // 2))
        out[f"max_abs_diff_vs_{name}"] = float((advantages.squeeze(-1) - ours).abs().max())
        out[f"speedup_vs_{name}"] = out[f"{name}_ms"] / rlcore_ms
    return out


def bench_token_gae(x: dict[str, Tensor], repeats: int) -> dict[str, Any]:
    args = (x["rewards"], x["values"], x["mask"])
    ours = token_gae(*args, GAMMA, LAM)
    reference, _ = loop_token_gae(*args, GAMMA, LAM)
    result = {
        "rlcore_ms": median_ms(lambda: token_gae(*args, GAMMA, LAM), repeats),
        "loop_ms": median_ms(lambda: loop_token_gae(*args, GAMMA, LAM), repeats),
        "max_abs_diff_vs_loop": float((ours.advantages - reference).abs().max()),
    }
    result["speedup_vs_loop"] = result["loop_ms"] / result["rlcore_ms"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--time", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--quick", action="store_true", help="small shapes, for smoke tests")
    args = parser.parse_args()
    if args.quick:
        args.batch, args.time, args.repeats = 8, 100, 2
    inputs = make_inputs(args.batch, args.time)
    runs: dict[str, Any] = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        runs[f"threads_{threads}"] = {
            "gae": bench_gae(inputs, args.repeats),
            "token_gae": bench_token_gae(inputs, args.repeats),
        }
    single = runs.get("threads_1", next(iter(runs.values())))
    worst = min(single["gae"]["speedup_vs_loop"], single["token_gae"]["speedup_vs_loop"])
    report = {
        "benchmark": "core_advantages",
        "shape": [args.batch, args.time],
        "dtype": "float32",
        "gamma": GAMMA,
        "lam": LAM,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "baseline": "reverse Python loop over time (verl/RLinf style), same inputs",
        "results": runs,
        "target": {"speedup_vs_loop_at_1_thread": TARGET_SPEEDUP},
        "achieved": {"speedup_vs_loop_at_1_thread": worst},
        "met": worst >= TARGET_SPEEDUP,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

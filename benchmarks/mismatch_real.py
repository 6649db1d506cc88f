"""The sampler–trainer gap on the real model: vLLM's fp32 and bf16 engines, with and without TIS.

Each row is a short run of ``configs/grpo_smollm2.py`` (SmolLM2-135M-Instruct, vLLM's CPU
engine beside the FSDP actor in one process, its weights reloaded in place after every
update) from a fresh run directory, evaluation off, the same seed:

- ``fp32``: the config as it is (the engine in the actor's precision, fp32);
- ``bf16``: ``rollout.precision=bf16``: the actor trains in fp32, the engine samples with
  its weights cast to bf16 at every sync (what a GPU user runs to halve the engine's
  memory and time);
- each again with ``algorithm.rollout_is=token_truncate`` (TIS, C = 2): every token's loss
  weighted by min(π_old/μ, C).

Reported per row, over the run's steps (the runner's own per-step metrics,
`rlcore.mismatch.logprob_mismatch` on the actor's recomputed log-probs against the
engine's): the mean of the per-step mean |log π_old − log μ|, the largest single token's
|Δ| over the run, the largest per-step k3 KL(μ ‖ π_old) and the largest per-response
|Σ log ρ| mean; with TIS, the importance weights' mean, their largest value, and the
share of tokens the truncation cut. A reference (the baseline of the comparison): the
fp32 row, whose gap is vLLM's kernels against the actor's eager forward alone.

Prints one JSON object. ``--quick``: two steps a row, fp32 and bf16 only (a smoke run).

    .venv/bin/python benchmarks/mismatch_real.py [--quick] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/grpo_smollm2.py"
TIS = ["algorithm.rollout_is=token_truncate"]
ROWS: dict[str, list[str]] = {
    "fp32": [],
    "bf16": ["rollout.precision=bf16"],
    "fp32_tis": TIS,
    "bf16_tis": ["rollout.precision=bf16", *TIS],
}
QUICK_ROWS = ("fp32", "bf16")


def run_row(name: str, overrides: list[str], steps: int, out: Path) -> dict[str, Any]:
    """One run of the row's config; its per-step gap statistics summarised."""
    from rlshell.metrics import read_metrics

    command = [
        sys.executable,
        "-m",
        "rlshell.train",
        CONFIG,
        *overrides,
        f"runner.max_steps={steps}",
        "runner.eval_interval=0",
        # No checkpoint: the config's keep_last and export_hf set back to their defaults,
        # which a run without checkpoints accepts (set otherwise, they are refused as unread).
        "checkpoint.interval=0",
        "checkpoint.keep_last=2",
        "checkpoint.export_hf=true",
        f"runner.experiment_name={name}",
        f"runner.output_dir={out}",
    ]
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="rm", dir="/tmp")}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    steps_seen = [r for r in read_metrics(out / name / "metrics.jsonl") if "time/step" in r]
    row: dict[str, Any] = {
        "overrides": overrides,
        "steps": len(steps_seen),
        "wall_s": time.perf_counter() - started,
        "abs_diff_mean": statistics.mean(r["rollout/mismatch_abs_diff_mean"] for r in steps_seen),
        "abs_diff_max": max(r["rollout/mismatch_abs_diff_max"] for r in steps_seen),
        "kl_k3_max": max(r["rollout/mismatch_kl_k3"] for r in steps_seen),
        "seq_log_ratio_abs_mean_max": max(
            r["rollout/mismatch_seq_log_ratio_abs_mean"] for r in steps_seen
        ),
        "train_reward_mean": statistics.mean(r["reward/mean"] for r in steps_seen),
    }
    if "rollout/mismatch_is_weight_mean" in steps_seen[0]:
        row["is_weight_mean"] = statistics.mean(
            r["rollout/mismatch_is_weight_mean"] for r in steps_seen
        )
        row["is_weight_max"] = max(r["rollout/mismatch_is_weight_max"] for r in steps_seen)
        row["is_truncated_frac_mean"] = statistics.mean(
            r["rollout/mismatch_is_truncated_frac"] for r in steps_seen
        )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; figures mean nothing")
    parser.add_argument("--steps", type=int, help="steps a row (default 6, --quick 2)")
    args = parser.parse_args()
    steps = args.steps or (2 if args.quick else 6)
    names = QUICK_ROWS if args.quick else tuple(ROWS)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mismatch") as scratch:
        rows = {name: run_row(name, ROWS[name], steps, Path(scratch)) for name in names}
    reference = rows["fp32"]["abs_diff_mean"]
    for row in rows.values():
        row["abs_diff_mean_over_fp32"] = row["abs_diff_mean"] / reference if reference else None
    report = {
        "benchmark": "mismatch_real",
        "quick": args.quick,
        "config": CONFIG,
        "steps_per_row": steps,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "baseline": "the fp32 row: vLLM's kernels against the actor's eager forward alone",
        "rows": rows,
        "wall_s": time.perf_counter() - started,
    }
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()

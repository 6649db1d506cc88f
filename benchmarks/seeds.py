"""A learning claim over seeds: one run of a config per seed, one metric summarised.

For each seed, ``python -m rlshell.train CONFIG runner.seed=S runner.output_dir=OUT/seed_S``
(one after the other: two runs at once would share the machine's cores), then, from each
run's ``metrics.jsonl``:

- ``last_mean``: the metric's mean over the last ``--last`` logged steps (the claim);
- ``first_reached``: the first step at which its ``--window``-step rolling mean reached
  ``--threshold``, with the env steps (``env/total_steps``) and wall time
  (``time/elapsed``) logged there;

and over the seeds: mean, standard deviation, minimum and maximum of ``last_mean``, and
whether every seed's ``last_mean`` reached the threshold. ``--runs DIR ...`` summarises
runs already made (their ``config.json`` names the seed) instead of starting any.

    .venv/bin/python benchmarks/seeds.py configs/ppo_pushcube_cpu.py --seeds 0 1 2 \\
        --metric env/success --threshold 0.9 [--out DIR] [--runs DIR ...]

Prints one JSON object. ``--quick`` is a smoke run (configs/ppo_cartpole.py, two seeds of
3 steps; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def metric_rows(run_dir: Path, metric: str) -> list[dict[str, Any]]:
    """The logged steps of ``run_dir`` that carry ``metric``, in order."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"{run_dir}: no metrics.jsonl (not a run directory, or it never logged)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    kept = [row for row in rows if metric in row]
    if not kept:
        raise SystemExit(f"{path}: no step logged {metric!r}")
    return kept


def summarise_run(
    rows: list[dict[str, Any]], metric: str, last: int, window: int, threshold: float
) -> dict[str, Any]:
    """One run's ``last_mean`` and ``first_reached`` (see the module's docstring)."""
    values = [float(row[metric]) for row in rows]
    tail = values[-last:]
    first = None
    for end in range(window, len(values) + 1):
        if statistics.fmean(values[end - window : end]) >= threshold:
            row = rows[end - 1]
            first = {
                "step": row.get("step"),
                "env_steps": row.get("env/total_steps"),
                "elapsed_s": row.get("time/elapsed"),
            }
            break
    return {
        "steps_logged": len(values),
        "last_mean": statistics.fmean(tail),
        "last_min": min(tail),
        "first_reached": first,
        "elapsed_s": rows[-1].get("time/elapsed"),
    }


def summarise(runs: dict[int, dict[str, Any]], threshold: float) -> dict[str, Any]:
    """Mean and spread of ``last_mean`` over the seeds."""
    means = [run["last_mean"] for run in runs.values()]
    return {
        "seeds": len(means),
        "last_mean": {
            "mean": statistics.fmean(means),
            "std": statistics.stdev(means) if len(means) > 1 else 0.0,
            "min": min(means),
            "max": max(means),
        },
        "every_seed_reached": all(mean >= threshold for mean in means),
    }


def train(config: Path, seed: int, out: Path, overrides: list[str]) -> tuple[Path, float]:
    """One run of ``config`` at ``seed`` under ``out``; its run directory and wall time."""
    started = time.perf_counter()
    command = [
        sys.executable,
        "-m",
        "rlshell.train",
        str(config),
        f"runner.seed={seed}",
        f"runner.output_dir={out}",
        *overrides,
    ]
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise SystemExit(
            f"seed {seed}: {' '.join(command)} exited {completed.returncode}:\n"
            f"{completed.stderr[-3000:]}"
        )
    (run_dir,) = (path.parent for path in out.glob("*/metrics.jsonl"))
    return run_dir, time.perf_counter() - started


def seed_of(run_dir: Path) -> int:
    config = json.loads((run_dir / "config.json").read_text())
    return int(config["runner"]["seed"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", type=Path, help="a config module or file")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every seed")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--metric", default="env/success")
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--last", type=int, default=50, help="steps the claim averages")
    parser.add_argument("--window", type=int, default=25, help="steps of the rolling mean")
    parser.add_argument("--out", type=Path, help="where the runs go (a temporary folder)")
    parser.add_argument("--runs", nargs="+", type=Path, help="summarise these runs instead")
    parser.add_argument("--quick", action="store_true", help="a smoke run; figures mean nothing")
    args = parser.parse_args()
    config, overrides, seeds = args.config, list(args.overrides), list(args.seeds)
    if args.quick:
        config = ROOT / "configs" / "ppo_cartpole.py"
        overrides, seeds = ["runner.max_steps=3", *overrides], [0, 1]
        args.metric, args.last, args.window = "env/episode_return", 2, 2
    wall: dict[int, float] = {}
    if args.runs:
        run_dirs = {seed_of(run_dir): run_dir for run_dir in args.runs}
    elif config is None:
        parser.error("give a config to run, or --runs to summarise")
    else:
        out = args.out or Path(tempfile.mkdtemp(prefix="rlstack-seeds-"))
        run_dirs = {}
        for seed in seeds:
            run_dirs[seed], wall[seed] = train(config, seed, out / f"seed_{seed}", overrides)
    runs = {
        seed: {
            "run_dir": str(run_dir),
            **summarise_run(
                metric_rows(run_dir, args.metric),
                args.metric,
                args.last,
                args.window,
                args.threshold,
            ),
            **({"wall_s": wall[seed]} if seed in wall else {}),
        }
        for seed, run_dir in sorted(run_dirs.items())
    }
    report = {
        "benchmark": "seeds",
        "quick": args.quick,
        "config": None if config is None else str(config),
        "overrides": overrides,
        "metric": args.metric,
        "claim": f"mean of the last {args.last} logged steps ≥ {args.threshold}",
        "by_seed": runs,
        "over_seeds": summarise(runs, args.threshold),
    }
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()

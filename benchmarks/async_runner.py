"""The asynchronous reasoning runner against the synchronous one, same placement, cores, seed.

Both runs train ``configs/grpo.py``'s task and model with the rollout in a process of its
own beside one actor rank and the reward worker (``configs/grpo_async.py``'s placement), for
the same number of steps, from a fresh run directory each:

- ``sync`` (the baseline): ``configs/grpo.py`` on that placement, ``runner.mode='sync'``:
  the rollout samples each batch with the previous step's weights while the actor waits,
  then the actor trains while the rollout waits;
- ``async``: ``configs/grpo_async.py``: the rollout one step ahead (``max_staleness`` 1),
  decoupled PPO.

Reported for each: samples (completions) per second over the run's wall time
(``time/elapsed``, evaluations included), each side's busy fraction (the actor: the update,
the log-prob passes and the reference; the rollout: its generation), the held-out accuracy
curve against wall time, and, at the wall time both runs reached, the accuracy of each (the
last evaluation at or before it). Target (reported, not asserted): async ≥ 1.3× the
synchronous samples/s with held-out accuracy at equal wall time no lower. On 2 cores the
gain is bounded by the cores: what the two sides can overlap is what the other processes
leave.

``--partial`` adds a third run, ``async_partial``: ``async`` with ``rollout.partial_rollouts``
(the weights offered to the rollout worker while it generates, taken up between two tokens),
reported beside the others with the share of its tokens sampled by the trained weights and of
its requests interrupted.

``--quick`` is a smoke run (four steps of two prompts; the runs side by side): its figures
mean nothing.

``--timeline PATH`` draws the async run's busy periods (generation on the rollout worker,
the step's update on the actor) over ten steps from its metrics into a PNG.

    .venv/bin/python benchmarks/async_runner.py [--quick] \\
        [--partial] [--timeline docs/async_timeline.png]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1.3
PLACEMENT = [
    'cluster.component_placement={"actor": "0:0", "rollout": "0:0", "reward": "0"}',
    # One actor rank in its model's precision is not sharded: no wrap policy to tune.
    "actor.fsdp_config.wrap_policy.min_num_params=0",
]
RUNS = {
    "sync": ["configs/grpo.py", *PLACEMENT],
    "async": ["configs/grpo_async.py"],
    "async_partial": ["configs/grpo_async.py", "rollout.partial_rollouts=true"],
}
FULL = {"max_steps": 1000, "eval_interval": 100}
QUICK = {
    "max_steps": 4,
    "eval_interval": 2,
    "extra": [
        "runner.prompts_per_step=2",
        "algorithm.group_size=2",
        "rollout.max_new_tokens=3",
        "data.num_val=4",
    ],
}


def train(mode: str, spec: dict[str, Any], out: Path) -> list[dict[str, float]]:
    """One run in a subprocess; its metrics records."""
    from rlshell.metrics import read_metrics

    args = [
        *RUNS[mode],
        f"runner.max_steps={spec['max_steps']}",
        f"runner.eval_interval={spec['eval_interval']}",
        "checkpoint.interval=0",
        'logger.backends=["jsonl"]',
        f"runner.output_dir={out}",
        *spec.get("extra", []),
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ra", dir=env.get("RAY_TMPDIR", "/tmp"))
    done = subprocess.run(
        [sys.executable, "-m", "rlshell.train", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the {mode} run failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    (run_dir,) = [p for p in out.iterdir() if (p / "metrics.jsonl").is_file()]
    config = json.loads((run_dir / "config.json").read_text())
    per_step = config["runner"]["prompts_per_step"] * config["algorithm"]["group_size"]
    records = read_metrics(run_dir / "metrics.jsonl")
    for record in records:
        if record["step"] > 0:
            record["samples"] = float(per_step)  # completions trained on this step
    return records


def summarise(records: list[dict[str, float]], mode: str) -> dict[str, Any]:
    steps = [r for r in records if r["step"] > 0]
    elapsed = steps[-1]["time/elapsed"]
    samples = sum(r["samples"] for r in steps)
    actor = sum(
        r.get("time/update", 0.0) + r.get("time/old_logprobs", 0.0) + r.get("time/reference", 0.0)
        for r in steps
    )
    if mode.startswith("async"):
        rollout = sum(r["async/rollout_busy_s"] for r in steps)
    else:
        rollout = sum(r["time/rollout"] for r in steps)
    curve = [[0.0, records[0]["eval/accuracy"]]] + [
        [r["time/elapsed"], r["eval/accuracy"]] for r in steps if "eval/accuracy" in r
    ]
    out: dict[str, Any] = {
        "steps": len(steps),
        "elapsed_s": elapsed,
        "samples": samples,
        "samples_per_s": samples / elapsed,
        "busy_frac": {"actor": actor / elapsed, "rollout": rollout / elapsed},
        "eval_curve": curve,
        "median_step_s": sorted(r["time/step"] for r in steps)[len(steps) // 2],
    }
    if mode.startswith("async"):
        out["staleness_mean"] = sum(r["async/staleness_mean"] for r in steps) / len(steps)
        out["tokens_frac_lag0"] = sum(r["async/tokens_frac_lag0"] for r in steps) / len(steps)
        out["behavior_weight_mean"] = sum(
            r.get("train/behavior_weight_mean", 1.0) for r in steps
        ) / len(steps)
    if mode == "async_partial":
        out["requests_interrupted_frac"] = sum(
            r["async/requests_interrupted_frac"] for r in steps
        ) / len(steps)
    return out


def accuracy_at(curve: list[list[float]], t: float) -> float:
    """The last evaluation at or before wall time ``t``."""
    return [acc for when, acc in curve if when <= t + 1e-9][-1]


def draw_timeline(records: list[dict[str, float]], path: Path, first: int, count: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r for r in records if first <= r["step"] < first + count]
    origin = steps[0]["async/generate_start"]
    fig, ax = plt.subplots(figsize=(9, 2.4))
    for r in steps:
        gen = (r["async/generate_start"] - origin, r["async/generate_end"] - origin)
        upd = (r["async/update_start"] - origin, r["async/update_end"] - origin)
        ax.broken_barh([(gen[0], gen[1] - gen[0])], (1.1, 0.8), color="tab:orange")
        ax.broken_barh([(upd[0], upd[1] - upd[0])], (0.1, 0.8), color="tab:blue")
        ax.text(gen[0], 1.5, f"{int(r['step'])}", fontsize=7, va="center")
        ax.text(upd[0], 0.5, f"{int(r['step'])}", fontsize=7, va="center", color="white")
    ax.set_yticks([0.5, 1.5], labels=["actor: step s's update", "rollout: step s's batch"])
    ax.set_xlabel("seconds (from a real run's async/ metrics)")
    ax.set_title(
        f"runner.mode='async', max_staleness 1: steps {first}-{first + count - 1}", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; figures mean nothing")
    parser.add_argument("--timeline", type=Path, help="draw the async run's busy periods here")
    parser.add_argument("--partial", action="store_true", help="also async with partial rollouts")
    args = parser.parse_args()
    spec = QUICK if args.quick else FULL
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    modes = ("sync", "async", "async_partial")[: 3 if args.partial else 2]
    with tempfile.TemporaryDirectory(prefix="async_bench") as tmp:
        if args.quick:  # a smoke run: the runs side by side (its figures mean nothing)
            with ThreadPoolExecutor(len(modes)) as pool:
                runs = {mode: pool.submit(train, mode, spec, Path(tmp) / mode) for mode in modes}
                records = {mode: run.result() for mode, run in runs.items()}
        else:  # one after the other, each with the machine to itself
            records = {mode: train(mode, spec, Path(tmp) / mode) for mode in modes}
        results = {mode: summarise(records[mode], mode) for mode in modes}
    if args.timeline is not None:
        draw_timeline(records["async"], args.timeline, first=2, count=min(10, spec["max_steps"]))
    sync, asynchronous = results["sync"], results["async"]
    ratio = asynchronous["samples_per_s"] / sync["samples_per_s"]
    both = min(result["elapsed_s"] for result in results.values())
    accuracy = {mode: accuracy_at(result["eval_curve"], both) for mode, result in results.items()}
    met = ratio >= TARGET and accuracy["async"] >= accuracy["sync"]
    print(
        json.dumps(
            {
                "benchmark": "async_runner",
                "quick": args.quick,
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "baseline": "the synchronous runner (configs/grpo.py) on the same placement",
                "workload": {k: v for k, v in spec.items() if k != "extra"},
                "results": results,
                "samples_per_s_ratio": ratio,
                "equal_wall_time_s": both,
                "accuracy_at_equal_wall_time": accuracy,
                "target": {"samples_per_s_ratio_at_least": TARGET, "accuracy": "async >= sync"},
                "met": met,
                "load_average": {"before": load_before, "after": os.getloadavg()[0]},
                "wall_s": time.perf_counter() - started,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

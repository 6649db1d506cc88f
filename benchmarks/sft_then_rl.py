"""RLinf's recipe against its baseline: behaviour cloning then PPO, against PPO from scratch.

``--task metaworld`` (the default): MetaWorld MT1 ``reach-v3`` with the flow policy of
configs/ppo_flow_metaworld_reach.py (chunks of 5 actions, Flow-SDE), cloned from
MetaWorld's scripted policy. ``--task pushcube``: ManiSkill's PushCube-v1 from state with
configs/ppo_flow_pushcube_cpu.py's flow policy, cloned from the successful episodes of a
trained Gaussian MLP (``--expert checkpoint:<a configs/ppo_pushcube_cpu.py run's
checkpoint> --only-success``). ``--task pushcube_rgb``: the same from PushCube's 64×64
camera and the robot's own 25 numbers (configs/ppo_flow_pushcube_rgb_cpu.py), the camera
recorded in lockstep with the expert reading the state (``rlshell.record --observe``).
Once: the expert records ``--episodes`` training and a
quarter as many held-out demonstrations (``python -m rlshell.record``). Then for each
seed, one after the other (two runs at once would share the machine's cores):

1. ``sft``: the task's sft config (``--sft-steps`` steps) with ``runner.seed=S``;
2. ``cloned``: the task's PPO config from its last checkpoint
   (``actor.model.checkpoint``) at ``--cloned-lr`` (3e-5);
3. ``scratch``: the same PPO from a fresh policy at its own best learning rate
   (``--scratch-lr``, 3e-4: PushCube's), for as many updates, so as many env steps.

``--starts cloned`` runs one start only; ``--sft-once`` clones once (with the first seed)
and starts every seed's PPO from that clone (the spread is then PPO's alone).

From each PPO run's ``metrics.jsonl``, for ``env/success_once`` (the episode reached the
goal at some step, MetaWorld's success) and ``env/success`` (at its last step): the mean
over the whole run (the area under the curve per update, at equal env steps), the mean of
the first ``--window`` updates and of the last ``--window``, and the wall time. Over the
seeds: mean and standard deviation of each, and the ratio of the means.

    .venv/bin/python benchmarks/sft_then_rl.py --seeds 0 1 2 [--updates 200] [--out DIR]

Prints one JSON object; ``--plot PNG`` also draws each run's ``env/success_once`` per
update (20-update means), the two starts side by side. ``--runs DIR`` summarises (and
plots) the runs an earlier call made in ``DIR`` instead of making any. ``--quick`` is a
smoke run (a few steps of each; its figures mean nothing).
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
# task: (the PPO config, the sft config, the config the expert records in, in words)
TASKS = {
    "metaworld": (
        ROOT / "configs" / "ppo_flow_metaworld_reach.py",
        ROOT / "configs" / "sft_flow_metaworld_reach.py",
        ROOT / "configs" / "ppo_flow_metaworld_reach.py",
        "MetaWorld MT1 reach-v3, state, 100-step episodes",
    ),
    "pushcube": (
        ROOT / "configs" / "ppo_flow_pushcube_cpu.py",
        ROOT / "configs" / "sft_flow_pushcube_cpu.py",
        ROOT / "configs" / "ppo_pushcube_cpu.py",
        "ManiSkill PushCube-v1, state, episodes end at success",
    ),
    "pushcube_rgb": (
        ROOT / "configs" / "ppo_flow_pushcube_rgb_cpu.py",
        ROOT / "configs" / "sft_flow_pushcube_rgb_cpu.py",
        ROOT / "configs" / "ppo_pushcube_cpu.py",
        "ManiSkill PushCube-v1, 64x64 camera + the robot's 25 numbers, episodes end at success",
    ),
}
# task: the camera its demonstrations are recorded through (``rlshell.record --observe``)
OBSERVE = {"pushcube_rgb": ("env.obs_mode=rgb", "env.image_size=64")}
METRICS = ("env/success_once", "env/success", "env/episode_return")


def _run(module: str, *args: str) -> float:
    """``python -m module args`` from the repository root; its wall time (stops on failure)."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"{module} {' '.join(args)} failed:\n{done.stdout[-2000:]}{done.stderr}")
    return time.perf_counter() - started


def summarise(run_dir: Path, window: int, wall_s: float | None) -> dict[str, Any]:
    """One PPO run's means (the module's docstring), from its ``metrics.jsonl``."""
    rows = _rows(run_dir)
    out: dict[str, Any] = {"updates": len(rows), "env_steps": rows[-1]["env/total_steps"]}
    for metric in METRICS:
        values = [float(row[metric]) for row in rows if metric in row]
        out[metric] = {
            "run_mean": statistics.fmean(values),
            "first_mean": statistics.fmean(values[:window]),
            "last_mean": statistics.fmean(values[-window:]),
        }
    out["wall_s"] = wall_s
    return out


def over_seeds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and standard deviation over the seeds of each figure of `summarise`."""
    out: dict[str, Any] = {}
    for metric in METRICS:
        out[metric] = {}
        for part in ("run_mean", "first_mean", "last_mean"):
            values = [run[metric][part] for run in runs]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            out[metric][part] = {"mean": statistics.fmean(values), "std": spread}
    walls = [run["wall_s"] for run in runs if run["wall_s"] is not None]
    out["wall_s"] = statistics.fmean(walls) if walls else None
    return out


def plot(starts: dict[str, list[dict[str, Any]]], out: Path, png: Path, task: str) -> Path:
    """Each run's ``env/success_once`` per update, as 20-update rolling means, into ``png``."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 3.5))
    axes = figure.add_subplot()
    for start, color in (("cloned", "tab:blue"), ("scratch", "tab:orange")):
        for index, run in enumerate(starts.get(start, [])):
            rows = _rows(out / f"seed_{run['seed']}" / start)
            values = [float(row["env/success_once"]) for row in rows if "env/success_once" in row]
            means = [statistics.fmean(values[max(0, i - 19) : i + 1]) for i in range(len(values))]
            label = f"{start} (seeds {', '.join(str(r['seed']) for r in starts[start])})"
            axes.plot(range(1, len(means) + 1), means, color=color, label=None if index else label)
    axes.set_xlabel("PPO update")
    axes.set_ylabel("success at some step (20-update mean)")
    axes.set_ylim(-0.02, 1.02)
    axes.set_title(task, fontsize=9)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(png, dpi=100)
    return png


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def make_runs(
    args: argparse.Namespace, out: Path, rl: Path, sft: Path, recorded_in: Path
) -> tuple[dict[str, list[dict[str, Any]]], list[float]]:
    """Record, then per seed clone and run both starts (the module's docstring); each
    start's runs summarised, and the sft runs' wall times."""
    demos = {"train": out / "demos" / "train.safetensors", "val": out / "demos" / "val.safetensors"}
    for split, episodes, seed in (
        ("train", args.episodes, 0),
        ("val", max(1, args.episodes // 4), 1),
    ):
        _run(
            "rlshell.record",
            str(recorded_in),
            *(["--only-success"] if args.only_success else []),
            "--expert",
            args.expert,
            "--episodes",
            str(episodes),
            "--seed",
            str(seed),
            "--out",
            str(demos[split]),
            *(["--observe", *OBSERVE[args.task]] if args.task in OBSERVE else []),
        )
    starts: dict[str, list[dict[str, Any]]] = {start: [] for start in args.starts}
    sft_wall = []
    for seed in args.seeds:
        runs = out / f"seed_{seed}"
        common = [f"runner.seed={seed}", f"runner.output_dir={runs}"]
        cloned_by = out / f"seed_{args.seeds[0]}" if args.sft_once else runs
        if cloned_by == runs:
            sft_wall.append(
                _run(
                    "rlshell.train",
                    str(sft),
                    *common,
                    f"data.train_path={demos['train']}",
                    f"data.val_path={demos['val']}",
                    f"runner.max_steps={args.sft_steps}",
                    f"runner.eval_interval={args.sft_steps}",
                    f"checkpoint.interval={args.sft_steps}",
                )
            )
        checkpoint = cloned_by / sft.stem / "checkpoints" / f"global_step_{args.sft_steps}"
        for start, overrides in (
            (
                "cloned",
                [f"actor.model.checkpoint={checkpoint}", f"actor.optim.lr={args.cloned_lr}"],
            ),
            ("scratch", [f"actor.optim.lr={args.scratch_lr}"]),
        ):
            if start not in args.starts:
                continue
            wall = _run(
                "rlshell.train",
                str(rl),
                *common,
                *overrides,
                f"runner.max_steps={args.updates}",
                "checkpoint.interval=0",
                f"runner.experiment_name={start}",
            )
            starts[start].append({"seed": seed, **summarise(runs / start, args.window, wall)})
    return starts, sft_wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="metaworld")
    parser.add_argument("--expert", default="metaworld", help="'metaworld' or 'checkpoint:PATH'")
    parser.add_argument("--only-success", action="store_true", help="record successes only")
    parser.add_argument("--cloned-lr", type=float, default=3e-5)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--updates", type=int, default=200, help="PPO updates of each start")
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--episodes", type=int, default=40, help="training demonstrations")
    parser.add_argument("--scratch-lr", type=float, default=3e-4)
    parser.add_argument("--window", type=int, default=20, help="updates the first/last means take")
    parser.add_argument("--out", type=Path, help="where the runs go (a temporary folder)")
    parser.add_argument("--plot", type=Path, help="draw the curves into this PNG")
    parser.add_argument("--runs", type=Path, help="summarise the runs made in this folder")
    parser.add_argument(
        "--starts", nargs="+", choices=["cloned", "scratch"], default=["cloned", "scratch"]
    )
    parser.add_argument(
        "--sft-once", action="store_true", help="clone once (the first seed); PPO per seed from it"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run; figures mean nothing")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.updates, args.sft_steps, args.episodes, args.window = [0], 2, 4, 4, 1
    rl, sft, recorded_in, task = TASKS[args.task]
    if args.runs is not None:
        out, sft_wall = args.runs, []
        starts = {
            start: [
                {"seed": seed, **summarise(out / f"seed_{seed}" / start, args.window, None)}
                for seed in args.seeds
            ]
            for start in args.starts
        }
    else:
        out = args.out or Path(tempfile.mkdtemp(prefix="sft_then_rl_"))
        starts, sft_wall = make_runs(args, out, rl, sft, recorded_in)
    summary = {start: over_seeds(runs) for start, runs in starts.items()}
    result = {
        "task": task,
        "policy": "flow_policy (Flow-SDE, 4 steps)",
        "seeds": args.seeds,
        "updates": args.updates,
        "demonstrations": {
            "train_episodes": args.episodes,
            "expert": args.expert,
            "only_success": args.only_success,
        },
        "sft": {
            "steps": args.sft_steps,
            "once": args.sft_once,
            "wall_s": statistics.fmean(sft_wall) if sft_wall else None,
        },
        "runs": starts,
        "summary": summary,
        "ratio_run_mean_success_once": (
            summary["cloned"]["env/success_once"]["run_mean"]["mean"]
            / max(summary["scratch"]["env/success_once"]["run_mean"]["mean"], 1e-9)
            if {"cloned", "scratch"} <= set(summary)
            else None
        ),
        "out": str(out),
        "quick": args.quick,
    }
    if args.plot is not None:
        result["plot"] = str(plot(starts, out, args.plot, task))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

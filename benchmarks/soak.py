"""Soak: the quickstart run with a random worker killed every M seconds, resumed each time.

Two runs of ``configs/grpo.py`` with the same seed and length, each from a fresh run
directory:

- ``undisturbed`` (the baseline): the run as it is;
- ``soaked``: the same run, with a Ray worker process of the run (an actor, rollout or
  reward worker: never Ray's own daemons) chosen at random and SIGKILLed every
  ``--kill-every`` seconds of training (counted from each start's first step); each death
  ends the run (exit 1), and it is started again at once with ``checkpoint.resume=auto``,
  until it finishes or ``--minutes`` have passed.

Reported: the kills, the restarts, the steps trained again after each (those since the
last checkpoint), whether the soaked run's metrics hold every step exactly once, and each
run's final held-out accuracy (``eval/accuracy`` at its last step) with their difference.
Not run in CI (it takes minutes by design); ``--steps``, ``--eval-interval`` and
``--checkpoint-interval`` size it.

    .venv/bin/python benchmarks/soak.py [--minutes 10] [--kill-every 30]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from rlshell.checkpoint import list_checkpoints  # noqa: E402 (after the path above)
from rlshell.metrics import read_metrics  # noqa: E402


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, pending = [], [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


# Processes Ray names ray::... that are Ray's own (its agents, idle workers in its pool).
RAY_OWN = frozenset({"IDLE", "DashboardAgent", "RuntimeEnvAgent", "JobSupervisor"})


def run_workers(driver: int) -> list[tuple[int, str]]:
    """The run's Ray worker processes (``ray::<Class>...``; Ray's own left out)."""
    workers = []
    for pid in descendants(driver):
        try:
            name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        if name.startswith("ray::") and name.split("::", 1)[1].split(".")[0] not in RAY_OWN:
            workers.append((pid, name))
    return workers


def command(args: argparse.Namespace, out: Path, resume: bool) -> list[str]:
    """The run's command line: continued from its last checkpoint where it has one, else
    started afresh over whatever a run killed before its first checkpoint left."""
    has_checkpoint = bool(list_checkpoints(out / "soak"))
    start = ["checkpoint.resume=auto"] if resume and has_checkpoint else ["--overwrite"]
    return [
        sys.executable,
        "-m",
        "rlshell.train",
        "configs/grpo.py",
        f"runner.max_steps={args.steps}",
        f"runner.eval_interval={args.eval_interval}",
        f"checkpoint.interval={args.checkpoint_interval}",
        f"runner.seed={args.seed}",
        f"runner.output_dir={out}",
        "runner.experiment_name=soak",
        *start,
    ]


def final_accuracy(run_dir: Path) -> float | None:
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval/accuracy" in r]
    return float(records[-1]["eval/accuracy"]) if records else None


def undisturbed(args: argparse.Namespace, out: Path, env: dict[str, str]) -> dict[str, Any]:
    started = time.monotonic()
    done = subprocess.run(
        command(args, out, False), cwd=ROOT, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"the undisturbed run failed:\n{done.stderr[-3000:]}")
    return {
        "wall_s": round(time.monotonic() - started, 1),
        "final_accuracy": final_accuracy(out / "soak"),
    }


def soaked(args: argparse.Namespace, out: Path, env: dict[str, str]) -> dict[str, Any]:
    rng = random.Random(args.seed)
    started = time.monotonic()
    deadline = started + 60 * args.minutes
    kills: list[dict[str, Any]] = []
    restarts, resumed_from = 0, []
    finished = False
    while time.monotonic() < deadline:
        run = subprocess.Popen(
            command(args, out, resume=True),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # The clock starts at the run's first step: a kill during start-up would test Ray's
        # start-up, and kills faster than start-up would leave no step done.
        metrics = out / "soak" / "metrics.jsonl"
        launched = time.time()
        next_kill = float("inf")
        while run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            if next_kill == float("inf"):
                if metrics.is_file() and metrics.stat().st_mtime > launched:
                    next_kill = time.monotonic() + args.kill_every
                continue
            if time.monotonic() < next_kill:
                continue
            workers = run_workers(run.pid)
            if workers:
                pid, name = rng.choice(workers)
                os.kill(pid, signal.SIGKILL)
                kills.append({"at_s": round(time.monotonic() - started, 1), "worker": name})
            next_kill = time.monotonic() + args.kill_every
        if run.poll() is None:  # out of time: stop it as a user would
            run.send_signal(signal.SIGINT)
        output = run.communicate()[0]
        for line in output.splitlines():
            if line.startswith("resumed from "):
                resumed_from.append(line)
        if run.returncode == 0:
            finished = True
            break
        restarts += 1
    steps = [int(r["step"]) for r in read_metrics(out / "soak" / "metrics.jsonl")]
    expected = list(range(steps[0], steps[-1] + 1)) if steps else []
    return {
        "wall_s": round(time.monotonic() - started, 1),
        "finished": finished,
        "kills": kills,
        "restarts": restarts,
        "resumed_from": resumed_from,
        "metrics_every_step_once": steps == expected,
        "last_step": steps[-1] if steps else None,
        "final_accuracy": final_accuracy(out / "soak") if finished else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="the soaked run's budget")
    parser.add_argument("--kill-every", type=float, default=30.0, help="seconds between kills")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--eval-interval", type=int, default=250)
    parser.add_argument("--checkpoint-interval", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with tempfile.TemporaryDirectory(prefix="soak") as tmp:
        env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rs", dir="/tmp")
        base = undisturbed(args, Path(tmp) / "undisturbed", env)
        soak = soaked(args, Path(tmp) / "soaked", env)
    difference = (
        None
        if base["final_accuracy"] is None or soak["final_accuracy"] is None
        else round(soak["final_accuracy"] - base["final_accuracy"], 4)
    )
    report = {
        "benchmark": "soak",
        "config": "configs/grpo.py",
        "settings": vars(args),
        "undisturbed": base,
        "soaked": soak,
        "accuracy_difference": difference,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

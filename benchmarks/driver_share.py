"""The driver's share of a pipelined embodied PPO step: windows through the driver or a channel.

The hybrid placement's trainer (`rlshell.runners.embodied_pipeline.PipelinedPPOTrainer`)
on CartPole (configs/ppo_cartpole.py): one env worker in two stages, one rollout
worker, one actor rank, ``runner.rollout_steps`` 64 (8 envs). Each transport
launches its own groups on one embedded Ray cluster and runs ``--warmup`` steps,
then ``--steps`` measured steps:

- ``driver``: the route before channels: each worker's window is a call result that the
  driver hands to the actor's call as an ObjectRef (Ray inlines results under 100 KiB
  into the driver's process, and sends them out again in the actor's call);
- ``channel``: the windows go from the env and rollout workers to the actor through a
  `rlshell.cluster.channel.Channel`; the driver hears only the env metrics.

Per measured step (median over the steps): ``cpu_s``: each process's CPU seconds (user
+ system, all its threads, Ray's own included), from ``/proc``; ``driver_share`` is the
driver process's part of the sum over the driver, the three workers and the channel's
queue actor, ``driver_per_step_wall`` the driver's CPU seconds over the step's wall time
(``step_s``). ``same_training`` says whether the last step's ``train/`` metrics are equal
under both (same seeds, same samples).

``bytes``: one more window is submitted after the measured steps, and the size of
everything its calls produced is taken (pickled): the per-step observations and actions
between the env and rollout workers, the windows, the metrics. ``moved`` counts each
object once; ``via_driver`` those that pass through the driver's process, by Ray's rules
(a call result under 100 KiB, ``max_direct_call_object_size``, comes back inside the
call's reply and goes out again inside the next call that takes it; a larger one stays
in the node's object store and only its ref passes; what the driver waits on it
receives), and ``driver_share`` their part of ``moved``; ``driver_traffic`` is what the
driver receives and sends for them (an inlined object twice); ``windows`` the window
objects' part of ``moved``.

``channel_round_trip_ms``: a ``put`` then a ``get`` of a 1 KiB item on the driver
(median of 200): what sending each per-step observation or action through a channel
would cost, set against ``step_s`` over the step's ``2 × rollout_steps × 2`` exchanges.
The per-step observations and actions take the driver's route in both transports (they
are under 100 KiB here): what differs is the windows'.

    .venv/bin/python benchmarks/driver_share.py [--quick] [--steps 6] [--warmup 2] \\
        [--rollout-steps 64]

Prints one JSON object. ``--quick`` is a smoke run (one step of 8; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "ppo_cartpole.py"
PLACEMENT = '{"actor": "0:0", "rollout": "0:0", "env": "0:0"}'
TRANSPORTS = ("driver", "channel")


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) of process ``pid`` so far."""
    import psutil

    cpu = psutil.Process(pid).cpu_times()
    return float(cpu.user + cpu.system)


INLINE_LIMIT = 100 * 1024  # Ray's max_direct_call_object_size, its default


def _size(value: Any) -> int:
    import pickle

    return len(pickle.dumps(value, protocol=5))


def window_bytes(trainer: Any) -> dict[str, float]:
    """The bytes one window moves, those of them that pass through the driver, and the
    driver's traffic for them (see the module)."""
    window = trainer.pipeline.submit()
    moved = via_driver = traffic = windows = 0
    for call in window.calls:
        for value in call.wait():
            size = _size(value)
            inline = size < INLINE_LIMIT
            if call.method in ("predict", "step", "observe"):  # taken by the next call
                moved += size
                via_driver += size if inline else 0
                traffic += 2 * size if inline else 0
            elif call.method == "finish":  # the route through the driver: the actor's input
                windows += size
                moved += size
                via_driver += size if inline else 0
                traffic += 2 * size if inline else 0
                if call is window.env_windows:  # and the driver reads the env windows
                    traffic += 0 if inline else size
            else:  # finish_into's metrics (or None), pop_metrics: the driver waits on them
                moved += size
                via_driver += size
                traffic += size
    if trainer.transport == "channel":  # the windows, read here from the channel to size them
        for _ in range(2 * trainer.envs.world_size):
            size = _size(trainer.channel.get((window.number, 0), timeout=60.0))
            windows += size
            moved += size
    return {
        "moved": float(moved),
        "via_driver": float(via_driver),
        "driver_share": via_driver / moved,
        "driver_traffic": float(traffic),
        "windows": float(windows),
    }


def channel_round_trip_ms(repeats: int) -> float:
    from rlshell.cluster.channel import Channel

    channel = Channel.create("round_trip", maxsize=1)
    item = bytes(1024)
    try:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            channel.put(item)
            channel.get(timeout=10.0)
            times.append(time.perf_counter() - started)
    finally:
        channel.close(kill=True)
    return 1000 * statistics.median(times)


def _queue_pid(channel: Any) -> int:
    import ray

    pid = ray.get(channel._queues.__ray_call__.remote(lambda _self: os.getpid()))
    return int(pid)


def measure(
    cluster: Any, transport: str, run_dir: Path, steps: int, warmup: int, rollout_steps: int
) -> dict[str, Any]:
    from rlshell.runners.embodied_pipeline import PipelinedPPOTrainer
    from rlshell.runners.spec import resolve_spec
    from rlshell.runners.validation import load_config, plan_for

    config = load_config(
        str(CONFIG),
        [
            f"cluster.component_placement={PLACEMENT}",
            "rollout.pipeline_stage_num=2",
            f"runner.rollout_steps={rollout_steps}",
            f"runner.max_steps={warmup + steps}",
            f"runner.output_dir={run_dir}",
        ],
        for_run=True,
    )
    plan = plan_for(config, cluster.spec())
    trainer_cls = type(f"{transport}_routed", (PipelinedPPOTrainer,), {"transport": transport})
    trainer = trainer_cls.launch(resolve_spec(config), cluster, plan, run_dir)
    try:
        groups = (trainer.envs, trainer.rollout, trainer.actor)
        workers = {f"{g.name}:{w.rank}": w.pid for g in groups for w in g.workers}
        workers["channel queue"] = _queue_pid(trainer.channel)
        driver = os.getpid()
        for step in range(1, warmup + 1):
            trainer.step(step)
        rows: list[dict[str, float]] = []
        metrics: dict[str, float] = {}
        for step in range(warmup + 1, warmup + steps + 1):
            processes = [("driver", driver), *workers.items()]
            before = {name: _cpu_s(pid) for name, pid in processes}
            started = time.perf_counter()
            metrics = trainer.step(step)
            wall = time.perf_counter() - started
            cpu = {name: _cpu_s(pid) - before[name] for name, pid in processes}
            rows.append(
                {"step_s": wall, "driver_cpu_s": cpu["driver"], "all_cpu_s": sum(cpu.values())}
            )
        moved = window_bytes(trainer)
    finally:
        trainer.close()

    def median(key: str) -> float:
        return float(statistics.median(row[key] for row in rows))

    return {
        "step_s": median("step_s"),
        "bytes": moved,
        "cpu_s": {
            "driver": median("driver_cpu_s"),
            "all_processes": median("all_cpu_s"),
            "driver_share": median("driver_cpu_s") / median("all_cpu_s"),
            "driver_per_step_wall": median("driver_cpu_s") / median("step_s"),
        },
        "train_metrics": {k: v for k, v in sorted(metrics.items()) if k.startswith("train/")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; figures mean nothing")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rollout-steps", type=int, default=64)
    args = parser.parse_args()
    steps, warmup, rollout_steps = (
        (1, 1, 8) if args.quick else (args.steps, args.warmup, args.rollout_steps)
    )
    from rlshell.cluster.ray_cluster import Cluster

    report: dict[str, Any] = {
        "benchmark": "driver_share",
        "config": f"{CONFIG.relative_to(ROOT)} with {PLACEMENT}, 2 stages",
        "rollout_steps": rollout_steps,
        "measured_steps": steps,
        "warmup_steps": warmup,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "quick": args.quick,
        "transports": {},
    }
    with (
        tempfile.TemporaryDirectory(prefix="driver_share") as directory,
        Cluster(num_cpus=2, temp_dir=tempfile.mkdtemp(prefix="ds", dir="/tmp")) as cluster,
    ):
        for transport in TRANSPORTS:
            report["transports"][transport] = measure(
                cluster, transport, Path(directory) / transport, steps, warmup, rollout_steps
            )
        report["channel_round_trip_ms"] = channel_round_trip_ms(20 if args.quick else 200)
    driver, channel = (report["transports"][t] for t in TRANSPORTS)
    report["same_training"] = driver["train_metrics"] == channel["train_metrics"]
    report["driver_bytes_channel_over_driver"] = (
        channel["bytes"]["via_driver"] / driver["bytes"]["via_driver"]
    )
    report["driver_cpu_channel_over_driver"] = (
        channel["cpu_s"]["driver"] / driver["cpu_s"]["driver"]
    )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

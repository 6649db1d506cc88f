"""Worker-group overhead: Ray start-up, group launch, and the round trip of a no-op call.

Measured on an embedded local Ray (``ray.init``, as ``rlshell`` starts it):

- ``ray_startup_s``: `Cluster()` start-up (``ray.init``);
- ``launch_s``: launching a 2-rank `WorkerGroup` (placement groups, two actors
  with their environment, constructors, the MASTER_ADDR/PORT rendezvous), the
  first launch and a second one (the class is exported to Ray only once);
- ``noop_call_ms``: ``group.noop().wait()`` on the 2-rank group, median and p90,
  against the baseline measured here on the same two actors: raw Ray calls
  ``ray.get([a.noop.remote() for a in actors])``. The two are interleaved call by
  call so that machine noise hits both alike.

Prints one JSON object. Target: the group call costs at most 1.5x the raw Ray
call (median), i.e. error translation, rank bookkeeping and first-failure
waiting stay cheap next to Ray's own round trip.

    python benchmarks/shell_workers.py [--calls 200] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import ray

from rlshell.cluster.placement import (
    ComponentPlan,
    ComponentRequest,
    NodeSpec,
    cluster_spec,
    plan_placement,
)
from rlshell.cluster.ray_cluster import Cluster
from rlshell.cluster.worker import Worker

TARGET_RATIO = 1.5
WORLD_SIZE = 2


class NoopWorker(Worker):
    """Does nothing, quickly."""

    def noop(self) -> None:
        return None


def two_rank_plan(name: str) -> ComponentPlan:
    """Two workers of 0.25 CPU on node 0 (small enough to fit any machine)."""
    node = cluster_spec([NodeSpec(gpus=0, cpus=1.0)])
    request = ComponentRequest(name, f"0:0-{WORLD_SIZE - 1}", cpus_per_worker=0.25, uses_gpus=False)
    return plan_placement(node, [request]).component(name)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def summary_ms(samples: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(samples) * 1000.0,
        "p90": percentile(samples, 0.9) * 1000.0,
        "min": min(samples) * 1000.0,
    }


def interleaved(calls: int, warmup: int, **fns: Callable[[], Any]) -> dict[str, list[float]]:
    """Time each function ``calls`` times, alternating between them call by call."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(calls):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="few calls, for smoke tests")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.warmup = 10, 2
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    try:
        with Cluster(num_cpus=2, temp_dir=temp_dir) as cluster:
            first = NoopWorker.create_group().launch(cluster, two_rank_plan("bench-first"))
            first.shutdown()
            group = NoopWorker.create_group().launch(cluster, two_rank_plan("bench"))
            actors = group.actors
            samples = interleaved(
                args.calls,
                args.warmup,
                worker_group=lambda: group.noop().wait(),
                raw_ray=lambda: ray.get([actor.noop.remote() for actor in actors]),
            )
            startup_s = cluster.startup_seconds
            launches = [first.launch_seconds, group.launch_seconds]
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)

    ours, raw = summary_ms(samples["worker_group"]), summary_ms(samples["raw_ray"])
    ratio = ours["median"] / raw["median"]
    report = {
        "benchmark": "shell_workers",
        "quick": args.quick,
        "ray": ray.__version__,
        "machine": platform.machine(),
        "cpus": len(os.sched_getaffinity(0)),
        "world_size": WORLD_SIZE,
        "calls": args.calls,
        "ray_startup_s": startup_s,
        "launch_s": {"first": launches[0], "second": launches[1]},
        "noop_call_ms": {"worker_group": ours, "raw_ray": raw},
        "baseline": "ray.get([a.noop.remote() for a in actors]) on the same 2 actors, interleaved",
        "ratio_vs_raw_ray": {
            "median": ratio,
            "p90": ours["p90"] / raw["p90"],
        },
        "target": {"median_ratio_at_most": TARGET_RATIO},
        "met": ratio <= TARGET_RATIO,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

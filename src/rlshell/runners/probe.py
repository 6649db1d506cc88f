"""The ``probe`` runner: check that a cluster realises a placement plan, and time it.

For every planned component it launches one `ProbeWorker` per process,
checks that each sees the rank, world size, local rank, node and
``CUDA_VISIBLE_DEVICES`` the plan gave it (and that extension modules
loaded), forms the component's gloo process group, then for
``runner.max_steps`` rounds times a no-op group call and an all-reduce on
every component. Results go to ``<run dir>/probe.json``.

    python -m rlshell.train configs/grpo.py runner.runner_type=probe runner.max_steps=20
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from rlshell.cluster.group import WorkerGroup
from rlshell.cluster.placement import ComponentPlan, PlacementPlan
from rlshell.cluster.ray_cluster import Cluster
from rlshell.extensions import extension_modules
from rlshell.runners.spec import RunSpec
from rlshell.workers.probe import ProbeWorker

__all__ = ["PlacementMismatchError", "run"]


class PlacementMismatchError(RuntimeError):
    """A worker does not see what the placement plan gave it."""


def run(spec: RunSpec, cluster: Cluster, plan: PlacementPlan, run_dir: Path) -> None:
    """Launch, check and time every component of ``plan``; ``probe.json`` in ``run_dir``."""
    config = spec.config
    groups: dict[str, WorkerGroup[ProbeWorker]] = {}
    try:
        for component in plan.components:
            started = time.perf_counter()
            group = ProbeWorker.create_group().launch(
                cluster, component, call_timeout_s=config.cluster.call_timeout_s
            )
            groups[component.name] = group
            print(
                f"probe: {component.name}: {component.world_size} workers up in "
                f"{time.perf_counter() - started:.1f} s",
                flush=True,
            )
        reports = {name: group.report().wait() for name, group in groups.items()}
        for component in plan.components:
            reservation = groups[component.name].reservation
            planned = (
                [reservation.node_id(rank) for rank in range(component.world_size)]
                if reservation is not None
                else None
            )
            _check(component, reports[component.name], planned)
        for group in groups.values():
            group.join().wait()
        timings = _rounds(config.runner.max_steps, groups)
        summary = {"reports": reports, "timings_ms": timings, "nodes": list(cluster.node_ids())}
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "probe.json").write_text(json.dumps(summary, indent=2) + "\n")
        for name, times in timings.items():
            print(
                f"probe: {name}: call {statistics.median(times['call']):.2f} ms, "
                f"all-reduce {statistics.median(times['all_reduce']):.2f} ms (median)",
                flush=True,
            )
        for group in groups.values():
            group.leave().wait()
    finally:
        for group in groups.values():
            group.shutdown()


def _check(
    component: ComponentPlan, reports: list[dict[str, Any]], node_ids: list[str] | None
) -> None:
    """Each rank's report against its plan: ranks, node rank, GPUs, extensions, and (where
    the group was reserved) the Ray node it runs on against the node its rank was pinned to."""
    expected_modules = list(extension_modules())
    for worker, report in zip(component.workers, reports, strict=True):
        seen = report["env"]
        wanted = {
            "RANK": str(worker.rank),
            "WORLD_SIZE": str(component.world_size),
            "LOCAL_RANK": str(worker.local_rank),
            "LOCAL_WORLD_SIZE": str(worker.local_world_size),
            "NODE_RANK": str(worker.node_rank),
            "CUDA_VISIBLE_DEVICES": worker.cuda_visible_devices,
        }
        wrong: dict[str, tuple[Any, Any]] = {
            key: (seen.get(key), value) for key, value in wanted.items() if seen.get(key) != value
        }
        if node_ids is not None and report["node_id"] != node_ids[worker.rank]:
            wrong["Ray node"] = (report["node_id"], node_ids[worker.rank])
        if report["extensions_loaded"] != expected_modules:
            wrong["RLSHELL_EXT_MODULE"] = (report["extensions_loaded"], expected_modules)
        if wrong:
            details = ", ".join(
                f"{key} is {got!r}, planned {want!r}" for key, (got, want) in wrong.items()
            )
            raise PlacementMismatchError(
                f"{component.name} rank {worker.rank} on {report['host']} (pid {report['pid']}): "
                f"{details}"
            )


def _rounds(
    steps: int, groups: dict[str, WorkerGroup[ProbeWorker]]
) -> dict[str, dict[str, list[float]]]:
    timings: dict[str, dict[str, list[float]]] = {
        name: {"call": [], "all_reduce": []} for name in groups
    }
    for step in range(steps):
        for name, group in groups.items():
            started = time.perf_counter()
            group.noop().wait()
            called = time.perf_counter()
            sums = group.all_reduce(1.0).wait()
            reduced = time.perf_counter()
            if sums != [float(group.world_size)] * group.world_size:
                raise RuntimeError(
                    f"{name}: all-reduce of 1.0 over {group.world_size} ranks gave {sums}"
                )
            timings[name]["call"].append((called - started) * 1e3)
            timings[name]["all_reduce"].append((reduced - called) * 1e3)
        print(f"probe step {step + 1}/{steps}", flush=True)
    return timings

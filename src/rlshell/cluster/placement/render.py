"""A plan as a table for people and as JSON for the run directory (written and read back)."""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import cattrs

from rlshell.cluster.placement.records import (
    DEFAULT_NODE_GROUP,
    ClusterSpec,
    ComponentPlan,
    Mode,
    NodeGroup,
    PlacementPlan,
    WorkerPlacement,
)
from rlshell.cluster.placement.syntax import format_ranks
from rlshell.cluster.placement.wording import counted, nodes_label, plain_number

__all__ = [
    "plan_from_dict",
    "plan_to_dict",
    "read_plan",
    "render_table",
    "write_plan",
]


def render_table(plan: PlacementPlan) -> str:
    """The plan as plain fixed-width text: a cluster summary, then one row per component and node.

    >>> requests = [ComponentRequest("actor", "0-7"), ComponentRequest("rollout", "0-7")]
    >>> print(render_table(plan_placement(simulated_cluster("1x8"), requests)))
    cluster: 1 node × 8 GPUs, 128 CPUs (simulated) · mode: collocated
    component  ranks  node  local ranks  GPUs  CPUs/worker
    ---------  -----  ----  -----------  ----  -----------
    actor      0-7    0     0-7          0-7   1
    rollout    0-7    0     0-7          0-7   1

    The GPUs column is each worker's ``CUDA_VISIBLE_DEVICES`` in rank order:
    ``0-7`` when each worker has its own single GPU, ``0-3 (2 workers each)``
    when consecutive workers share one, else the list (``0,1 2,3``).
    """
    header = ("component", "ranks", "node", "local ranks", "GPUs", "CPUs/worker")
    rows = [row for component in plan.components for row in _component_rows(component)]
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    lines = [f"cluster: {_describe_cluster(plan.cluster)} · mode: {plan.mode.value}"]
    labelled = [g for g in plan.cluster.node_groups if g.label != DEFAULT_NODE_GROUP]
    if labelled:
        lines.append(
            "node groups: "
            + " · ".join(f"{g.label} = {nodes_label(g.node_ranks)}{_extras(g)}" for g in labelled)
        )
    if plan.cluster.comm_net_devices:
        lines.append(f"collectives' network interface: {plan.cluster.comm_net_devices}")
    for line in [header, tuple("-" * width for width in widths), *rows]:
        lines.append(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )
    return "\n".join(lines)


def _extras(group: NodeGroup) -> str:
    """A group's hardware and workers' environment, e.g. " (Accelerator; node 1: FOO, python
    /opt/venv/bin/python)"; empty when it declares neither."""
    parts = [group.hardware] if group.hardware else []
    for env in group.envs:
        settings = sorted(env.env_vars)
        if env.python_executable:
            settings.append(f"python {env.python_executable}")
        if settings:
            parts.append(f"{nodes_label(env.node_ranks)}: {', '.join(settings)}")
    return f" ({'; '.join(parts)})" if parts else ""


def _component_rows(component: ComponentPlan) -> list[tuple[str, ...]]:
    by_node: dict[int, list[WorkerPlacement]] = defaultdict(list)
    for worker in component.workers:
        by_node[worker.node_rank].append(worker)
    return [
        (
            component.name,
            format_ranks(w.rank for w in workers),
            str(node),
            format_ranks(w.local_rank for w in workers),
            _describe_worker_gpus(workers),
            plain_number(workers[0].cpus),
        )
        for node, workers in sorted(by_node.items())
    ]


def _describe_worker_gpus(workers: Sequence[WorkerPlacement]) -> str:
    visible = [w.gpus for w in workers]
    if not any(visible):
        return "-"
    if all(len(gpus) == 1 for gpus in visible):
        flat = [gpus[0] for gpus in visible]
        if len(set(flat)) == len(flat):
            return format_ranks(flat)
        distinct = list(dict.fromkeys(flat))
        per_gpu = len(flat) // len(distinct)
        if flat == [gpu for gpu in distinct for _ in range(per_gpu)]:
            return f"{format_ranks(distinct)} ({per_gpu} workers each)"
    return " ".join(f"[{format_ranks(w.gpus)}]" if w.gpus else "-" for w in workers)


def _describe_cluster(cluster: ClusterSpec) -> str:
    kinds = Counter((node.gpus, node.cpus) for node in cluster.nodes)
    parts = []
    for (gpus, cpus), count in kinds.items():
        each = " each" if count > 1 else ""
        if gpus:
            parts.append(
                f"{counted(count, 'node')} × {counted(gpus, 'GPU')}, "
                f"{plain_number(cpus)} CPUs{each}"
            )
        else:
            parts.append(f"{counted(count, 'CPU-only node')}, {plain_number(cpus)} CPUs{each}")
    return " + ".join(parts) + (" (simulated)" if cluster.simulated else "")


_CONVERTER = cattrs.Converter(unstruct_collection_overrides={tuple: list})
_CONVERTER.register_unstructure_hook(Mode, lambda mode: mode.value)


def plan_to_dict(plan: PlacementPlan) -> dict[str, object]:
    """The plan as JSON-ready dicts, lists and scalars, fields in declaration order.

    >>> plan = plan_placement(simulated_cluster("1x0x2"), [ComponentRequest("env", "0:0-1")])
    >>> data = plan_to_dict(plan)
    >>> list(data), data["mode"], data["components"][0]["workers"][1]["resources"]
    (['cluster', 'components', 'mode'], 'collocated', [0])
    >>> plan_from_dict(json.loads(json.dumps(plan_to_dict(plan)))) == plan
    True
    """
    data: dict[str, object] = _CONVERTER.unstructure(plan)
    return data


def plan_from_dict(data: Mapping[str, object]) -> PlacementPlan:
    """The inverse of `plan_to_dict` (cattrs names the field of any malformed entry)."""
    return _CONVERTER.structure(data, PlacementPlan)


def write_plan(plan: PlacementPlan, path: str | Path) -> Path:
    """Write the plan as JSON (indent 2); into ``placement.json`` when ``path`` is a directory.

    ``write_plan(plan, run_dir)`` writes and returns ``run_dir / "placement.json"``.
    """
    target = Path(path)
    if target.is_dir():
        target = target / "placement.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(plan_to_dict(plan), indent=2) + "\n", encoding="utf-8")
    os.replace(partial, target)  # a reader sees the old plan or the new one, never half of one
    return target


def read_plan(path: str | Path) -> PlacementPlan:
    """A plan written by `write_plan` (a file, or a directory holding ``placement.json``)."""
    source = Path(path)
    if source.is_dir():
        source = source / "placement.json"
    return plan_from_dict(json.loads(source.read_text(encoding="utf-8")))

"""The planner: requests and a cluster spec to a `PlacementPlan`, every problem reported at once."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence

from attrs import frozen

from rlshell.cluster.placement.clusters import node_problems
from rlshell.cluster.placement.node_groups import worker_settings
from rlshell.cluster.placement.records import (
    ClusterSpec,
    ComponentPlan,
    ComponentRequest,
    Mode,
    NodeGroup,
    PlacementError,
    PlacementPlan,
    Segment,
    WorkerPlacement,
    groups_by_label,
    unknown_group,
)
from rlshell.cluster.placement.syntax import (
    ParsedSegment,
    format_ranks,
    number_processes,
    parse_segments,
    segment_name,
    uneven_segments,
)
from rlshell.cluster.placement.wording import counted, nodes_label, plain_number

__all__ = [
    "detect_mode",
    "plan_placement",
]


@frozen
class _Resources:
    """What a component's resource ranks mean in its node group.

    ``locations[r]`` is (global node rank, node-local GPU) of resource r, the
    GPU being None when resources are nodes.
    """

    group: NodeGroup
    gpus: bool
    locations: tuple[tuple[int, int | None], ...]
    gpu_counts: tuple[int, ...]

    @classmethod
    def of(cls, cluster: ClusterSpec, group: NodeGroup, uses_gpus: bool) -> _Resources:
        counts = tuple(cluster.nodes[rank].gpus for rank in group.node_ranks)
        if uses_gpus and sum(counts) > 0:
            gpu_locations = [
                (node, gpu)
                for node, count in zip(group.node_ranks, counts, strict=True)
                for gpu in range(count)
            ]
            return cls(group, True, tuple(gpu_locations), counts)
        node_locations = [(node, None) for node in group.node_ranks]
        return cls(group, False, tuple(node_locations), counts)

    @property
    def unit(self) -> str:
        return "GPU" if self.gpus else "node"

    def describe(self) -> str:
        """The group's size, e.g. "8 GPUs (1 node × 8)" or "1 node (node 2)"."""
        nodes = len(self.group.node_ranks)
        if not self.gpus:
            return f"{counted(nodes, 'node')} ({nodes_label(self.group.node_ranks)})"
        if len(set(self.gpu_counts)) == 1:
            layout = f"{counted(nodes, 'node')} × {self.gpu_counts[0]}"
        else:
            layout = f"nodes {format_ranks(self.group.node_ranks)} with " + ", ".join(
                str(count) for count in self.gpu_counts
            )
        return f"{counted(len(self.locations), 'GPU')} ({layout})"


def plan_placement(cluster: ClusterSpec, requests: Sequence[ComponentRequest]) -> PlacementPlan:
    """Every component's workers on ``cluster``, or one PlacementError listing every problem.

    >>> plan = plan_placement(
    ...     simulated_cluster("1x8"),
    ...     [ComponentRequest("actor", "0-7"), ComponentRequest("rollout", "0-7")],
    ... )
    >>> plan.mode, plan.component("rollout").workers[3].gpus
    (<Mode.COLLOCATED: 'collocated'>, (3,))

    Problems are checked per component (node group, syntax, ranks, process
    layout, tensor parallelism, CPUs per worker), then across components
    (CPUs per node, GPUs shared with a component that does not share).
    """
    problems = _cluster_problems(cluster)
    if problems:
        raise PlacementError(problems)
    problems = _request_name_problems(requests)
    groups = groups_by_label(cluster)
    planned: list[ComponentPlan] = []
    unique = _unique_requests(requests)
    for request in unique:
        component, found = _plan_component(cluster, groups, request)
        problems += found
        if component is not None:
            planned.append(component)
    problems += _cpu_problems(cluster, planned)
    problems += _sharing_problems(planned, {request.name: request for request in unique})
    if problems:
        raise PlacementError(problems)
    return PlacementPlan(cluster=cluster, components=planned, mode=detect_mode(planned))


def _cluster_problems(cluster: ClusterSpec) -> list[str]:
    problems = node_problems(cluster.nodes)
    for label, count in Counter(group.label for group in cluster.node_groups).items():
        if count > 1:
            problems.append(f"node group '{label}': defined {count} times; labels must be unique")
    for group in cluster.node_groups:
        beyond = [rank for rank in group.node_ranks if not 0 <= rank < len(cluster.nodes)]
        if beyond or not group.node_ranks:
            problems.append(
                f"node group '{group.label}': node ranks ({format_ranks(group.node_ranks)}) "
                f"must be a non-empty subset of 0-{len(cluster.nodes) - 1}"
            )
    return problems


def _request_name_problems(requests: Sequence[ComponentRequest]) -> list[str]:
    problems = []
    for name, count in Counter(request.name for request in requests).items():
        if count > 1:
            problems.append(f"{name}: requested {count} times; each component is planned once")
        if not name.strip() or "," in name:
            problems.append(
                f"'{name}': a component name must be non-empty and without ','; "
                "expand keys like 'actor,rollout' with split_component_keys"
            )
    return problems


def _unique_requests(requests: Sequence[ComponentRequest]) -> list[ComponentRequest]:
    seen: set[str] = set()
    unique = []
    for request in requests:
        if request.name not in seen:
            seen.add(request.name)
            unique.append(request)
    return unique


def _plan_component(
    cluster: ClusterSpec, groups: Mapping[str, NodeGroup], request: ComponentRequest
) -> tuple[ComponentPlan | None, list[str]]:
    """One component's workers; None when its placement cannot be laid out at all."""
    name = request.name
    problems = []
    if not request.cpus_per_worker > 0:
        problems.append(f"{name}: cpus_per_worker must be > 0, got {request.cpus_per_worker}")
    group = groups.get(request.node_group)
    if group is None:
        return None, [*problems, f"{name}: {unknown_group(request.node_group, groups)}"]
    resources = _Resources.of(cluster, group, request.uses_gpus)
    tp_problems = _tensor_parallel_problems(request, resources)
    per_process = request.tensor_parallel_size if not tp_problems else 1
    try:
        parsed = parse_segments(request.placement, len(resources.locations))
    except ValueError as error:
        return None, [*problems, *tp_problems, f"{name}: {error}"]
    layout_problems = [
        *tp_problems,
        *_range_problems(request, parsed, resources),
        *(
            f"{name}: tensor_parallel_size {per_process} does not divide the "
            f"{counted(len(segment.resources), 'GPU')} of "
            f"{segment_name(segment, request.placement)}"
            for segment in uneven_segments(parsed, per_process)
        ),
    ]
    if layout_problems:
        return None, problems + layout_problems
    segments = number_processes(parsed, per_process)
    layout_problems = [
        *_process_rank_problems(request, segments),
        *_segment_shape_problems(request, parsed, segments, resources, per_process),
    ]
    if layout_problems:
        return None, problems + layout_problems
    return _component_plan(request, segments, resources, cluster.comm_net_devices), problems


def _tensor_parallel_problems(request: ComponentRequest, resources: _Resources) -> list[str]:
    tp = request.tensor_parallel_size
    if tp < 1:
        return [f"{request.name}: tensor_parallel_size must be >= 1, got {tp}"]
    if tp > 1 and not resources.gpus:
        why = (
            "uses_gpus is False"
            if not request.uses_gpus
            else f"node group '{resources.group.label}' has no GPUs"
        )
        return [
            f"{request.name}: tensor_parallel_size {tp} needs GPUs, but {why}, so its "
            "resources are nodes; use tensor_parallel_size 1"
        ]
    return []


def _range_problems(
    request: ComponentRequest, parsed: Sequence[ParsedSegment], resources: _Resources
) -> list[str]:
    available = len(resources.locations)
    beyond = sorted({r for segment in parsed for r in segment.resources if r >= available})
    if not beyond:
        return []
    unit = resources.unit + ("s" if len(beyond) > 1 else "")
    return [
        f"{request.name}: placement '{request.placement}' names {unit} {format_ranks(beyond)} "
        f"but node group '{resources.group.label}' has {resources.describe()}"
    ]


def _process_rank_problems(request: ComponentRequest, segments: Sequence[Segment]) -> list[str]:
    ranks = [rank for segment in segments for rank in segment.processes]
    counts = Counter(ranks)
    repeated = sorted(rank for rank, count in counts.items() if count > 1)
    distinct = sorted(counts)
    where = f"{request.name}: process ranks of placement '{request.placement}'"
    problems = []
    if repeated:
        problems.append(f"{where} repeat {format_ranks(repeated)}; each rank must appear once")
    # Compared with 0..N-1 for the N distinct ranks: a stray huge rank costs nothing.
    if distinct != list(range(len(distinct))):
        problems.append(
            f"{where} are {format_ranks(distinct)}; they must be "
            f"{format_ranks(range(len(distinct)))}, without gaps"
        )
    return problems


def _segment_shape_problems(
    request: ComponentRequest,
    parsed: Sequence[ParsedSegment],
    segments: Sequence[Segment],
    resources: _Resources,
    tensor_parallel_size: int,
) -> list[str]:
    problems = []
    unit = resources.unit
    for written, segment in zip(parsed, segments, strict=True):
        where = f"{request.name}: {segment_name(written, request.placement)}"
        held, shared = len(segment.resources), len(segment.processes)
        if held % shared and shared % held:
            problems.append(
                f"{where} has {counted(held, unit)} and {counted(shared, 'process')}; one count "
                f"must be a multiple of the other (processes sharing a {unit}, or each process "
                f"holding several {unit}s)"
            )
            continue
        if tensor_parallel_size > 1 and held != shared * tensor_parallel_size:
            problems.append(
                f"{where} gives its {counted(shared, 'process')} {counted(held, 'GPU')}, but "
                f"tensor_parallel_size {tensor_parallel_size} needs "
                f"{shared * tensor_parallel_size} (exactly {tensor_parallel_size} per process)"
            )
            continue
        problems += _spanning_problems(where, segment, resources)
    return problems


def _spanning_problems(where: str, segment: Segment, resources: _Resources) -> list[str]:
    spanning = [
        (process, held)
        for process, held in _assign(segment)
        if len({resources.locations[r][0] for r in held}) > 1
    ]
    if not spanning:
        return []
    process, held = spanning[0]
    nodes = sorted({resources.locations[r][0] for r in held})
    more = f" (and {counted(len(spanning) - 1, 'more process')})" if len(spanning) > 1 else ""
    if not resources.gpus:
        return [
            f"{where}: process {process} would span nodes {format_ranks(nodes)}{more}; "
            "a process runs on one node"
        ]
    return [
        f"{where}: process {process} would hold GPUs {format_ranks(held)} on nodes "
        f"{format_ranks(nodes)}{more}; a process's GPUs must all be on one node"
    ]


def _assign(segment: Segment) -> list[tuple[int, tuple[int, ...]]]:
    """(process rank, the resources it holds) for a segment whose counts divide evenly."""
    held, shared = len(segment.resources), len(segment.processes)
    if held >= shared:
        per = held // shared
        return [
            (process, segment.resources[i * per : (i + 1) * per])
            for i, process in enumerate(segment.processes)
        ]
    # Several processes per resource: consecutive ranks share one, as "0-3:0-7" puts 0 and 1 on 0.
    per = shared // held
    return [
        (process, (segment.resources[i // per],)) for i, process in enumerate(segment.processes)
    ]


def _component_plan(
    request: ComponentRequest,
    segments: Sequence[Segment],
    resources: _Resources,
    comm_net_devices: str | None,
) -> ComponentPlan:
    assigned = sorted(pair for segment in segments for pair in _assign(segment))
    node_of = {rank: resources.locations[held[0]][0] for rank, held in assigned}
    per_node = Counter(node_of.values())
    seen_on_node: Counter[int] = Counter()
    workers = []
    for rank, held in assigned:
        node = node_of[rank]
        gpus = tuple(gpu for r in held if (gpu := resources.locations[r][1]) is not None)
        env_vars, python = worker_settings(resources.group, node, comm_net_devices)
        workers.append(
            WorkerPlacement(
                rank=rank,
                node_rank=node,
                local_rank=seen_on_node[node],
                local_world_size=per_node[node],
                cpus=request.cpus_per_worker,
                gpus=gpus,
                resources=held,
                node_group=resources.group.label,
                env_vars=env_vars,
                python_executable=python,
            )
        )
        seen_on_node[node] += 1
    return ComponentPlan(
        name=request.name,
        placement=request.placement,
        node_group=resources.group.label,
        workers=workers,
    )


def _cpu_problems(cluster: ClusterSpec, components: Sequence[ComponentPlan]) -> list[str]:
    # node -> component -> its workers' CPUs there, in component order
    asked: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for component in components:
        for worker in component.workers:
            asked[worker.node_rank][component.name].append(worker.cpus)
    problems = []
    for node in sorted(asked):
        total = sum(sum(cpus) for cpus in asked[node].values())
        available = cluster.nodes[node].cpus
        # A tolerance keeps fractional requests such as 0.1 × 10 from failing on rounding.
        if total > available + 1e-9:
            detail = ", ".join(
                f"{name} {len(cpus)} × {plain_number(cpus[0])}"
                for name, cpus in asked[node].items()
            )
            problems.append(
                f"{', '.join(asked[node])}: node {node} has {plain_number(available)} CPUs but its "
                f"workers ask for {plain_number(total)} ({detail}); lower cpus_per_worker or move "
                "workers to other nodes"
            )
    return problems


def _sharing_problems(
    components: Sequence[ComponentPlan], requests: Mapping[str, ComponentRequest]
) -> list[str]:
    problems = []
    for first, second in itertools.combinations(components, 2):
        exclusive = [c.name for c in (first, second) if not requests[c.name].shares_devices]
        shared = first.devices & second.devices
        if exclusive and shared:
            problems.append(
                f"{first.name}, {second.name}: both use GPUs {_describe_devices(shared)}, but "
                f"{' and '.join(exclusive)} {'has' if len(exclusive) == 1 else 'have'} "
                "shares_devices=False; give them disjoint GPUs or allow sharing"
            )
    return problems


def _describe_devices(devices: Iterable[tuple[int, int]]) -> str:
    by_node: dict[int, list[int]] = defaultdict(list)
    for node, gpu in sorted(devices):
        by_node[node].append(gpu)
    return "; ".join(f"{format_ranks(gpus)} on node {node}" for node, gpus in by_node.items())


def detect_mode(components: Sequence[ComponentPlan]) -> Mode:
    """Collocated, disaggregated or hybrid, from the devices the components hold.

    >>> requests = [ComponentRequest("actor", "0-7"), ComponentRequest("rollout", "4-7")]
    >>> detect_mode(plan_placement(simulated_cluster("1x8"), requests).components)
    <Mode.HYBRID: 'hybrid'>

    Only GPU-holding components count; when none holds a GPU, each
    component's set of nodes is compared instead. The same set everywhere
    (or a single component) is collocated, pairwise disjoint sets are
    disaggregated, anything else is hybrid.
    """
    device_sets = [component.devices for component in components if component.devices]
    if not device_sets:
        # Node sets, with -1 for "the whole node", so the comparison below serves both cases.
        device_sets = [frozenset((w.node_rank, -1) for w in c.workers) for c in components]
    if len(set(device_sets)) <= 1:
        return Mode.COLLOCATED
    if all(a.isdisjoint(b) for a, b in itertools.combinations(device_sets, 2)):
        return Mode.DISAGGREGATED
    return Mode.HYBRID

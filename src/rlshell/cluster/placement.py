"""Placement: which process of which component runs on which node and device.

A pure planner, no Ray: a `ClusterSpec` (nodes, their GPUs and CPUs, node
groups) and one `ComponentRequest` per component (RLinf's compact placement
string, CPUs per worker, tensor-parallel size) become a `PlacementPlan`
record: for every component, its workers with rank, node, local rank, CPUs
and GPU indices. `rlshell.cluster.ray_cluster` realises a plan with Ray placement groups.

Placement strings follow RLinf (``resource_ranks[:process_ranks]``, segments
joined by commas):

- ``"0-7"``: eight processes, one on each of resources 0-7;
- ``"0-3:0-7"``: processes 0-7 spread evenly over resources 0-3 (two each);
- ``"0-7:0-1"``: two processes holding four resources each;
- ``"all"``: every resource of the node group, one process each.

A *resource* is a GPU, numbered across the node group's nodes in order
(node 0's GPUs first); in a node group without GPUs, or for a component that
asks for no GPUs, it is a node. Components named together (``"actor,rollout"``)
get the same placement.

The rules the planner enforces:

- ranges are inclusive (``"a-b"``), ``"all"`` may stand only for resources;
- over all segments, the process ranks are exactly ``0..N-1``, each once;
- a segment without process ranks gets the next block of ranks after the
  highest so far, one process per resource (per ``tensor_parallel_size``
  GPUs when that is above 1);
- within a segment one count divides the other: several processes share
  each resource, or each process holds several, all on one node;
- with ``tensor_parallel_size`` k > 1 every process holds exactly k GPUs;
  at 1 (the default) the placement string alone decides;
- the CPUs asked of a node (all components' workers on it) fit the node;
- a component with ``shares_devices=False`` shares no GPU with another
  component (CPU-only workers may always share a node).

Every problem is collected and reported at once, in one `PlacementError`
whose lines each begin with the component(s) concerned.
"""

from __future__ import annotations

import difflib
import enum
import itertools
import json
import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import cattrs
from attrs import field, frozen

__all__ = [
    "DEFAULT_NODE_GROUP",
    "ClusterSpec",
    "ComponentPlan",
    "ComponentRequest",
    "Mode",
    "NodeGroup",
    "NodeSpec",
    "PlacementError",
    "PlacementPlan",
    "Segment",
    "WorkerPlacement",
    "cluster_spec",
    "detect_mode",
    "format_ranks",
    "label_selector",
    "local_cluster_spec",
    "parse_node_ranks",
    "parse_placement",
    "parse_ranks",
    "plan_from_dict",
    "plan_placement",
    "plan_to_dict",
    "read_plan",
    "render_table",
    "simulated_cluster",
    "split_component_keys",
    "write_plan",
]

DEFAULT_NODE_GROUP = "all"


# Typed converters: given a bare ``tuple`` as converter mypy cannot infer the element type,
# and rejects every call that passes a list or a tuple.
def _ints(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


def _nodes(values: Iterable[NodeSpec]) -> tuple[NodeSpec, ...]:
    return tuple(values)


def _node_groups(values: Iterable[NodeGroup]) -> tuple[NodeGroup, ...]:
    return tuple(values)


def _workers(values: Iterable[WorkerPlacement]) -> tuple[WorkerPlacement, ...]:
    return tuple(values)


def _component_plans(values: Iterable[ComponentPlan]) -> tuple[ComponentPlan, ...]:
    return tuple(values)


class PlacementError(ValueError):
    """A plan that cannot be realised; the message lists every problem and its component."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class Mode(enum.StrEnum):
    """How the GPU-holding components share devices.

    collocated: they all use the same devices (time-sharing them, with offload);
    disaggregated: no device is used by two components;
    hybrid: anything in between (e.g. env on 0-3, rollout on 4-7, actor on 0-7).
    """

    COLLOCATED = "collocated"
    DISAGGREGATED = "disaggregated"
    HYBRID = "hybrid"


@frozen
class NodeSpec:
    """One machine: its GPU count, CPU count and (for a real cluster) its address."""

    gpus: int
    cpus: float
    address: str = ""


@frozen
class NodeGroup:
    """A labelled set of nodes (by node rank) that placements can target."""

    label: str
    node_ranks: tuple[int, ...] = field(converter=_ints)


@frozen
class ClusterSpec:
    """The machines a plan is made for, real (read from Ray) or simulated.

    Node rank 0 is the head (driver) node. ``node_groups`` always contains the
    group ``"all"`` with every node; more groups may be labelled.
    """

    nodes: tuple[NodeSpec, ...] = field(converter=_nodes)
    node_groups: tuple[NodeGroup, ...] = field(converter=_node_groups, default=())
    simulated: bool = False

    def node_group(self, label: str) -> NodeGroup:
        """The group labelled ``label`` (``"all"`` even when not listed), else a KeyError."""
        groups = _groups_by_label(self)
        if label not in groups:
            raise KeyError(_unknown_group(label, groups))
        return groups[label]


@frozen
class ComponentRequest:
    """What one component asks of the planner.

    ``placement`` is RLinf's compact syntax (see the module docstring).
    ``uses_gpus=False`` makes resources mean nodes even on GPU nodes (a reward
    or env worker that needs only CPUs). ``tensor_parallel_size`` is the number
    of GPUs one process drives; ``shares_devices`` says whether this component
    may time-share its GPUs with another component (collocated mode needs
    offloading between phases).
    """

    name: str
    placement: str
    node_group: str = DEFAULT_NODE_GROUP
    cpus_per_worker: float = 1.0
    uses_gpus: bool = True
    tensor_parallel_size: int = 1
    shares_devices: bool = True


@frozen
class WorkerPlacement:
    """One process of a component.

    ``rank`` is its rank within the component (0..world_size-1), ``node_rank``
    the node it runs on, ``local_rank`` its index among this component's
    processes on that node, ``gpus`` the node-local GPU indices it sees
    (``CUDA_VISIBLE_DEVICES``), ``resources`` the resource ranks of its node
    group it was placed on.
    """

    rank: int
    node_rank: int
    local_rank: int
    local_world_size: int
    cpus: float
    gpus: tuple[int, ...] = field(converter=_ints)
    resources: tuple[int, ...] = field(converter=_ints)
    node_group: str = DEFAULT_NODE_GROUP

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(gpu) for gpu in self.gpus)


@frozen
class ComponentPlan:
    """Every worker of one component, in rank order."""

    name: str
    placement: str
    node_group: str
    workers: tuple[WorkerPlacement, ...] = field(converter=_workers)

    @property
    def world_size(self) -> int:
        return len(self.workers)

    @property
    def devices(self) -> frozenset[tuple[int, int]]:
        """The (node rank, GPU) pairs the component's workers hold."""
        return frozenset((w.node_rank, gpu) for w in self.workers for gpu in w.gpus)


@frozen
class PlacementPlan:
    """The whole cluster's plan: the spec it was made for, each component's workers, the mode."""

    cluster: ClusterSpec
    components: tuple[ComponentPlan, ...] = field(converter=_component_plans)
    mode: Mode

    def component(self, name: str) -> ComponentPlan:
        for plan in self.components:
            if plan.name == name:
                return plan
        known = ", ".join(plan.name for plan in self.components) or "none"
        raise KeyError(f"no component '{name}' in the placement plan; planned: {known}")


@frozen
class Segment:
    """One comma-separated piece of a placement string, with its process ranks filled in.

    ``Segment(resources=(0, 1, 2, 3), processes=(0, 1, 2, 3, 4, 5, 6, 7))`` is
    ``"0-3:0-7"``: two processes on each of resources 0-3.
    """

    resources: tuple[int, ...] = field(converter=_ints)
    processes: tuple[int, ...] = field(converter=_ints)


# ---------------------------------------------------------------------------
# Rank syntax


_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_NEGATIVE = re.compile(r"-[0-9]+(?:-[0-9]+)?")
_MAX_RANKS = 1_000_000


def parse_ranks(text: str) -> tuple[int, ...]:
    """Ranks from RLinf's range syntax, in the order written; ranges are inclusive.

    >>> parse_ranks("0-3,5,7-8")
    (0, 1, 2, 3, 5, 7, 8)

    A ValueError names the offending part: empty text, a non-number, a
    negative rank, a range that runs backwards (``"3-1"``), a repeated rank.
    """
    if not text.strip():
        raise ValueError("empty rank list; expected ranks like '0-3,5'")
    ranks = [rank for part in text.split(",") for rank in _parse_range(part.strip(), text)]
    repeated = sorted(rank for rank, count in Counter(ranks).items() if count > 1)
    if repeated:
        raise ValueError(f"rank(s) {format_ranks(repeated)} appear more than once in '{text}'")
    return tuple(ranks)


def _parse_range(part: str, text: str) -> range:
    match = _RANGE.fullmatch(part)
    if match is None:
        if not part:
            raise ValueError(f"empty part in ranks '{text}' (a stray comma?)")
        if _NEGATIVE.fullmatch(part):
            raise ValueError(f"negative rank '{part}' in '{text}'; ranks count from 0")
        raise ValueError(
            f"bad rank '{part}' in '{text}'; expected a rank like '5' "
            "or an inclusive range like '0-7'"
        )
    first = int(match[1])
    last = int(match[2]) if match[2] is not None else first
    if last < first:
        raise ValueError(
            f"range '{part}' in '{text}' runs backwards; did you mean '{last}-{first}'?"
        )
    # A typo such as "0-70000000" would otherwise build a huge tuple before any range check.
    if last - first >= _MAX_RANKS:
        raise ValueError(f"range '{part}' in '{text}' spans more than {_MAX_RANKS} ranks")
    return range(first, last + 1)


def format_ranks(ranks: Iterable[int]) -> str:
    """The inverse of `parse_ranks`: runs of consecutive ranks become ranges.

    >>> format_ranks([0, 1, 2, 3, 5, 7, 8])
    '0-3,5,7-8'
    """
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


# ---------------------------------------------------------------------------
# Placement strings


@frozen
class _ParsedSegment:
    """A segment as written: ``processes`` is None when the process ranks were left out."""

    text: str
    resources: tuple[int, ...]
    processes: tuple[int, ...] | None


def parse_placement(
    text: str, num_resources: int, *, tensor_parallel_size: int = 1
) -> tuple[Segment, ...]:
    """The segments of a placement string; ``"all"`` means resources ``0..num_resources-1``.

    >>> parse_placement("0-3:0-7,4-5", num_resources=8)
    (Segment(resources=(0, 1, 2, 3), processes=(0, 1, 2, 3, 4, 5, 6, 7)),
     Segment(resources=(4, 5), processes=(8, 9)))

    A segment without process ranks gets the next ranks after the highest so
    far, one process per ``tensor_parallel_size`` resources. Only the syntax
    is checked here (ValueError); `plan_placement` checks the ranks against
    a cluster.
    """
    segments = _parse_segments(text, num_resources)
    for segment in _uneven_segments(segments, tensor_parallel_size):
        raise ValueError(
            f"tensor_parallel_size {tensor_parallel_size} does not divide the "
            f"{len(segment.resources)} resources of {_segment_name(segment, text)}"
        )
    return _number_processes(segments, tensor_parallel_size)


def _parse_segments(text: str, num_resources: int) -> tuple[_ParsedSegment, ...]:
    if not text.strip():
        raise ValueError("empty placement; expected e.g. '0-7', '0-3:0-7' or 'all'")
    try:
        return tuple(_parse_segment(part.strip(), num_resources) for part in text.split(","))
    except ValueError as error:
        raise ValueError(f"placement '{text}': {error}") from None


def _parse_segment(text: str, num_resources: int) -> _ParsedSegment:
    if not text:
        raise ValueError("empty segment (a stray comma?)")
    resource_text, colon, process_text = (part.strip() for part in text.partition(":"))
    if ":" in process_text:
        raise ValueError(f"segment '{text}' has more than one ':'")
    if resource_text == "all":
        if num_resources < 1:
            raise ValueError(f"segment '{text}': 'all' names no resources here")
        resources = tuple(range(num_resources))
    else:
        resources = parse_ranks(resource_text)
    if not colon:
        return _ParsedSegment(text, resources, None)
    if process_text == "all":
        raise ValueError(
            f"segment '{text}': 'all' stands only for resources; write process ranks, e.g. "
            f"'{resource_text}:0-{max(len(resources), 1) - 1}'"
        )
    return _ParsedSegment(text, resources, parse_ranks(process_text))


def _uneven_segments(segments: Sequence[_ParsedSegment], per_process: int) -> list[_ParsedSegment]:
    """Segments without process ranks whose resources do not split into per_process blocks."""
    return [s for s in segments if s.processes is None and len(s.resources) % per_process]


def _number_processes(segments: Sequence[_ParsedSegment], per_process: int) -> tuple[Segment, ...]:
    numbered: list[Segment] = []
    next_rank = 0
    for segment in segments:
        processes = segment.processes
        if processes is None:
            count = max(len(segment.resources) // per_process, 1)
            processes = tuple(range(next_rank, next_rank + count))
        next_rank = max(next_rank, max(processes, default=-1) + 1)
        numbered.append(Segment(segment.resources, processes))
    return tuple(numbered)


def _segment_name(segment: _ParsedSegment, placement: str) -> str:
    if segment.text == placement.strip():
        return f"placement '{placement}'"
    return f"segment '{segment.text}' of placement '{placement}'"


def split_component_keys(mapping: Mapping[str, str]) -> dict[str, str]:
    """One entry per component from RLinf's placement mapping, where keys may name several.

    >>> split_component_keys({"actor,rollout": "0-7", "env": "0-3"})
    {'actor': '0-7', 'rollout': '0-7', 'env': '0-3'}

    A component named twice, or an empty name, is a PlacementError.
    """
    split: dict[str, str] = {}
    first_key: dict[str, str] = {}
    problems: list[str] = []
    for key, placement in mapping.items():
        for name in (part.strip() for part in key.split(",")):
            if not name:
                problems.append(f"'{key}': empty component name (a stray comma?)")
            elif name in split:
                problems.append(
                    f"{name}: placed twice, by '{first_key[name]}' ('{split[name]}') "
                    f"and by '{key}' ('{placement}'); name each component once"
                )
            else:
                split[name] = placement
                first_key[name] = key
    if problems:
        raise PlacementError(problems)
    return split


# ---------------------------------------------------------------------------
# Clusters


_SIMULATED = re.compile(r"\s*([0-9]+)\s*[xX×]\s*([0-9]+)\s*(?:[xX×]\s*([0-9]+)\s*)?")


def simulated_cluster(spec: str, node_groups: Mapping[str, str] | None = None) -> ClusterSpec:
    """A cluster of identical nodes from ``NODESxGPUS[xCPUS]``, for planning without hardware.

    >>> simulated_cluster("4x8").nodes[0]
    NodeSpec(gpus=8, cpus=128.0, address='')

    ``"4x8"`` is 4 nodes with 8 GPUs each; ``"4x8x64"`` gives each 64 CPUs;
    ``"1x0"`` is one CPU-only node. Without a CPU count a node has
    ``max(16, 16 × GPUs)`` CPUs, a common ratio on GPU servers. ``node_groups``
    maps labels to node ranks, as in `cluster_spec`.
    """
    match = _SIMULATED.fullmatch(spec)
    if match is None or int(match[1]) == 0:
        raise ValueError(
            f"simulated cluster '{spec}': expected NODESxGPUS or NODESxGPUSxCPUS with at least "
            "one node, e.g. '4x8' (4 nodes, 8 GPUs each), '4x8x64' or '1x0' (one CPU-only node)"
        )
    gpus = int(match[2])
    cpus = float(match[3]) if match[3] is not None else float(max(16, 16 * gpus))
    nodes = [NodeSpec(gpus=gpus, cpus=cpus) for _ in range(int(match[1]))]
    return cluster_spec(nodes, node_groups, simulated=True)


def cluster_spec(
    nodes: Sequence[NodeSpec],
    node_groups: Mapping[str, str] | None = None,
    simulated: bool = False,
) -> ClusterSpec:
    """A `ClusterSpec` with node group ``"all"`` first, then ``node_groups`` (label → node ranks).

    >>> spec = cluster_spec([NodeSpec(8, 128), NodeSpec(8, 128), NodeSpec(0, 32)], {"cpu": "2"})
    >>> [(g.label, g.node_ranks) for g in spec.node_groups]
    [('all', (0, 1, 2)), ('cpu', (2,))]

    A group's nodes are kept in rank order (its resources are numbered that
    way). Bad nodes, bad rank strings, ranks beyond the cluster and the
    reserved label ``"all"`` are reported together in one PlacementError.
    """
    problems = _node_problems(nodes)
    groups = [NodeGroup(DEFAULT_NODE_GROUP, range(len(nodes)))]
    for label, ranks_text in (node_groups or {}).items():
        group, found = _labelled_group(label, ranks_text, len(nodes))
        problems += found
        if group is not None:
            groups.append(group)
    if problems:
        raise PlacementError(problems)
    return ClusterSpec(nodes=nodes, node_groups=groups, simulated=simulated)


def _node_problems(nodes: Sequence[NodeSpec]) -> list[str]:
    problems = [] if nodes else ["cluster: no nodes; a cluster needs at least one node"]
    for rank, node in enumerate(nodes):
        if node.gpus < 0:
            problems.append(f"node {rank}: GPU count must be >= 0, got {node.gpus}")
        if not node.cpus > 0:
            problems.append(f"node {rank}: CPU count must be > 0, got {_number(node.cpus)}")
    return problems


def _labelled_group(
    label: str, ranks_text: str, num_nodes: int
) -> tuple[NodeGroup | None, list[str]]:
    if label == DEFAULT_NODE_GROUP:
        return None, [f"node group '{label}': the label is reserved for the group of every node"]
    if not label.strip() or label != label.strip():
        return None, [f"node group '{label}': labels must be non-empty, without outer spaces"]
    if "=" in ranks_text:
        return None, [
            f"node group '{label}': '{ranks_text}' selects nodes by a Ray node label, which "
            "only a running cluster has (cluster.address); a planned (cluster.simulate) or "
            "embedded cluster's groups are node ranks such as '1-2'"
        ]
    try:
        ranks = sorted(parse_ranks(ranks_text))
    except ValueError as error:
        return None, [f"node group '{label}': {error}"]
    beyond = [rank for rank in ranks if rank >= num_nodes]
    if beyond:
        return None, [
            f"node group '{label}': node ranks {format_ranks(beyond)} are beyond the cluster's "
            f"{_count(num_nodes, 'node')} (0-{num_nodes - 1})"
        ]
    return NodeGroup(label, ranks), []


def _groups_by_label(cluster: ClusterSpec) -> dict[str, NodeGroup]:
    """The cluster's groups by label; ``"all"`` is implied when a hand-built spec omits it."""
    groups = {DEFAULT_NODE_GROUP: NodeGroup(DEFAULT_NODE_GROUP, range(len(cluster.nodes)))}
    groups.update((group.label, group) for group in cluster.node_groups)
    return groups


def _unknown_group(label: str, groups: Mapping[str, NodeGroup]) -> str:
    close = difflib.get_close_matches(label, list(groups), n=1, cutoff=0.5)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown node group '{label}'{hint}; the cluster has {', '.join(groups)}"


# ---------------------------------------------------------------------------
# Planning


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
            return f"{_count(nodes, 'node')} ({_nodes_label(self.group.node_ranks)})"
        if len(set(self.gpu_counts)) == 1:
            layout = f"{_count(nodes, 'node')} × {self.gpu_counts[0]}"
        else:
            layout = f"nodes {format_ranks(self.group.node_ranks)} with " + ", ".join(
                str(count) for count in self.gpu_counts
            )
        return f"{_count(len(self.locations), 'GPU')} ({layout})"


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
    groups = _groups_by_label(cluster)
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
    problems = _node_problems(cluster.nodes)
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
        return None, [*problems, f"{name}: {_unknown_group(request.node_group, groups)}"]
    resources = _Resources.of(cluster, group, request.uses_gpus)
    tp_problems = _tensor_parallel_problems(request, resources)
    per_process = request.tensor_parallel_size if not tp_problems else 1
    try:
        parsed = _parse_segments(request.placement, len(resources.locations))
    except ValueError as error:
        return None, [*problems, *tp_problems, f"{name}: {error}"]
    layout_problems = [
        *tp_problems,
        *_range_problems(request, parsed, resources),
        *(
            f"{name}: tensor_parallel_size {per_process} does not divide the "
            f"{_count(len(segment.resources), 'GPU')} of "
            f"{_segment_name(segment, request.placement)}"
            for segment in _uneven_segments(parsed, per_process)
        ),
    ]
    if layout_problems:
        return None, problems + layout_problems
    segments = _number_processes(parsed, per_process)
    layout_problems = [
        *_process_rank_problems(request, segments),
        *_segment_shape_problems(request, parsed, segments, resources, per_process),
    ]
    if layout_problems:
        return None, problems + layout_problems
    return _component_plan(request, segments, resources), problems


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
    request: ComponentRequest, parsed: Sequence[_ParsedSegment], resources: _Resources
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
    parsed: Sequence[_ParsedSegment],
    segments: Sequence[Segment],
    resources: _Resources,
    tensor_parallel_size: int,
) -> list[str]:
    problems = []
    unit = resources.unit
    for written, segment in zip(parsed, segments, strict=True):
        where = f"{request.name}: {_segment_name(written, request.placement)}"
        held, shared = len(segment.resources), len(segment.processes)
        if held % shared and shared % held:
            problems.append(
                f"{where} has {_count(held, unit)} and {_count(shared, 'process')}; one count "
                f"must be a multiple of the other (processes sharing a {unit}, or each process "
                f"holding several {unit}s)"
            )
            continue
        if tensor_parallel_size > 1 and held != shared * tensor_parallel_size:
            problems.append(
                f"{where} gives its {_count(shared, 'process')} {_count(held, 'GPU')}, but "
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
    more = f" (and {_count(len(spanning) - 1, 'more process')})" if len(spanning) > 1 else ""
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
    request: ComponentRequest, segments: Sequence[Segment], resources: _Resources
) -> ComponentPlan:
    assigned = sorted(pair for segment in segments for pair in _assign(segment))
    node_of = {rank: resources.locations[held[0]][0] for rank, held in assigned}
    per_node = Counter(node_of.values())
    seen_on_node: Counter[int] = Counter()
    workers = []
    for rank, held in assigned:
        node = node_of[rank]
        gpus = tuple(gpu for r in held if (gpu := resources.locations[r][1]) is not None)
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
                f"{name} {len(cpus)} × {_number(cpus[0])}" for name, cpus in asked[node].items()
            )
            problems.append(
                f"{', '.join(asked[node])}: node {node} has {_number(available)} CPUs but its "
                f"workers ask for {_number(total)} ({detail}); lower cpus_per_worker or move "
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


# ---------------------------------------------------------------------------
# Rendering and files


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
            + " · ".join(f"{g.label} = {_nodes_label(g.node_ranks)}" for g in labelled)
        )
    for line in [header, tuple("-" * width for width in widths), *rows]:
        lines.append(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )
    return "\n".join(lines)


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
            _number(workers[0].cpus),
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
                f"{_count(count, 'node')} × {_count(gpus, 'GPU')}, {_number(cpus)} CPUs{each}"
            )
        else:
            parts.append(f"{_count(count, 'CPU-only node')}, {_number(cpus)} CPUs{each}")
    return " + ".join(parts) + (" (simulated)" if cluster.simulated else "")


_CONVERTER = cattrs.Converter(unstruct_collection_overrides={tuple: list})
# Mode is a str subclass, which cattrs would pass through as the enum itself.
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


# ---------------------------------------------------------------------------
# Wording


def _count(count: int, noun: str) -> str:
    plural = "es" if noun.endswith("s") else "s"
    return f"{count} {noun}" if count == 1 else f"{count} {noun}{plural}"


def _number(value: float) -> str:
    """CPU figures without a spurious ".0": 2 → "2", 0.5 → "0.5"."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _nodes_label(node_ranks: Sequence[int]) -> str:
    noun = "node" if len(node_ranks) == 1 else "nodes"
    return f"{noun} {format_ranks(node_ranks)}"


def label_selector(text: str) -> tuple[str, str] | None:
    """``("pool", "cpu")`` from a node group given as a Ray node label, ``"pool=cpu"``;
    None for node ranks (``"1-2"``)."""
    key, equals, value = text.partition("=")
    if not equals:
        return None
    if not key.strip() or not value.strip():
        raise ValueError(f"'{text}' is neither node ranks nor a label like 'pool=cpu'")
    return key.strip(), value.strip()


def parse_node_ranks(text: str, node_count: int, label: str = "") -> tuple[int, ...]:
    """Node ranks from ``"0-1,3"`` (or ``"all"``), checked against ``node_count``.

    ``label`` names the node group in errors.
    """
    where = f"node group '{label}'" if label else "node ranks"
    if text.strip() == DEFAULT_NODE_GROUP:
        return tuple(range(node_count))
    ranks: list[int] = []
    for part in (piece.strip() for piece in text.split(",")):
        low_text, _, high_text = part.partition("-")
        try:
            low = int(low_text)
            high = int(high_text) if high_text else low
        except ValueError:
            raise ValueError(
                f"{where}: '{part}' in '{text}' is not a node rank or range like '0-3'"
            ) from None
        if low > high:
            raise ValueError(f"{where}: range '{part}' in '{text}' runs backwards")
        ranks.extend(range(low, high + 1))
    outside = sorted(rank for rank in set(ranks) if not 0 <= rank < node_count)
    if outside:
        raise ValueError(
            f"{where}: node ranks {outside} in '{text}' do not exist; "
            f"the cluster has nodes 0-{node_count - 1}"
        )
    repeated = sorted({rank for rank in ranks if ranks.count(rank) > 1})
    if repeated:
        raise ValueError(f"{where}: node ranks {repeated} appear twice in '{text}'")
    return tuple(ranks)


def local_cluster_spec() -> ClusterSpec:
    """This machine as a one-node `ClusterSpec`, without Ray (for ``--dry-run``).

    CPUs are those this process may run on (its affinity mask, which container
    CPU limits set), GPUs those torch sees.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    import torch  # deferred: reading the spec must not cost a torch import elsewhere

    gpus = torch.cuda.device_count()
    return ClusterSpec(
        nodes=(NodeSpec(gpus=gpus, cpus=float(cpus)),),
        node_groups=(NodeGroup(DEFAULT_NODE_GROUP, (0,)),),
    )

"""Placement: which process of which component runs on which node and device.

A pure planner, no Ray: a `ClusterSpec` (nodes, their GPUs and CPUs, node
groups) and one `ComponentRequest` per component (RLinf's compact placement
string, CPUs per worker, tensor-parallel size) become a `PlacementPlan`
record: for every component, its workers with rank, node, local rank, CPUs
and GPU indices. `rlshell.cluster` realises a plan with Ray placement groups.

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
"""

from __future__ import annotations

import enum

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
    "WorkerPlacement",
]

DEFAULT_NODE_GROUP = "all"


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
    node_ranks: tuple[int, ...] = field(converter=tuple)


@frozen
class ClusterSpec:
    """The machines a plan is made for, real (read from Ray) or simulated.

    Node rank 0 is the head (driver) node. ``node_groups`` always contains the
    group ``"all"`` with every node; more groups may be labelled.
    """

    nodes: tuple[NodeSpec, ...] = field(converter=tuple)
    node_groups: tuple[NodeGroup, ...] = field(converter=tuple, default=())
    simulated: bool = False


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
    gpus: tuple[int, ...] = field(converter=tuple)
    resources: tuple[int, ...] = field(converter=tuple)
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
    workers: tuple[WorkerPlacement, ...] = field(converter=tuple)

    @property
    def world_size(self) -> int:
        return len(self.workers)


@frozen
class PlacementPlan:
    """The whole cluster's plan: the spec it was made for, each component's workers, the mode."""

    cluster: ClusterSpec
    components: tuple[ComponentPlan, ...] = field(converter=tuple)
    mode: Mode

    def component(self, name: str) -> ComponentPlan:
        for plan in self.components:
            if plan.name == name:
                return plan
        known = ", ".join(plan.name for plan in self.components) or "none"
        raise KeyError(f"no component '{name}' in the placement plan; planned: {known}")

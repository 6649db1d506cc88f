"""The planner's records: the cluster it plans on, what each component asks for, and the plan."""

from __future__ import annotations

import difflib
import enum
from collections.abc import Iterable, Mapping

from attrs import field, frozen

__all__ = [
    "DEFAULT_NODE_GROUP",
    "ClusterSpec",
    "ComponentPlan",
    "ComponentRequest",
    "Mode",
    "NodeEnv",
    "NodeGroup",
    "NodeSpec",
    "PlacementError",
    "PlacementPlan",
    "Segment",
    "WorkerPlacement",
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


def _envs(values: Iterable[NodeEnv]) -> tuple[NodeEnv, ...]:
    return tuple(values)


@frozen
class NodeEnv:
    """The environment of a node group's workers on some of its nodes (from RLinf's
    ``env_configs``): variables set in them and the Python they run (None: the driver's)."""

    node_ranks: tuple[int, ...] = field(converter=_ints)
    env_vars: dict[str, str] = field(factory=dict, hash=False)
    python_executable: str | None = None


@frozen
class NodeGroup:
    """A labelled set of nodes (by node rank) that placements can target.

    ``hardware``: the hardware type its resources are (``"Accelerator"``: GPUs, which
    every node of the group has), None when not declared. ``envs``: the environment of
    the workers placed on the group, per node (no node in two).
    """

    label: str
    node_ranks: tuple[int, ...] = field(converter=_ints)
    hardware: str | None = None
    envs: tuple[NodeEnv, ...] = field(converter=_envs, default=())

    def env_of(self, node_rank: int) -> NodeEnv | None:
        """The environment of this group's workers on node ``node_rank``, if one is set."""
        return next((env for env in self.envs if node_rank in env.node_ranks), None)


@frozen
class ClusterSpec:
    """The machines a plan is made for, real (read from Ray) or simulated.

    Node rank 0 is the head (driver) node. ``node_groups`` always contains the
    group ``"all"`` with every node; more groups may be labelled.
    ``comm_net_devices``: the network interface(s) every worker's collectives use
    (``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME``), None to leave them to gloo and NCCL.
    """

    nodes: tuple[NodeSpec, ...] = field(converter=_nodes)
    node_groups: tuple[NodeGroup, ...] = field(converter=_node_groups, default=())
    simulated: bool = False
    comm_net_devices: str | None = None

    def node_group(self, label: str) -> NodeGroup:
        """The group labelled ``label`` (``"all"`` even when not listed), else a KeyError."""
        groups = groups_by_label(self)
        if label not in groups:
            raise KeyError(unknown_group(label, groups))
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
    group it was placed on. ``env_vars`` and ``python_executable`` are what its node
    group and the cluster's collective interface give it (`NodeEnv`,
    `ClusterSpec.comm_net_devices`), set on top of what every worker gets.
    """

    rank: int
    node_rank: int
    local_rank: int
    local_world_size: int
    cpus: float
    gpus: tuple[int, ...] = field(converter=_ints)
    resources: tuple[int, ...] = field(converter=_ints)
    node_group: str = DEFAULT_NODE_GROUP
    env_vars: dict[str, str] = field(factory=dict, hash=False)
    python_executable: str | None = None

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


def groups_by_label(cluster: ClusterSpec) -> dict[str, NodeGroup]:
    """The cluster's groups by label; ``"all"`` is implied when a hand-built spec omits it."""
    groups = {DEFAULT_NODE_GROUP: NodeGroup(DEFAULT_NODE_GROUP, range(len(cluster.nodes)))}
    groups.update((group.label, group) for group in cluster.node_groups)
    return groups


def unknown_group(label: str, groups: Mapping[str, NodeGroup]) -> str:
    close = difflib.get_close_matches(label, list(groups), n=1, cutoff=0.5)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown node group '{label}'{hint}; the cluster has {', '.join(groups)}"

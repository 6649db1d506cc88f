"""Cluster specs: simulated (``--dry-run``), from a config's node groups, or this machine's."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from rlshell.cluster.placement.node_groups import node_group, node_ranks_of
from rlshell.cluster.placement.records import (
    DEFAULT_NODE_GROUP,
    ClusterSpec,
    NodeGroup,
    NodeSpec,
    PlacementError,
)
from rlshell.cluster.placement.syntax import format_ranks, parse_ranks
from rlshell.cluster.placement.wording import counted, plain_number
from rlshell.config.schema import NodeGroupEntry

__all__ = [
    "cluster_spec",
    "local_cluster_spec",
    "simulated_cluster",
]


_SIMULATED = re.compile(r"\s*([0-9]+)\s*[xX×]\s*([0-9]+)\s*(?:[xX×]\s*([0-9]+)\s*)?")


def simulated_cluster(
    spec: str,
    node_groups: Mapping[str, str | NodeGroupEntry] | None = None,
    comm_net_devices: str | None = None,
) -> ClusterSpec:
    """A cluster of identical nodes from ``NODESxGPUS[xCPUS]``, for planning without hardware.

    >>> simulated_cluster("4x8").nodes[0]
    NodeSpec(gpus=8, cpus=128.0, address='')

    ``"4x8"`` is 4 nodes with 8 GPUs each; ``"4x8x64"`` gives each 64 CPUs;
    ``"1x0"`` is one CPU-only node. Without a CPU count a node has
    ``max(16, 16 × GPUs)`` CPUs, a common ratio on GPU servers. ``node_groups``
    and ``comm_net_devices`` are as in `cluster_spec`.
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
    return cluster_spec(nodes, node_groups, simulated=True, comm_net_devices=comm_net_devices)


def cluster_spec(
    nodes: Sequence[NodeSpec],
    node_groups: Mapping[str, str | NodeGroupEntry] | None = None,
    simulated: bool = False,
    comm_net_devices: str | None = None,
) -> ClusterSpec:
    """A `ClusterSpec` with node group ``"all"`` first, then ``node_groups`` (label → node
    ranks, or a `NodeGroupEntry` with its workers' environment and its hardware).

    >>> spec = cluster_spec([NodeSpec(8, 128), NodeSpec(8, 128), NodeSpec(0, 32)], {"cpu": "2"})
    >>> [(g.label, g.node_ranks) for g in spec.node_groups]
    [('all', (0, 1, 2)), ('cpu', (2,))]

    A group's nodes are kept in rank order (its resources are numbered that
    way). Bad nodes, bad rank strings, ranks beyond the cluster, the reserved label
    ``"all"`` and bad environments or hardware (`rlshell.cluster.placement.node_groups`)
    are reported together in one PlacementError. ``comm_net_devices``: the interface
    collectives use (`ClusterSpec.comm_net_devices`).
    """
    problems = node_problems(nodes)
    groups = [NodeGroup(DEFAULT_NODE_GROUP, range(len(nodes)))]
    for label, entry in (node_groups or {}).items():
        labelled, found = _labelled_group(label, node_ranks_of(entry), len(nodes))
        problems += found
        if labelled is not None:
            group, found = node_group(label, labelled.node_ranks, entry, nodes)
            problems += found
            groups.append(group)
    if problems:
        raise PlacementError(problems)
    return ClusterSpec(
        nodes=nodes, node_groups=groups, simulated=simulated, comm_net_devices=comm_net_devices
    )


def node_problems(nodes: Sequence[NodeSpec]) -> list[str]:
    problems = [] if nodes else ["cluster: no nodes; a cluster needs at least one node"]
    for rank, node in enumerate(nodes):
        if node.gpus < 0:
            problems.append(f"node {rank}: GPU count must be >= 0, got {node.gpus}")
        if not node.cpus > 0:
            problems.append(f"node {rank}: CPU count must be > 0, got {plain_number(node.cpus)}")
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
            f"{counted(num_nodes, 'node')} (0-{num_nodes - 1})"
        ]
    return NodeGroup(label, ranks), []


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

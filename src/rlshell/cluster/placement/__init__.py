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

The package: `records` (the records), `syntax` (RLinf's placement syntax), `clusters`
(cluster specs), `planner` (the planner), `render` (tables and JSON), `wording`.
"""

from __future__ import annotations

from rlshell.cluster.placement.clusters import (
    cluster_spec,
    local_cluster_spec,
    simulated_cluster,
)
from rlshell.cluster.placement.planner import (
    detect_mode,
    plan_placement,
)
from rlshell.cluster.placement.records import (
    DEFAULT_NODE_GROUP,
    ClusterSpec,
    ComponentPlan,
    ComponentRequest,
    Mode,
    NodeGroup,
    NodeSpec,
    PlacementError,
    PlacementPlan,
    Segment,
    WorkerPlacement,
)
from rlshell.cluster.placement.render import (
    plan_from_dict,
    plan_to_dict,
    read_plan,
    render_table,
    write_plan,
)
from rlshell.cluster.placement.syntax import (
    format_ranks,
    label_selector,
    parse_node_ranks,
    parse_placement,
    parse_ranks,
    split_component_keys,
)

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

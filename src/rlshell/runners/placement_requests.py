"""From a config to a placement: the components a run needs, what each asks of the
cluster (`rlshell.cluster.placement.ComponentRequest`), the cluster spec its node groups
describe, and the plan, with the planner's problems in the config's terms."""

from __future__ import annotations

import difflib
import os
import re
from typing import Any

import attrs

from rlshell.cluster.placement import ClusterSpec, ComponentRequest, PlacementError, PlacementPlan
from rlshell.config import (
    COMPONENTS,
    Config,
    PlacementEntry,
)
from rlshell.runners.facts import trains_critic

__all__ = [
    "cluster_spec_and_problems",
    "cluster_spec_for",
    "comm_net_devices_of",
    "placement_requests",
    "plan_and_problems",
    "plan_for",
    "required_components",
]


def required_components(config: Config) -> tuple[str, ...]:
    """The components a run of this config starts."""
    runner = config.runner.runner_type
    needed: list[str] = []
    if runner == "reasoning":
        needed = ["actor", "rollout", "reward"]
    elif runner == "sft":
        needed = ["actor"]
    elif runner == "embodied":
        needed = ["actor", "rollout", "env"]
    if runner == "reasoning" and config.algorithm.kl_coef > 0:
        needed.append("reference")  # only the reasoning runner has a KL term
    if runner == "reasoning" and trains_critic(config):
        needed.append("critic")  # the embodied policies carry their own value heads
    return tuple(needed)


def placement_requests(config: Config) -> tuple[list[ComponentRequest], list[str]]:
    """One planner request per placed component, and the problems in ``component_placement``."""
    key_root = "cluster.component_placement"
    entries: dict[str, tuple[str, PlacementEntry]] = {}
    problems = []
    for key, value in config.cluster.component_placement.items():
        entry = value if isinstance(value, PlacementEntry) else PlacementEntry(value)
        for raw_name in key.split(","):
            name = raw_name.strip()
            if name not in COMPONENTS:
                close = difflib.get_close_matches(name, COMPONENTS, n=1, cutoff=0.5)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                problems.append(
                    f"{key_root}.{key}: unknown component '{name}'{hint}; "
                    f"components: {', '.join(COMPONENTS)}"
                )
            elif name in entries:
                problems.append(
                    f"{key_root}.{key}: component '{name}' is already placed by "
                    f"'{entries[name][0]}'"
                )
            else:
                entries[name] = (key, entry)
    required = required_components(config)
    # The frozen reference and the critic default to the actor's devices, in processes of
    # their own.
    for beside in ("reference", "critic"):
        if beside in required and beside not in entries and "actor" in entries:
            entries[beside] = entries["actor"]
    if "critic" in entries and "critic" not in required:
        problems.append(
            f"{key_root}.{entries['critic'][0]}: places a critic, which only a reasoning run "
            "with algorithm.adv_type='gae' trains (embodied policies carry their own value "
            "heads)"
        )
    for name in required:
        if name not in entries:
            problems.append(
                f"{key_root}: a {config.runner.runner_type} run needs a placement for '{name}'"
            )
    if not entries:
        problems.append(f"{key_root}: place at least one component")
    requests = [_request(config, name, entries[name][1]) for name in COMPONENTS if name in entries]
    return requests, problems


def _request(config: Config, name: str, entry: PlacementEntry) -> ComponentRequest:
    sections: dict[str, Any] = {
        "actor": config.actor,
        "reference": config.actor,
        "critic": config.critic,
        "rollout": config.rollout,
        "reward": config.reward,
        "env": config.env,
    }
    own = config.actor.reference_cpus_per_worker if name == "reference" else None
    cpus = entry.cpus_per_worker or own or float(sections[name].cpus_per_worker)
    return ComponentRequest(
        name=name,
        placement=entry.placement,
        node_group=entry.node_group,
        cpus_per_worker=cpus,
        uses_gpus=name in ("actor", "reference", "critic", "rollout")
        or (name == "env" and config.env.uses_gpus),
        tensor_parallel_size=config.rollout.tensor_parallel_size if name == "rollout" else 1,
        shares_devices=_shares_devices(config, name),
    )


def _shares_devices(config: Config, name: str) -> bool:
    # Time-sharing GPUs with another component means moving out of the way between phases:
    # null (where the plan shares) and true allow it, false refuses it.
    if name == "actor":
        return config.actor.enable_offload is not False
    if name == "rollout":
        return config.rollout.enable_offload is not False
    return True


def comm_net_devices_of(config: Config) -> tuple[str | None, str]:
    """The network interface(s) the run's collectives use on every node, and where that was
    said: ``cluster.comm_net_devices``, else, for an embedded or planned cluster (whose node
    is the driver's), RLinf's ``RLINF_COMM_NET_DEVICES`` in the driver's environment, else
    none. On an attached cluster each node's own ``RLINF_COMM_NET_DEVICES`` (set where
    ``ray start`` ran there) applies instead, read and checked by its workers
    (`rlshell.cluster.node_facts.adopt_node_interface`)."""
    from rlshell.cluster.placement.node_groups import RLINF_COMM_NET_DEVICES

    if config.cluster.comm_net_devices is not None:
        return config.cluster.comm_net_devices, "cluster.comm_net_devices"
    from_env = os.environ.get(RLINF_COMM_NET_DEVICES)
    if from_env and config.cluster.address is None:
        return from_env, RLINF_COMM_NET_DEVICES
    return None, "cluster.comm_net_devices"


def cluster_spec_for(config: Config) -> ClusterSpec | None:
    """The cluster a plan is checked against before anything starts.

    The simulated cluster when ``cluster.simulate`` is set; this machine for
    an embedded Ray; None when attaching to a running cluster (its plan is
    checked once connected, before any worker starts).
    """
    from rlshell.cluster.placement import cluster_spec, local_cluster_spec, simulated_cluster

    groups = config.cluster.node_groups or None
    interface, _ = comm_net_devices_of(config)
    if config.cluster.simulate is not None:
        return simulated_cluster(config.cluster.simulate, groups, interface)
    if config.cluster.address is not None:
        return None
    local = local_cluster_spec()
    nodes = list(local.nodes)
    if config.cluster.num_cpus is not None:
        nodes = [attrs.evolve(nodes[0], cpus=float(config.cluster.num_cpus))]
    return cluster_spec(nodes, groups, comm_net_devices=interface)


def cluster_spec_and_problems(config: Config) -> tuple[ClusterSpec | None, list[str]]:
    """`cluster_spec_for`, or the problems of the strings that describe the cluster
    (``cluster.simulate``, ``cluster.node_groups``) that keep it from being made. An attached
    cluster's node groups are checked against its nodes once connected; here, their syntax."""
    from rlshell.cluster.placement import DEFAULT_NODE_GROUP, label_selector, parse_ranks
    from rlshell.cluster.placement.node_groups import node_group, node_ranks_of

    problems = _comm_net_devices_problems(config)
    if config.cluster.address is None and config.cluster.simulate is None:
        problems += _this_node_problems(config, syntax_ok=not problems)
    try:
        spec = cluster_spec_for(config)
    except PlacementError as error:  # the node groups
        return None, [f"cluster.node_groups: {problem}" for problem in error.problems] + problems
    except ValueError as error:  # a malformed simulate string
        return None, [f"cluster.simulate: {error}", *problems]
    if spec is None:
        for label, entry in config.cluster.node_groups.items():
            ranks = node_ranks_of(entry)
            if ranks.strip() == DEFAULT_NODE_GROUP:
                continue
            known: list[int] | None = None
            try:
                if label_selector(ranks) is None:  # a Ray label is matched once connected
                    known = list(parse_ranks(ranks))
            except ValueError as error:
                problems.append(f"cluster.node_groups: node group '{label}': {error}")
                continue
            # Against no nodes: the entry's own checks (the nodes' once connected).
            _, found = node_group(label, known, entry, [])
            problems += [f"cluster.node_groups: {problem}" for problem in found]
    return spec, problems


def _comm_net_devices_problems(config: Config) -> list[str]:
    from rlshell.cluster.placement.node_groups import comm_net_devices_problems

    interface, source = comm_net_devices_of(config)
    if interface is None:
        return []
    return [f"{source}: {problem}" for problem in comm_net_devices_problems(interface)]


def _this_node_problems(config: Config, *, syntax_ok: bool) -> list[str]:
    """An embedded cluster's one node is this machine: the interfaces and interpreters the
    config names must be on it, refused here before Ray starts (``syntax_ok``: the
    interface setting is well-formed, so worth looking for)."""
    from rlshell.cluster.node_facts import executable_problem, local_interfaces
    from rlshell.cluster.placement.node_groups import interface_problems

    present = local_interfaces()
    problems = []
    interface, source = comm_net_devices_of(config)
    if interface is not None and syntax_ok:
        for name in interface.split(","):
            if name not in present:
                problems.append(
                    f"{source}: no network interface '{name}' on this node (node 0); its "
                    f"interfaces: {', '.join(present)}"
                )
    for label, entry in config.cluster.node_groups.items():
        if isinstance(entry, str):
            continue
        for index, env in enumerate(entry.env_configs):
            at = f"cluster.node_groups: node group '{label}': env_configs[{index}]"
            for problem in interface_problems(env.env_vars, present, "this node (node 0)"):
                problems.append(f"{at}.env_vars: {problem}")
            if (env.python_interpreter_path or "").startswith("/"):  # (else refused as such)
                reason = executable_problem(env.python_interpreter_path or "")
                if reason is not None:
                    problems.append(f"{at}.python_interpreter_path: {reason} on this node")
    return problems


def plan_for(config: Config, spec: ClusterSpec) -> PlacementPlan:
    """The placement plan of ``config`` on ``spec`` (raises `PlacementError`); its workers
    get the collectives' network interface (`comm_net_devices_of`) unless ``spec`` names
    one (a spec read from Ray knows the nodes, not the config)."""
    from rlshell.cluster.placement import plan_placement

    requests, problems = placement_requests(config)
    if problems:
        raise PlacementError(problems)
    if spec.comm_net_devices is None:
        spec = attrs.evolve(spec, comm_net_devices=comm_net_devices_of(config)[0])
    return plan_placement(spec, requests)


def plan_and_problems(
    cluster: ClusterSpec, requests: list[ComponentRequest]
) -> tuple[PlacementPlan | None, list[str]]:
    """The plan of ``requests`` on ``cluster``, or the problems that keep it from being made."""
    from rlshell.cluster.placement import plan_placement

    try:
        return plan_placement(cluster, requests), []
    except PlacementError as error:
        return None, [f"cluster.component_placement: {_in_config_terms(p)}" for p in error.problems]
    except ValueError as error:  # a malformed simulate or node-group string
        return None, [f"cluster: {error}"]


def _in_config_terms(problem: str) -> str:
    # The planner speaks of its request fields; a config user knows the offload switches.
    return re.sub(
        r"\b(actor|rollout) has shares_devices=False",
        r"\1.enable_offload is false (collocated components offload between phases)",
        problem,
    )

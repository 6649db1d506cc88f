"""Node groups as RLinf writes them: their workers' environment, their hardware, and the
network interface collectives use, checked and turned into the planner's records.

A node group of ``cluster.node_groups`` is node ranks (``"0-1"``) or a
`rlshell.config.schema.NodeGroupEntry`: node ranks with ``env_configs`` (variables and a
Python interpreter for the workers placed on the group, per node) and ``hardware``.
`node_group` makes the `NodeGroup` record and lists what is wrong; `worker_settings`
gives one worker its variables and interpreter; `interface_problems` checks the
interfaces a worker's variables name against a node's.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence

from rlshell.cluster.placement.records import NodeEnv, NodeGroup, NodeSpec
from rlshell.cluster.placement.syntax import parse_ranks
from rlshell.cluster.placement.wording import nodes_label
from rlshell.config.schema import NodeGroupEntry, NodeGroupEnvConfig, NodeHardwareConfig

__all__ = [
    "ACCELERATOR",
    "COLLECTIVE_INTERFACE_VARS",
    "RESERVED_ENV_PREFIXES",
    "RESERVED_ENV_VARS",
    "RLINF_COMM_NET_DEVICES",
    "ROBOT_HARDWARE",
    "comm_net_devices_problems",
    "interface_problems",
    "interfaces_named",
    "node_group",
    "node_ranks_of",
    "worker_settings",
]

RLINF_COMM_NET_DEVICES = "RLINF_COMM_NET_DEVICES"
"""RLinf's variable for the interface collectives use; read when ``cluster.comm_net_devices``
is null."""

COLLECTIVE_INTERFACE_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")

RESERVED_ENV_VARS = {
    "RANK": "the worker's rank in its component",
    "WORLD_SIZE": "its component's worker count",
    "LOCAL_RANK": "the worker's rank on its node",
    "LOCAL_WORLD_SIZE": "its component's worker count on the node",
    "NODE_RANK": "the worker's node",
    "MASTER_ADDR": "rank 0's address, for the rendezvous",
    "MASTER_PORT": "rank 0's port, for the rendezvous",
    "CUDA_VISIBLE_DEVICES": "the worker's GPUs in the placement plan",
    "OMP_NUM_THREADS": "the worker's CPUs (cpus_per_worker)",
    "PYTHONPATH": "the driver's, so that extension modules import in every worker",
}
"""What rlstack sets in every worker itself (`rlshell.cluster.ray_cluster.Cluster.worker_env`):
a node group's ``env_vars`` may not set these."""

RESERVED_ENV_PREFIXES = {
    "RLSHELL_": "rlstack's own (extension modules and objects, config tracing, rendezvous)",
    "RAY_": "Ray's, which its daemons and the worker's start read, not the worker's code",
}

ACCELERATOR = "Accelerator"
"""RLinf's hardware type for GPUs (and other accelerators): the one rlstack honours."""

ROBOT_HARDWARE = ("Franka", "DualFranka", "GimArm", "Turtle2", "DOSW1")
"""RLinf's robot hardware types, which its scheduler enumerates and pings on their nodes."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INTERFACE = re.compile(r"[^\s,/:]+")


def node_ranks_of(value: str | NodeGroupEntry) -> str:
    """A ``cluster.node_groups`` value's node ranks (or Ray label selector)."""
    return value if isinstance(value, str) else value.node_ranks


def node_group(
    label: str,
    ranks: Sequence[int] | None,
    entry: str | NodeGroupEntry,
    nodes: Sequence[NodeSpec],
) -> tuple[NodeGroup, list[str]]:
    """The `NodeGroup` of ``label`` on nodes ``ranks``, with ``entry``'s environments and
    hardware, and every problem with them (each line starts with the group).

    ``ranks=None``: the group's nodes are not known yet (a Ray label on a cluster not yet
    attached to); what does not depend on them is checked, and the group has no nodes.
    """
    if isinstance(entry, str):
        return NodeGroup(label, ranks or ()), []
    where = f"node group '{label}'"
    envs, problems = _envs(where, ranks, entry.env_configs)
    hardware, hardware_problems = _hardware(where, ranks, entry.hardware, nodes)
    group = NodeGroup(label, ranks or (), hardware=hardware, envs=envs)
    return group, problems + hardware_problems


def _envs(
    where: str, group_ranks: Sequence[int] | None, configs: Sequence[NodeGroupEnvConfig]
) -> tuple[list[NodeEnv], list[str]]:
    envs: list[NodeEnv] = []
    problems: list[str] = []
    claimed: dict[int, int] = {}
    for index, config in enumerate(configs):
        at = f"{where}: env_configs[{index}]"
        if config.node_ranks is None:
            ranks: tuple[int, ...] = tuple(group_ranks or ())
        else:
            try:
                ranks = tuple(sorted(set(parse_ranks(config.node_ranks))))
            except ValueError as error:
                problems.append(f"{at}.node_ranks: {error}")
                continue
        outside = [rank for rank in ranks if group_ranks is not None and rank not in group_ranks]
        if outside and group_ranks is not None:
            problems.append(
                f"{at}.node_ranks: {nodes_label(outside)} not in the group (its "
                f"{nodes_label(group_ranks)})"
            )
        twice = [rank for rank in ranks if rank in claimed]
        if twice:
            problems.append(
                f"{at}.node_ranks: {nodes_label(twice)} already configured by "
                f"env_configs[{claimed[twice[0]]}]; each node takes one entry"
            )
        claimed.update((rank, index) for rank in ranks)
        problems += [f"{at}.env_vars: {p}" for p in _env_var_problems(config.env_vars)]
        python = config.python_interpreter_path
        if python is not None and not python.startswith("/"):
            problems.append(
                f"{at}.python_interpreter_path: expected an absolute path to a Python "
                f"executable on the group's nodes, got '{python}'"
            )
        envs.append(NodeEnv(ranks, dict(config.env_vars), python))
    return envs, problems


def _env_var_problems(env_vars: Mapping[str, str]) -> list[str]:
    problems = []
    for name, value in env_vars.items():
        if not _ENV_NAME.fullmatch(name):
            problems.append(
                f"'{name}' is not a variable name (letters, digits and '_', not starting "
                "with a digit)"
            )
        elif name in RESERVED_ENV_VARS:
            problems.append(
                f"'{name}' is set by rlstack in every worker ({RESERVED_ENV_VARS[name]}); "
                "a node group cannot override it"
            )
        elif prefix := next((p for p in RESERVED_ENV_PREFIXES if name.startswith(p)), None):
            problems.append(
                f"'{name}': {prefix}* variables are {RESERVED_ENV_PREFIXES[prefix]}; a node "
                "group cannot set them (set them where the driver or `ray start` runs)"
            )
        elif "\0" in value:
            problems.append(f"'{name}': a value cannot hold a NUL character")
        elif name in COLLECTIVE_INTERFACE_VARS:
            problems += [f"'{name}': {p}" for p in _interface_syntax_problems(name, value)]
    return problems


def _hardware(
    where: str,
    ranks: Sequence[int] | None,
    hardware: NodeHardwareConfig | None,
    nodes: Sequence[NodeSpec],
) -> tuple[str | None, list[str]]:
    if hardware is None:
        return None, []
    at = f"{where}: hardware.type"
    if hardware.type in ROBOT_HARDWARE:
        return None, [
            f"{at}: '{hardware.type}' is one of RLinf's robots, which its scheduler finds and "
            "pings on their nodes; rlstack has no robot drivers to do so. Leave out "
            "'hardware' and place the env that drives the robot on this group's nodes (it "
            "connects to the robot itself)"
        ]
    if hardware.type != ACCELERATOR:
        close = difflib.get_close_matches(
            hardware.type, [ACCELERATOR, *ROBOT_HARDWARE], n=1, cutoff=0.5
        )
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return None, [
            f"{at}: unknown hardware type '{hardware.type}'{hint}; rlstack places on "
            f"'{ACCELERATOR}' (GPUs) and refuses RLinf's robots ({', '.join(ROBOT_HARDWARE)})"
        ]
    problems = []
    if hardware.configs:
        problems.append(
            f"{where}: hardware.configs: '{ACCELERATOR}' takes no configs (each node's GPUs "
            f"are read from the node), got {len(hardware.configs)}"
        )
    ranks = ranks or ()
    without = [rank for rank in ranks if rank < len(nodes) and nodes[rank].gpus == 0]
    if without:
        problems.append(
            f"{at}: '{ACCELERATOR}' is not present on {nodes_label(without)} of the "
            f"group, which have no GPU (GPUs per node: "
            + ", ".join(f"node {rank}: {nodes[rank].gpus}" for rank in ranks if rank < len(nodes))
            + ")"
        )
    return ACCELERATOR, problems


def comm_net_devices_problems(value: str) -> list[str]:
    """What is wrong with a ``comm_net_devices`` value's syntax: interface names joined
    by commas (``"eth0"``, ``"eth0,eth1"``)."""
    names = value.split(",")
    if not value or any(not _INTERFACE.fullmatch(name) for name in names):
        return [
            f"expected network interface names joined by ',' (e.g. 'eth0' or "
            f"'ib0,eth0'), got '{value}'"
        ]
    return []


def _interface_syntax_problems(variable: str, value: str) -> list[str]:
    if variable == "NCCL_SOCKET_IFNAME":
        value = value.removeprefix("^").removeprefix("=")
    return comm_net_devices_problems(value)


def worker_settings(
    group: NodeGroup, node_rank: int, comm_net_devices: str | None
) -> tuple[dict[str, str], str | None]:
    """The variables and interpreter a worker of ``group`` on node ``node_rank`` gets.

    The collective interface (``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` from
    ``comm_net_devices``), then the group's ``env_vars`` for that node over them: a group
    that names its own interface keeps it, as RLinf keeps one set before its own.
    """
    env: dict[str, str] = {}
    if comm_net_devices:
        env.update(dict.fromkeys(COLLECTIVE_INTERFACE_VARS, comm_net_devices))
    node_env = group.env_of(node_rank)
    if node_env is None:
        return env, None
    env.update(node_env.env_vars)
    return env, node_env.python_executable


def interfaces_named(env: Mapping[str, str]) -> list[tuple[str, str, bool]]:
    """(variable, interface, exact) for each interface a worker's variables name.

    ``GLOO_SOCKET_IFNAME`` names interfaces exactly. ``NCCL_SOCKET_IFNAME`` names
    prefixes (``eth`` matches ``eth0``), exact names after ``=``, and interfaces to avoid
    after ``^`` (not named here: avoiding an absent one is no problem).
    """
    named = []
    for variable in COLLECTIVE_INTERFACE_VARS:
        value = env.get(variable)
        if not value or (variable == "NCCL_SOCKET_IFNAME" and value.startswith("^")):
            continue
        exact = variable == "GLOO_SOCKET_IFNAME" or value.startswith("=")
        for name in value.removeprefix("=").split(","):
            if name:
                named.append((variable, name, exact))
    return named


def interface_problems(env: Mapping[str, str], available: Iterable[str], where: str) -> list[str]:
    """The interfaces ``env`` names that are not among ``available`` (a node's), each
    line naming ``where`` (the node) and the interfaces it has."""
    present = sorted(set(available))
    problems = []
    for variable, name, exact in interfaces_named(env):
        found = name in present if exact else any(p.startswith(name) for p in present)
        if not found:
            problems.append(
                f"{variable}={env[variable]}: no network interface '{name}' on {where}; its "
                f"interfaces: {', '.join(present) or 'none'}"
            )
    return problems

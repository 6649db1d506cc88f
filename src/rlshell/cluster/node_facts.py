"""What a node has that a node group's settings name: its network interfaces and whether
an interpreter path is an executable there.

`local_facts` reads this machine; `probe_node` reads another node of a Ray cluster (a task
pinned to it). `setting_problems` checks workers' placement settings (their collective
interface variables and interpreter, `rlshell.cluster.placement.WorkerPlacement`) against
a node's facts, before any of them starts. `adopt_node_interface` runs in a worker: the
interface its node's ``RLINF_COMM_NET_DEVICES`` names (set where ``ray start`` ran there,
as RLinf's multi-node setup does) becomes its collectives' where the launch named none.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Sequence
from typing import Any

from attrs import frozen

from rlshell.cluster.placement import WorkerPlacement
from rlshell.cluster.placement.node_groups import (
    COLLECTIVE_INTERFACE_VARS,
    RLINF_COMM_NET_DEVICES,
    comm_net_devices_problems,
    interface_problems,
)

__all__ = [
    "NodeFacts",
    "adopt_node_interface",
    "executable_problem",
    "local_facts",
    "local_interfaces",
    "probe_node",
    "setting_problems",
]

_PROBE_TIMEOUT_S = 120.0


@frozen
class NodeFacts:
    """A node's network interface names and, for each interpreter path asked about, why it
    cannot run there (None: it can)."""

    interfaces: tuple[str, ...]
    executables: tuple[tuple[str, str | None], ...] = ()

    def executable_problem(self, path: str) -> str | None:
        return dict(self.executables).get(path)


def local_interfaces() -> tuple[str, ...]:
    """This machine's network interface names (``lo``, ``eth0``, ...), sorted."""
    return tuple(sorted(name for _, name in socket.if_nameindex()))


def executable_problem(path: str) -> str | None:
    """Why ``path`` cannot serve as an interpreter on this machine, or None."""
    if not os.path.isabs(path):
        return f"'{path}' is not an absolute path"
    if not os.path.exists(path):
        return f"'{path}' does not exist"
    if not os.path.isfile(path):
        return f"'{path}' is not a file"
    if not os.access(path, os.X_OK):
        return f"'{path}' is not executable"
    return None


def local_facts(paths: Iterable[str] = ()) -> NodeFacts:
    """This machine's `NodeFacts` for the interpreter ``paths``."""
    return NodeFacts(
        interfaces=local_interfaces(),
        executables=tuple((path, executable_problem(path)) for path in sorted(set(paths))),
    )


def probe_node(node_id: str, paths: Iterable[str] = ()) -> NodeFacts:
    """The `NodeFacts` of the Ray node ``node_id``, read by a task pinned to it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # Ray's remote-function stubs do not see local_facts's parameters.
    probe: Any = ray.remote(num_cpus=0, max_retries=0)(local_facts).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        name="rlshell-node-facts",
    )
    facts: NodeFacts = ray.get(probe.remote(tuple(paths)), timeout=_PROBE_TIMEOUT_S)
    return facts


def setting_problems(workers: Sequence[WorkerPlacement], facts: NodeFacts, where: str) -> list[str]:
    """What the workers' interface variables and interpreters name that the node (``where``,
    e.g. "node 1 (10.0.0.2)") lacks, once per distinct problem."""
    problems: list[str] = []
    for worker in workers:
        for problem in interface_problems(worker.env_vars, facts.interfaces, where):
            line = f"node group '{worker.node_group}': {problem}"
            if line not in problems:
                problems.append(line)
        if worker.python_executable is not None:
            reason = facts.executable_problem(worker.python_executable)
            line = f"node group '{worker.node_group}': python_interpreter_path: {reason} on {where}"
            if reason is not None and line not in problems:
                problems.append(line)
    return problems


def adopt_node_interface(where: str) -> dict[str, str]:
    """In a worker: set ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` (those the launch left
    unset) to this node's ``RLINF_COMM_NET_DEVICES``, once checked against the node's
    interfaces; a name the node lacks raises a ValueError naming ``where`` (the worker and
    node) and the interfaces it has. Returns what was set."""
    value = os.environ.get(RLINF_COMM_NET_DEVICES)
    unset = [name for name in COLLECTIVE_INTERFACE_VARS if not os.environ.get(name)]
    if not value or not unset:
        return {}
    adopted = dict.fromkeys(unset, value)
    problems = comm_net_devices_problems(value) or [
        problem.split(": ", 1)[1]
        for problem in interface_problems(adopted, local_interfaces(), where)
    ]
    if problems:
        raise ValueError(
            f"{RLINF_COMM_NET_DEVICES}={value} (this node's, for its collectives): "
            + "; ".join(dict.fromkeys(problems))
        )
    os.environ.update(adopted)
    return adopted

"""Cluster: Ray started or attached, its nodes read as a `ClusterSpec`, plans reserved.

`Cluster()` starts an embedded local Ray (``ray.init``); ``Cluster("auto")`` or
``Cluster("ray://head:10001")`` attaches to a cluster started with ``ray start``.
If Ray is already initialised in this process, the cluster reuses it and leaves
it running on shutdown.

`Cluster.spec` reads the live nodes (the driver's node is node rank 0, the
others follow sorted by IP) so the pure planner in `rlshell.cluster.placement` can plan
against them. `Cluster.reserve` realises one component of a plan: one Ray
placement group per node it uses, pinned to that node with Ray's
``ray.io/node-id`` label selector. (`rlshell.cluster.placement.local_cluster_spec`
describes this machine without Ray, for ``--dry-run``.)

    with Cluster() as cluster:
        spec = cluster.spec()
        actor = ActorWorker.create_group(cfg).launch(cluster, plan.component("actor"))
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlshell.cluster.node_facts import NodeFacts, local_facts, probe_node, setting_problems
from rlshell.cluster.placement import (
    DEFAULT_NODE_GROUP,
    ClusterSpec,
    ComponentPlan,
    NodeGroup,
    NodeSpec,
    WorkerPlacement,
    label_selector,
    parse_node_ranks,
)
from rlshell.cluster.placement.node_groups import node_group, node_ranks_of
from rlshell.config import TRACE_ENV_VAR, WORKER_MALLOC_ENV
from rlshell.config.schema import NodeGroupEntry
from rlshell.extensions import ENV_VAR as EXT_MODULE_ENV_VAR
from rlshell.extensions import OBJECTS_ENV_VAR

# Where Hub ids resolve and whether they may download (`rlshell.hub`); tokens are not sent.
HUB_ENV_VARS = ("HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_ENDPOINT")

__all__ = [
    "HUB_ENV_VARS",
    "NODE_ID_LABEL",
    "NODE_RANK_LABEL",
    "Cluster",
    "Reservation",
    "ReservationError",
]

# Every Ray node carries this label (its hex node id); placement-group bundles
# can select on it, which pins a bundle to one node (ray.util.placement_group
# in Ray >= 2.49 takes ``bundle_label_selector``).
NODE_ID_LABEL = "ray.io/node-id"
# Nodes started with this label (``ray start --labels=rlstack/node-rank=2``) are ranked by
# it, before any unlabelled node: ranks then survive a node that leaves and rejoins with a
# new node id, and nodes that share an IP (several on one machine) keep the user's order.
NODE_RANK_LABEL = "rlstack/node-rank"

# Ray rejects bundles whose resources are all zero; a worker planned with no CPU
# still gets a sliver so that its bundle, and so its node, exist.
_MIN_BUNDLE_CPUS = 0.01


# Ray leaves these unannotated; typed views keep the rest of the module checked.
_ray_nodes = cast(Callable[[], list[dict[str, Any]]], ray.nodes)


class ReservationError(RuntimeError):
    """A component's placement groups could not be created; the message says why."""


class _Stoppable(Protocol):
    def shutdown(self) -> None: ...


def _fmt(value: float) -> str:
    return f"{value:g}"


def _ip_key(address: str) -> tuple[int, int | str]:
    try:
        return (0, int(ipaddress.ip_address(address)))
    except ValueError:
        return (1, address)


def _node_labels(node: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in (node.get("Labels") or {}).items()}


class _ReleaseHook(Protocol):
    def __call__(self, reservation: Reservation, /) -> None: ...


class Reservation:
    """One component's CPU bundles: a STRICT_PACK placement group on each node it uses.

    Worker rank r runs in bundle `bundle_index(r)` of the group on its node;
    `scheduling_strategy(r)` is what its actor is created with.
    """

    def __init__(
        self,
        component: ComponentPlan,
        groups: Mapping[int, PlacementGroup],
        node_ids: Mapping[int, str],
        node_gpus: Mapping[int, int],
        node_addresses: Mapping[int, str],
        on_release: _ReleaseHook | None = None,
    ) -> None:
        self.component = component
        self.groups = dict(groups)
        self.node_ids = dict(node_ids)
        self.node_gpus = dict(node_gpus)
        self.node_addresses = dict(node_addresses)
        self._on_release = on_release
        self._released = False
        # Bundles are laid out per node in rank order, so a worker's bundle index
        # is its position among the component's workers on its node.
        seen: dict[int, int] = {}
        self._bundle_index: list[int] = []
        for worker in component.workers:
            self._bundle_index.append(seen.get(worker.node_rank, 0))
            seen[worker.node_rank] = seen.get(worker.node_rank, 0) + 1

    @property
    def released(self) -> bool:
        return self._released

    def bundle_index(self, rank: int) -> int:
        """The bundle of rank ``rank`` within its node's placement group."""
        return self._bundle_index[rank]

    def node_id(self, rank: int) -> str:
        """The Ray node id rank ``rank`` is pinned to."""
        return self.node_ids[self.component.workers[rank].node_rank]

    def scheduling_strategy(self, rank: int) -> PlacementGroupSchedulingStrategy:
        """Ray's scheduling strategy that puts rank ``rank``'s actor into its bundle."""
        worker = self.component.workers[rank]
        return PlacementGroupSchedulingStrategy(
            placement_group=self.groups[worker.node_rank],
            placement_group_bundle_index=self._bundle_index[rank],
        )

    def release(self) -> None:
        """Remove the placement groups (idempotent). Actors in them should be gone first."""
        if self._released:
            return
        self._released = True
        if ray.is_initialized():
            for group in self.groups.values():
                remove_placement_group(group)
        if self._on_release is not None:
            self._on_release(self)


class Cluster:
    """The Ray cluster workers run on: started here, attached to, or reused.

    ``address=None`` starts an embedded local Ray (``num_cpus`` and
    ``temp_dir`` apply only then; Ray's socket paths must stay under 107
    characters, so keep ``temp_dir`` short). ``"auto"`` or ``"ray://host:port"``
    attaches to a cluster started with ``ray start``. ``runtime_env_vars`` are
    set in every worker this cluster launches (None: `WORKER_MALLOC_ENV`, the
    default of ``cluster.worker_env_vars``). Use it as a context manager, or
    call `shutdown`.
    """

    embedded = False  # set by __init__: this process's local Ray, on loopback only

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: int | None = None,
        temp_dir: str | None = None,
        namespace: str = "rlshell",
        runtime_env_vars: Mapping[str, str] | None = None,
    ) -> None:
        embedded = address in (None, "local")
        if not embedded and (num_cpus is not None or temp_dir is not None):
            raise ValueError(
                f"num_cpus and temp_dir configure an embedded Ray; the cluster at "
                f"'{address}' was sized by `ray start` (drop them, or use address=None)"
            )
        self.address = address
        self.namespace = namespace
        self.runtime_env_vars: dict[str, str] = dict(
            WORKER_MALLOC_ENV if runtime_env_vars is None else runtime_env_vars
        )
        self._stoppables: list[_Stoppable] = []
        self._reservations: list[Reservation] = []
        self._node_facts: dict[tuple[str, tuple[str, ...]], NodeFacts] = {}
        self._closed = False
        start = time.perf_counter()
        self.owns_ray = not ray.is_initialized()
        self._rendezvous_dir: str | None = None
        if self.owns_ray:
            if embedded:
                # An embedded cluster listens on loopback only (`_loopback_only`).
                restore = _loopback_only()
                try:
                    _start_embedded_ray(num_cpus, namespace, temp_dir)
                finally:
                    restore()  # its daemons, started, keep the setting; nothing else gets it
            else:
                ray.init(address=address, namespace=namespace, log_to_driver=True)
        # This process's local Ray, on loopback only: its groups meet through files.
        node_ip = cast(Callable[[], str], ray.util.get_node_ip_address)()
        self.embedded = embedded and ipaddress.ip_address(node_ip).is_loopback
        self.startup_seconds = time.perf_counter() - start

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Cluster was shut down; create a new one")

    def _alive_nodes(self) -> list[dict[str, Any]]:
        """Ray's node records, alive only, in node-rank order: by `NODE_RANK_LABEL` where
        nodes carry it, then the driver's node, then the others by IP address."""
        nodes = [node for node in _ray_nodes() if node.get("Alive", False)]
        driver_node = ray.get_runtime_context().get_node_id()
        if not any(node["NodeID"] == driver_node for node in nodes):
            # A ray:// client's driver runs on no cluster node: the head stands in.
            heads = [n for n in nodes if "node:__internal_head__" in n.get("Resources", {})]
            driver_node = heads[0]["NodeID"] if heads else ""

        def key(node: dict[str, Any]) -> tuple[float, int, tuple[int, int | str], str]:
            first = 0 if node["NodeID"] == driver_node else 1
            labelled = _node_labels(node).get(NODE_RANK_LABEL)
            try:
                rank = float(labelled) if labelled is not None else float("inf")
            except ValueError:
                raise ValueError(
                    f"node {node['NodeManagerAddress']} ({node['NodeID']}): label "
                    f"{NODE_RANK_LABEL}={labelled!r} is not a node rank"
                ) from None
            address = _ip_key(str(node["NodeManagerAddress"]))
            return (rank, first, address, str(node["NodeID"]))

        return sorted(nodes, key=key)

    def node_ids(self) -> tuple[str, ...]:
        """Ray node ids (hex) of the alive nodes, indexed by node rank."""
        self._check_open()
        return tuple(str(node["NodeID"]) for node in self._alive_nodes())

    def spec(self, node_groups: Mapping[str, str | NodeGroupEntry] | None = None) -> ClusterSpec:
        """The alive nodes as a `ClusterSpec` (node rank 0 is the driver's node).

        ``node_groups`` labels sets of nodes, by node rank (``{"env": "1-2"}``)
        or by a Ray node label (``{"env": "pool=cpu"}``: the nodes started with
        ``ray start --labels=pool=cpu``, in rank order); the group ``"all"`` with
        every node is always present. A `NodeGroupEntry` adds the group's workers'
        environment and its hardware, checked against the nodes (a ValueError lists
        what is wrong). Node ranks follow `NODE_RANK_LABEL` where
        nodes carry it; the driver's node comes next (rank 0 without labels),
        then the rest by IP address.
        """
        self._check_open()
        nodes = self._alive_nodes()
        specs = [
            NodeSpec(
                gpus=int(node["Resources"].get("GPU", 0)),
                cpus=float(node["Resources"].get("CPU", 0.0)),
                address=str(node["NodeManagerAddress"]),
            )
            for node in nodes
        ]
        groups = [NodeGroup(DEFAULT_NODE_GROUP, range(len(specs)))]
        problems: list[str] = []
        for label, entry in (node_groups or {}).items():
            ranks = node_ranks_of(entry)
            if label == DEFAULT_NODE_GROUP:
                raise ValueError(
                    f"node group '{DEFAULT_NODE_GROUP}' is built in (every node); "
                    "pick another label"
                )
            selector = label_selector(ranks)
            if selector is None:
                matching = list(parse_node_ranks(ranks, len(specs), label))
            else:
                name, value = selector
                matching = [
                    i for i, node in enumerate(nodes) if _node_labels(node).get(name) == value
                ]
                if not matching:
                    found = sorted({_node_labels(n).get(name, "(none)") for n in nodes})
                    raise ValueError(
                        f"node group '{label}': no alive node has label {name}={value} (the "
                        f"{len(nodes)} alive nodes have {name}: {', '.join(found)})"
                    )
            group, found_problems = node_group(label, matching, entry, specs)
            problems += found_problems
            groups.append(group)
        if problems:
            raise ValueError("; ".join(problems))
        return ClusterSpec(nodes=specs, node_groups=groups)

    def reserve(self, component: ComponentPlan, timeout_s: float = 60.0) -> Reservation:
        """Create and wait for one placement group per node the component uses.

        Each group is STRICT_PACK with one ``{"CPU": cpus}`` bundle per worker on
        that node, pinned to the node by its ``ray.io/node-id`` label. Raises
        `ReservationError` at once when a node cannot hold the request at all,
        and after ``timeout_s`` when the resources stay busy; groups already
        made are removed either way.
        """
        self._check_open()
        nodes = self._alive_nodes()
        by_node: dict[int, list[WorkerPlacement]] = {}
        for worker in component.workers:
            by_node.setdefault(worker.node_rank, []).append(worker)
        for node_rank, workers in by_node.items():
            self._check_fits(component, node_rank, workers, nodes)
        self._check_node_settings(component, by_node, nodes)

        # GPUs are not reserved through Ray: like RLinf we pin them ourselves with
        # CUDA_VISIBLE_DEVICES. Collocated components (actor and rollout on the
        # same GPUs, taking turns with offload) time-share devices, and Ray's GPU
        # accounting can only hand each GPU (or a fixed fraction) to one holder.
        groups: dict[int, PlacementGroup] = {}
        try:
            for node_rank, workers in sorted(by_node.items()):
                node_id = str(nodes[node_rank]["NodeID"])
                bundles = [{"CPU": max(w.cpus, _MIN_BUNDLE_CPUS)} for w in workers]
                groups[node_rank] = placement_group(
                    bundles,
                    strategy="STRICT_PACK",
                    name=f"{component.name}:node{node_rank}",
                    bundle_label_selector=[{NODE_ID_LABEL: node_id}] * len(bundles),
                )
            pending = {group.ready(): rank for rank, group in groups.items()}
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
            unplaced = sorted(rank for ref, rank in pending.items() if ref not in ready)
            if unplaced:
                lines = [
                    self._describe_request(component, rank, by_node[rank], nodes[rank])
                    for rank in unplaced
                ]
                raise ReservationError(
                    f"component '{component.name}': placement groups not placed within "
                    f"{_fmt(timeout_s)} s:\n  " + "\n  ".join(lines)
                )
        except BaseException:
            for group in groups.values():
                remove_placement_group(group)
            raise
        reservation = Reservation(
            component,
            groups,
            node_ids={rank: str(nodes[rank]["NodeID"]) for rank in groups},
            node_gpus={rank: int(nodes[rank]["Resources"].get("GPU", 0)) for rank in groups},
            node_addresses={rank: str(nodes[rank]["NodeManagerAddress"]) for rank in groups},
            on_release=self._forget_reservation,
        )
        self._reservations.append(reservation)
        return reservation

    def _check_fits(
        self,
        component: ComponentPlan,
        node_rank: int,
        workers: Sequence[WorkerPlacement],
        nodes: Sequence[dict[str, Any]],
    ) -> None:
        ranks = ", ".join(str(w.rank) for w in workers)
        if node_rank >= len(nodes):
            raise ReservationError(
                f"component '{component.name}' places ranks {ranks} on node {node_rank}, "
                f"but the cluster has {len(nodes)} alive node(s) (0-{len(nodes) - 1})"
            )
        resources = nodes[node_rank]["Resources"]
        address = nodes[node_rank]["NodeManagerAddress"]
        asked = sum(max(w.cpus, _MIN_BUNDLE_CPUS) for w in workers)
        total = float(resources.get("CPU", 0.0))
        if asked > total + 1e-9:
            raise ReservationError(
                f"component '{component.name}' cannot be placed on node {node_rank} "
                f"({address}): ranks {ranks} ask for {_fmt(asked)} CPUs in all, "
                f"the node has {_fmt(total)} CPUs"
            )
        gpus = int(resources.get("GPU", 0))
        for worker in workers:
            missing = [gpu for gpu in worker.gpus if gpu >= gpus]
            if missing:
                raise ReservationError(
                    f"component '{component.name}' rank {worker.rank} asks for GPUs "
                    f"{list(worker.gpus)} on node {node_rank} ({address}), which has "
                    f"{gpus} GPU(s)"
                )

    def _check_node_settings(
        self,
        component: ComponentPlan,
        by_node: Mapping[int, Sequence[WorkerPlacement]],
        nodes: Sequence[dict[str, Any]],
    ) -> None:
        """Refuse, before any of the component's workers starts, a collective interface
        or an interpreter its workers are given that their node lacks. This machine is
        read directly for an embedded cluster; another node by a task pinned to it."""
        problems = []
        for node_rank, workers in sorted(by_node.items()):
            named = any(w.env_vars for w in workers) or any(w.python_executable for w in workers)
            if not named:
                continue
            node = nodes[node_rank]
            paths = tuple(sorted({w.python_executable for w in workers if w.python_executable}))
            key = (str(node["NodeID"]), paths)
            if key not in self._node_facts:
                self._node_facts[key] = (
                    local_facts(paths) if self.embedded else probe_node(key[0], paths)
                )
            where = f"node {node_rank} ({node['NodeManagerAddress']})"
            problems += setting_problems(workers, self._node_facts[key], where)
        if problems:
            raise ReservationError(
                f"component '{component.name}' cannot start: "
                + "; ".join(problems)
                + " (interfaces come from cluster.comm_net_devices, RLINF_COMM_NET_DEVICES or "
                "a node group's env_vars; interpreters from its python_interpreter_path)"
            )

    def _describe_request(
        self,
        component: ComponentPlan,
        node_rank: int,
        workers: Sequence[WorkerPlacement],
        node: Mapping[str, Any],
    ) -> str:
        asked = sum(max(w.cpus, _MIN_BUNDLE_CPUS) for w in workers)
        total = float(node["Resources"].get("CPU", 0.0))
        free = _free_cpus(str(node["NodeID"]))
        free_text = "unknown" if free is None else _fmt(free)
        return (
            f"node {node_rank} ({node['NodeManagerAddress']}): ranks "
            f"{', '.join(str(w.rank) for w in workers)} ask for {_fmt(asked)} CPUs; "
            f"{free_text} of the node's {_fmt(total)} CPUs are free (the rest is held "
            "by other placement groups, actors or tasks)"
        )

    def _forget_reservation(self, reservation: Reservation) -> None:
        if reservation in self._reservations:
            self._reservations.remove(reservation)

    def worker_env(
        self, component: ComponentPlan, worker: WorkerPlacement, *, gpu_node: bool
    ) -> dict[str, str]:
        """The environment variables one worker process starts with.

        Torch's env:// rendezvous variables (MASTER_ADDR/PORT come after start,
        from rank 0), ``CUDA_VISIBLE_DEVICES`` from the plan, the driver's
        ``RLSHELL_EXT_MODULE``, ``RLSHELL_EXT_OBJECTS`` and ``PYTHONPATH`` (so
        extensions and the Python objects `rlshell.api` was given register in the
        worker) and ``RLSHELL_TRACE_CONFIG_READS`` (so workers trace their config
        reads, `rlshell.config.tracing`), the driver's Hugging Face Hub settings
        (`HUB_ENV_VARS`, so workers resolve Hub ids as the driver validated them,
        on a cluster one attaches to too), the cluster's ``runtime_env_vars``, then
        what the plan gives the worker (`WorkerPlacement.env_vars`: its node group's
        variables and the collectives' network interface).
        """
        env: dict[str, str] = {}
        for name in (
            EXT_MODULE_ENV_VAR,
            OBJECTS_ENV_VAR,
            "PYTHONPATH",
            TRACE_ENV_VAR,
            *HUB_ENV_VARS,
        ):
            if name in os.environ:
                env[name] = os.environ[name]
        if self.embedded:
            # Gloo's pairs on the loopback interface, as the embedded Ray itself.
            # (Ray's loopback switch they inherit from the daemons that start them.)
            env["GLOO_SOCKET_IFNAME"] = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
        env.update(self.runtime_env_vars)
        # The worker's node group and the collective interface (the plan's record of them).
        env.update(worker.env_vars)
        env.update(
            RANK=str(worker.rank),
            WORLD_SIZE=str(component.world_size),
            LOCAL_RANK=str(worker.local_rank),
            LOCAL_WORLD_SIZE=str(worker.local_world_size),
            NODE_RANK=str(worker.node_rank),
            CUDA_VISIBLE_DEVICES=worker.cuda_visible_devices,
            # torch sizes its intra-op pool from this at import; one thread per
            # reserved core, since oversubscribed threads slow small ops 4-27x.
            OMP_NUM_THREADS=str(max(1, int(worker.cpus))),
        )
        if gpu_node or worker.gpus:
            # Otherwise Ray rewrites CUDA_VISIBLE_DEVICES from its own GPU
            # accounting, in which our workers hold no GPUs at all.
            env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
        return env

    def runtime_env(
        self, component: ComponentPlan, worker: WorkerPlacement, *, gpu_node: bool
    ) -> dict[str, Any]:
        """Ray's ``runtime_env`` for one worker: its `worker_env`, and the interpreter its
        node group names (``py_executable``; otherwise the one Ray starts workers with)."""
        runtime_env: dict[str, Any] = {
            "env_vars": self.worker_env(component, worker, gpu_node=gpu_node)
        }
        if worker.python_executable is not None:
            runtime_env["py_executable"] = worker.python_executable
        return runtime_env

    def _track(self, stoppable: _Stoppable) -> None:
        """Remember a worker group so `shutdown` stops it."""
        self._check_open()
        self._stoppables.append(stoppable)

    def launched(self) -> list[_Stoppable]:
        """What this cluster launched and has not shut down (its worker groups among them)."""
        return list(self._stoppables)

    def _untrack(self, stoppable: _Stoppable) -> None:
        if stoppable in self._stoppables:
            self._stoppables.remove(stoppable)

    def shutdown(self) -> None:
        """Stop this cluster's worker groups, remove its placement groups, stop Ray if started here.

        Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        for stoppable in reversed(list(self._stoppables)):
            stoppable.shutdown()
        self._stoppables.clear()
        for reservation in list(self._reservations):
            reservation.release()
        if self.owns_ray and ray.is_initialized():
            ray.shutdown()
        if self._rendezvous_dir is not None:
            shutil.rmtree(self._rendezvous_dir, ignore_errors=True)
            self._rendezvous_dir = None

    def rendezvous_file(self, group: str) -> str:
        """A fresh file for one launch of ``group`` to meet through (an embedded cluster's
        ranks share this machine: torch's FileStore, no listening socket)."""
        if self._rendezvous_dir is None:
            self._rendezvous_dir = tempfile.mkdtemp(prefix="rlshell-rendezvous-")
        return os.path.join(self._rendezvous_dir, f"{group}-{secrets.token_hex(6)}")


LOOPBACK_ENV_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch (`ray._private.services.get_node_ip_address`) between a node reachable from
other machines and one on loopback only; despite its name it applies on Linux too."""


def _loopback_only() -> Callable[[], None]:
    """Make the embedded Ray about to start a loopback-only one: its node address
    127.0.0.1, so that the GCS, the raylet, the workers and the agents listen on loopback
    and nowhere else. Ray reads the switch when its module loads (here, long ago) and its
    processes read it from their environment: both are set. Returns what undoes it."""
    from ray._private import ray_constants

    before_env = os.environ.get(LOOPBACK_ENV_VAR)
    before_constant = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[LOOPBACK_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False

    def restore() -> None:
        ray_constants.ENABLE_RAY_CLUSTER = before_constant
        if before_env is None:
            os.environ.pop(LOOPBACK_ENV_VAR, None)
        else:
            os.environ[LOOPBACK_ENV_VAR] = before_env

    return restore


AUTH_MODE_ENV_VAR = "RAY_AUTH_MODE"
AUTH_TOKEN_ENV_VARS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _token_auth() -> None:
    """Ray's token authentication for the embedded cluster about to start: every
    connection to its GCS, raylet and workers must carry the token. Unless this process
    was given one (``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``), the token is drawn
    here, for this run alone, and handed to Ray's processes through the environment (Ray's
    own default writes one to ``~/.ray/auth_token``, for every later cluster of the user).
    ``RAY_AUTH_MODE=disabled`` set by the user is respected (Ray warns on start)."""
    mode = os.environ.get(AUTH_MODE_ENV_VAR)
    if mode is not None and mode.lower() != "token":
        return
    if not any(os.environ.get(name) for name in AUTH_TOKEN_ENV_VARS):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    os.environ[AUTH_MODE_ENV_VAR] = "token"
    # Ray read the mode when it loaded (its C++ configuration): read again, as Ray does
    # when it turns token authentication on by default.
    from ray._raylet import Config  # type: ignore[attr-defined]  # (Cython, untyped)

    Config.initialize("")


# What Ray raises when its node's raylet has not registered with the GCS within its fixed 30 s
# (ray._private.node): on a machine loaded by other work, not a broken installation.
_STARTUP_TIMEOUT = "timed out during startup"
_RETRY_PAUSE_S = 5.0


def _start_embedded_ray(num_cpus: int | None, namespace: str, temp_dir: str | None) -> None:
    """``ray.init`` of a local cluster; a start-up that times out is tried once more, and said.

    Ray gives its node 30 s to register and has no setting for it. A second try, after a
    pause in which the load that slowed the first may pass, gets another 30 s; a second
    time-out is raised as Ray raised it.
    """
    _token_auth()
    for attempt in (1, 2):
        try:
            # "local" (not None): never attach to a cluster Ray finds on its own
            # (RAY_ADDRESS, /tmp/ray/ray_current_cluster) by accident.
            ray.init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                log_to_driver=True,
                namespace=namespace,
                _temp_dir=temp_dir,
                # Ray starts one idle worker per CPU for a new driver's tasks; every
                # worker here is an actor with its own runtime_env (its env_vars), which
                # an idle worker cannot serve: they would only take the CPUs the actors
                # import torch on (measured: 2.5 s of a 2-step CartPole run's 31 s).
                _system_config={"prestart_worker_first_driver": False},
            )
            return
        except Exception as error:
            if attempt == 2 or _STARTUP_TIMEOUT not in str(error):
                raise
            ray.shutdown()  # whatever the first try left running
            print(
                f"Ray's local node did not start within Ray's 30 s ({error}); the machine "
                f"may be loaded: starting it once more in {_RETRY_PAUSE_S:g} s",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(_RETRY_PAUSE_S)


def _free_cpus(node_id: str) -> float | None:
    """Unreserved CPUs on a node, for error messages; None if Ray cannot say."""
    try:
        # A DeveloperAPI (Ray has no public per-node figure without the
        # dashboard); only an error message depends on it.
        from ray._private.state import available_resources_per_node

        per_node_fn = cast(Callable[[], dict[str, dict[str, float]]], available_resources_per_node)
        per_node = per_node_fn()
        return float(per_node.get(node_id, {}).get("CPU", 0.0))
    except Exception:
        return None

"""The worker side: `Worker`, the base class of every role, and what runs in its process.

A worker is a plain Python class; `rlshell.cluster.group.WorkerGroup` turns it
into one Ray actor per rank of a planned component and calls methods on every
rank at once (RLinf's ``Worker`` / ``WorkerGroup`` pattern):

    class ActorWorker(Worker):
        def __init__(self, cfg): ...
        def run_training(self, batch): ...

    actor = ActorWorker.create_group(cfg).launch(cluster, plan.component("actor"))
    metrics = actor.run_training(batch).wait()            # one result per rank, rank order
    actor.execute_on(0).save_checkpoint(path).wait()      # rank 0 only
    actor.scatter.run_training(batches).wait()            # batches[i] to rank i

Inside a method a worker knows `component`, `rank`, `world_size`,
`local_rank`, `placement` and `node_ip`; its environment holds RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, CUDA_VISIBLE_DEVICES and
MASTER_ADDR/MASTER_PORT, so `Worker.init_process_group` (torch's env://
rendezvous) just works. Before the subclass's ``__init__`` runs, a worker sets
its torch threads to its reserved CPUs and loads ``RLSHELL_EXT_MODULE``.

Here: `Worker`, the `WorkerContext` it starts with, the `WorkerInfo` it
reports, and the Ray actor class that runs its start-up hooks. The driver side
(launching, calling, gathering, time-outs) is `rlshell.cluster.group`; the
errors a failed worker becomes are `rlshell.cluster.errors`. This module
imports neither, except `Worker.create_group`, which builds a group when called.
"""

from __future__ import annotations

import os
import random
import socket
import sys
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, cast

import ray
from attrs import frozen

from rlshell.cluster.placement import WorkerPlacement
from rlshell.extensions import load_extensions

if TYPE_CHECKING:
    from rlshell.cluster.group import WorkerGroup

__all__ = [
    "Worker",
    "WorkerContext",
    "WorkerInfo",
    "rendezvous_port",
]

# The frames the start-up hooks of this file add to every constructor error's
# traceback (the actor class's __init__, then Worker._rlshell_ready re-raising);
# the driver drops them from the traceback it shows (rlshell.cluster.errors).
HOOK_FILE = os.path.join(*__name__.split(".")) + ".py"  # rlshell/cluster/worker.py
HOOK_FRAMES = frozenset({"_rlshell_ready", "__init__"})


@frozen
class WorkerContext:
    """What a worker process is told about itself when it starts."""

    component: str
    placement: WorkerPlacement
    world_size: int


@frozen
class WorkerInfo:
    """Where one rank of a launched group runs."""

    rank: int
    pid: int
    node_ip: str
    node_id: str


# Ray leaves it unannotated; a typed view keeps the callers checked.
_node_ip_address = cast(Callable[[], str], ray.util.get_node_ip_address)

_STANDALONE = WorkerPlacement(
    rank=0, node_rank=0, local_rank=0, local_world_size=1, cpus=1.0, gpus=(), resources=()
)


class Worker:
    """Base class of rlshell workers: a plain class that a `WorkerGroup` runs as Ray actors.

    Subclasses write an ordinary ``__init__`` (arguments come from
    `create_group`) and public methods, which the group calls on every rank.
    Inside them ``self.component`` (the group's name: the component's unless
    launched under another), ``self.rank``, ``self.world_size``,
    ``self.local_rank``, ``self.placement`` (this rank's `WorkerPlacement`) and
    ``self.node_ip`` describe this process; they are set before ``__init__``
    runs. Instantiated directly (in a unit test) a worker is rank 0 of 1.
    """

    component: str = ""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    placement: WorkerPlacement = _STANDALONE
    node_ip: str = ""

    @classmethod
    def create_group(cls, *args: Any, **kwargs: Any) -> WorkerGroup[Self]:
        """A group of this worker; ``args``/``kwargs`` go to every rank's ``__init__``."""
        # Imported here: the group module imports this one.
        from rlshell.cluster.group import WorkerGroup

        return WorkerGroup(cls, args, kwargs)

    def init_process_group(self, backend: str = "gloo", *, timeout_s: float = 300.0) -> None:
        """Join this group's torch.distributed process group (env:// rendezvous).

        MASTER_ADDR/MASTER_PORT (rank 0's node and a free port) and the ranks
        come from the launch. Every rank must call it (``group.init_process_group()``);
        ``timeout_s`` bounds the rendezvous and later collectives. A second call
        in the same process does nothing.
        """
        import torch.distributed as dist

        if dist.is_initialized():
            return
        missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
        if missing:
            raise RuntimeError(
                f"{type(self).__name__}.init_process_group: {', '.join(missing)} unset; "
                "only workers started by WorkerGroup.launch have a rendezvous address"
            )
        dist.init_process_group(
            backend=backend,
            init_method="env://",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
        )

    def __repr__(self) -> str:
        # Ray prefixes a worker's log lines with this.
        return f"{type(self).__name__}({self.component} rank {self.rank})"

    # Hooks the group calls; the leading underscore keeps them off the group's
    # public method list.

    def _rlshell_start(self, context: WorkerContext) -> None:
        placement = context.placement
        self.component = context.component
        self.placement = placement
        self.rank = placement.rank
        self.world_size = context.world_size
        self.local_rank = placement.local_rank
        self.local_world_size = placement.local_world_size
        self.node_rank = placement.node_rank
        self.node_ip = _node_ip_address()
        # OMP_NUM_THREADS in the process environment sizes torch's pool when torch
        # is first imported; if the worker's module already imported it, set it
        # here. Importing torch just for this would cost each worker ~2 s.
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(max(1, int(placement.cpus)))
        load_extensions(where=f"{context.component} rank {placement.rank}")

    def _rlshell_ready(self) -> WorkerInfo:
        startup_error: Exception | None = self.__dict__.get("_rlshell_startup_error")
        if startup_error is not None:
            raise startup_error
        return WorkerInfo(
            rank=self.rank,
            pid=os.getpid(),
            node_ip=self.node_ip,
            node_id=ray.get_runtime_context().get_node_id(),
        )

    def _rlshell_rendezvous_address(self) -> tuple[str, int]:
        return self.node_ip, rendezvous_port()

    def _rlshell_set_env(self, env: dict[str, str]) -> None:
        os.environ.update(env)


def rendezvous_port(
    ephemeral_range: Path = Path("/proc/sys/net/ipv4/ip_local_port_range"),
) -> int:
    """A free TCP port for rank 0's rendezvous store, below the kernel's ephemeral range.

    The port is free when chosen and bound by torch a moment later. A port the
    kernel hands out for port 0 lies in the ephemeral range, which every
    outgoing connection on the machine draws from too (Ray opens many): one of
    them took such a port in that moment in a CI run (EADDRINUSE). Below the
    range only a process that binds that very port can collide. Where the
    range is unknown (not Linux), the kernel's choice.
    """
    try:
        low = int(ephemeral_range.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = None
    candidates = random.Random().sample(range(10_000, low), 64) if low and low > 10_100 else [0]
    for candidate in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("", candidate))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise RuntimeError(f"no free TCP port for the rendezvous among {len(candidates)} tried")


_ACTOR_CLASSES: dict[tuple[type[Worker], tuple[tuple[str, int], ...]], Any] = {}


def actor_class(
    worker_cls: type[Worker], concurrency_groups: Mapping[str, int] | None = None
) -> Any:
    """The Ray actor class for ``worker_cls`` (cached): its constructor sets up the worker first.

    ``concurrency_groups`` (name → threads) are declared on the class, where
    Ray reads them (``.options()`` cannot set them).

    The subclass's ``__init__`` runs after `Worker._rlshell_start` (attributes,
    threads, extensions). An exception from either is kept and raised by
    ``_rlshell_ready``, so the driver sees the original exception type rather
    than Ray's generic actor-death error.
    """
    key = (worker_cls, tuple(sorted((concurrency_groups or {}).items())))
    if key in _ACTOR_CLASSES:
        return _ACTOR_CLASSES[key]

    def __init__(
        self: Worker, context: WorkerContext, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.__dict__["_rlshell_startup_error"] = None
        try:
            self._rlshell_start(context)
            worker_cls.__init__(self, *args, **kwargs)
        except Exception as error:
            self.__dict__["_rlshell_startup_error"] = error

    # Same __name__ so Ray's process titles and logs show the user's class.
    actor_cls = type(
        worker_cls.__name__,
        (worker_cls,),
        {"__init__": __init__, "__module__": __name__, "__qualname__": worker_cls.__qualname__},
    )
    remote_cls: Any = (
        ray.remote(concurrency_groups=dict(concurrency_groups))(actor_cls)  # type: ignore[call-overload]
        if concurrency_groups
        else ray.remote(actor_cls)
    )
    _ACTOR_CLASSES[key] = remote_cls
    return remote_cls

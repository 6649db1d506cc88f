"""What runs in a worker's process: `WorkerBase` (every worker but its driver-side
`create_group`), the `WorkerContext` it starts with, the `WorkerInfo` it reports, and
the Ray actor class that runs its start-up hooks (`actor_class`).

`rlshell.cluster.worker.Worker` is what users subclass; the driver side
(`rlshell.cluster.group`) builds on this module, which imports neither.
"""

from __future__ import annotations

import os
import random
import socket
import sys
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import ray
from attrs import frozen

from rlshell.cluster.node_facts import adopt_node_interface
from rlshell.cluster.placement import WorkerPlacement
from rlshell.extensions import load_extensions

__all__ = [
    "HOOK_FILE",
    "HOOK_FRAMES",
    "WorkerBase",
    "WorkerContext",
    "WorkerInfo",
    "actor_class",
    "rendezvous_port",
]

# The frames the start-up hooks of this file add to every constructor error's
# traceback (the actor class's __init__, then WorkerBase._rlshell_ready re-raising);
# the driver drops them from the traceback it shows (rlshell.cluster.errors).
HOOK_FILE = os.path.join(*__name__.split(".")) + ".py"  # rlshell/cluster/worker_base.py
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


class WorkerBase:
    """Every rlshell worker but its driver-side `create_group`: what `WorkerGroup` needs of
    the classes it runs (`rlshell.cluster.worker.Worker`, which users subclass, says what
    a worker knows about itself)."""

    component: str = ""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    placement: WorkerPlacement = _STANDALONE
    node_ip: str = ""

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
        rendezvous_file = os.environ.get(RENDEZVOUS_FILE_ENV_VAR)
        if rendezvous_file:  # an embedded cluster: one machine, no listening socket
            dist.init_process_group(
                backend=backend,
                init_method=f"file://{rendezvous_file}",
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(seconds=timeout_s),
            )
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
        adopt_node_interface(f"node {placement.node_rank} ({self.node_ip})")

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


RENDEZVOUS_FILE_ENV_VAR = "RLSHELL_RENDEZVOUS_FILE"
"""Set by an embedded cluster's groups: ranks meet through this file (torch's FileStore)
rather than a TCP store, which would listen on every interface."""


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


_ACTOR_CLASSES: dict[tuple[type[WorkerBase], tuple[tuple[str, int], ...]], Any] = {}


def actor_class(
    worker_cls: type[WorkerBase], concurrency_groups: Mapping[str, int] | None = None
) -> Any:
    """The Ray actor class for ``worker_cls`` (cached): its constructor sets up the worker first.

    ``concurrency_groups`` (name → threads) are declared on the class, where
    Ray reads them (``.options()`` cannot set them).

    The subclass's ``__init__`` runs after `WorkerBase._rlshell_start` (attributes,
    threads, extensions). An exception from either is kept and raised by
    ``_rlshell_ready``, so the driver sees the original exception type rather
    than Ray's generic actor-death error.
    """
    key = (worker_cls, tuple(sorted((concurrency_groups or {}).items())))
    if key in _ACTOR_CLASSES:
        return _ACTOR_CLASSES[key]

    def __init__(
        self: WorkerBase, context: WorkerContext, args: tuple[Any, ...], kwargs: dict[str, Any]
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

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

Here: `Worker`. What runs in its process (the start-up hooks, `WorkerContext`,
`WorkerInfo`, the Ray actor class) is `rlshell.cluster.worker_base`; the driver
side (launching, calling, gathering, time-outs) is `rlshell.cluster.group`, which
imports only the base; the errors a failed worker becomes are
`rlshell.cluster.errors`. `Worker.create_group` imports the group module when
called, so that a worker's process never loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

from rlshell.cluster.worker_base import WorkerBase, WorkerContext, WorkerInfo, rendezvous_port

if TYPE_CHECKING:
    from rlshell.cluster.group import WorkerGroup

__all__ = ["Worker", "WorkerContext", "WorkerInfo", "rendezvous_port"]


class Worker(WorkerBase):
    """Base class of rlshell workers: a plain class that a `WorkerGroup` runs as Ray actors.

    Subclasses write an ordinary ``__init__`` (arguments come from
    `create_group`) and public methods, which the group calls on every rank.
    Inside them ``self.component`` (the group's name: the component's unless
    launched under another), ``self.rank``, ``self.world_size``,
    ``self.local_rank``, ``self.placement`` (this rank's `WorkerPlacement`) and
    ``self.node_ip`` describe this process; they are set before ``__init__``
    runs. Instantiated directly (in a unit test) a worker is rank 0 of 1.
    """

    @classmethod
    def create_group(cls, *args: Any, **kwargs: Any) -> WorkerGroup[Self]:
        """A group of this worker; ``args``/``kwargs`` go to every rank's ``__init__``."""
        # Imported here: a worker's own process never needs the driver's side.
        from rlshell.cluster.group import WorkerGroup

        return WorkerGroup(cls, args, kwargs)

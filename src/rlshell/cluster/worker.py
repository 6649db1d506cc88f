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

RLinf's worker calls are here too: ``self.log_info(msg)`` / ``log_warning`` /
``log_error`` write one line to the worker's stderr, which Ray forwards to the
driver's console, where the run logs (``[INFO 17:02:11 env rank 1 step 3] msg``);
the run loop calls ``group.set_global_step(step)`` on every group before each
step, so ``self.current_step`` (and the log lines) name the step being worked on.
The run calls `show_every_worker_line` on the driver first, so that Ray shows each
rank's line as it comes rather than folding lines that differ only in numbers.

Here: `Worker`. What runs in its process (the start-up hooks, `WorkerContext`,
`WorkerInfo`, the Ray actor class) is `rlshell.cluster.worker_base`; the driver
side (launching, calling, gathering, time-outs) is `rlshell.cluster.group`, which
imports only the base; the errors a failed worker becomes are
`rlshell.cluster.errors`. `Worker.create_group` imports the group module when
called, so that a worker's process never loads it.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import TYPE_CHECKING, Any, Self

from rlshell.cluster.worker_base import WorkerBase, WorkerContext, WorkerInfo, rendezvous_port

if TYPE_CHECKING:
    from rlshell.cluster.group import WorkerGroup

__all__ = ["Worker", "WorkerContext", "WorkerInfo", "rendezvous_port", "show_every_worker_line"]


class Worker(WorkerBase):
    """Base class of rlshell workers: a plain class that a `WorkerGroup` runs as Ray actors.

    Subclasses write an ordinary ``__init__`` (arguments come from
    `create_group`) and public methods, which the group calls on every rank.
    Inside them ``self.component`` (the group's name: the component's unless
    launched under another), ``self.rank``, ``self.world_size``,
    ``self.local_rank``, ``self.placement`` (this rank's `WorkerPlacement`) and
    ``self.node_ip`` describe this process; they are set before ``__init__``
    runs. Instantiated directly (in a unit test) a worker is rank 0 of 1.

    ``self.current_step`` is the run loop's step this worker works on (None
    before the first `set_global_step`); it is the loop's, not the worker's
    own count of updates (an actor's ``global_step``, restored from
    checkpoints, stays its own).
    """

    current_step: int | None = None

    def set_global_step(self, step: int) -> None:
        """The step the run loop is about to run (from 1); called on every group each step."""
        self.current_step = step

    def log_info(self, message: str) -> None:
        """One line at INFO to the run's log, naming this worker, its rank and the step."""
        self._log(logging.INFO, message)

    def log_warning(self, message: str) -> None:
        """One line at WARNING to the run's log (see `log_info`)."""
        self._log(logging.WARNING, message)

    def log_error(self, message: str) -> None:
        """One line at ERROR to the run's log (see `log_info`)."""
        self._log(logging.ERROR, message)

    def _log(self, level: int, message: str) -> None:
        where = f"{self.component or type(self).__name__} rank {self.rank}"
        if self.current_step is not None:
            where += f" step {self.current_step}"
        _worker_logger().log(level, message, extra={"worker": where})

    @classmethod
    def create_group(cls, *args: Any, **kwargs: Any) -> WorkerGroup[Self]:
        """A group of this worker; ``args``/``kwargs`` go to every rank's ``__init__``."""
        # Imported here: a worker's own process never needs the driver's side.
        from rlshell.cluster.group import WorkerGroup

        return WorkerGroup(cls, args, kwargs)


# The start of a line `Worker._log` writes, as Ray's log deduplicator sees it.
_WORKER_LINE = r"^\[(?:INFO|WARNING|ERROR) \d\d:\d\d:\d\d [^\]]* rank \d+(?: step \d+)?\] "


def show_every_worker_line() -> None:
    """On the driver: let the workers' log lines through Ray's log deduplication.

    Ray folds lines of different workers that differ only in words with digits
    into one ("[repeated 2x across cluster]") and holds the second back until a
    later line arrives, which may be minutes; a worker line names its rank, so
    each is shown as written. Ray's own setting (RAY_DEDUP_LOGS_ALLOW_REGEX)
    still applies to other lines. Calling it again changes nothing; a Ray
    without this internal hook keeps its deduplication.
    """
    try:
        from ray._private import ray_logging

        deduplicators = (ray_logging.stdout_deduplicator, ray_logging.stderr_deduplicator)
    except (ImportError, AttributeError):
        return
    for deduplicator in deduplicators:
        allowed = getattr(deduplicator, "allow_re", None)
        if allowed is not None and _WORKER_LINE in allowed.pattern:
            continue
        pattern = _WORKER_LINE if allowed is None else f"{allowed.pattern}|{_WORKER_LINE}"
        deduplicator.allow_re = re.compile(pattern)


def _worker_logger() -> logging.Logger:
    """The logger of a worker's lines: straight to stderr, which Ray forwards to the driver's
    console (not through the root logger, whose handlers a library may have changed)."""
    logger = logging.getLogger("rlshell.worker")
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(
            logging.Formatter("[%(levelname)s %(asctime)s %(worker)s] %(message)s", "%H:%M:%S")
        )
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time (a test's capture, Ray's redirection)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> Any:
        return sys.stderr

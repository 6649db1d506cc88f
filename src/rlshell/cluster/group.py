"""The driver side: `WorkerGroup`, one Ray actor per rank of a component, called as one.

`Worker.create_group` makes a group and `WorkerGroup.launch` starts it on a
planned component; ``group.method(*args)`` calls a public method of the worker
on every rank and returns a `GroupCall`, whose `GroupCall.wait` gathers the
results in rank order (`WorkerGroup.execute_on` picks ranks,
`WorkerGroup.scatter` sends one argument item per rank; `WorkerGroupView` is
either). A call's time-out and the group's shutdown are here too.

Failures come back as `rlshell.cluster.errors.WorkerError`s naming the
component, rank, node, pid and method: a worker's own exception is re-raised
as an instance of both `WorkerError` and the original type, carrying the
worker's traceback; a worker that died raises `WorkerDiedError`; a call past
its timeout raises `WorkerTimeoutError`. `WorkerGroup._translate` is where a
Ray failure becomes one of those.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError

from rlshell.cluster.errors import (
    WorkerDiedError,
    WorkerError,
    WorkerFailure,
    WorkerTimeoutError,
    ray_reason,
    remote_traceback,
    worker_error_for,
)
from rlshell.cluster.placement import ComponentPlan
from rlshell.cluster.worker_base import (
    HOOK_FILE,
    HOOK_FRAMES,
    RENDEZVOUS_FILE_ENV_VAR,
    WorkerBase,
    WorkerContext,
    WorkerInfo,
    actor_class,
)

if TYPE_CHECKING:
    from rlshell.cluster.ray_cluster import Cluster, Reservation

__all__ = ["GroupCall", "WorkerGroup", "WorkerGroupView"]

W = TypeVar("W", bound=WorkerBase)

# Methods of `Worker` that make sense only on the driver.
_DRIVER_ONLY = frozenset({"create_group"})
# Ray refuses zero-CPU placement-group bundles; keep in step with rlshell.cluster.ray_cluster.
_MIN_ACTOR_CPUS = 0.01
# How long a dead worker's node may take to be reported dead too (see WorkerGroup._lost_node):
# Ray's GCS declares a node dead after its health checks fail (5 × 3 s by default).
NODE_LOSS_WAIT_S = 45.0


def _actor_state(handle: Any) -> str | None:
    """The actor's state in Ray's GCS (``"ALIVE"``, ``"RESTARTING"``, ``"DEAD"``, ...);
    None where Ray cannot say (its debugging API, ``ray._private.state.actors``)."""
    try:
        from ray._private.state import actors

        info = actors(actor_id=handle._actor_id.hex())
    except Exception:  # an internal API: a Ray without it leaves the question open
        return None
    state = info.get("State") if isinstance(info, dict) else None
    return str(state) if state is not None else None


def _node_state(node_id: str) -> str | None:
    """``"ALIVE"`` or ``"DEAD"`` as Ray's GCS has node ``node_id`` now; None if unknown."""
    nodes = cast(Callable[[], list[dict[str, Any]]], ray.nodes)()  # Ray leaves it untyped
    for node in nodes:
        if node.get("NodeID") == node_id:
            return "ALIVE" if node.get("Alive", False) else "DEAD"
    return None


def _public_methods(worker_cls: type[WorkerBase]) -> frozenset[str]:
    return frozenset(
        name
        for name in dir(worker_cls)
        if not name.startswith("_")
        and name not in _DRIVER_ONLY
        and callable(getattr(worker_cls, name, None))
        and not isinstance(getattr(worker_cls, name, None), type)
    )


class GroupCall:
    """A method running on some ranks of a group: `wait` for the results, `done` to poll.

    Results come back in the order of the ranks called (rank order for a
    whole-group call). The first rank to fail raises at once, even while
    others are still running.
    """

    def __init__(
        self,
        group: WorkerGroup[Any],
        method: str,
        ranks: tuple[int, ...],
        refs: Sequence[ray.ObjectRef[Any]],
    ) -> None:
        self.group = group
        self.method = method
        self.ranks = ranks
        self._refs = list(refs)
        self._slot = {ref: index for index, ref in enumerate(self._refs)}
        self._values: list[Any] = [None] * len(self._refs)
        self._pending = list(self._refs)
        self._error: BaseException | None = None

    def __repr__(self) -> str:
        return (
            f"GroupCall({self.group.name}.{self.method}() on ranks {list(self.ranks)}, "
            f"{len(self.ranks) - len(self._pending)}/{len(self.ranks)} done)"
        )

    @property
    def refs(self) -> tuple[ray.ObjectRef[Any], ...]:
        """The Ray ObjectRefs of the ranks' results, in the order of the ranks called.

        Passed as a top-level argument of another call (of this group or
        another), a ref is a channel: Ray hands that worker the result once it
        is ready, without the driver waiting for it or fetching it, so a chain
        of dependent calls can be submitted at once. A failure travels down
        the chain: each dependent call fails with the first one's error.
        """
        return tuple(self._refs)

    def done(self) -> bool:
        """Whether every rank has finished (returned or failed); never blocks."""
        if not self._pending:
            return True
        ready, _ = ray.wait(self._pending, num_returns=len(self._pending), timeout=0)
        return len(ready) == len(self._pending)

    def wait(self, timeout: float | None = None) -> list[Any]:
        """Block until every rank has returned; their results in the order of the ranks called.

        ``timeout`` (seconds) defaults to the group's ``call_timeout_s`` (None:
        no limit). Raises `WorkerTimeoutError` when it passes, the worker's
        exception (also a `WorkerError`) when a rank raised, `WorkerDiedError`
        when one died. Waiting again after a timeout resumes the same call.
        """
        if self._error is not None:
            raise self._error
        limit = self.group.call_timeout_s if timeout is None else timeout
        deadline = None if limit is None else time.monotonic() + limit
        while self._pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            # One at a time, so the first failure surfaces while others still run.
            ready, self._pending = ray.wait(self._pending, num_returns=1, timeout=remaining)
            if not ready:
                raise self._timeout_error(cast(float, limit))
            for ref in ready:
                slot = self._slot[ref]
                try:
                    self._values[slot] = ray.get(ref)
                except RayError as error:
                    self._error = self._first_failure(self.ranks[slot], error)
                    raise self._error from None
        return list(self._values)

    # How long a failure waits for the other ranks' news before it is reported: a rank
    # that died takes Ray a moment to declare, while its peers' collectives fail at once.
    FAILURE_GRACE_S = 1.0

    def _first_failure(self, rank: int, error: RayError) -> WorkerError:
        """The error to raise for a failed call: a rank that died is named first (its peers'
        errors in a shared collective are the consequence, not the cause), the other
        failures already known are listed after it; fetching them also keeps Ray from
        logging them as unhandled errors."""
        failures = [(rank, error)]
        if self._pending:
            ready, self._pending = ray.wait(
                self._pending, num_returns=len(self._pending), timeout=self.FAILURE_GRACE_S
            )
            for ref in ready:
                try:
                    self._values[self._slot[ref]] = ray.get(ref)
                except RayError as failed:
                    failures.append((self.ranks[self._slot[ref]], failed))
        deaths = [f for f in failures if _is_death(f[1])]
        first = deaths[0] if deaths else failures[0]
        raised = self.group._translate(first[1], first[0], self.method)
        notes = []
        for other_rank, other in failures:
            if other is first[1]:
                continue
            if _is_death(other):
                self.group._dead.add(other_rank)
            if isinstance(other, RayTaskError) and not isinstance(other.cause, RayActorError):
                notes.append(f"rank {other_rank} ({type(other.cause).__name__}: {other.cause})")
            else:
                notes.append(f"rank {other_rank} ({type(other).__name__})")
        if notes:
            raised.extend_message(f"\n\nAlso failed: {', '.join(notes)}")
        return raised

    def _timeout_error(self, limit: float) -> WorkerTimeoutError:
        pending = tuple(self.ranks[self._slot[ref]] for ref in self._pending)
        where = ", ".join(self.group._describe(rank) for rank in pending)
        return WorkerTimeoutError(
            f"{self.method}() on component '{self.group.name}' did not finish within "
            f"{limit:g} s; still running on rank(s) {list(pending)}: {where}. The call "
            "goes on in those workers (wait again, or shut the group down to stop it)",
            WorkerFailure(component=self.group.name, method=self.method),
            pending_ranks=pending,
            timeout_s=limit,
        )


def _is_death(error: RayError) -> bool:
    """Whether a rank's failure is its process's end (directly, or seen through a nested call)."""
    if isinstance(error, RayTaskError):
        return isinstance(error.cause, RayActorError)
    return isinstance(error, RayActorError)


class _GroupMethod:
    """``group.method``: calling it submits the method to the chosen ranks."""

    def __init__(
        self, group: WorkerGroup[Any], method: str, ranks: tuple[int, ...] | None, scatter: bool
    ) -> None:
        self._group = group
        self._method = method
        self._ranks = ranks
        self._scatter = scatter

    def __call__(self, *args: Any, **kwargs: Any) -> GroupCall:
        return self._group._submit(self._method, self._ranks, args, kwargs, scatter=self._scatter)

    def __repr__(self) -> str:
        return f"<group method {self._group.name}.{self._method}>"


class WorkerGroupView:
    """Some ranks of a group (`WorkerGroup.execute_on`), and/or scattered arguments.

    ``view.method(*args)`` calls the method on those ranks only; results come
    back in the order the ranks were given.
    """

    def __init__(
        self, group: WorkerGroup[Any], ranks: tuple[int, ...] | None, scatter: bool = False
    ) -> None:
        self._group = group
        self._ranks = ranks
        self._scatter = scatter

    @property
    def ranks(self) -> tuple[int, ...]:
        return self._ranks if self._ranks is not None else tuple(range(self._group.world_size))

    @property
    def scatter(self) -> WorkerGroupView:
        """Per-rank arguments: every argument is a sequence with one item per rank called."""
        return WorkerGroupView(self._group, self._ranks, scatter=True)

    def call(self, method: str, *args: Any, **kwargs: Any) -> GroupCall:
        """Call ``method`` by name (for names the group itself uses, like ``shutdown``)."""
        return self._group._submit(method, self._ranks, args, kwargs, scatter=self._scatter)

    def call_in(self, concurrency_group: str, method: str, *args: Any, **kwargs: Any) -> GroupCall:
        """Call ``method`` in one of the concurrency groups the workers were launched with
        (`WorkerGroup.launch`): it runs beside the calls of the default group."""
        return self._group._submit(
            method,
            self._ranks,
            args,
            kwargs,
            scatter=self._scatter,
            concurrency_group=concurrency_group,
        )

    def __getattr__(self, name: str) -> _GroupMethod:
        if name.startswith("__") or "_group" not in self.__dict__:
            raise AttributeError(name)
        self._group._check_method(name)
        return _GroupMethod(self._group, name, self._ranks, self._scatter)


class WorkerGroup(Generic[W]):
    """One Ray actor per rank of a component, called as one.

    Made by `Worker.create_group`, started by `launch`. ``group.method(*args)``
    calls the worker's public method on every rank and returns a `GroupCall`;
    `execute_on` picks ranks, `scatter` sends one argument item per rank.

    Arguments are serialised once per rank called. To broadcast a large object
    (a batch, a state dict), store it once with ``ref = ray.put(obj)`` and pass
    ``ref``: Ray resolves a top-level ObjectRef argument to the stored object in
    each worker, so the driver serialises it only once.
    """

    def __init__(self, worker_cls: type[W], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.worker_cls = worker_cls
        self._args = args
        self._kwargs = kwargs
        self._public = _public_methods(worker_cls)
        self._name = ""
        self._plan: ComponentPlan | None = None
        self._handles: list[Any] = []
        self._infos: list[WorkerInfo | None] = []
        self._dead: set[int] = set()
        self._cluster: Cluster | None = None
        self._reservation: Reservation | None = None
        self._stopped = False
        # Between `start` and `wait_started`: the cluster, the reservation, when the launch
        # began and its deadline.
        self._pending: tuple[Cluster, Reservation, float, float] | None = None
        self.call_timeout_s: float | None = None
        self.launch_seconds = 0.0

    # -- launching

    def launch(
        self,
        cluster: Cluster,
        placement: ComponentPlan,
        name: str | None = None,
        *,
        max_concurrency: int | None = None,
        concurrency_groups: Mapping[str, int] | None = None,
        call_timeout_s: float | None = None,
        timeout_s: float = 300.0,
    ) -> WorkerGroup[W]:
        """Start one actor per worker of ``placement`` and wait until every constructor ran.

        Actors are named ``f"{name}:{rank}"`` (``name`` defaults to the
        component's) in the cluster's namespace and pinned to their planned
        node and bundle. ``max_concurrency`` > 1 lets a worker run that many
        calls at once (in threads). ``concurrency_groups`` (name → threads):
        Ray concurrency groups beside the default one (one thread, calls in
        order); `WorkerGroupView.call_in` runs a call in one of them, so it
        does not wait behind the calls in the default group.
        ``call_timeout_s`` is the default timeout
        of `GroupCall.wait`; ``timeout_s`` bounds the reservation and the
        constructors. A constructor that raises fails the launch with its
        exception (also a `WorkerError` naming rank and node); every actor and
        placement group made so far is removed.

        ``launch`` is `start` then `wait_started`. Several groups start side by
        side with `start` on each, then `wait_started` on each: their processes
        start and import together instead of one group after another.
        """
        self.start(
            cluster,
            placement,
            name,
            max_concurrency=max_concurrency,
            concurrency_groups=concurrency_groups,
            call_timeout_s=call_timeout_s,
            timeout_s=timeout_s,
        )
        return self.wait_started()

    def start(
        self,
        cluster: Cluster,
        placement: ComponentPlan,
        name: str | None = None,
        *,
        max_concurrency: int | None = None,
        concurrency_groups: Mapping[str, int] | None = None,
        call_timeout_s: float | None = None,
        timeout_s: float = 300.0,
    ) -> WorkerGroup[W]:
        """The first half of `launch` (same arguments): reserve the placement and create the
        actors, without waiting for their constructors. Call `wait_started` next; until then
        the group takes no calls. Actors that fail to be created are stopped."""
        if self._handles or self._stopped or self._pending is not None:
            raise RuntimeError(
                f"this {self.worker_cls.__name__} group was already launched; "
                "create another with create_group()"
            )
        start = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        self._name = name or placement.name
        self._plan = placement
        self.call_timeout_s = call_timeout_s
        self._infos = [None] * placement.world_size
        reservation = cluster.reserve(placement, timeout_s=timeout_s)
        self._reservation = reservation
        try:
            self._start_actors(cluster, reservation, placement, max_concurrency, concurrency_groups)
        except BaseException:
            self._stop()
            raise
        self._pending = (cluster, reservation, start, deadline)
        return self

    def wait_started(self) -> WorkerGroup[W]:
        """The second half of `launch`: wait until every constructor ran, check each worker
        runs on its planned node, and give the ranks their rendezvous address. A failure
        stops the group (every actor and placement group removed) and is raised."""
        if self._pending is None:
            done = self._cluster is not None or self._stopped
            raise RuntimeError(
                f"this {self.worker_cls.__name__} group "
                + ("was already launched" if done else "was not started: call start() first")
            )
        cluster, reservation, start, deadline = self._pending
        self._pending = None
        try:
            everyone = tuple(range(self.world_size))
            infos = self._startup_call(everyone, "_rlshell_ready", deadline)
            self._infos = list(infos)
            self._check_pinning(reservation)
            ((address, port),) = self._startup_call((0,), "_rlshell_rendezvous_address", deadline)
            rendezvous = {"MASTER_ADDR": str(address), "MASTER_PORT": str(port)}
            if cluster.embedded:
                rendezvous[RENDEZVOUS_FILE_ENV_VAR] = cluster.rendezvous_file(self._name)
            self._startup_call(everyone, "_rlshell_set_env", deadline, rendezvous)
        except BaseException:
            self._stop()
            raise
        self._cluster = cluster
        cluster._track(self)
        self.launch_seconds = time.perf_counter() - start
        return self

    def _start_actors(
        self,
        cluster: Cluster,
        reservation: Reservation,
        placement: ComponentPlan,
        max_concurrency: int | None,
        concurrency_groups: Mapping[str, int] | None = None,
    ) -> None:
        remote_cls = actor_class(self.worker_cls, concurrency_groups)
        for worker in placement.workers:
            context = WorkerContext(
                component=self._name, placement=worker, world_size=placement.world_size
            )
            runtime_env = cluster.runtime_env(
                placement, worker, gpu_node=reservation.node_gpus[worker.node_rank] > 0
            )
            options: dict[str, Any] = {
                "name": f"{self._name}:{worker.rank}",
                "namespace": cluster.namespace,
                "num_cpus": max(worker.cpus, _MIN_ACTOR_CPUS),
                "num_gpus": 0,
                "max_restarts": 0,
                "scheduling_strategy": reservation.scheduling_strategy(worker.rank),
                "runtime_env": runtime_env,
            }
            if max_concurrency is not None:
                options["max_concurrency"] = max_concurrency
            try:
                handle = remote_cls.options(**options).remote(context, self._args, self._kwargs)
            except ValueError as error:
                if "already taken" not in str(error):
                    raise
                raise WorkerError(
                    f"cannot launch component '{self._name}': an actor named "
                    f"'{options['name']}' already exists in namespace '{cluster.namespace}' "
                    "(a group of that name is running; shut it down or pass another name=)",
                    WorkerFailure(component=self._name, rank=worker.rank, method="__init__"),
                ) from error
            self._handles.append(handle)

    def _startup_call(
        self, ranks: tuple[int, ...], hook: str, deadline: float, *args: Any
    ) -> list[Any]:
        """Call a start-up hook on ``ranks``; failures are reported as failures of __init__."""
        refs = [getattr(self._handles[rank], hook).remote(*args) for rank in ranks]
        call = GroupCall(self, "__init__", ranks, refs)
        return call.wait(timeout=max(0.0, deadline - time.monotonic()))

    def _check_pinning(self, reservation: Reservation) -> None:
        for rank, info in enumerate(self._infos):
            expected = reservation.node_id(rank)
            if info is not None and info.node_id != expected:
                raise WorkerError(
                    f"{self._describe(rank)} started on Ray node {info.node_id}, but its "
                    f"placement group was pinned to node {expected}",
                    WorkerFailure(
                        component=self._name,
                        rank=rank,
                        node=info.node_ip,
                        pid=info.pid,
                        method="__init__",
                    ),
                )

    # -- describing

    @property
    def name(self) -> str:
        """The group's name (the component's unless given to `launch`)."""
        return self._name

    @property
    def world_size(self) -> int:
        return len(self._handles) if self._plan is None else self._plan.world_size

    def __len__(self) -> int:
        return self.world_size

    @property
    def placement(self) -> ComponentPlan | None:
        """The component plan the group was launched with."""
        return self._plan

    @property
    def reservation(self) -> Reservation | None:
        """The placement groups holding the group's CPUs (None before `launch`)."""
        return self._reservation

    @property
    def workers(self) -> tuple[WorkerInfo, ...]:
        """Rank, pid, node IP and Ray node id of every rank (after `launch`)."""
        return tuple(info for info in self._infos if info is not None)

    @property
    def actors(self) -> tuple[Any, ...]:
        """The Ray actor handles, by rank, for code that needs Ray directly."""
        return tuple(self._handles)

    @property
    def dead_ranks(self) -> tuple[int, ...]:
        """Ranks whose process is known to have died."""
        return tuple(sorted(self._dead))

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else ("running" if self._handles else "not launched")
        return (
            f"WorkerGroup({self.worker_cls.__name__}, name='{self._name}', "
            f"world_size={self.world_size}, {state})"
        )

    def _describe(self, rank: int) -> str:
        info = self._infos[rank] if rank < len(self._infos) else None
        if info is not None:
            return f"rank {rank} (node {info.node_ip}, pid {info.pid})"
        return f"rank {rank} (node {self._planned_node(rank)})"

    def _planned_node(self, rank: int) -> str:
        if self._plan is None or self._reservation is None:
            return "?"
        node_rank = self._plan.workers[rank].node_rank
        return f"{node_rank}, {self._reservation.node_addresses.get(node_rank, '?')}"

    # -- calling

    def _check_method(self, name: str) -> None:
        if name.startswith("_"):
            raise AttributeError(
                f"'{name}' is private: only public methods of {self.worker_cls.__name__} "
                "can be called on its group"
            )
        if name not in self._public:
            close = difflib.get_close_matches(name, sorted(self._public), n=3)
            hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
            raise AttributeError(
                f"{self.worker_cls.__name__} has no public method '{name}'{hint}; "
                f"its methods: {', '.join(sorted(self._public)) or 'none'}"
            )

    def _submit(
        self,
        method: str,
        ranks: tuple[int, ...] | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        scatter: bool,
        concurrency_group: str | None = None,
    ) -> GroupCall:
        self._check_method(method)
        if not self._handles:
            raise RuntimeError(
                f"{self.worker_cls.__name__} group is not running: "
                + ("it was shut down" if self._stopped else "call launch() first")
            )
        targets = tuple(range(self.world_size)) if ranks is None else ranks
        if scatter:
            self._check_scatter(method, targets, args, kwargs)
        refs = []
        for index, rank in enumerate(targets):
            remote = getattr(self._handles[rank], method)
            if concurrency_group is not None:
                remote = remote.options(concurrency_group=concurrency_group)
            if scatter:
                refs.append(
                    remote.remote(
                        *(arg[index] for arg in args),
                        **{key: value[index] for key, value in kwargs.items()},
                    )
                )
            else:
                refs.append(remote.remote(*args, **kwargs))
        return GroupCall(self, method, targets, refs)

    def _check_scatter(
        self,
        method: str,
        ranks: tuple[int, ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        named: Iterator[tuple[str, Any]] = iter(
            [*((f"argument {i}", a) for i, a in enumerate(args)), *kwargs.items()]
        )
        for label, value in named:
            if not isinstance(value, Sequence) or len(value) != len(ranks):
                size = len(value) if isinstance(value, Sequence) else "not a sequence"
                raise ValueError(
                    f"scatter {self._name}.{method}(): {label} must hold one item per rank "
                    f"called ({len(ranks)}: ranks {list(ranks)}), got {size}"
                )

    def call(self, method: str, *args: Any, **kwargs: Any) -> GroupCall:
        """Call ``method`` by name on every rank (for names the group itself uses)."""
        return self._submit(method, None, args, kwargs, scatter=False)

    def execute_on(self, *ranks: int) -> WorkerGroupView:
        """A view whose calls go to ``ranks`` only; results come back in that order."""
        if not ranks:
            raise ValueError("execute_on() needs at least one rank")
        bad = [rank for rank in ranks if not 0 <= rank < self.world_size]
        if bad:
            raise ValueError(
                f"execute_on: ranks {bad} are outside component '{self._name}' "
                f"(ranks 0-{self.world_size - 1})"
            )
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"execute_on: ranks {list(ranks)} repeat a rank")
        return WorkerGroupView(self, tuple(ranks))

    @property
    def scatter(self) -> WorkerGroupView:
        """Per-rank arguments: ``group.scatter.method(items)`` sends ``items[i]`` to rank i."""
        return WorkerGroupView(self, None, scatter=True)

    def __getattr__(self, name: str) -> _GroupMethod:
        if name.startswith("__") or "_public" not in self.__dict__:
            # Dunder protocol probes, and lookups before __init__ ran (copy,
            # unpickling), must stay plain AttributeErrors.
            raise AttributeError(name)
        self._check_method(name)
        return _GroupMethod(self, name, None, False)

    def _translate(self, error: BaseException, rank: int, method: str) -> WorkerError:
        """The driver-side error for a Ray failure of ``rank`` running ``method``."""
        info = self._infos[rank] if rank < len(self._infos) else None
        node = info.node_ip if info is not None else self._planned_node(rank)
        pid = info.pid if info is not None else None
        cause, traceback_text = error, ""
        if isinstance(error, RayTaskError):
            cause = error.cause
            if not isinstance(cause, RayActorError):  # else a nested call to a dead actor
                traceback_text, remote_pid, remote_ip = remote_traceback(
                    str(error), HOOK_FILE, HOOK_FRAMES
                )
                node = node if info is not None or not remote_ip else remote_ip
                pid = pid if pid is not None else remote_pid
        failure = WorkerFailure(
            component=self._name,
            rank=rank,
            node=node,
            pid=pid,
            method=method,
            remote_traceback=traceback_text,
            cause=cause,
        )
        if isinstance(cause, RayActorError):
            self._dead.add(rank)
            return self._died(failure)
        if isinstance(error, RayTaskError):
            return worker_error_for(
                failure,
                f"{failure.where} raised in {method}(): {type(cause).__name__}: {cause}\n\n"
                f"Worker traceback:\n{traceback_text}",
            )
        return WorkerError(
            f"{failure.where} failed in {method}(): {type(error).__name__}: {ray_reason(error)}",
            failure,
        )

    def _died(self, failure: WorkerFailure) -> WorkerDiedError:
        method = failure.method
        doing = "while starting" if method == "__init__" else f"while running {method}()"
        why = (
            "the group was shut down"
            if self._stopped
            else self._lost_node(failure.rank)
            or "its process exited (killed, out of memory, or crashed)"
        )
        return WorkerDiedError(
            f"{failure.where} died {doing}: {why}. Ray says: {ray_reason(failure.cause, 2000)}",
            failure,
        )

    def _lost_node(self, rank: int | None, wait_s: float = NODE_LOSS_WAIT_S) -> str | None:
        """Why rank ``rank`` died when its Ray node is gone: the node (rank, IP, id) and the
        ranks of every group of this cluster that ran there; None while the node is alive.

        The driver sees a worker's connection drop at once; Ray's GCS marks the actor
        dead soon after where only its process died (its node's raylet reports it),
        and the node dead only once the node's health checks have failed. So the
        GCS is asked, for up to ``wait_s`` seconds, until it says one or the other.
        """
        if rank is None or rank >= len(self._infos) or not ray.is_initialized():
            return None
        info = self._infos[rank]
        if info is None:
            return None
        handle = self._handles[rank] if rank < len(self._handles) else None
        deadline = time.monotonic() + wait_s
        process_dead_seen = False
        while True:
            state = _node_state(info.node_id)
            if state == "DEAD":
                break
            if state is None or time.monotonic() >= deadline:
                return None
            if handle is not None and _actor_state(handle) == "DEAD":
                if process_dead_seen:  # dead twice with its node alive: the process alone
                    return None
                process_dead_seen = True
            time.sleep(0.5)
        node_rank = self._plan.workers[rank].node_rank if self._plan is not None else None
        on_node = []
        groups = (
            [group for group in self._cluster.launched() if isinstance(group, WorkerGroup)]
            if self._cluster is not None
            else [self]
        )
        for group in groups:
            ranks = [i.rank for i in group._infos if i is not None and i.node_id == info.node_id]
            if ranks:
                on_node.append(f"'{group.name}' rank{'s' if len(ranks) > 1 else ''} {ranks}")
        where = f"node {node_rank} " if node_rank is not None else "its node "
        return (
            f"{where}({info.node_ip}, Ray node {info.node_id[:12]}) left the Ray cluster (its "
            "raylet died or its machine was lost), taking every worker on it: " + ", ".join(on_node)
        )

    # -- stopping

    def shutdown(self) -> None:
        """Kill every rank's actor and release the group's placement groups (idempotent)."""
        if self._stopped:
            return
        self._stop()
        if self._cluster is not None:
            self._cluster._untrack(self)

    def _stop(self) -> None:
        self._stopped = True
        if ray.is_initialized():
            for handle in self._handles:
                ray.kill(handle, no_restart=True)
        self._handles = []
        if self._reservation is not None:
            self._reservation.release()

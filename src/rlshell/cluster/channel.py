"""Channels between worker groups: batches sent from one group's workers to another's directly.

A `Channel` is a named FIFO queue (one per key) that any worker, and the
driver, can put into and get from; RLinf's ``Channel`` with the same calls:

    channel = Channel.create("rollout_to_actor", maxsize=4)        # on the driver
    rollout.generate(channel)   # in a rollout worker: channel.put(batch, key=...)
    actor.train(channel)        # in an actor worker:  batch = channel.get(key=..., timeout=60)
    channel.close()

The payload never passes through the driver, nor through the queue: ``put``
stores the item in the sender's Ray object store (``ray.put``) and queues only
its ObjectRef, in a small asyncio Ray actor that holds the queues; ``get``
takes the ref and reads the object from where it lies (shared memory on the
same node, Ray's object transfer across nodes). ``broadcast`` stores an item
once and queues its ref under several keys (one per reader, say).

Capacity is bounded per key (``maxsize`` refs): ``put`` waits for room
(back-pressure) and raises `ChannelFull` when ``timeout`` passes first; ``get``
waits for an item and raises `ChannelEmpty` when its ``timeout`` passes. After
``close`` every ``put`` and every ``get`` of an empty queue raise `ChannelClosed`
(items put before the close are still delivered). `ChannelPeerDied` says a peer
is gone: the queue's actor, a worker that has put into the channel while a ``get``
waits on an empty key, one that has taken from it while a ``put`` waits on a full
key, or the sender of the item being read when that item is lost with it. (An
item lives in its sender's node's object store: on the reader's node it is still
read after its sender died; from another node, Ray cannot fetch it once its owner
is gone.)
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Literal, cast

import ray
from attrs import frozen
from ray.exceptions import ObjectLostError, RayActorError

__all__ = [
    "DEFAULT_KEY",
    "Channel",
    "ChannelClosed",
    "ChannelEmpty",
    "ChannelError",
    "ChannelFull",
    "ChannelPeerDied",
]

DEFAULT_KEY = "default"

# How long one wait inside the queue's actor lasts before the waiting side checks its
# peers' lives and waits again.
_LIVENESS_SLICE_S = 1.0


class ChannelError(RuntimeError):
    """A channel operation that could not complete; the subclasses say why."""


class ChannelClosed(ChannelError):
    """The channel was closed: nothing more can be put, and its queue holds nothing more."""


class ChannelFull(ChannelError, TimeoutError):
    """``put`` waited ``timeout`` seconds for room in a full queue."""


class ChannelEmpty(ChannelError, TimeoutError):
    """``get`` waited ``timeout`` seconds and nothing arrived."""


class ChannelPeerDied(ChannelError):
    """A peer of the channel died: its queue's actor, or a worker at the other end."""


@frozen
class _Peer:
    """A process that used the channel: its Ray actor id (None for the driver) and its name."""

    actor_id: str | None
    name: str


def _this_process() -> _Peer:
    context = ray.get_runtime_context()
    actor_id = context.get_actor_id()
    if actor_id is None:
        return _Peer(None, f"the driver (pid {os.getpid()})")
    name = context.get_actor_name() or f"actor {actor_id[:12]}"
    return _Peer(actor_id, f"{name} (pid {os.getpid()})")


def _actor_state(actor_id: str) -> str | None:
    """``"ALIVE"``, ``"DEAD"``, ... as Ray's GCS has the actor now; None where it cannot say."""
    try:
        from ray._private.state import actors

        info = actors(actor_id=actor_id)
    except Exception:  # an internal API: a Ray without it leaves the question open
        return None
    state = info.get("State") if isinstance(info, dict) else None
    return str(state) if state is not None else None


class _Queues:
    """The queues of one channel, held by a Ray actor (asyncio: a waiting ``get`` blocks no
    ``put``). Every method answers with a status rather than raising, so that the caller
    raises the channel's own errors."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        # A key's queue exists while it holds items (keys may be many: one per window).
        self.queues: dict[Hashable, deque[tuple[list[Any], _Peer]]] = {}
        self.writers: dict[str, _Peer] = {}
        self.readers: dict[str, _Peer] = {}
        self.closed = False
        self.reason = ""
        self._changed: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:  # made in the actor's event loop
            self._changed = asyncio.Condition()
        return self._changed

    def _held(self, key: Hashable) -> int:
        queue = self.queues.get(key)
        return len(queue) if queue is not None else 0

    async def put(
        self, keys: list[Hashable], boxed_ref: list[Any], sender: _Peer, wait_s: float
    ) -> tuple[str, str]:
        """Queue the ref under every key once each has room: ``("ok", "")``; else
        ``("closed", reason)`` or ``("full", "")`` after ``wait_s`` seconds."""
        if sender.actor_id is not None:
            self.writers[sender.actor_id] = sender
        changed = self._condition()

        def room() -> bool:
            return self.closed or all(self._held(key) < self.maxsize for key in keys)

        async with changed:
            try:
                await asyncio.wait_for(changed.wait_for(room), timeout=wait_s)
            except TimeoutError:
                return "full", ""
            if self.closed:
                return "closed", self.reason
            for key in keys:
                self.queues.setdefault(key, deque()).append((boxed_ref, sender))
            changed.notify_all()
        return "ok", ""

    async def get(
        self, key: Hashable, reader: _Peer, wait_s: float
    ) -> tuple[str, list[Any] | None, _Peer | None, str]:
        """The oldest ref under ``key``: ``("ok", boxed_ref, sender, "")``; else
        ``("closed", ..., reason)`` once closed and empty, or ``("empty", ...)`` after
        ``wait_s`` seconds."""
        if reader.actor_id is not None:
            self.readers[reader.actor_id] = reader
        changed = self._condition()
        async with changed:
            try:
                await asyncio.wait_for(
                    changed.wait_for(lambda: self.closed or self._held(key) > 0), timeout=wait_s
                )
            except TimeoutError:
                return "empty", None, None, ""
            queue = self.queues.get(key)
            if not queue:
                return "closed", None, None, self.reason
            boxed_ref, sender = queue.popleft()
            if not queue:
                del self.queues[key]
            changed.notify_all()
        return "ok", boxed_ref, sender, ""

    async def close(self, reason: str) -> None:
        changed = self._condition()
        async with changed:
            if not self.closed:
                self.closed, self.reason = True, reason
            changed.notify_all()

    def peers(self, role: Literal["writers", "readers"]) -> list[_Peer]:
        """The workers that have put into (``writers``) or taken from (``readers``) the
        channel."""
        return list((self.writers if role == "writers" else self.readers).values())

    def qsize(self, key: Hashable) -> int:
        return self._held(key)

    def is_closed(self) -> bool:
        return self.closed


# Ray's decorator leaves the class untyped; its handle is used through `Any`.
_QueuesActor: Any = ray.remote(_Queues)


class Channel:
    """A named, bounded FIFO queue per key between workers; made by `create`, passed to
    workers as an argument (it pickles as a handle to its queues). See the module."""

    def __init__(self, name: str, maxsize: int, queues: Any) -> None:
        self.name = name
        self.maxsize = maxsize
        self._queues = queues

    @classmethod
    def create(cls, name: str, maxsize: int = 16) -> Channel:
        """A new channel whose queues hold at most ``maxsize`` items per key.

        Its queues live in a small actor of no CPUs, which lives as long as the
        process that created the channel (the driver) or until `close`
        ``(kill=True)``.
        """
        if maxsize < 1:
            raise ValueError(f"Channel {name!r}: maxsize must be at least 1, got {maxsize}")
        queues = _QueuesActor.options(num_cpus=0, max_concurrency=1000).remote(maxsize)
        return cls(name, maxsize, queues)

    def __repr__(self) -> str:
        return f"Channel({self.name!r}, maxsize={self.maxsize})"

    def __reduce__(self) -> tuple[Callable[..., Channel], tuple[str, int, Any]]:
        return (Channel, (self.name, self.maxsize, self._queues))

    # -- sending

    def put(self, item: Any, key: Hashable = DEFAULT_KEY, *, timeout: float | None = None) -> None:
        """Send ``item`` to whoever gets from ``key``; waits while the queue is full.

        Raises `ChannelFull` after ``timeout`` seconds without room (None: wait
        as long as it takes), `ChannelClosed`, or `ChannelPeerDied` when a
        worker that took from this key died while the queue was full.
        """
        self.broadcast(item, [key], timeout=timeout)

    def broadcast(
        self, item: Any, keys: Sequence[Hashable], *, timeout: float | None = None
    ) -> None:
        """``put`` to every key of ``keys`` at once: the item is stored once and each
        key's queue gets its reference, when every one of them has room."""
        if not keys:
            raise ValueError(f"{self}: broadcast to no keys")
        sender = _this_process()
        boxed_ref = [ray.put(item)]  # in a list: Ray hands the actor the ref, not the object
        status, reason = self._wait(
            lambda wait_s: self._queues.put.remote(list(keys), boxed_ref, sender, wait_s),
            timeout,
            "readers",
            "full",
        )
        if status == "closed":
            raise ChannelClosed(f"{self}: closed, nothing can be put{_because(reason)}")
        if status == "full":
            raise ChannelFull(
                f"{self}: no room under key(s) {list(keys)} within {timeout:g} s "
                f"({self.maxsize} items each, none taken since)"
            )

    # -- receiving

    def get(self, key: Hashable = DEFAULT_KEY, *, timeout: float | None = None) -> Any:
        """The oldest item under ``key``; waits while there is none.

        Raises `ChannelEmpty` after ``timeout`` seconds with nothing (None:
        wait as long as it takes), `ChannelClosed` once closed and empty, or
        `ChannelPeerDied` when the worker that put the item died before it was
        read, or one that put into this key died while nothing was there.
        """
        reader = _this_process()
        status, boxed_ref, sender, reason = self._wait(
            lambda wait_s: self._queues.get.remote(key, reader, wait_s),
            timeout,
            "writers",
            "empty",
        )
        if status == "closed":
            raise ChannelClosed(
                f"{self}: closed, and nothing is left under key {key!r}{_because(reason)}"
            )
        if status == "empty":
            raise ChannelEmpty(f"{self}: nothing arrived under key {key!r} within {timeout:g} s")
        assert boxed_ref is not None
        assert sender is not None
        try:
            return ray.get(boxed_ref[0])
        except ObjectLostError as error:  # OwnerDiedError among them
            raise ChannelPeerDied(
                f"{self}: the item under key {key!r} from {sender.name} is lost before it "
                f"was read: {type(error).__name__} (its sender, or the sender's node, died)"
            ) from None

    # -- the channel

    def qsize(self, key: Hashable = DEFAULT_KEY) -> int:
        """How many items wait under ``key``."""
        return int(self._call(self._queues.qsize.remote(key)))

    def closed(self) -> bool:
        return bool(self._call(self._queues.is_closed.remote()))

    def close(self, reason: str = "", *, kill: bool = False) -> None:
        """Close the channel: waiting and later ``put``s, and ``get``s of empty keys, raise
        `ChannelClosed` (naming ``reason``). ``kill``: stop its queue actor too (what was
        still queued is dropped). Closing twice changes nothing."""
        try:
            self._call(self._queues.close.remote(reason))
        except ChannelPeerDied:
            if not kill:
                raise
        if kill:
            ray.kill(self._queues)

    # -- waiting

    def _wait(
        self,
        submit: Callable[[float], Any],
        timeout: float | None,
        peers: Literal["writers", "readers"],
        waiting: str,
    ) -> Any:
        """``submit(wait_s)``'s answer, asked again slice by slice while it is ``waiting``
        and ``timeout`` lasts; between slices, a dead peer (``writers`` for a get, ``readers``
        for a put) raises."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            wait_s = _LIVENESS_SLICE_S if remaining is None else min(remaining, _LIVENESS_SLICE_S)
            answer = self._call(submit(wait_s))
            if answer[0] != waiting or (remaining is not None and remaining <= wait_s):
                return answer
            for peer in cast(list[_Peer], self._call(self._queues.peers.remote(peers))):
                if peer.actor_id is not None and _actor_state(peer.actor_id) == "DEAD":
                    did, would = (
                        ("put into", "sent") if peers == "writers" else ("took from", "taken")
                    )
                    raise ChannelPeerDied(
                        f"{self}: {peer.name}, which {did} it, died while the queue was "
                        f"{waiting}: what it would have {would} will not come"
                    )

    def _call(self, ref: Any) -> Any:
        try:
            return ray.get(ref)
        except RayActorError as error:
            raise ChannelPeerDied(
                f"{self}: its queue actor died ({type(error).__name__}); what it held is lost"
            ) from None


def _because(reason: str) -> str:
    return f" ({reason})" if reason else ""

"""The actor's weights to the rollout: when, how, and the errors of syncs queued behind rollouts.

Synchronous runs sync after each update and wait for the rollout to load the
weights. ``runner.mode='async'`` stages them on the actor and queues them on
every rollout worker behind the requests already there (or, with
``rollout.partial_rollouts``, offers them beside the requests in flight),
tagged with the actor's version; `WeightSync.check` surfaces the queued
syncs' errors.
"""

from __future__ import annotations

from typing import Any

from rlshell.cluster.group import GroupCall, WorkerGroup
from rlshell.config import Config
from rlshell.workers.actor import ActorWorker

__all__ = ["WeightSync"]


class WeightSync:
    """Syncs ``actor``'s weights to ``rollout`` (the actor's own group when the rollout runs
    in its processes); ``queued``: ``runner.mode='async'``'s syncs behind the rollouts."""

    def __init__(
        self,
        config: Config,
        actor: WorkerGroup[ActorWorker],
        rollout: WorkerGroup[Any],
        rollout_in_actor: bool,
        queued: bool,
    ) -> None:
        self.config = config
        self.actor = actor
        self.rollout = rollout
        self.rollout_in_actor = rollout_in_actor
        self.queued = queued
        self.synced = False  # whether the rollout holds the actor's current weights
        self._calls: list[GroupCall] = []  # async weight syncs queued on the rollout

    def ensure(self, version: int) -> None:
        """A full sync after launch or load, before the rollout generates."""
        if not self.synced:
            self.sync(full=True, version=version)

    def sync(self, full: bool, version: int) -> dict[str, float]:
        """The actor's weights to the rollout (``full``: every tensor, even in ``patch``
        mode), as ``version``; the ``rollout/sync_*`` metrics."""
        self.synced = self.synced or full
        if self.rollout_in_actor and self.config.rollout.weight_sync == "shared":
            return {"rollout/sync_bytes": 0.0}  # the engine generates with the actor's module
        if self.queued:
            return self._push(full, version)
        stats: dict[str, float] = self.actor.sync_model_to_rollout(full=full).wait()[0]
        if not self.rollout_in_actor:
            finished = self.rollout.finish_sync(full).wait()
            stats["engine_reload_seconds"] = max(part["engine_reload_seconds"] for part in finished)
        return {f"rollout/sync_{key}": value for key, value in stats.items()}

    def _push(self, full: bool, version: int) -> dict[str, float]:
        """Stage the actor's weights and queue them on every rollout worker behind the
        requests already there, as ``version``; waits for the actor only."""
        refs, stats = self.actor.stage_weights(full).wait()[0]
        rollout = self.rollout
        if self.config.rollout.partial_rollouts:
            # Offered beside the requests in flight, which take them up between two tokens;
            # acknowledged before anything else is queued, so a request queued later starts
            # with these weights or newer (the staleness bound's premise).
            for rank in range(rollout.world_size):
                view = rollout.execute_on(rank)
                view.call_in("control", "offer_sync", refs, full, version).wait()
        else:
            self._calls += [
                rollout.execute_on(rank).apply_sync(refs, full, version)
                for rank in range(rollout.world_size)
            ]
        return {f"rollout/sync_{key}": value for key, value in stats.items()}

    def check(self, wait: bool) -> None:
        """Surface the errors of the weight syncs queued on the rollout workers: of those
        done (``wait``: of all, waiting for them)."""
        pending = []
        for call in self._calls:
            if wait or call.done():
                call.wait()
            else:
                pending.append(call)
        self._calls = pending

"""The actor and the rollout taking turns on GPUs they share (`rlshell.runners.offload`).

`GpuTurns.rollout` makes room for generation, `GpuTurns.update` for the
actor's update; each move happens once per change of phase, and the seconds
spent moving are handed out once by `GpuTurns.take_seconds`.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from rlshell.cluster.group import WorkerGroup
from rlshell.runners.offload import OffloadPlan

__all__ = ["GpuTurns"]


class GpuTurns:
    """Who holds the shared GPUs now; moves state to host memory as ``offload`` says."""

    def __init__(self, offload: OffloadPlan, actor: WorkerGroup[Any], rollout: WorkerGroup[Any]):
        self.offload = offload
        self.actor = actor
        self.rollout_group = rollout
        self.phase: Literal["rollout", "update"] | None = None
        self._seconds = 0.0

    def rollout(self) -> None:
        """Make room for the rollout: the actor's state to host memory, the rollout's back."""
        if self.phase == "rollout" or not self.offload.any:
            return
        started = time.perf_counter()
        if self.offload.actor_optimizer:
            self.actor.offload(self.offload.actor_params).wait()
        if self.offload.rollout and self.phase == "update":
            self.rollout_group.reload().wait()
        self.phase = "rollout"
        self._seconds += time.perf_counter() - started

    def update(self) -> None:
        """Make room for the update: the rollout's model to host memory, the actor's state back."""
        if self.phase == "update" or not self.offload.any:
            return
        started = time.perf_counter()
        if self.offload.rollout:
            self.rollout_group.offload().wait()
        if self.offload.actor_optimizer and self.phase == "rollout":
            self.actor.reload(self.offload.actor_params).wait()
        self.phase = "update"
        self._seconds += time.perf_counter() - started

    def take_seconds(self) -> float:
        """The seconds spent moving state since the last call."""
        seconds, self._seconds = self._seconds, 0.0
        return seconds

    def describe(self) -> str:
        """What moves between phases, for the launch line ('' when nothing does)."""
        offload = self.offload
        moved = []
        if offload.actor_optimizer:
            moved.append("actor optimizer" + (" and parameters" if offload.actor_params else ""))
        if offload.rollout:
            moved.append("rollout model")
        return f"; offloading the {' and the '.join(moved)} between phases" if moved else ""

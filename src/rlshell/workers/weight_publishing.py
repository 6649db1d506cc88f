"""Where one actor rank's weights go after an update: the rollout engine in its process,
or (rank 0) the rollout workers of their own, now or staged for later.

The shards are gathered whole on every rank (`TrainingBackend.unsharded`, collective),
taken by name (`TrainingBackend.full_tensors`), a LoRA actor's with its adapters merged
in under the plain model's names (`rlshell.models.lora.MergedLoRAWeights`), and sent by
the `rlshell.sync.transfer.WeightSender` (``bucket`` or ``patch``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from rlshell.engines.rollout import RolloutEngine
from rlshell.engines.training import TrainingBackend
from rlshell.models.lora import MergedLoRAWeights
from rlshell.sync.codec import FlatBuckets
from rlshell.sync.transfer import WeightSender, message_bytes

__all__ = ["WeightPublisher"]


class WeightPublisher:
    """One actor rank's weight syncs: ``engine`` (the collocated engine, whose tensors
    ``flat`` may lay out as buckets) or ``rollout_handles`` (the rollout workers rank 0
    sends to), with ``sender``'s codec."""

    def __init__(
        self,
        sender: WeightSender,
        *,
        rank: int,
        lora: bool,
        engine: RolloutEngine | None = None,
        flat: FlatBuckets | None = None,
    ) -> None:
        self.sender = sender
        self.rank = rank
        self.lora = lora
        self.engine = engine
        self.flat = flat
        self.rollout_handles: Sequence[Any] = ()

    def _named(self, manager: TrainingBackend, model: Any) -> Mapping[str, Tensor]:
        gathered: Mapping[str, Tensor] = manager.full_tensors(model)
        return MergedLoRAWeights(model, gathered) if self.lora else gathered

    def sync(self, manager: TrainingBackend, full: bool) -> dict[str, float]:
        """Send the current weights: in memory to the engine in this process, or rank 0 to the
        rollout workers (which apply each record before it returns). Every rank takes part
        (gathering is collective); ``full=True`` sends everything even in ``patch`` mode."""
        with manager.unsharded() as model:  # one all-gather per FSDP unit
            gathered = self._named(manager, model)
            if self.engine is not None:
                targets = self.engine.weight_targets()
                if gathered.keys() != targets.keys():
                    raise RuntimeError(
                        "the rollout engine's tensors differ from the actor's: only in the "
                        f"engine {sorted(targets.keys() - gathered.keys())[:5]}, only in the "
                        f"actor {sorted(gathered.keys() - targets.keys())[:5]}"
                    )
                # In the engine's order: its FlatBuckets expect that layout.
                tensors = ((name, gathered[name]) for name in targets)
                stats = self.sender.send_in_memory(tensors, targets, full=full, flat=self.flat)
                started = time.perf_counter()
                self.engine.weights_updated()
                stats["engine_reload_seconds"] = time.perf_counter() - started
                return stats
            if self.rank == 0:
                return self.sender.send_to_workers(
                    gathered.items(), self.rollout_handles, full=full
                )
        return {}

    def stage(self, manager: TrainingBackend, full: bool) -> tuple[list[Any], dict[str, float]]:
        """One sync to the rollout workers put in the object store without waiting for them.

        ``runner.mode='async'``: the rollout workers are busy generating, so rank 0 does not
        deliver the records itself (`sync` waits for every worker to apply each one); it
        returns their refs, and the driver queues them on each worker
        (`rlshell.workers.rollout.RolloutWorker.apply_sync`), which applies them between two
        requests. Every rank takes part (the gather is collective); the others return no
        refs. The stats: the bytes and records staged and the seconds it took.
        """
        import ray

        if self.engine is not None:
            raise RuntimeError(
                "stage_weights() sends to rollout workers of their own; this actor's rollout "
                "engine is in its process (sync_model_to_rollout)"
            )
        started = time.perf_counter()
        refs: list[Any] = []
        staged = 0
        with manager.unsharded() as model:
            gathered = self._named(manager, model)
            if self.rank == 0:
                for message in self.sender.messages(gathered.items(), full):
                    staged += message_bytes(message)
                    refs.append(ray.put(message))  # a copy: the gathered tensors are freed
        stats = {"bytes": float(staged), "seconds": time.perf_counter() - started}
        return refs, {**stats, "messages": float(len(refs))} if self.rank == 0 else {}

"""Moving encoded weights: in memory (collocated) or to rollout workers through Ray.

`rlshell.sync.codec` encodes and decodes (pure); this module moves the
records. `WeightSender` lives on the actor: in memory it applies each bucket
or patch to the engine's tensors as soon as it is made; across processes
actor rank 0 puts each record in the Ray object store once and every rollout
worker applies it (`WeightReceiver`) before the next is made, so at most one
record is in flight.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from rlshell.sync.codec import (
    Bucket,
    BucketReceiver,
    FlatBuckets,
    Patch,
    PatchEncoder,
    WeightSyncError,
    apply_patch,
    bucket_bytes_for,
    iter_buckets,
)

__all__ = ["WeightReceiver", "WeightSender", "message_bytes"]


def message_bytes(message: Bucket | Patch) -> int:
    """The weight bytes one record carries, as a receiver counts them applied."""
    if isinstance(message, Bucket):
        return sum(piece.nbytes for piece in message.pieces)
    return message.nbytes


class WeightSender:
    """The actor's side: turns the current weights into buckets or patches and delivers them."""

    def __init__(
        self,
        mode: Literal["bucket", "patch"],
        bucket_size_mb: float,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.mode = mode
        self.bucket_bytes = bucket_bytes_for(bucket_size_mb)
        self.dtype = dtype
        self.encoder = PatchEncoder()

    def _cast(self, named_tensors: Iterable[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
        for name, tensor in named_tensors:
            if self.dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(self.dtype)
            yield name, tensor

    def messages(
        self,
        named_tensors: Iterable[tuple[str, Tensor]],
        full: bool,
        into: FlatBuckets | None = None,
    ) -> Iterator[Bucket | Patch]:
        """The records of one sync, made lazily (one full tensor and one record at a time).

        Floating-point tensors are cast to the engine's ``dtype`` (buckets: as
        they are packed). ``into``: buckets are packed straight into the
        in-memory receiver's weights (see `rlshell.sync.codec.FlatBuckets`).
        """
        if self.mode == "bucket":
            yield from iter_buckets(named_tensors, self.bucket_bytes, dtype=self.dtype, into=into)
            return
        named_tensors = self._cast(named_tensors)
        if full:
            self.encoder.reset()
        yield from self.encoder.iter_patches(named_tensors, self.bucket_bytes)

    def send_in_memory(
        self,
        named_tensors: Iterable[tuple[str, Tensor]],
        targets: Mapping[str, Tensor],
        full: bool,
        flat: FlatBuckets | None = None,
    ) -> dict[str, float]:
        """Apply one sync to ``targets`` (the collocated engine's tensors) in this process.

        ``flat``: the targets' `FlatBuckets`, so that a bucket sync writes
        each byte once, straight into them (ignored by ``patch``).
        """
        receiver = WeightReceiver(targets, flat if self.mode == "bucket" else None)
        start = time.perf_counter()
        count = 0
        for message in self.messages(named_tensors, full, into=flat):
            receiver.receive(message)
            count += 1
        stats = receiver.finish(full or self.mode == "bucket")
        stats.update(seconds=time.perf_counter() - start, messages=float(count))
        return stats

    def send_to_workers(
        self, named_tensors: Iterable[tuple[str, Tensor]], handles: Sequence[Any], full: bool
    ) -> dict[str, float]:
        """Deliver one sync to every rollout worker's `receive_weights` via the object store."""
        import ray

        if not handles:
            raise RuntimeError("no rollout workers to send weights to (set_rollout_handles)")
        start = time.perf_counter()
        count = 0
        sent = 0
        for message in self.messages(named_tensors, full):
            ref = ray.put(message)
            applied = ray.get([handle.receive_weights.remote(ref) for handle in handles])
            sent += int(applied[0])
            count += 1
        return {"bytes": float(sent), "seconds": time.perf_counter() - start, "messages": count}


class WeightReceiver:
    """The engine's side: applies buckets or patches to its tensors in place.

    ``flat``: the targets' `FlatBuckets`; a bucket packed into it is in
    place already, and the sync is checked by `FlatBuckets.finish`.
    """

    def __init__(self, targets: Mapping[str, Tensor], flat: FlatBuckets | None = None) -> None:
        self.targets = targets
        self.flat = flat
        self.in_place: list[int] = []
        self.buckets = BucketReceiver(targets)
        self.patch_bytes = 0

    def receive(self, message: Bucket | Patch) -> int:
        if isinstance(message, Bucket):
            if self.flat is not None and self.flat.holds(message):
                self.in_place.append(message.index)
                return sum(piece.nbytes for piece in message.pieces)
            return self.buckets.apply(message)
        if isinstance(message, Patch):
            applied = apply_patch(self.targets, message)
            self.patch_bytes += applied
            return applied
        raise TypeError(f"expected a weight Bucket or Patch, got {type(message).__name__}")

    def finish(self, check_coverage: bool) -> dict[str, float]:
        """End a sync; a bucket (or full) sync must have covered every tensor exactly once."""
        if self.in_place:
            assert self.flat is not None
            if self.buckets.bytes_applied or self.patch_bytes:
                raise WeightSyncError(
                    "a sync mixed buckets packed in place with others; send all of one kind"
                )
            received = self.flat.finish(self.in_place, self.targets)
            self.in_place = []
            return {"bytes": float(received)}
        received = self.buckets.bytes_applied + self.patch_bytes
        if check_coverage and self.buckets.bytes_applied:
            self.buckets.finish()
        else:
            self.buckets = BucketReceiver(self.targets)
        self.patch_bytes = 0
        return {"bytes": float(received)}

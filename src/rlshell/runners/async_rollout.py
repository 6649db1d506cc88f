"""Rollouts ahead of the update, at most ``algorithm.max_staleness`` versions behind it.

``runner.mode='async'`` (the reasoning runner, its rollout in workers of
its own). The actor's *version* is the number of updates its weights have
had: step s trains version s − 1 into version s. `AsyncRollouts` keeps the
rollout workers ``K = max_staleness`` steps ahead: when step s takes its
batch, the rollouts of steps s+1 … s+K are already queued on the workers, so
they generate while the actor updates. After its update the actor's new
weights are queued on every rollout worker behind those requests
(`rlshell.workers.actor.ActorWorker.stage_weights`,
`rlshell.workers.rollout.RolloutWorker.apply_sync`): a worker switches
versions between two requests, never during one, and neither side waits for
the other. Each worker tags what it generates with the version it held.

Why the bound holds: a worker applies requests and syncs in the order they
were queued. The rollout of step s is queued at the start of step s − K,
after the sync of version s − K − 1 (queued at the end of step s − K − 1),
so it is sampled by version s − K − 1 or later, and step s trains version
s − 1: a lag of at most K. `AsyncRollouts.take` checks every batch's tags
against the bound and raises `StalenessError` on a breach. With K = 0 each
rollout is queued after the previous update's sync: the synchronous loop,
to the bit.

What has been generated is never lost by a checkpoint: `AsyncRollouts.drain`
waits for the queued rollouts, and the trainer saves them beside the
weights; after a resume they are trained on first, each once, with their
original tags.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import torch
from attrs import define

from rlshell.cluster.errors import WorkerError
from rlshell.data import PromptExample
from rlshell.workers.rollout import RolloutResult

__all__ = [
    "AsyncRollouts",
    "RolloutTicket",
    "Slot",
    "StalenessError",
    "lag_metrics",
    "load_queue",
    "save_queue",
]


class StalenessError(RuntimeError):
    """A batch older than ``algorithm.max_staleness`` versions (a bug if it ever happens)."""


class RolloutTicket(Protocol):
    """Rollout requests in flight on the workers."""

    def done(self) -> bool:
        """Whether every request has finished; never blocks."""
        ...

    def wait(self) -> list[RolloutResult]:
        """Every worker's result, in the order the requests were made."""
        ...


@define
class Slot:
    """The rollout of one step: its prompts, how many went to each worker (in the order of
    the results), and the requests in flight or their results."""

    step: int
    prompts: list[PromptExample]
    counts: list[int]
    ticket: RolloutTicket | None = None
    results: list[RolloutResult] | None = None

    def ready(self) -> bool:
        return self.results is not None or (self.ticket is not None and self.ticket.done())

    def collect(self) -> list[RolloutResult]:
        if self.results is None:
            if self.ticket is None:
                raise RuntimeError(f"the rollout of step {self.step} was never submitted")
            self.results = self.ticket.wait()
            self.ticket = None
        return self.results


def save_queue(slots: Sequence[Slot], path: Path) -> None:
    """The rollouts generated ahead of a checkpoint's step (`AsyncRollouts.drain`), to ``path``."""
    if any(slot.ticket is not None for slot in slots):
        raise ValueError("save_queue: a slot still has requests in flight; drain the queue first")
    torch.save(list(slots), path)


def load_queue(path: Path) -> list[Slot]:
    """What `save_queue` wrote, read without running code from the file: tensors, plain data
    and the queue's own record classes only (``torch.load(weights_only=True)`` with them
    allowed); anything else in it raises ``pickle.UnpicklingError``."""
    from rlshell.rollout import RolloutBatch

    with torch.serialization.safe_globals([Slot, PromptExample, RolloutResult, RolloutBatch]):
        slots: list[Slot] = torch.load(path, weights_only=True)
    return slots


class AsyncRollouts:
    """The queue of rollouts submitted ahead of the update.

    ``submit(step)`` draws a step's prompts and queues its rollout on the
    workers (it must not wait for them). `take` returns step s's slot,
    waiting for its results, after queueing every rollout up to step s + K.
    """

    def __init__(
        self,
        max_staleness: int,
        submit: Callable[[int], Slot],
        resubmit: Callable[[Slot], RolloutTicket],
    ) -> None:
        if max_staleness < 0:
            raise ValueError(f"algorithm.max_staleness must be >= 0, got {max_staleness}")
        self.max_staleness = max_staleness
        self._submit = submit
        self._resubmit = resubmit
        self.slots: deque[Slot] = deque()
        self.submitted_through = 0  # the last step whose rollout is queued or held

    def start_at(self, step: int, restored: Sequence[Slot] = ()) -> None:
        """Continue from ``step`` (the last step trained), with ``restored`` rollouts (steps
        step+1, step+2, … in order: a checkpoint's queue) first."""
        if self.slots:
            raise RuntimeError("start_at() with rollouts still queued")
        expected = list(range(step + 1, step + 1 + len(restored)))
        if [slot.step for slot in restored] != expected:
            raise ValueError(
                f"the restored rollouts are of steps {[slot.step for slot in restored]}, "
                f"expected {expected} after step {step}"
            )
        self.slots.extend(restored)
        self.submitted_through = step + len(restored)

    def take(self, step: int, version: int) -> tuple[Slot, dict[str, float]]:
        """Step ``step``'s rollout (results collected) and what the queue looked like;
        ``version``: the actor's, which this step trains (``step`` − 1, unless updates were
        skipped, as in a critic's warm-up)."""
        for slot in self.slots:  # restored without results: queued again first, in order
            if slot.results is None and slot.ticket is None:
                slot.ticket = self._resubmit(slot)
        while self.submitted_through < step + self.max_staleness:
            self.submitted_through += 1
            slot = self._submit(self.submitted_through)
            if slot.step != self.submitted_through:
                raise RuntimeError(f"submit({self.submitted_through}) returned step {slot.step}")
            self.slots.append(slot)
        if not self.slots or self.slots[0].step != step:
            queued = [slot.step for slot in self.slots]
            raise RuntimeError(f"step {step} asked for its rollout; the queue holds {queued}")
        ready = sum(slot.ready() for slot in self.slots)
        slot = self.slots[0]
        started = time.perf_counter()
        results = slot.collect()  # (a failure leaves the slot queued: a checkpoint keeps it)
        self.slots.popleft()
        metrics = {
            "async/queue_ready": float(ready),
            "async/queue_length": float(len(self.slots) + 1),
            "async/wait_s": time.perf_counter() - started,
            **lag_metrics(results, version=version, max_staleness=self.max_staleness),
        }
        return slot, metrics

    def drain(self, keep_failed: bool = False) -> list[Slot]:
        """Wait for every queued rollout; the slots, collected, still queued (a checkpoint
        saves them). ``keep_failed``: a slot whose requests failed (a rollout worker died)
        keeps its prompts without results, and is queued again after a resume."""
        for slot in self.slots:
            try:
                slot.collect()
            except WorkerError:
                if not keep_failed:
                    raise
                slot.ticket = None
        return list(self.slots)


def lag_metrics(
    results: Sequence[RolloutResult], version: int, max_staleness: int
) -> dict[str, float]:
    """How far behind ``version`` (the weights being trained) each result's sampler was.

    Raises `StalenessError` when a result is more than ``max_staleness``
    versions behind, or ahead of ``version``. The metrics: the lag's mean
    and max over rows, the fraction of rows and of response tokens at each
    lag 0 … ``max_staleness``, and the generation's span (the workers' busy
    and idle seconds, their first start and last end).
    """
    lags = [version - result.version for result in results]
    # Tokens per lag: a result's all at its lag, or each token's (partial rollouts).
    token_lags = [
        torch.full((int(r.batch.response_mask.sum()),), lag)
        if r.token_versions is None
        else version - r.token_versions[r.batch.response_mask]
        for r, lag in zip(results, lags, strict=True)
    ]
    for lag, result, per_token in zip(lags, results, token_lags, strict=True):
        seen = [lag, *per_token.tolist()]
        worst = max(seen) if max(seen) > max_staleness else min(seen)
        if not 0 <= worst <= max_staleness:
            raise StalenessError(
                f"a rollout sampled by version {result.version} reached the update of version "
                f"{version}: {worst} versions behind, algorithm.max_staleness is {max_staleness}"
            )
    rows = [result.batch.rows for result in results]
    every_token = torch.cat(token_lags)
    total_rows, total_tokens = sum(rows), max(1, every_token.numel())
    metrics = {
        "async/staleness_mean": sum(lag * n for lag, n in zip(lags, rows, strict=True))
        / max(1, total_rows),
        "async/staleness_max": float(max(lags)),
    }
    for lag in range(max_staleness + 1):
        metrics[f"async/rows_frac_lag{lag}"] = sum(
            n for got, n in zip(lags, rows, strict=True) if got == lag
        ) / max(1, total_rows)
        metrics[f"async/tokens_frac_lag{lag}"] = int((every_token == lag).sum()) / total_tokens
    metrics["async/rollout_busy_s"] = sum(r.finished - r.started for r in results)
    metrics["async/rollout_idle_s"] = sum(r.idle_before for r in results)
    metrics["async/generate_start"] = min(r.started for r in results)
    metrics["async/generate_end"] = max(r.finished for r in results)
    if any(r.token_versions is not None for r in results):  # rollout.partial_rollouts
        metrics["async/syncs_mid_generation"] = float(sum(len(r.syncs) for r in results))
        metrics["async/requests_interrupted_frac"] = sum(bool(r.syncs) for r in results) / len(
            results
        )
    return metrics

"""`rlshell.runners.async_rollout`: the staleness bound under random delays on both sides.

The rollout workers are simulated by threads that serve their queue in order, as a Ray actor
serves its calls: rollout requests and weight syncs, each taking a delay drawn by
hypothesis. The driver does what `ReasoningTrainer` does in ``runner.mode='async'``: take the
step's rollout, update (a drawn delay), queue the new version's sync on every worker.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlshell.data import PromptExample
from rlshell.rollout import RolloutBatch
from rlshell.runners.async_rollout import AsyncRollouts, Slot, StalenessError, lag_metrics
from rlshell.workers.rollout import RolloutResult

MS = 0.001


def tiny_batch(rows: int, tokens: int) -> RolloutBatch:
    mask = torch.zeros(rows, 3, dtype=torch.bool)
    mask[:, :tokens] = True
    return RolloutBatch(
        prompt_ids=torch.ones(rows, 2, dtype=torch.long),
        prompt_mask=torch.ones(rows, 2, dtype=torch.bool),
        response_ids=torch.ones(rows, 3, dtype=torch.long),
        response_mask=mask,
        logprobs=torch.zeros(rows, 3),
        response_texts=("x",) * rows,
        group_size=1,
    )


class FifoWorker:
    """Serves rollout requests and syncs in the order they were queued, one at a time.

    ``partial`` (``rollout.partial_rollouts``): a sync is offered at once instead of
    queued, and a request takes up what was offered at its start and again halfway (its
    second token is then sampled by the newer version), as `RolloutWorker` does.
    """

    def __init__(self, partial: bool = False) -> None:
        self.version = 0
        self.partial = partial
        self.offered: list[int] = []
        self.lock = threading.Lock()
        self.tasks: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while (task := self.tasks.get()) is not None:
            task()

    def generate(self, rows: int, delay: float) -> Future[RolloutResult]:
        future: Future[RolloutResult] = Future()

        def run() -> None:
            started = time.time()
            if not self.partial:
                time.sleep(delay)
                result = RolloutResult(tiny_batch(rows, 2), self.version, started, time.time(), 0.0)
                future.set_result(result)
                return
            self.take_offers()
            first = self.version
            time.sleep(delay / 2)
            switched = self.take_offers()
            time.sleep(delay / 2)
            tags = torch.tensor([[first, self.version, -1]] * rows)
            syncs = ({"bytes": 0.0},) if switched else ()
            result = RolloutResult(
                tiny_batch(rows, 2), first, started, time.time(), 0.0, tags, syncs
            )
            future.set_result(result)

        self.tasks.put(run)
        return future

    def take_offers(self) -> bool:
        with self.lock:
            offered, self.offered = self.offered, []
        if offered:
            self.version = offered[-1]
        return bool(offered)

    def sync(self, version: int, delay: float) -> None:
        if self.partial:  # offered, acknowledged at once
            with self.lock:
                self.offered.append(version)
            return

        def run() -> None:
            time.sleep(delay)
            self.version = version

        self.tasks.put(run)

    def stop(self) -> None:
        self.tasks.put(None)
        self.thread.join()


class Ticket:
    def __init__(self, futures: list[Future[RolloutResult]]) -> None:
        self.futures = futures

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def wait(self) -> list[RolloutResult]:
        return [f.result(timeout=30) for f in self.futures]


def drive(
    max_staleness: int,
    workers: int,
    gen_ms: list[int],
    update_ms: list[int],
    sync_ms: list[int],
    partial: bool = False,
) -> list[dict[str, float]]:
    """Run ``len(update_ms)`` steps; each step's queue metrics."""
    pool = [FifoWorker(partial) for _ in range(workers)]
    delays = iter(gen_ms * 100)

    def submit(step: int) -> Slot:
        prompts = [PromptExample(f"{step}", str(step))]
        futures = [w.generate(1, next(delays) * MS) for w in pool]
        return Slot(step, prompts, [1] * workers, Ticket(futures))

    rollouts = AsyncRollouts(max_staleness, submit, resubmit=unexpected)
    version, seen = 0, []
    try:
        for step, (update, sync) in enumerate(zip(update_ms, sync_ms, strict=True), start=1):
            slot, metrics = rollouts.take(step, version)
            assert slot.step == step
            assert slot.prompts[0].prompt == f"{step}"
            seen.append(metrics)
            time.sleep(update * MS)  # the update
            version = step
            for worker in pool:
                worker.sync(version, sync * MS)
    finally:
        for worker in pool:
            worker.stop()
    return seen


def unexpected(slot: Slot) -> Ticket:
    raise AssertionError(f"step {slot.step} was queued again")


delays = st.lists(st.integers(0, 4), min_size=1, max_size=6)


@settings(max_examples=30, deadline=None)
@given(
    max_staleness=st.integers(0, 3),
    workers=st.integers(1, 3),
    gen_ms=delays,
    update_ms=st.lists(st.integers(0, 4), min_size=6, max_size=6),
    sync_ms=st.lists(st.integers(0, 2), min_size=6, max_size=6),
    partial=st.booleans(),
)
def test_no_batch_is_ever_older_than_the_bound_whatever_the_delays(
    max_staleness: int,
    workers: int,
    gen_ms: list[int],
    update_ms: list[int],
    sync_ms: list[int],
    partial: bool,
) -> None:
    steps = drive(max_staleness, workers, gen_ms, update_ms, sync_ms, partial)
    for step, metrics in enumerate(steps, start=1):
        assert 0 <= metrics["async/staleness_max"] <= max_staleness
        # The first K steps' rollouts were all queued before any sync: sampled by version 0.
        if step <= max_staleness + 1 and not partial:
            assert metrics["async/staleness_max"] == step - 1
        for unit in ("rows", "tokens"):
            lags = range(max_staleness + 1)
            total = sum(metrics[f"async/{unit}_frac_lag{lag}"] for lag in lags)
            assert total == pytest.approx(1.0)
        assert metrics["async/queue_length"] == max_staleness + 1
        if partial:  # no token is older than its row's first
            assert metrics["async/requests_interrupted_frac"] <= 1.0
            assert metrics["async/tokens_frac_lag0"] >= metrics["async/rows_frac_lag0"]


def test_partial_rollouts_take_new_weights_mid_request_and_stay_within_the_bound() -> None:
    # Generation (200 ms) outlasts the update (5 ms): every request after the first steps
    # is interrupted by the sync made while it ran, its second token one version newer.
    steps = drive(1, 1, [200], [5] * 5, [0] * 5, partial=True)
    later = steps[2:]
    assert all(m["async/requests_interrupted_frac"] == 1.0 for m in later)
    assert all(m["async/tokens_frac_lag0"] == 0.5 for m in later)
    assert all(m["async/staleness_max"] == 1.0 for m in later)


def test_with_a_bound_of_0_every_batch_is_sampled_by_the_weights_it_trains() -> None:
    steps = drive(0, 2, [3, 0, 1], [2] * 5, [1] * 5)
    assert [m["async/staleness_max"] for m in steps] == [0.0] * 5


def test_a_breach_of_the_bound_is_an_error_naming_both_versions() -> None:
    late = RolloutResult(tiny_batch(2, 1), version=3, started=0.0, finished=1.0, idle_before=0.0)
    with pytest.raises(
        StalenessError, match="sampled by version 3 reached the update of version 6"
    ):
        lag_metrics([late], version=6, max_staleness=2)
    with pytest.raises(StalenessError, match="-1 versions behind"):
        lag_metrics([late], version=2, max_staleness=2)  # from the future: a bookkeeping bug


def test_a_token_older_than_the_bound_is_a_breach_even_when_its_row_started_fresh() -> None:
    tags = torch.tensor([[5, 2, -1]])  # impossible (versions only grow): a bookkeeping bug
    odd = RolloutResult(tiny_batch(1, 2), 5, 0.0, 1.0, 0.0, tags, ({},))
    with pytest.raises(StalenessError, match="3 versions behind"):
        lag_metrics([odd], version=5, max_staleness=2)


def test_lag_metrics_count_each_tokens_version_with_partial_rollouts() -> None:
    mixed = RolloutResult(
        tiny_batch(2, 2), 3, 0.0, 1.0, 0.0, torch.tensor([[3, 4, -1], [3, 4, -1]]), ({},)
    )
    whole = RolloutResult(tiny_batch(1, 2), 4, 0.0, 1.0, 0.0, torch.tensor([[4, 4, -1]]))
    metrics = lag_metrics([mixed, whole], version=4, max_staleness=1)
    assert metrics["async/rows_frac_lag1"] == pytest.approx(2 / 3)  # rows: their first token's
    assert metrics["async/tokens_frac_lag1"] == pytest.approx(2 / 6)
    assert metrics["async/syncs_mid_generation"] == 1.0
    assert metrics["async/requests_interrupted_frac"] == 0.5


def test_lag_metrics_weigh_rows_and_tokens() -> None:
    fresh = RolloutResult(tiny_batch(3, 1), version=4, started=0.0, finished=2.0, idle_before=0.5)
    stale = RolloutResult(tiny_batch(1, 3), version=3, started=1.0, finished=4.0, idle_before=0.0)
    metrics = lag_metrics([fresh, stale], version=4, max_staleness=1)
    assert metrics["async/rows_frac_lag0"] == 0.75
    assert metrics["async/tokens_frac_lag1"] == 0.5  # 3 of 6 tokens
    assert metrics["async/staleness_mean"] == 0.25
    assert metrics["async/rollout_busy_s"] == 5.0
    assert metrics["async/rollout_idle_s"] == 0.5
    assert (metrics["async/generate_start"], metrics["async/generate_end"]) == (0.0, 4.0)


def test_restored_rollouts_are_taken_first_and_must_follow_the_checkpoints_step() -> None:
    order: list[str] = []

    def submit(step: int) -> Slot:
        order.append(f"submit {step}")
        result = RolloutResult(tiny_batch(1, 1), step - 1, 0.0, 0.0, 0.0)
        return Slot(step, [PromptExample("p", "a")], [1], results=[result])

    def resubmit(slot: Slot) -> Ticket:
        order.append(f"again {slot.step} {slot.prompts[0].prompt}")
        future: Future[RolloutResult] = Future()
        future.set_result(RolloutResult(tiny_batch(1, 1), 4, 0.0, 0.0, 0.0))
        return Ticket([future])

    done = RolloutResult(tiny_batch(1, 1), 4, 0.0, 0.0, 0.0)
    restored = [
        Slot(5, [PromptExample("q5", "a")], [1], results=[done]),
        Slot(6, [PromptExample("q6", "a")], [1]),  # its worker died: prompts only
    ]
    rollouts = AsyncRollouts(2, submit, resubmit)
    rollouts.start_at(4, restored)
    slot, _ = rollouts.take(5, version=4)
    assert slot is restored[0]
    # Step 6's prompts are queued again before step 7's are drawn.
    assert order == ["again 6 q6", "submit 7"]
    slot, metrics = rollouts.take(6, version=5)
    assert slot.prompts[0].prompt == "q6"
    assert metrics["async/staleness_max"] == 1.0
    with pytest.raises(ValueError, match=r"of steps \[7\], expected \[5\] after step 4"):
        AsyncRollouts(1, submit, resubmit).start_at(4, [Slot(7, [], [1])])


class DeadTicket:
    def done(self) -> bool:
        return True

    def wait(self) -> list[RolloutResult]:
        from rlshell.cluster.errors import WorkerDiedError, WorkerFailure

        raise WorkerDiedError("rollout rank 0 died", WorkerFailure(component="rollout", rank=0))


def test_a_failed_rollout_stays_queued_and_a_salvaging_drain_keeps_its_prompts() -> None:
    slots = iter([Slot(1, [PromptExample("p1", "a")], [1], DeadTicket())])
    rollouts = AsyncRollouts(0, lambda step: next(slots), resubmit=unexpected)
    from rlshell.cluster.errors import WorkerDiedError

    with pytest.raises(WorkerDiedError):
        rollouts.take(1, version=0)
    assert [slot.step for slot in rollouts.slots] == [1]  # not lost with the failure
    with pytest.raises(WorkerDiedError):
        rollouts.drain()
    (kept,) = rollouts.drain(keep_failed=True)
    assert (kept.step, kept.results, kept.ticket) == (1, None, None)
    assert kept.prompts[0].prompt == "p1"

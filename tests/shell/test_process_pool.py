"""The process pool the reward pool and the tool sandbox share (`rlshell.process_pool`):
answers, lost calls (time-outs, deaths, messages out of protocol), start-up failures, and
the attack it stops: a process that sends a pickle where the pool expects JSON."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

from rlshell.process_pool import ProcessPool, ProtocolError, Starter
from tests.shell.pool_servers import server


class PoolTestError(RuntimeError):
    pass


class Doubling:
    """Calls i = 0..n-1 ask for 2 i; answers and losses recorded."""

    def __init__(self, n: int) -> None:
        self.answers: dict[int, Any] = {}
        self.lost_calls: dict[int, tuple[str, bool]] = {}
        self.n = n

    def request(self, indices: list[int]) -> list[Any]:
        return ["double", indices]

    def answered(self, index: int, answer: list[Any]) -> None:
        if len(answer) != 1 or not isinstance(answer[0], int):
            raise ProtocolError(f"call {index}: {answer!r}")
        self.answers[index] = answer[0]

    def lost(self, index: int, reason: str, *, timed_out: bool, seconds: float) -> None:
        self.lost_calls[index] = (reason, timed_out)


def pool_of(
    behaviour: str, marker: Path, count: int = 2, timeout_s: float = 2.0, **kwargs: Any
) -> ProcessPool:
    starter = Starter(
        context=multiprocessing.get_context("spawn"),
        target=server,
        args=(behaviour, str(marker)),
        name="pool-test",
        label="test process",
    )
    return ProcessPool(
        starter, count, timeout_s=timeout_s, owner="test pool", error=PoolTestError, **kwargs
    )


@pytest.mark.parametrize("max_chunk", [1, 4])
def test_every_call_is_answered_in_order(tmp_path: Path, max_chunk: int) -> None:
    pool = pool_of("plain", tmp_path / "marker")
    try:
        batch = Doubling(40)
        pool.run(batch, range(40), max_chunk=max_chunk)
        assert batch.answers == {i: 2 * i for i in range(40)}
        assert batch.lost_calls == {}
    finally:
        pool.close()
    assert pool.closed
    with pytest.raises(RuntimeError, match="this test pool is closed"):
        pool.run(Doubling(1), [0])


def test_a_forged_pickle_is_never_loaded_and_loses_only_its_call(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    pool = pool_of("pickle", marker)
    try:
        first = pool.pids
        batch = Doubling(12)
        pool.run(batch, range(12), max_chunk=4)
        assert not marker.exists()  # the payload did not run in this process
        reason, timed_out = batch.lost_calls[7]
        assert "test process (pid" in reason
        assert "broke the protocol" in reason
        assert "not JSON" in reason
        assert not timed_out
        assert batch.answers == {i: 2 * i for i in range(12) if i != 7}
        assert pool.pids != first
        assert len(pool.pids) == 2
    finally:
        pool.close()


@pytest.mark.parametrize(
    ("behaviour", "said", "timed_out"),
    [
        ("shape", "broke the protocol: call 7", False),
        ("exit", "exited with code 3", False),
        ("hang", "timed out after 1 s", True),
        ("huge", "broke its connection (bad message length) and was killed", False),
    ],
)
def test_a_call_that_gets_no_answer_is_lost_and_the_rest_answered(
    tmp_path: Path, behaviour: str, said: str, timed_out: bool
) -> None:
    pool = pool_of(behaviour, tmp_path / "marker", timeout_s=1.0)
    try:
        batch = Doubling(12)
        started = time.monotonic()
        pool.run(batch, range(12), max_chunk=4)
        assert time.monotonic() - started < 30
        assert set(batch.lost_calls) == {7}
        reason, lost_by_time = batch.lost_calls[7]
        assert said in reason
        assert lost_by_time == timed_out
        assert batch.answers == {i: 2 * i for i in range(12) if i != 7}
    finally:
        pool.close()


def test_a_grace_is_added_to_the_deadline_and_named(tmp_path: Path) -> None:
    pool = pool_of("hang", tmp_path / "marker", count=1, timeout_s=0.5, grace_s=0.5)
    try:
        batch = Doubling(8)
        pool.run(batch, range(8))
        reason, timed_out = batch.lost_calls[7]
        assert timed_out
        assert reason == "test process did not answer within 0.5 s + 0.5 s and was killed"
    finally:
        pool.close()


def test_a_process_that_cannot_start_raises_the_owners_error(tmp_path: Path) -> None:
    with pytest.raises(
        PoolTestError,
        match=r"test process \(pid \d+\) for test pool failed to start: no such tool: nope",
    ):
        pool_of("fail_start", tmp_path / "marker")
    with pytest.raises(PoolTestError, match="for test pool did not start within 1 s"):
        pool_of("never_ready", tmp_path / "marker", count=1, start_timeout_s=1.0)


def test_a_pool_needs_a_process() -> None:
    with pytest.raises(ValueError, match="count: expected a positive integer, got 0"):
        pool_of("plain", Path("unused"), count=0)

"""RLinf's worker calls: ``log_info`` / ``log_warning`` / ``log_error`` and ``set_global_step``.

The lines a real Ray worker logs are read where the run logs: the driver's
console, to which Ray forwards every worker's stderr. The worker classes live
at module level so Ray workers can import them by name.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from rlshell.cluster.placement import ComponentPlan
from rlshell.cluster.ray_cluster import Cluster
from rlshell.cluster.worker import Worker, show_every_worker_line
from rlshell.runners.loop import announce_step

PlanFactory = Callable[..., ComponentPlan]


class TalkingWorker(Worker):
    def say(self, message: str) -> int | None:
        self.log_info(f"{message} (info)")
        self.log_warning(f"{message} (warning)")
        self.log_error(f"{message} (error)")
        return self.current_step


def test_a_line_names_the_level_worker_rank_and_step(capsys: pytest.CaptureFixture[str]) -> None:
    worker = TalkingWorker()  # outside Ray: rank 0 of 1, no component
    assert worker.say("before") is None
    worker.set_global_step(12)
    assert worker.say("during") == 12
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 6
    stamp = r"\d\d:\d\d:\d\d"
    assert re.fullmatch(rf"\[INFO {stamp} TalkingWorker rank 0\] before \(info\)", lines[0])
    assert re.fullmatch(rf"\[WARNING {stamp} TalkingWorker rank 0\] before \(warning\)", lines[1])
    assert re.fullmatch(
        rf"\[ERROR {stamp} TalkingWorker rank 0 step 12\] during \(error\)", lines[5]
    )


def _wait_for(capfd: pytest.CaptureFixture[str], wanted: list[str], within_s: float) -> str:
    """The driver's output once every pattern of ``wanted`` is in it (Ray forwards a worker's
    lines a moment after they are written)."""
    seen = ""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        out, err = capfd.readouterr()
        seen += out + err
        if all(re.search(pattern, seen) for pattern in wanted):
            return seen
        time.sleep(0.2)
    missing = [pattern for pattern in wanted if not re.search(pattern, seen)]
    raise AssertionError(f"not in the driver's output after {within_s} s: {missing}\n{seen}")


def test_a_ray_workers_lines_reach_the_drivers_console_with_the_loops_step(
    ray_cluster: Cluster, plan_component: PlanFactory, capfd: pytest.CaptureFixture[str]
) -> None:
    show_every_worker_line()  # as the run loop does first
    plan = plan_component("talker", world_size=2)
    group = TalkingWorker.create_group().launch(ray_cluster, plan)
    try:
        # What the run loop does before step 7: every running group is told, nothing waits.
        pending = announce_step(ray_cluster, 7, [])
        assert any(call.group is group for call in pending)
        assert group.say("hello").wait() == [7, 7]
        seen = _wait_for(
            capfd,
            [
                rf"\[INFO \S+ {plan.name} rank 0 step 7\] hello \(info\)",
                rf"\[WARNING \S+ {plan.name} rank 1 step 7\] hello \(warning\)",
                rf"\[ERROR \S+ {plan.name} rank 1 step 7\] hello \(error\)",
            ],
            within_s=30.0,
        )
        assert "hello (info)" in seen
        # The next step: the last step's calls are collected, the new step announced.
        pending = announce_step(ray_cluster, 8, pending)
        assert group.say("again").wait() == [8, 8]
    finally:
        group.shutdown()


def test_the_loop_announces_nothing_without_a_cluster() -> None:
    # A stand-in trainer's run (tests/shell/test_loop_interrupt.py) passes no cluster.
    stand_in: Any = None
    assert announce_step(stand_in, 3, []) == []

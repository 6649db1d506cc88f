"""Where the suite's time goes, printed at the end of every run and written to a file.

A pytest plugin (``tests/conftest.py`` loads it). Each test's time is its setup, call
and teardown together: a module fixture's work (a run several tests inspect) lands in
the setup of the first test that asks for it, and is counted there. Under xdist the
controlling process receives every worker's reports, so the figures cover the whole
run. At the end it prints the time per file and the slowest tests, and writes both
as JSON (``build/test-times.json``, or where ``RLSTACK_TEST_TIMES`` says), with how
`tests/launcher.py` started the runs of the command-line tools (forked or cold, on the
shared Ray or not, and why) and the shared cluster's Ray workers (forked or cold, and why).

This is a report, not a check: no figure here fails a test.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

LAUNCHES_KEY = "rlstack_launches"
SLOWEST = 20
FILES_SHOWN = 25
ENV_VAR = "RLSTACK_TEST_TIMES"


class SuiteTimes:
    def __init__(self, rootdir: Path) -> None:
        self.rootdir = rootdir
        self.started = time.monotonic()
        self.by_test: dict[str, float] = defaultdict(float)
        self.outcome: dict[str, str] = {}
        # How tests/launcher.py started the runs, from each xdist worker as it finishes.
        self.launches: Counter[str] = Counter()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        self.launches.update(getattr(node, "workeroutput", {}).get(LAUNCHES_KEY, {}))

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.by_test[report.nodeid] += report.duration
        if report.when == "call" or report.outcome != "passed":
            self.outcome[report.nodeid] = report.outcome

    def by_file(self) -> dict[str, tuple[float, int]]:
        files: dict[str, list[float]] = defaultdict(list)
        for nodeid, seconds in self.by_test.items():
            files[nodeid.split("::", 1)[0]].append(seconds)
        ranked = sorted(files.items(), key=lambda item: -sum(item[1]))
        return {path: (sum(times), len(times)) for path, times in ranked}

    @pytest.hookimpl
    def pytest_terminal_summary(
        self, terminalreporter: Any, exitstatus: int, config: pytest.Config
    ) -> None:
        if not self.by_test:
            return
        wall = time.monotonic() - self.started
        total = sum(self.by_test.values())
        files = self.by_file()
        slowest = sorted(self.by_test.items(), key=lambda item: -item[1])[:SLOWEST]
        write = terminalreporter.write_line
        terminalreporter.section("time per file (setup + call + teardown of its tests)")
        for path, (seconds, count) in list(files.items())[:FILES_SHOWN]:
            write(f"{seconds:8.1f} s  {100 * seconds / total:5.1f}%  {path} ({count} tests)")
        if len(files) > FILES_SHOWN:
            others = list(files.values())[FILES_SHOWN:]
            rest = sum(seconds for seconds, _ in others)
            write(f"{rest:8.1f} s  {100 * rest / total:5.1f}%  the other {len(others)} files")
        write(
            f"{total:.1f} s of test time in {wall:.1f} s of wall time "
            f"({len(self.by_test)} tests, {len(files)} files)"
        )
        terminalreporter.section(f"{SLOWEST} slowest tests (setup + call + teardown)")
        for nodeid, seconds in slowest:
            write(f"{seconds:8.1f} s  {nodeid}")
        if not self.launches:  # no xdist workers: this process started the runs
            from tests import launcher

            self.launches.update(launcher.launches())
        if self.launches:
            terminalreporter.section("how runs and Ray workers started (tests/launcher.py)")
            for how, count in self.launches.most_common():
                write(f"{count:8d}  {how}")
        target = Path(os.environ.get(ENV_VAR) or self.rootdir / "build" / "test-times.json")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(
            json.dumps(
                {
                    "wall_s": round(wall, 1),
                    "test_time_s": round(total, 1),
                    "exit_status": int(exitstatus),
                    "launches": dict(self.launches),
                    "files": {
                        path: {"seconds": round(seconds, 2), "tests": count}
                        for path, (seconds, count) in files.items()
                    },
                    "tests": {
                        nodeid: {"seconds": round(seconds, 2), "outcome": self.outcome.get(nodeid)}
                        for nodeid, seconds in sorted(self.by_test.items(), key=lambda i: -i[1])
                    },
                },
                indent=1,
            )
            + "\n"
        )
        write(f"(written to {target})")


def pytest_configure(config: pytest.Config) -> None:
    # The xdist workers report to the controlling process, which sums for all of them.
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(SuiteTimes(config.rootpath), "rlstack-suite-times")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workeroutput"):  # an xdist worker: tell the controller
        from tests import launcher

        session.config.workeroutput[LAUNCHES_KEY] = dict(launcher.launches())

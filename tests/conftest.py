"""Test-wide settings: hypothesis profiles and Ray's environment.

``HYPOTHESIS_PROFILE=ci`` (what ``make test`` uses) keeps the suite fast and
deterministic; ``dev`` runs more examples; ``thorough`` many more.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, settings

# The time per file and the slowest tests, printed after every run (tests/suite_times.py).
pytest_plugins = ["tests.suite_times"]

_COMMON = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile("ci", max_examples=40, derandomize=True, print_blob=True, **_COMMON)
settings.register_profile("dev", max_examples=100, **_COMMON)
settings.register_profile("thorough", max_examples=2000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# One intra-op thread per process: tests run in 2 xdist workers on 2 cores, and
# oversubscribed threads make small torch ops orders of magnitude slower.
torch.set_num_threads(1)

# Ray's token authentication, as in runs: one token for the session, drawn here, so that
# the pytest processes, the runs they start and the clusters they share agree on it, and
# Ray writes none under ~/.ray (rlshell.cluster.ray_cluster._token_auth).
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))

# Runs of the command-line tools forked from a warm interpreter, on one Ray cluster per
# pytest process (tests/launcher.py); imported once the environment above is set.
from tests import launcher  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Long tests (marked ``slow``) first, each group of tests in its order. pytest-xdist
    hands out the ``xdist_group`` groups (largest first), then single tests in this order:
    a minute-long test given out last keeps one worker busy while the other has nothing
    left, and on 2 workers that tail is wall time lost."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session", autouse=True)
def _stop_the_launcher() -> Iterator[None]:
    yield
    launcher.shutdown()


# What earlier tests and imports left in the environment (tests/launcher.py: not the test's),
# noted before any fixture of the test is set up: a module's fixture that starts runs (as
# tests/shell/test_config_reads.py's does) is set up with the first test of the module.
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    launcher.note_test_start()

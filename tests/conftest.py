"""Test-wide settings: hypothesis profiles and Ray's environment.

``HYPOTHESIS_PROFILE=ci`` (what ``make test`` uses) keeps the suite fast and
deterministic; ``dev`` runs more examples; ``thorough`` many more.
"""

from __future__ import annotations

import os
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

# Ray writes an auth token under ~/.ray unless told not to (shared/ENVIRONMENT.md).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# Runs of the command-line tools forked from a warm interpreter, on one Ray cluster per
# pytest process (tests/launcher.py); imported once the environment above is set.
from tests import launcher  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _stop_the_launcher() -> Iterator[None]:
    yield
    launcher.shutdown()


# The environment every test starts in is the session's. Libraries write to os.environ when
# imported or used in this process (importing vllm sets PYTORCH_NVML_BASED_CUDA_CHECK and
# TORCHINDUCTOR_COMPILE_THREADS, building its CPU engine LD_PRELOAD, wandb WANDB_SERVICE):
# left there, they reach every run a later test starts from os.environ, which then differs
# from the run the test means (and cannot be forked warm, tests/launcher.py).
def pytest_collection_finish(session: pytest.Session) -> None:
    """What the test modules' imports wrote to the environment, undone."""
    os.environ.clear()
    os.environ.update(launcher.SESSION_ENV)


@pytest.fixture(autouse=True)
def _own_environment() -> Iterator[None]:
    """What a test (or what it called in this process) wrote to the environment, undone."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)

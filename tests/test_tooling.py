"""The developer tooling: CI entry point and the Makefile's handling of an empty test run."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_make_test() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert "make test" in script
    assert os.access(ROOT / ".ci" / "run", os.X_OK)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
@pytest.mark.skipif(
    not (ROOT / ".venv" / ".installed").exists(), reason="needs the .venv made by `make install`"
)
def test_a_run_that_collects_no_tests_fails_instead_of_passing() -> None:
    result = subprocess.run(
        ["make", "-s", "pytest", "PYTEST_ARGS=-p no:cacheprovider -k zz_matches_no_test_zz"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "pytest collected no tests: failing" in result.stderr

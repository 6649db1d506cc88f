"""The developer tooling: CI entry point and the Makefile's handling of an empty test run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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
        # One file to collect from (the whole suite would import every test module first).
        [
            "make",
            "-s",
            "pytest",
            "PYTEST_ARGS=-p no:cacheprovider -k zz_matches_no_test_zz tests/test_tooling.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "pytest collected no tests: failing" in result.stderr


GROUPED = """
import json
import os
from pathlib import Path

import pytest

OUT = Path(os.environ["GROUP_PROBE_OUT"])


@pytest.mark.xdist_group("probe")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    (OUT / f"grouped-{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])


@pytest.mark.parametrize("i", range(6))
def test_free(i):
    pass
"""


def test_xdist_groups_hold_under_the_makefiles_pytest_args(tmp_path: Path) -> None:
    """`make test` runs ``-n 2 --dist loadgroup``: tests of one ``xdist_group`` share a worker.

    pytest 9.2.0 broke this silently (pytest-xdist#1386: the group suffix xdist writes into the
    node id no longer takes), so grouped module fixtures ran on both workers, twice; the
    constraints pin a pytest with which it holds.
    """
    probe = tmp_path / "test_group_probe.py"
    probe.write_text(GROUPED)
    makefile = (ROOT / "Makefile").read_text()
    assert "PYTEST_ARGS ?= -n 2 --dist loadgroup" in makefile
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-q",
            str(probe),
            "--rootdir",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env={**os.environ, "GROUP_PROBE_OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:]
    workers = {path.read_text() for path in tmp_path.glob("grouped-*")}
    assert len(list(tmp_path.glob("grouped-*"))) == 6
    assert len(workers) == 1, f"one xdist_group ran on {sorted(workers)}"


@pytest.mark.slow
def test_the_suite_profile_splits_a_real_run_by_process_kind_and_activity(tmp_path: Path) -> None:
    """``tests/profile_suite.py`` on a test of `tests/test_launcher.py`: the pytest process
    and the zygote import the stack (the probe counts it), the split adds up to the CPU the
    sampling saw, and the probe is gone afterwards."""
    out = tmp_path / "profile.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "profile_suite.py"),
            "--out",
            str(out),
            "-p",
            "no:cacheprovider",
            "-q",
            "tests/test_launcher.py::test_a_forked_run_has_the_exit_status_streams_and_arguments_of_a_fresh_one",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["pytest_exit_status"] == 0
    by_kind = report["by_kind"]
    pytest_row = by_kind["pytest (tests in their own process)"]
    assert pytest_row["processes"] == 1
    assert pytest_row["imports_s"] > 0.5
    # The zygote, which imports the drivers' modules once (its forked run lives ~0.1 s: the
    # sampling may not see it).
    assert by_kind["other python (snippets, tools)"]["imports_s"] > 0.5
    split = sum(part["cpu_s"] for part in report["where"].values())
    assert split == pytest.approx(report["cpu_s"]["sampled"], abs=0.3)
    # The probe left the interpreter's site-packages as it found it.
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    assert not list(site.glob("_rlstack_suite_probe*"))

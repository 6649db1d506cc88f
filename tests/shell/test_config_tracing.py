"""The config-read tracer (`rlshell.config.tracing`): what it records, what it leaves out.

Each test that installs it does so in a fresh interpreter: installing
replaces the config classes' field descriptors for the whole process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import pytest

from rlshell.cluster.placement import ComponentPlan, WorkerPlacement
from rlshell.config import TRACE_ENV_VAR, Config, PlacementEntry, all_key_paths
from rlshell.config.tracing import installed, key_paths_of_fields, read_keys

ROOT = Path(__file__).resolve().parents[2]


def run_traced(code: str, reads: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter with the tracer writing to ``reads``."""
    env = {**os.environ, TRACE_ENV_VAR: str(reads)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_it_is_not_installed_unless_asked_for() -> None:
    assert TRACE_ENV_VAR not in os.environ
    assert not installed()
    assert type(Config.__dict__["actor"]).__name__ == "member_descriptor"


def test_every_field_has_the_key_path_its_reads_stand_for() -> None:
    paths = key_paths_of_fields()
    assert set(paths.values()) == set(all_key_paths())
    assert paths[(Config, "actor")] == "actor"
    assert paths[(type(Config().actor.optim), "lr")] == "actor.optim.lr"
    # A placement entry lives in a dict: its fields stand for the dict's key.
    for field in attrs.fields(PlacementEntry):
        assert paths[(PlacementEntry, field.name)] == "cluster.component_placement"


def test_reads_by_the_run_are_recorded_once_per_process_with_where(tmp_path: Path) -> None:
    reads = tmp_path / "reads"
    result = run_traced(
        """
        from rlshell.config import Config, PlacementEntry
        config = Config()
        for _ in range(3):
            config.actor.optim.lr
        entry = PlacementEntry("0-1", node_group="a")
        entry.node_group
        """,
        reads,
    )
    assert result.returncode == 0, result.stderr
    (keys_file,) = reads.glob("*.keys")
    lines = keys_file.read_text().splitlines()
    keys = [line.split("\t")[0] for line in lines]
    assert keys == ["actor", "actor.optim", "actor.optim.lr", "cluster.component_placement"]
    assert all(line.split("\t")[1].startswith("<string>:") for line in lines)
    assert read_keys(reads) == set(keys)


def test_copies_pickles_comparisons_json_and_validation_are_not_reads(tmp_path: Path) -> None:
    reads = tmp_path / "reads"
    result = run_traced(
        """
        import copy, pickle
        from attrs import evolve
        from rlshell.config import Config, config_from_dict, config_to_dict, write_config
        from rlshell.runners.validation import load_config, validate
        from pathlib import Path
        config = load_config("configs/grpo.py", ["algorithm.kl_coef=0.1"])
        pickle.loads(pickle.dumps(config))
        copy.deepcopy(config)
        evolve(config, runner=evolve(config.runner, max_steps=3))
        config == Config()
        hash(repr(config))
        config_from_dict(config_to_dict(config))
        write_config(config, Path(__import__("tempfile").mkdtemp()) / "config.json")
        validate(config, for_run=False)
        """,
        reads,
    )
    assert result.returncode == 0, result.stderr
    # Only what this script itself read: the two sections it handed to evolve.
    assert read_keys(reads) == {"runner"}


def test_a_forked_child_writes_a_file_of_its_own(tmp_path: Path) -> None:
    reads = tmp_path / "reads"
    result = run_traced(
        """
        import os
        from rlshell.config import Config
        config = Config()
        config.runner.seed
        pid = os.fork()
        if pid == 0:
            config.runner.seed
            os._exit(0)
        os.waitpid(pid, 0)
        """,
        reads,
    )
    assert result.returncode == 0, result.stderr
    files = sorted(reads.glob("*.keys"))
    assert len(files) == 2
    for path in files:
        assert {line.split("\t")[0] for line in path.read_text().splitlines()} == {
            "runner",
            "runner.seed",
        }


def test_ray_workers_get_the_tracer_from_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlshell.cluster.ray_cluster import Cluster

    component = ComponentPlan(
        name="actor",
        placement="0",
        node_group="all",
        workers=[WorkerPlacement(0, 0, 0, 1, cpus=1.0, gpus=(), resources=(0,))],
    )
    worker = component.workers[0]
    cluster = Cluster.__new__(Cluster)  # worker_env reads only the cluster's env vars
    cluster.runtime_env_vars = {}
    monkeypatch.setenv(TRACE_ENV_VAR, "/tmp/reads")
    assert cluster.worker_env(component, worker, gpu_node=False)[TRACE_ENV_VAR] == "/tmp/reads"
    monkeypatch.delenv(TRACE_ENV_VAR)
    assert TRACE_ENV_VAR not in cluster.worker_env(component, worker, gpu_node=False)

"""The swanlab backend with the real swanlab package in its offline mode: the experiment's
project, name and config, the steps it receives read back from its local files, a resume that
continues the same experiment, and the error a missing package gives.

SwanLab's offline run file (``run-<id>.swanlab``) is a LevelDB-format log of its protobuf
``Record`` messages; swanlab's own reader and message class read it back.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from attrs import frozen

from rlshell.config import ConfigError
from rlshell.metrics import SWANLAB_RUN_FILE, MetricLogger, read_metrics
from rlshell.runners.validation import load_config
from tests.shell.test_run import cli_env, train


@frozen
class SwanLabRun:
    """What one offline SwanLab run file holds."""

    run_id: str
    project: str
    name: str
    history: dict[str, list[tuple[int, float]]]  # key -> (step, value) in logged order
    config: dict[str, Any]
    finished: bool


def offline_runs(log_dir: Path) -> list[SwanLabRun]:
    """Every run swanlab wrote under ``log_dir``, oldest first."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    runs = []
    for path in sorted(log_dir.glob("run-*/run-*.swanlab")):
        reader = DataStoreReader()
        reader.open(path)
        start: Any = None
        history: dict[str, list[tuple[int, float]]] = {}
        finished = False
        for payload in reader:
            record = Record()
            record.ParseFromString(payload)
            if record.HasField("start"):
                start = record.start
            elif record.HasField("scalar"):
                scalar = record.scalar
                history.setdefault(scalar.key, []).append((scalar.step, scalar.value.number))
            elif record.HasField("finish"):
                finished = True
        assert start is not None, f"{path}: no start record"
        config = yaml.safe_load((path.parent / "files" / "config.yaml").read_text())
        runs.append(
            SwanLabRun(
                run_id=start.id,
                project=start.project,
                name=start.name,
                history=history,
                config={key: entry["value"] for key, entry in config.items()},
                finished=finished,
            )
        )
    return runs


@pytest.fixture
def offline_swanlab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The real swanlab package, offline, its settings kept out of the home directory."""
    pytest.importorskip("swanlab", reason="installed with the swanlab extra (make install)")
    env = {"SWANLAB_MODE": "offline", "SWANLAB_ROOT": str(tmp_path / "swanlab-home")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def log_steps(logger: MetricLogger, steps: range) -> None:
    for step in steps:
        logger.log(step, {"reward/mean": 0.5 * step, "train/loss": -float(step)})


def test_an_offline_experiment_holds_the_project_name_config_and_periodic_steps(
    tmp_path: Path, offline_swanlab: dict[str, str]
) -> None:
    config = {"runner": {"max_steps": 5, "experiment_name": "cartpole"}, "seed": 3}
    with MetricLogger(
        tmp_path,
        ["swanlab", "jsonl"],
        total_steps=5,
        log_every=2,
        swanlab_project="rlstack-test",
        experiment_name="cartpole",
        config=config,
    ) as logger:
        log_steps(logger, range(1, 6))
        logger.log(5, {"eval/accuracy": 0.75})
    (run,) = offline_runs(tmp_path / "swanlab")
    assert (run.project, run.name, run.finished) == ("rlstack-test", "cartpole", True)
    assert run.config == config
    # every log_every-th step and the last one, and the evaluation
    assert run.history == {
        "reward/mean": [(2, 1.0), (4, 2.0), (5, 2.5)],
        "train/loss": [(2, -2.0), (4, -4.0), (5, -5.0)],
        "eval/accuracy": [(5, 0.75)],
    }
    assert [record["step"] for record in read_metrics(tmp_path / "metrics.jsonl")] == [
        1,
        2,
        3,
        4,
        5,
        5,
    ]


def test_a_resume_continues_the_experiment_without_the_replayed_steps(
    tmp_path: Path, offline_swanlab: dict[str, str]
) -> None:
    with MetricLogger(tmp_path, ["swanlab"], total_steps=6) as logger:
        log_steps(logger, range(1, 5))
    # The checkpoint was at step 2: steps 3 and 4 are replayed, and swanlab has them.
    with MetricLogger(tmp_path, ["swanlab"], total_steps=6, start_step=2) as logger:
        log_steps(logger, range(3, 7))
    first, second = offline_runs(tmp_path / "swanlab")
    assert second.run_id == first.run_id
    assert [step for step, _ in first.history["train/loss"]] == [1, 2, 3, 4]
    assert [step for step, _ in second.history["train/loss"]] == [5, 6]
    state = (tmp_path / SWANLAB_RUN_FILE).read_text()
    assert f'"id": "{first.run_id}"' in state
    assert '"step": 6' in state


def test_a_damaged_run_file_is_named_on_resume(
    tmp_path: Path, offline_swanlab: dict[str, str]
) -> None:
    (tmp_path / SWANLAB_RUN_FILE).write_text('{"id": 3}')
    with pytest.raises(ValueError, match=r"swanlab_run.json: not a swanlab run record .*delete"):
        MetricLogger(tmp_path, ["swanlab"], total_steps=4, start_step=2)


def test_a_missing_swanlab_names_the_fix_and_touches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "swanlab", None)  # as if not installed
    run_dir = tmp_path / "run"
    with pytest.raises(ModuleNotFoundError) as error:
        MetricLogger(run_dir, ["jsonl", "swanlab"], total_steps=5)
    assert str(error.value) == (
        'logger.backends includes "swanlab" but the swanlab package is not installed: run '
        "`pip install -e '.[swanlab]'` (or `pip install swanlab`), or remove \"swanlab\" from "
        "logger.backends"
    )
    assert not run_dir.exists()
    with pytest.raises(ConfigError) as refused:
        load_config("configs/grpo.py", ['logger.backends=["console","swanlab"]'], for_run=True)
    assert refused.value.problems == [
        "logger.backends: 'swanlab' needs the swanlab package, which is not installed: run "
        "`pip install -e '.[swanlab]'` (or `pip install swanlab`), or remove 'swanlab' from "
        "logger.backends"
    ]


@pytest.fixture
def run_env(offline_swanlab: dict[str, str]) -> Iterator[dict[str, str]]:
    ray_tmp = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))  # Ray's socket paths stay short
    yield cli_env(ray_tmp, **offline_swanlab)
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.slow
def test_a_cartpole_run_logs_its_metrics_and_config_to_swanlab(
    tmp_path: Path, run_env: dict[str, str]
) -> None:
    import json

    done = train(
        "configs/ppo_cartpole.py",
        "runner.max_steps=2",
        "runner.rollout_steps=8",
        "algorithm.ppo_epochs=2",
        'logger.backends=["jsonl","swanlab"]',
        "logger.swanlab_project=rlstack-test",
        f"runner.output_dir={tmp_path}",
        env=run_env,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = [path for path in tmp_path.iterdir() if (path / "config.json").is_file()]
    (run,) = offline_runs(run_dir / "swanlab")
    resolved = json.loads((run_dir / "config.json").read_text())
    assert (run.project, run.name) == ("rlstack-test", resolved["runner"]["experiment_name"])
    assert run.config == resolved
    logged = read_metrics(run_dir / "metrics.jsonl")
    expected: dict[str, list[tuple[int, float]]] = {}
    for record in logged:
        for key, value in record.items():
            if key != "step":
                expected.setdefault(key, []).append((record["step"], value))
    assert run.history.keys() == expected.keys()
    for key, points in expected.items():
        assert [step for step, _ in run.history[key]] == [step for step, _ in points], key
        values = [value for _, value in run.history[key]]
        assert values == pytest.approx([value for _, value in points], rel=1e-12), key


def test_a_swanlab_project_without_the_backend_is_refused_as_unread() -> None:
    with pytest.raises(ConfigError) as refused:
        load_config("configs/grpo.py", ["logger.swanlab_project=rl"])
    assert refused.value.problems == [
        "logger.swanlab_project: names the project of the swanlab backend, and logger.backends "
        "has no 'swanlab'"
    ]
    load_config(
        "configs/grpo.py", ['logger.backends=["console","swanlab"]', "logger.swanlab_project=rl"]
    )

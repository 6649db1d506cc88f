"""The wandb backend in a real GRPO run, offline: its project, name and resolved config, the
metrics the jsonl file has, and a resume that continues the same W&B run."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlshell.metrics import WANDB_RUN_FILE, read_metrics
from tests.shell.test_run import ONE_ACTOR_RANK, cli_env, train
from tests.shell.wandb_records import offline_runs

pytestmark = pytest.mark.slow

RUN = [
    "configs/grpo.py",
    *ONE_ACTOR_RANK,
    "runner.max_steps=3",
    "runner.prompts_per_step=4",
    "runner.eval_interval=0",
    "algorithm.group_size=4",
    "checkpoint.interval=2",
    "checkpoint.keep_last=null",
    "checkpoint.export_hf=false",
    'logger.backends=["jsonl","wandb"]',
    "logger.wandb_project=rlstack-test",
]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    pytest.importorskip("wandb", reason="wandb is installed by `make install`")
    ray_tmp = Path(tempfile.mkdtemp(prefix="rw", dir="/tmp"))  # Ray's socket paths stay short
    home = tmp_path / "wandb-home"
    yield cli_env(
        ray_tmp,
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_CONFIG_DIR=str(home / "config"),
        WANDB_CACHE_DIR=str(home / "cache"),
        WANDB_DATA_DIR=str(home / "data"),
    )
    shutil.rmtree(ray_tmp, ignore_errors=True)


def test_an_offline_run_holds_our_config_and_metrics_and_a_resume_continues_it(
    tmp_path: Path, env: dict[str, str]
) -> None:
    out = f"runner.output_dir={tmp_path}"
    first = train(*RUN, out, env=env, timeout=400)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    run_dir = tmp_path / "grpo"
    (run,) = offline_runs(run_dir)
    assert (run.project, run.name) == ("rlstack-test", "grpo")
    assert run.config == json.loads((run_dir / "config.json").read_text())
    logged = read_metrics(run_dir / "metrics.jsonl")
    assert [row["step"] for row in run.history] == [1, 2, 3]
    for row, record in zip(run.history, logged, strict=True):
        assert row == pytest.approx(record, rel=1e-12)
    assert json.loads((run_dir / WANDB_RUN_FILE).read_text()) == {"id": run.run_id, "step": 3}

    # As if the first attempt had died after logging step 3 but before its checkpoint.
    shutil.rmtree(run_dir / "checkpoints" / "global_step_3")
    resumed = train(*RUN, out, "runner.max_steps=5", "checkpoint.resume=auto", env=env, timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    again, second = offline_runs(run_dir)
    assert again == run
    assert second.run_id == run.run_id
    # Step 3, replayed from the checkpoint of step 2, is in W&B already: only 4 and 5 go.
    assert [row["step"] for row in second.history] == [4, 5]
    assert second.config["runner"]["max_steps"] == 5
    assert [record["step"] for record in read_metrics(run_dir / "metrics.jsonl")] == [1, 2, 3, 4, 5]

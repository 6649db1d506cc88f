"""`python -m rlshell.train configs/sac_*.py` for real: short asynchronous SAC runs on Ray."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest
import torch

from rlshell.metrics import read_metrics
from tests.shell.conftest import TrainHere
from tests.shell.test_export import assert_exported_final_policy
from tests.shell.test_run import cli_env, train

pytestmark = pytest.mark.slow

# 4 envs × 25 steps = 100 transitions a step; chunks 1-3 act at random (learning_starts 256).
SHORT = [
    "configs/sac_pendulum.py",
    "checkpoint.interval=3",
    "algorithm.sac.learning_starts=256",
    "algorithm.sac.batch_size=64",
    "algorithm.sac.utd_ratio=0.1",
    "actor.model.model_kwargs.hidden_sizes=32,32",
]


def test_a_short_sac_run_trains_after_learning_starts_and_resumes_its_replay_buffer(
    tmp_path: Path,
) -> None:
    env = cli_env(Path(tempfile.mkdtemp(prefix="rs", dir="/tmp")))
    out = tmp_path / "runs"
    result = train(*SHORT, "runner.max_steps=6", f"runner.output_dir={out}", env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = out / "sac_pendulum"
    records = read_metrics(run / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["env/total_steps"] for r in records] == [100.0 * k for k in range(1, 7)]
    assert [r["train/replay_size"] for r in records] == [100.0 * k for k in range(1, 7)]
    # No update before 256 transitions; then 0.1 per transition beyond them, carried over.
    updates = [r["train/updates"] for r in records]
    assert updates[:2] == [0.0, 0.0]
    assert sum(updates) == math.floor(0.1 * (600 - 256))
    assert all(u > 0 for u in updates[2:])
    last = records[-1]
    for key in ("train/qf_loss", "train/actor_loss", "train/alpha", "time/update"):
        assert math.isfinite(last.get(key, math.nan)), key
    saved = torch.load(run / "checkpoints" / "global_step_6" / "sac_learner.pt", weights_only=False)
    assert saved["replay"]["size"] == 600
    assert saved["transitions"] == 600
    assert_exported_final_policy(run, "global_step_6")
    # Two more steps from the last checkpoint: the replay buffer comes back with it.
    again = train(
        *SHORT,
        "runner.max_steps=8",
        "checkpoint.resume=auto",
        f"runner.output_dir={out}",
        env=env,
        timeout=300,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resumed from" in again.stdout
    resumed = read_metrics(run / "metrics.jsonl")
    assert [int(r["step"]) for r in resumed][-2:] == [7, 8]
    assert [r["train/replay_size"] for r in resumed][-2:] == [700.0, 800.0]
    assert resumed[-1]["env/total_steps"] == 800.0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            'cluster.component_placement={"actor,rollout,env": "0"}',
            "SAC runs its learner ('actor') in a process of its own",
        ),
        (
            'cluster.component_placement={"actor": "0", "rollout": "0", "env": "0"}',
            "place 'rollout' and 'env' under one key",
        ),
        ("algorithm.sac.learning_starts=10", "algorithm.sac.learning_starts: the first update"),
    ],
)
def test_sac_placements_and_settings_it_cannot_run_are_refused_before_ray(
    tmp_path: Path, override: str, message: str, train_here: TrainHere
) -> None:
    result = train_here(*SHORT, override, f"runner.output_dir={tmp_path}")
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert message in result.stdout + result.stderr


def test_a_short_fetchreach_run_reports_success_from_mujoco(tmp_path: Path) -> None:
    """configs/sac_fetchreach.py shortened: gymnasium-robotics' dict observations and success."""
    env = cli_env(Path(tempfile.mkdtemp(prefix="rs", dir="/tmp")))
    result = train(
        "configs/sac_fetchreach.py",
        "runner.max_steps=3",
        "runner.rollout_steps=50",
        "algorithm.sac.learning_starts=256",
        "algorithm.sac.batch_size=64",
        "algorithm.sac.utd_ratio=0.05",
        "checkpoint.interval=0",
        f"runner.output_dir={tmp_path}",
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = read_metrics(tmp_path / "sac_fetchreach" / "metrics.jsonl")
    assert [r["env/total_steps"] for r in records] == [200.0, 400.0, 600.0]
    # 50-step episodes: every chunk ends one per env, each with a success flag.
    assert all(r["env/episodes"] == 4 and 0 <= r["env/success"] <= 1 for r in records)
    assert records[-1]["train/updates"] > 0

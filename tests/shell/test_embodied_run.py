"""`python -m rlshell.train configs/ppo_cartpole.py` for real: a short PPO run on Ray, resumed."""

from __future__ import annotations

import importlib.util
import math
import tempfile
from pathlib import Path

import pytest

from rlshell.metrics import read_metrics
from tests.shell.conftest import TrainHere
from tests.shell.test_export import assert_exported_final_policy
from tests.shell.test_run import cli_env, train

pytestmark = pytest.mark.slow

SHORT = ["configs/ppo_cartpole.py", "runner.max_steps=4", "checkpoint.interval=2"]


def test_a_short_ppo_run_logs_env_and_train_metrics_and_resumes(tmp_path: Path) -> None:
    env = cli_env(Path(tempfile.mkdtemp(prefix="re", dir="/tmp")))
    out = tmp_path / "runs"
    result = train(*SHORT, f"runner.output_dir={out}", env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = out / "ppo_cartpole"
    records = read_metrics(run / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [1, 2, 3, 4]
    for key in ("train/pg_loss", "train/value_loss", "train/entropy", "train/lr", "env/steps"):
        assert key in records[-1], key
    assert records[-1]["env/total_steps"] == 4 * 8 * 32
    assert any("env/episode_return" in r for r in records)
    assert records[1]["train/lr"] < records[0]["train/lr"]  # rl-zoo's linear decay
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "global_step_2",
        "global_step_4",
    ]
    assert (run / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_exported_final_policy(run, "global_step_4")
    # Two more steps from the last checkpoint, the update and the rollout call compiled: the
    # compiled calls read the weights the checkpoint put in place.
    again = train(
        *SHORT[:1],
        "runner.max_steps=6",
        "checkpoint.interval=2",
        "checkpoint.resume=auto",
        "actor.compile=true",
        "rollout.compile=true",
        f"runner.output_dir={out}",
        env=env,
        timeout=300,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resumed from" in again.stdout
    records = read_metrics(run / "metrics.jsonl")
    assert [int(r["step"]) for r in records][-2:] == [5, 6]
    resumed = records[-2]
    # The schedule goes on from step 4 (over the longer run), not from its start.
    assert 0 < resumed["train/lr"] < records[0]["train/lr"]
    assert all(math.isfinite(r["train/loss"]) for r in records[-2:])
    assert resumed["env/steps"] == 8 * 32


def test_two_components_grouped_apart_from_the_third_are_refused(
    tmp_path: Path, train_here: TrainHere
) -> None:
    placement = '{"actor": "0:0-1", "rollout,env": "0:0-1"}'
    result = train_here(
        *SHORT, f"cluster.component_placement={placement}", f"runner.output_dir={tmp_path}"
    )
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "'rollout,env' groups two of them apart from 'actor'" in result.stdout + result.stderr


def test_a_short_halfcheetah_run_normalises_and_resumes_its_reward_scaler(tmp_path: Path) -> None:
    """configs/ppo_halfcheetah.py shortened: MuJoCo, normalize_obs, norm_reward, resume."""
    env = cli_env(Path(tempfile.mkdtemp(prefix="re", dir="/tmp")))
    out = tmp_path / "runs"
    short = [
        "configs/ppo_halfcheetah.py",
        "runner.rollout_steps=16",
        "algorithm.num_minibatches=4",
        "algorithm.ppo_epochs=2",
        "checkpoint.interval=2",
        f"runner.output_dir={out}",
    ]
    result = train(*short, "runner.max_steps=2", env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    checkpoint = out / "ppo_halfcheetah" / "checkpoints" / "global_step_2"
    assert (checkpoint / "reward_scaler_rank0.pt").is_file()
    again = train(*short, "runner.max_steps=3", "checkpoint.resume=auto", env=env, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    records = read_metrics(out / "ppo_halfcheetah" / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [1, 2, 3]
    assert records[-1]["env/total_steps"] == 3 * 8 * 16
    assert all(r["train/value_loss"] < 1e3 for r in records)  # rewards were scaled


def test_a_flow_policy_acting_in_chunks_trains_counts_env_steps_and_resumes(
    tmp_path: Path,
) -> None:
    """configs/ppo_halfcheetah.py with ``flow_policy`` acting in chunks of 2 actions: each
    policy step is two env steps, in the metrics and after a resume."""
    env = cli_env(Path(tempfile.mkdtemp(prefix="re", dir="/tmp")))
    out = tmp_path / "runs"
    flow = (
        '{"obs_dim": 17, "action_dim": 6, "action_low": -1.0, "action_high": 1.0, '
        '"action_chunk": 2, "num_steps": 3, "hidden_sizes": "32,32", "normalize_obs": true}'
    )
    short = [
        "configs/ppo_halfcheetah.py",
        "actor.model.model_type=flow_policy",
        f"actor.model.model_kwargs={flow}",
        "runner.rollout_steps=16",
        "algorithm.num_minibatches=4",
        "algorithm.ppo_epochs=2",
        "checkpoint.interval=2",
        f"runner.output_dir={out}",
    ]
    result = train(*short, "runner.max_steps=2", env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    again = train(*short, "runner.max_steps=3", "checkpoint.resume=auto", env=env, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    records = read_metrics(out / "ppo_halfcheetah" / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [1, 2, 3]
    # 8 envs × 16 policy steps × 2 actions a window.
    assert [r["env/steps"] for r in records] == [256.0] * 3
    assert records[-1]["env/total_steps"] == 3 * 256
    assert [r["train/samples"] for r in records] == [128.0] * 3  # one per policy step
    assert all(math.isfinite(r["train/pg_loss"]) for r in records)


def test_the_gpu_pushcube_config_plans_here_and_a_real_run_names_what_is_missing(
    tmp_path: Path,
) -> None:
    """configs/ppo_pushcube.py runs ManiSkill's batched GPU simulation; this machine has no GPU
    (configs/ppo_pushcube_cpu.py is the CPU run, tests/shell/test_maniskill.py)."""
    from rlshell.envs.maniskill import maniskill_unavailable_reason

    reason = maniskill_unavailable_reason(uses_gpus=True)
    if reason is None:
        pytest.skip("ManiSkill's GPU simulation can run here: the GPU run applies")
    env = cli_env(Path(tempfile.mkdtemp(prefix="re", dir="/tmp")))
    planned = train(
        "configs/ppo_pushcube.py", "--dry-run", f"runner.output_dir={tmp_path}", env=env
    )
    assert planned.returncode == 0, planned.stdout[-2000:] + planned.stderr[-2000:]
    result = train(
        "configs/ppo_pushcube.py", "runner.max_steps=1", f"runner.output_dir={tmp_path}", env=env
    )
    output = result.stdout + result.stderr
    if importlib.util.find_spec("mani_skill") is None:
        # Validation names the missing packages before anything starts.
        assert result.returncode == 2, output[-2000:]
        assert "'maniskill' needs the mani-skill and sapien packages" in output
    else:
        assert result.returncode != 0
        assert (
            "ManiSkillUnavailableError: env type 'maniskill' (PushCube-v1, GPU simulation) "
            f"cannot run on this machine: {reason}"
        ) in output

"""The embodied sft run for real: demonstrations, behaviour cloning, a checkpoint RL starts from."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from rlshell.api import load_config
from rlshell.config import ConfigError
from rlshell.demonstrations import load_demonstrations, record_demonstrations, save_demonstrations
from rlshell.evaluation.embodied import load_embodied_policy
from rlshell.metrics import read_metrics
from tests import launcher
from tests.shell.test_demonstrations import pendulum_expert, pendulum_stepper
from tests.shell.test_run import cli_env, train

pytestmark = pytest.mark.slow

SFT = "configs/sft_flow_metaworld_reach.py"
PENDULUM_FLOW = {
    "obs_dim": 3,
    "action_dim": 1,
    "action_low": -2.0,
    "action_high": 2.0,
    "action_chunk": 2,
    "num_steps": 4,
    "hidden_sizes": "64,64",
    "normalize_obs": True,
}


def record(path: Path, episodes: int, seed: int) -> Path:
    demos = record_demonstrations(
        pendulum_stepper(num_envs=4, max_steps=20), pendulum_expert, episodes, seed, name="swing"
    )
    return save_demonstrations(demos, path)


def sft_args(tmp_path: Path, *more: str) -> list[str]:
    return [
        SFT,
        f"actor.model.model_kwargs={json.dumps(PENDULUM_FLOW)}",
        f"data.train_path={record(tmp_path / 'train.safetensors', 16, 0)}",
        f"data.val_path={record(tmp_path / 'val.safetensors', 4, 1)}",
        f"runner.output_dir={tmp_path / 'runs'}",
        *more,
    ]


def test_behaviour_cloning_learns_the_expert_and_its_checkpoint_acts_like_it(
    tmp_path: Path,
) -> None:
    env = cli_env(Path(tempfile.mkdtemp(prefix="re", dir="/tmp")))
    args = sft_args(
        tmp_path,
        "runner.max_steps=60",
        "runner.eval_interval=30",
        "runner.prompts_per_step=64",
        "checkpoint.interval=60",
    )
    result = train(*args, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = tmp_path / "runs" / "sft_flow_metaworld_reach"
    records = read_metrics(run / "metrics.jsonl")
    evals = [r for r in records if "eval/action_mse" in r]
    assert [int(r["step"]) for r in evals] == [0, 30, 60]
    # The deterministic actions move toward the expert's on held-out episodes.
    assert evals[-1]["eval/action_mse"] < 0.5 * evals[0]["eval/action_mse"], evals
    losses = [r["train/loss"] for r in records if "train/loss" in r]
    assert sum(losses[-10:]) < 0.5 * sum(losses[:10]), losses
    # The checkpoint is a policy an RL run (actor.model.checkpoint) or an evaluation loads.
    checkpoint = run / "checkpoints" / "global_step_60"
    config = load_config(SFT, args[1:])
    policy = load_embodied_policy(checkpoint, config)
    held_out = load_demonstrations(tmp_path / "val.safetensors")
    obs, expert = held_out.sft_batch(torch.arange(len(held_out)), chunk=2)
    with torch.no_grad():
        acted, _ = policy.predict_action_batch(obs, mode="eval", compute_values=False)
    mse = float(((acted - expert) ** 2).mean())
    assert mse == pytest.approx(evals[-1]["eval/action_mse"], rel=1e-4)


def test_demonstrations_that_do_not_fit_the_policy_stop_the_run_naming_the_file(
    tmp_path: Path,
) -> None:
    wrong = {**PENDULUM_FLOW, "obs_dim": 5}
    args = sft_args(tmp_path, "runner.max_steps=2", "runner.eval_interval=0")
    args[1] = f"actor.model.model_kwargs={json.dumps(wrong)}"
    result = train(*args, env=cli_env(Path(tempfile.mkdtemp(prefix="re", dir="/tmp"))))
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert (
        "train.safetensors (observations states [3]; actions [2, 1]) do not fit flow_policy" in out
    )


def test_an_embodied_sft_config_refuses_what_it_would_not_read() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(SFT, ["data.task=conversations", "algorithm.gamma=0.5", "env.num_envs=8"])
    problems = "\n".join(caught.value.problems)
    assert "data.task: an sft run of an embodied policy" in problems
    assert (
        "algorithm.gamma: the embodied sft run's loss is the policy's own sft_forward" in problems
    )
    assert "env.num_envs: the embodied sft run trains on recorded episodes" in problems


def test_on_metaworld_reach_rl_from_cloned_demonstrations_beats_rl_from_scratch(
    tmp_path: Path,
) -> None:
    """Issue 43's claim at the smallest size that shows it: MetaWorld's scripted reach policy
    recorded, cloned into configs/ppo_flow_metaworld_reach.py's flow policy, then PPO; the
    same PPO from scratch (at its own learning rate, 3e-4) for as many env steps does worse."""
    env = cli_env(Path(tempfile.mkdtemp(prefix="re", dir="/tmp")))
    rl = "configs/ppo_flow_metaworld_reach.py"
    demos = {}
    for split, episodes, seed in (("train", 16, 0), ("val", 4, 1)):
        demos[split] = tmp_path / f"{split}.safetensors"
        command = [sys.executable, "-m", "rlshell.record", rl, "--expert", "metaworld"]
        command += ["--episodes", str(episodes), "--seed", str(seed), "--out", str(demos[split])]
        recorded = launcher.run(command, env=env, timeout=120)
        assert recorded.returncode == 0, recorded.stdout[-2000:] + recorded.stderr[-2000:]
    out = tmp_path / "runs"
    cloned = train(
        SFT,
        f"data.train_path={demos['train']}",
        f"data.val_path={demos['val']}",
        "runner.max_steps=150",
        "runner.eval_interval=150",
        "checkpoint.interval=150",
        f"runner.output_dir={out}",
        env=env,
        timeout=300,
    )
    assert cloned.returncode == 0, cloned.stdout[-3000:] + cloned.stderr[-3000:]
    checkpoint = out / "sft_flow_metaworld_reach" / "checkpoints" / "global_step_150"
    success = {}
    for start, overrides in (
        ("cloned", [f"actor.model.checkpoint={checkpoint}"]),
        ("scratch", ["actor.optim.lr=3e-4"]),
    ):
        run = train(
            rl,
            *overrides,
            "runner.max_steps=8",
            "checkpoint.interval=0",
            f"runner.experiment_name={start}",
            f"runner.output_dir={out}",
            env=env,
            timeout=300,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        records = read_metrics(out / start / "metrics.jsonl")
        assert records[-1]["env/total_steps"] == 8 * 4 * 100  # equal env steps
        values = [r["env/success_once"] for r in records if "env/success_once" in r]
        success[start] = sum(values) / len(values)
    assert success["cloned"] >= success["scratch"] + 0.3, success

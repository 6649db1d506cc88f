"""examples/custom_policy: an extension's own policy and env, trained by the embodied runner on Ray.

The package ``rlshell_point_reach`` registers the model type
``linear_gaussian`` and the env type ``point_reach``; the runner's Ray worker
knows them only through ``RLSHELL_EXT_MODULE``. The quick tests check the two
against their contracts in this process; the slow one trains through
``python -m rlshell.train examples/custom_policy/config.py`` and needs the
return to rise well above a random walk's.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from statistics import mean
from types import ModuleType

import pytest
import torch
from gymnasium.utils.env_checker import check_env

from rlshell.config import EnvConfig
from rlshell.envs.stepper import EnvStepper
from rlshell.metrics import read_metrics
from tests.shell.test_run import ROOT, cli_env, train

EXAMPLE = ROOT / "examples" / "custom_policy"


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    """A short temp dir for the CLI's Ray (socket paths stay under 107 characters)."""
    path = Path(tempfile.mkdtemp(prefix="cp", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def package() -> Iterator[ModuleType]:
    sys.path.insert(0, str(EXAMPLE))
    try:
        import rlshell_point_reach

        yield rlshell_point_reach
    finally:
        sys.path.remove(str(EXAMPLE))


def test_the_env_passes_gymnasiums_checks_and_the_builder_autoresets_in_the_same_step(
    package: ModuleType,
) -> None:
    check_env(package.PointReach(), skip_render_check=True)
    cfg = EnvConfig(env_type="point_reach", env_id="PointReach", num_envs=3, max_episode_steps=4)
    stepper = EnvStepper(package.make_point_reach_env(cfg, 0), cfg.env_id)
    obs = stepper.reset(seed=0)
    assert obs["states"].shape == (3, 4)
    for _ in range(4):
        result = stepper.step(torch.zeros(3, 2))
    assert bool(result.truncated.all())  # nobody moved, nobody arrived: the time limit ends them
    assert not torch.equal(result.next_obs["states"], result.obs["states"])
    metrics = stepper.pop_metrics()
    assert metrics["env/episodes"] == 3.0
    assert metrics["env/success"] == 0.0


def test_the_policy_rescores_its_actions_exactly_after_its_statistics_moved_on(
    package: ModuleType,
) -> None:
    torch.manual_seed(0)
    policy = package.LinearGaussianPolicy(obs_dim=4, action_dim=2)
    states = torch.randn(8, 4) * 3 + 1
    actions, info = policy.predict_action_batch({"states": states}, mode="train")
    assert actions.shape == (8, 2)
    assert float(actions.abs().max()) <= 1.0
    assert float(policy.obs_count) == 8.0
    policy.predict_action_batch({"states": torch.randn(8, 4)}, mode="train")  # stats move on
    out = policy(forward_inputs=info["forward_inputs"])
    torch.testing.assert_close(out["logprobs"], info["prev_logprobs"])
    torch.testing.assert_close(out["values"], info["prev_values"])
    assert out["entropy"].shape == (8,)
    eval_actions, _ = policy.predict_action_batch({"states": states}, mode="eval")
    assert float(policy.obs_count) == 16.0  # eval leaves the statistics alone
    assert torch.equal(eval_actions, policy.predict_action_batch({"states": states}, "eval")[0])
    assert set(policy.state_dict()) >= {"obs_count", "obs_mean", "obs_m2"}  # checkpointed


@pytest.mark.slow
def test_ppo_with_the_examples_policy_and_env_learns_in_ray_workers(
    tmp_path: Path, ray_tmp: Path
) -> None:
    env = cli_env(
        ray_tmp,
        PYTHONPATH=os.pathsep.join([str(EXAMPLE), os.environ.get("PYTHONPATH", "")]),
        RLSHELL_EXT_MODULE="rlshell_point_reach",
    )
    result = train(
        "examples/custom_policy/config.py",
        "runner.max_steps=12",
        f"runner.output_dir={tmp_path}",
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "16 PointReach envs" in result.stdout
    run = tmp_path / "point_reach"
    records = read_metrics(run / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == list(range(1, 13))
    returns = [r["env/episode_return"] for r in records]
    first, last = mean(returns[:3]), mean(returns[-3:])
    # A random walk scores about -20 (20 steps at about one unit from the goal).
    assert first < -14, returns
    assert last > first + 6, returns
    assert mean(r["env/success"] for r in records[-3:]) > 0.5, records[-3:]
    assert (run / "checkpoints" / "global_step_12").is_dir()

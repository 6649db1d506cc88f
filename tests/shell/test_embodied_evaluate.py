"""`python -m rlshell.evaluate` on embodied checkpoints, and the interval maths it reports.

A 2-step CartPole run of the real CLI (shared by the module) gives the
checkpoint the PPO runner writes; the CLI evaluates it in subprocesses
(report, GIF, determinism). Checkpoints written in this process (the same
``actor/`` layout, or the SAC learner's) cover success reporting, the SAC
layout and the error paths through `rlshell.evaluate.main`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import gymnasium
import numpy as np
import pytest
import torch
from attrs import evolve
from torch import nn

from rlcore import typecheck_enabled
from rlshell.checkpoint import TrainerState, checkpoint_dir, write_manifest, write_trainer_state
from rlshell.config import (
    ActorConfig,
    AlgorithmConfig,
    ClusterConfig,
    Config,
    EnvConfig,
    ModelConfig,
    RunnerConfig,
)
from rlshell.config.loading import write_config
from rlshell.evaluate import main
from rlshell.evaluation.embodied import (
    EmbodiedEvaluation,
    Episode,
    _make_stepper,
    eval_seed,
    load_embodied_policy,
    run_episodes,
)
from rlshell.evaluation.intervals import (
    student_t_interval,
    student_t_quantile,
    wilson_interval,
)
from rlshell.models import MODELS, get_model, register_model
from rlshell.models.base import BasePolicy
from tests import launcher
from tests.shell.rlcore_checks import rlcore_checks_run
from tests.shell.test_run import cli_env, train

# --- the interval maths ------------------------------------------------------------------------

# Two-sided 95% t quantiles, t_{0.975, ν}, from published tables (to the digits tables give).
T_TABLE = {1: 12.7062, 2: 4.3027, 4: 2.7764, 9: 2.2622, 29: 2.0452, 120: 1.9799}


@pytest.mark.parametrize(("df", "expected"), sorted(T_TABLE.items()))
def test_the_t_quantile_matches_the_table(df: int, expected: float) -> None:
    assert student_t_quantile(0.975, df) == pytest.approx(expected, abs=5e-5)


def test_the_t_interval_by_hand() -> None:
    # Returns 1..5: mean 3, s = √2.5, half-width t_{0.975,4} · s/√5 = 2.776445 · 0.707107.
    low, high = student_t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.7764451051977934 * math.sqrt(2.5) / math.sqrt(5)
    assert (low, high) == pytest.approx((3 - half, 3 + half), rel=1e-12)
    assert student_t_interval([7.0]) is None
    assert student_t_interval([2.0, 2.0]) == (2.0, 2.0)


def test_the_wilson_interval_by_hand() -> None:
    # 8 of 10 with z = 1.959964: centre (0.8 + z²/20)/(1 + z²/10) = 0.71675, half-width 0.22650.
    z = 1.959963984540054
    centre = (0.8 + z * z / 20) / (1 + z * z / 10)
    half = z / (1 + z * z / 10) * math.sqrt(0.8 * 0.2 / 10 + z * z / 400)
    assert wilson_interval(8, 10) == pytest.approx((centre - half, centre + half), rel=1e-12)
    assert wilson_interval(8, 10) == pytest.approx((0.4902, 0.9433), abs=5e-5)
    low, high = wilson_interval(0, 20)
    assert low == 0.0
    assert high == pytest.approx(0.16113, abs=5e-5)
    assert wilson_interval(20, 20)[1] == 1.0
    with pytest.raises(ValueError, match="successes <= trials"):
        wilson_interval(3, 2)


def test_the_intervals_agree_with_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 5, 8, 13, 50, 333, 5000):
        for probability in (0.9, 0.975, 0.995):
            expected = float(stats.t.ppf(probability, df))
            assert student_t_quantile(probability, df) == pytest.approx(expected, rel=1e-9)
    values = [float(v) for v in np.random.default_rng(0).normal(200.0, 40.0, size=17)]
    expected_interval = stats.t.interval(
        0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values)
    )
    assert student_t_interval(values) == pytest.approx(expected_interval, rel=1e-9)
    # Wilson is scipy's binomtest(...).proportion_ci(method="wilson").
    for successes, trials in ((0, 5), (3, 7), (19, 20), (50, 100)):
        ci = stats.binomtest(successes, trials).proportion_ci(0.95, method="wilson")
        assert wilson_interval(successes, trials) == pytest.approx((ci.low, ci.high), rel=1e-9)


def _evaluation(episodes: list[Episode]) -> EmbodiedEvaluation:
    return EmbodiedEvaluation(
        step=3,
        env_id="Probe-v0",
        seed=0,
        num_envs=2,
        episodes=tuple(episodes),
        gifs=None,
        gif_warning=None,
        seconds=0.1,
    )


def test_the_report_states_means_intervals_and_success() -> None:
    figures = [(10.0, 5, True), (20.0, 6, False), (30.0, 7, True), (40.0, 8, True)]
    episodes = [
        Episode(i % 2, i // 2, episode_return, length, success, success or i == 0)
        for i, (episode_return, length, success) in enumerate(figures)
    ]
    report = _evaluation(episodes).report()
    assert report["eval/episodes"] == 4
    assert report["eval/episode_return"] == 25.0
    assert report["eval/episode_return_ci95"] == pytest.approx(
        list(student_t_interval([10.0, 20.0, 30.0, 40.0]))
    )
    assert report["eval/episode_return_std"] == pytest.approx(math.sqrt(500 / 3))
    assert report["eval/episode_length"] == 6.5
    assert report["eval/success"] == 0.75
    assert report["eval/success_ci95"] == pytest.approx(list(wilson_interval(3, 4)))
    assert report["eval/success_once"] == 0.75
    no_success = _evaluation([Episode(0, 0, 1.0, 1, None, None)]).report()
    assert no_success["eval/success"] is None
    assert no_success["eval/success_ci95"] is None
    assert no_success["eval/episode_return_ci95"] is None  # one episode: no interval
    json.dumps(report)


def test_eval_seeds_are_not_the_training_runner_seeds() -> None:
    # The runner resets rank r's envs from runner.seed + 1000 × r, small ints.
    training = {seed + 1000 * rank for seed in range(100) for rank in range(64)}
    assert not training & {eval_seed(seed) for seed in range(100)}
    assert eval_seed(0) == eval_seed(0) != eval_seed(1)


# --- checkpoints written in this process -------------------------------------------------------

PROBE_ID = "RlshellEvaluateProbe-v0"


class _SuccessProbe(gymnasium.Env[np.ndarray, np.int64]):
    """Two steps: success at the first always, at the last iff action 1; reward = action."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, (1,)).astype(np.float32), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        success = True if self.t == 1 else bool(action == 1)
        obs = np.zeros(1, np.float32)
        return obs, float(action), self.t >= 2, False, {"is_success": success}


@pytest.fixture
def probe_env() -> Iterator[str]:
    gymnasium.register(PROBE_ID, entry_point=_SuccessProbe)
    yield PROBE_ID
    del gymnasium.registry[PROBE_ID]


def _policy_config(env_id: str, obs_dim: int, action_type: str = "discrete") -> Config:
    return Config(
        cluster=ClusterConfig(component_placement={"actor,rollout,env": "0:0"}),
        actor=ActorConfig(
            model=ModelConfig(
                model_type="mlp_policy",
                category="embodied",
                model_kwargs={
                    "obs_dim": obs_dim,
                    "action_dim": 2 if action_type == "discrete" else 1,
                    "action_type": action_type,
                    "hidden_sizes": "8",
                },
            )
        ),
        env=EnvConfig(env_type="gymnasium", env_id=env_id, num_envs=3),
        algorithm=AlgorithmConfig(adv_type="gae"),
        runner=RunnerConfig(runner_type="embodied", experiment_name="probe"),
    )


def _constant_action_policy(config: Config, action: int) -> nn.Module:
    """The config's mlp_policy with every weight zero and the logits favouring ``action``."""
    policy = get_model(config.actor.model)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.zero_()
        policy.get_parameter("actor.2.bias")[action] = 1.0
    return policy


def write_actor_checkpoint(run_dir: Path, config: Config, policy: nn.Module, step: int) -> Path:
    """What the PPO runner writes, from one process: ``actor/`` (DCP), trainer state, config."""
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    write_config(config, run_dir / "config.json")
    path = checkpoint_dir(run_dir, step)
    (path / "actor").mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp_save({"model": policy.state_dict()}, checkpoint_id=str(path / "actor"), no_dist=True)
    write_trainer_state(
        path, TrainerState(step=step, experiment_name=config.runner.experiment_name)
    )
    write_manifest(path)  # as a committed checkpoint has: every load verifies it
    return path


def evaluate_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    """``main(args)`` in this process: exit status, the printed JSON (or None), stderr."""
    status = main(list(args))
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    return status, json.loads(lines[-1]) if status == 0 else None, captured.err


def test_success_at_the_end_and_at_any_step_with_wilson_intervals(
    probe_env: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _policy_config(probe_env, obs_dim=1)
    for action, run in ((0, "fails"), (1, "succeeds")):
        checkpoint = write_actor_checkpoint(
            tmp_path / run, config, _constant_action_policy(config, action), step=7
        )
        status, report, err = evaluate_here(capsys, str(checkpoint), "--episodes", "5")
        assert status == 0, err
        assert (report["step"], report["num_envs"], report["eval/episodes"]) == (7, 3, 5)
        assert report["episode_lengths"] == [2] * 5
        assert report["episode_returns"] == [2.0 * action] * 5
        assert report["eval/success"] == float(action)
        assert report["eval/success_ci95"] == pytest.approx(list(wilson_interval(5 * action, 5)))
        assert report["eval/success_once"] == 1.0
        # The probe cannot render: the evaluation stands, with a warning instead of a GIF.
        assert report["gifs"] is None
        assert f"warning: no GIF: env {probe_env} does not render rgb_array frames" in err


FAILING_ID = "RlshellEvaluateFailingProbe-v0"


class _FailingProbe(_SuccessProbe):
    """`_SuccessProbe` whose copies share a step count and raise at the counts in ``fail_at``
    (and at every count from ``fail_from``); it renders a grey frame (for GIFs)."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 4}
    steps: ClassVar[int] = 0
    fail_at: ClassVar[frozenset[int]] = frozenset()
    fail_from: ClassVar[int | None] = None

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        cls = _FailingProbe
        cls.steps += 1
        if cls.steps in cls.fail_at or (cls.fail_from is not None and cls.steps >= cls.fail_from):
            raise RuntimeError(f"injected eval fault at count {cls.steps}")
        return super().step(action)

    def render(self) -> np.ndarray:
        return np.full((16, 16, 3), 128, np.uint8)


@pytest.fixture
def failing_env() -> Iterator[type[_FailingProbe]]:
    gymnasium.register(FAILING_ID, entry_point=_FailingProbe)
    _FailingProbe.steps, _FailingProbe.fail_at, _FailingProbe.fail_from = 0, frozenset(), None
    yield _FailingProbe
    del gymnasium.registry[FAILING_ID]


def _failing_checkpoint(tmp_path: Path) -> Path:
    config = _policy_config(FAILING_ID, obs_dim=1)
    return write_actor_checkpoint(tmp_path, config, _constant_action_policy(config, 1), step=3)


def test_an_env_that_fails_stops_the_evaluation_naming_it_and_the_episodes_done(
    failing_env: type[_FailingProbe], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 3 envs of 2-step episodes: counts 1-6 finish 3 episodes, count 7 is env 0's 3rd step.
    failing_env.fail_at = frozenset({7})
    checkpoint = _failing_checkpoint(tmp_path)
    status, _, err = evaluate_here(capsys, str(checkpoint), "--episodes", "5", "--no-gif")
    assert status == 1
    assert (
        f"error: env {FAILING_ID}: the env raised at env step 3: RuntimeError: injected eval "
        "fault at count 7 — the evaluation stopped after 3 of 5 episodes; env.on_failure=reset "
        "rebuilds the envs and plays on"
    ) in err
    assert 'test_embodied_evaluate.py", line' in err  # the env's own traceback
    # Every failure at once, past the bound: the same stop, without the advice to reset.
    failing_env.steps, failing_env.fail_from = 0, 7
    status, _, err = evaluate_here(
        capsys,
        str(checkpoint),
        "env.on_failure=reset",
        "env.max_consecutive_failures=1",
        "--episodes",
        "5",
        "--no-gif",
    )
    assert status == 1
    assert "2 env steps in a row failed, more than env.max_consecutive_failures=1; stopping" in err
    assert "the evaluation stopped after 3 of 5 episodes\n" in err


def test_with_reset_an_env_failure_rebuilds_the_envs_and_every_episode_is_played(
    failing_env: type[_FailingProbe], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failing_env.fail_at = frozenset({7})
    checkpoint = _failing_checkpoint(tmp_path)
    status, report, err = evaluate_here(
        capsys, str(checkpoint), "env.on_failure=reset", "--episodes", "5", "--no-gif"
    )
    assert status == 0, err
    assert f"env {FAILING_ID}: the env raised at env step 3" in err
    assert "rebuilding and resetting its 3 envs (env.on_failure='reset')" in err
    # The episodes cut by the failure are not counted: 5 whole ones, played after the rebuild.
    assert report["eval/env_failures"] == 1
    assert report["eval/episodes"] == 5
    assert report["episode_lengths"] == [2] * 5
    assert report["episode_returns"] == [2.0] * 5
    # Without a failure the count is there, and 0; with on_failure=stop it is not reported.
    failing_env.fail_at = frozenset()
    _, report, _ = evaluate_here(
        capsys, str(checkpoint), "env.on_failure=reset", "--episodes", "5", "--no-gif"
    )
    assert report["eval/env_failures"] == 0
    _, report, _ = evaluate_here(capsys, str(checkpoint), "--episodes", "5", "--no-gif")
    assert "eval/env_failures" not in report


def test_an_env_failure_while_recording_the_gif_keeps_the_evaluation(
    failing_env: type[_FailingProbe], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 2 envs play 2 episodes (counts 1-4); the recording env's first step is count 5.
    failing_env.fail_at = frozenset({5})
    checkpoint = _failing_checkpoint(tmp_path)
    status, report, err = evaluate_here(capsys, str(checkpoint), "--episodes", "2")
    assert status == 0, err
    assert report["eval/episodes"] == 2
    assert report["gifs"] is None
    assert (
        f"warning: no GIF: the recording's env failed: env {FAILING_ID}: the env raised at "
        "env step 1: RuntimeError: injected eval fault at count 5"
    ) in err
    # Without the failure the same env is recorded.
    failing_env.steps, failing_env.fail_at = 0, frozenset()
    status, report, err = evaluate_here(capsys, str(checkpoint), "--episodes", "2")
    assert status == 0, err
    assert report["gifs"] is not None


@pytest.mark.skipif(not typecheck_enabled(), reason="RLCORE_TYPECHECK=0: nothing is checked")
def test_episodes_check_rlcores_shapes_on_their_first_step_only() -> None:
    config = _policy_config("CartPole-v1", obs_dim=4)
    policy = get_model(config.actor.model)
    assert isinstance(policy, BasePolicy)
    checked: list[bool] = []
    predict = policy.predict_action_batch

    def recording(*args: Any, **kwargs: Any) -> Any:
        checked.append(rlcore_checks_run())
        return predict(*args, **kwargs)

    policy.predict_action_batch = recording  # type: ignore[method-assign]
    run_episodes(policy, _make_stepper(config, 2, seed=0), episodes=2, seed=0)
    assert len(checked) > 2
    assert checked[0]
    assert not any(checked[1:])


def test_a_sac_checkpoint_is_evaluated_through_its_layout_entry(tmp_path: Path) -> None:
    config = _policy_config("Pendulum-v1", obs_dim=3, action_type="tanh_gaussian")
    trained = get_model(config.actor.model)
    with torch.no_grad():
        for parameter in trained.parameters():
            parameter.add_(0.5)
    run_dir = tmp_path / "sac"
    write_config(config, run_dir / "config.json")
    checkpoint = checkpoint_dir(run_dir, 4)
    checkpoint.mkdir(parents=True)
    torch.save({"learner": {"policy": trained.state_dict()}}, checkpoint / "sac_learner.pt")
    write_trainer_state(checkpoint, TrainerState(step=4, experiment_name="sac"))
    write_manifest(checkpoint)
    loaded = load_embodied_policy(checkpoint, config)
    for name, tensor in trained.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, msg=name)
    assert not loaded.training


def test_the_actor_layout_loads_the_saved_weights(tmp_path: Path) -> None:
    config = _policy_config("CartPole-v1", obs_dim=4)
    policy = _constant_action_policy(config, 1)
    checkpoint = write_actor_checkpoint(tmp_path / "run", config, policy, step=2)
    loaded = load_embodied_policy(checkpoint, config)
    for name, tensor in policy.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, msg=name)


def test_an_image_policy_is_recorded_from_what_it_sees(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from PIL import Image

    config = evolve(
        _policy_config("CartPole-v1", obs_dim=4),
        actor=ActorConfig(
            model=ModelConfig(
                model_type="cnn_policy",
                category="embodied",
                model_kwargs={
                    "action_dim": 2,
                    "action_type": "discrete",
                    "conv_channels": "8,16,16",
                    "feature_dim": 32,
                    "hidden_size": 32,
                },
            )
        ),
        env=EnvConfig(env_type="gymnasium_pixels", env_id="CartPole-v1", num_envs=2),
    )
    torch.manual_seed(0)
    checkpoint = write_actor_checkpoint(tmp_path / "run", config, get_model(config.actor.model), 1)
    status, report, err = evaluate_here(capsys, str(checkpoint), "--episodes", "2")
    assert status == 0, err
    assert report["eval/episodes"] == 2
    # The env states its task: the GIF is named by it, made of the 64-pixel observations.
    gif = Path(report["gifs"]["balance the pole"])
    assert gif == tmp_path / "run" / "eval" / "step_1" / "CartPole-v1-balance-the-pole.gif"
    with Image.open(gif) as image:
        assert image.n_frames > 1
        assert image.size == (192, 192)  # 64 × 3, the smallest whole factor reaching 160


# --- errors ------------------------------------------------------------------------------------


@pytest.fixture
def cartpole_checkpoint(tmp_path: Path) -> Path:
    config = _policy_config("CartPole-v1", obs_dim=4)
    return write_actor_checkpoint(
        tmp_path / "run", config, _constant_action_policy(config, 0), step=2
    )


def test_a_missing_checkpoint_names_the_runs_checkpoints(
    cartpole_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = evaluate_here(capsys, str(cartpole_checkpoint.with_name("global_step_9")))
    assert status == 1
    assert "global_step_9 does not exist; the run has global_step_2" in err


def test_a_checkpoint_away_from_its_run_needs_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = tmp_path / "backup" / "global_step_3"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text('{"step": 3, "experiment_name": "x"}')
    status, _, err = evaluate_here(capsys, str(checkpoint))
    assert status == 1
    assert f"--config: no run config beside {checkpoint} (looked for {tmp_path}/config.json " in err


def test_a_checkpoint_without_policy_weights_is_refused(
    cartpole_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.rmtree(cartpole_checkpoint / "actor")
    status, _, err = evaluate_here(capsys, str(cartpole_checkpoint))
    assert status == 1
    assert "holds no policy weights: expected actor/.metadata" in err
    assert "sac_learner.pt" in err


def test_weights_of_another_model_are_refused(
    cartpole_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = evaluate_here(
        capsys, str(cartpole_checkpoint), "actor.model.model_kwargs.hidden_sizes=16"
    )
    assert status == 1
    assert "actor/.metadata does not fit the MLPPolicy that actor.model builds" in err
    assert "Size mismatch between saved torch.Size([8, 4]) and current: torch.Size([16, 4])" in err


def test_an_env_that_cannot_be_made_is_named(
    cartpole_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = evaluate_here(capsys, str(cartpole_checkpoint), "env.env_id=CartPole-v9")
    assert status == 1
    assert "cannot make the run's env" in err
    assert "unknown gymnasium id 'CartPole-v9' (did you mean 'CartPole-v1'" in err


@pytest.fixture
def plain_module_type() -> Iterator[str]:
    name = "evaluate_test_plain_module"
    register_model(name, lambda cfg, dtype: nn.Linear(4, 2), category="embodied")
    yield name
    MODELS.unregister(name)


def test_a_model_that_is_not_a_policy_is_refused(
    cartpole_checkpoint: Path, plain_module_type: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = evaluate_here(
        capsys, str(cartpole_checkpoint), f"actor.model.model_type={plain_module_type}"
    )
    assert status == 1
    assert "builds a Linear, not a rlshell.models.BasePolicy" in err


def test_options_of_the_other_kind_of_run_are_refused(
    cartpole_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit, match="2"):
        main([str(cartpole_checkpoint), "--limit", "3"])
    assert "--limit: not an option of the evaluation of embodied runs" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):
        main([str(cartpole_checkpoint), "--episodes", "0"])
    assert "expected a positive int, got 0" in capsys.readouterr().err


def test_a_run_without_an_evaluation_is_refused(
    cartpole_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = evaluate_here(capsys, str(cartpole_checkpoint), "runner.runner_type=probe")
    assert status == 1
    assert "'probe' runs have no evaluation; python -m rlshell.evaluate evaluates" in err


# --- a real run's checkpoint, evaluated by the CLI ---------------------------------------------


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ray_tmp = Path(tempfile.mkdtemp(prefix="ev", dir="/tmp"))
    out = tmp_path_factory.mktemp("runs")
    result = train(
        "configs/ppo_cartpole.py",
        "runner.max_steps=2",
        "checkpoint.interval=2",
        f"runner.output_dir={out}",
        env=cli_env(ray_tmp),
        timeout=300,
    )
    shutil.rmtree(ray_tmp, ignore_errors=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out / "ppo_cartpole"


def evaluate_cli(*args: str) -> dict[str, Any]:
    result = launcher.run(
        [sys.executable, "-m", "rlshell.evaluate", *args], env=dict(os.environ), timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


@pytest.fixture(scope="module")
def first_report(trained_run: Path) -> dict[str, Any]:
    checkpoint = trained_run / "checkpoints" / "global_step_2"
    return evaluate_cli(str(checkpoint), "--episodes", "12", "--num-envs", "4", "--seed", "3")


@pytest.mark.slow
@pytest.mark.xdist_group("embodied_evaluate")
def test_the_cli_reports_a_ppo_runs_checkpoint(
    trained_run: Path, first_report: dict[str, Any]
) -> None:
    report = first_report
    assert report["path"].endswith("global_step_2")
    assert (report["step"], report["env_id"], report["seed"]) == (2, "CartPole-v1", 3)
    assert (report["num_envs"], report["eval/episodes"]) == (4, 12)
    returns, lengths = report["episode_returns"], report["episode_lengths"]
    assert len(returns) == len(lengths) == 12
    assert returns == [float(length) for length in lengths]  # CartPole: 1 per step
    assert all(1 <= length <= 500 for length in lengths)
    assert report["eval/episode_return"] == pytest.approx(sum(returns) / 12)
    low, high = report["eval/episode_return_ci95"]
    assert low <= report["eval/episode_return"] <= high
    assert (low, high) == pytest.approx(student_t_interval(returns))
    assert report["eval/success"] is None
    assert report["eval/success_ci95"] is None
    assert report["time/eval"] > 0


@pytest.mark.slow
@pytest.mark.xdist_group("embodied_evaluate")
def test_the_cli_writes_a_gif_of_an_episode(
    trained_run: Path, first_report: dict[str, Any]
) -> None:
    from PIL import Image

    # CartPole renders with pygame (gymnasium[classic-control]); without it the GIF is skipped.
    assert first_report["gifs"] is not None, "no GIF written: is pygame installed?"
    gif = Path(first_report["gifs"]["CartPole-v1"])
    assert gif == trained_run / "eval" / "step_2" / "CartPole-v1.gif"
    with Image.open(gif) as image:
        assert image.format == "GIF"
        assert image.n_frames > 1
        assert max(image.size) <= 320  # CartPole renders 600 × 400: scaled down


@pytest.mark.slow
@pytest.mark.xdist_group("embodied_evaluate")
def test_the_same_seed_plays_the_same_episodes(
    trained_run: Path, first_report: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = str(trained_run / "checkpoints" / "global_step_2")
    same = ["--episodes", "12", "--num-envs", "4"]
    again = evaluate_cli(checkpoint, *same, "--seed", "3", "--no-gif")
    assert again["episode_returns"] == first_report["episode_returns"]
    assert again["gifs"] is None
    status, other, err = evaluate_here(capsys, checkpoint, *same, "--seed", "4", "--no-gif")
    assert status == 0, err
    assert other["episode_returns"] != first_report["episode_returns"]

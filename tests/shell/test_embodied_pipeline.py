"""The embodied runner's hybrid placement: env and rollout workers apart, pipelined in stages."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from attrs import evolve

from rlcore import typecheck_enabled
from rlshell.cluster.errors import WorkerError
from rlshell.cluster.ray_cluster import Cluster
from rlshell.config import Config, ConfigError
from rlshell.envs.stepper import EnvStepper
from rlshell.metrics import read_metrics
from rlshell.models.base import BasePolicy
from rlshell.rollout.trajectory import Samples, TrajectoryBuffer
from rlshell.runners.embodied_pipeline import Pipeline
from rlshell.runners.validation import load_config
from rlshell.workers.common import build_rollout_model
from rlshell.workers.embodied_pipeline import (
    EnvWindow,
    EnvWorker,
    PipelineRolloutWorker,
    RolloutWindow,
    StageObs,
    stage_seed,
    window_buffer,
)
from rlshell.workers.embodied_update import collect_rollout
from tests.shell.conftest import PlanFactory
from tests.shell.rlcore_checks import rlcore_checks_run
from tests.shell.test_run import cli_env, train

CARTPOLE = "configs/ppo_cartpole.py"
HYBRID = '{"actor": "0:0-1", "rollout": "0:0", "env": "0:0-1"}'


def cartpole(*overrides: str, for_run: bool = False) -> Config:
    return load_config(CARTPOLE, list(overrides), for_run=for_run)


@pytest.mark.skipif(not typecheck_enabled(), reason="RLCORE_TYPECHECK=0: nothing is checked")
def test_a_rollout_worker_checks_rlcores_shapes_on_its_first_step_only() -> None:
    """Its policy's rlcore calls cost more than their maths on a few envs: checked once."""
    worker = PipelineRolloutWorker(cartpole())
    worker.init_worker()
    assert worker.policy is not None
    checked: list[bool] = []
    predict = worker.policy.predict_action_batch

    def recording(*args: Any, **kwargs: Any) -> Any:
        checked.append(rlcore_checks_run())
        return predict(*args, **kwargs)

    worker.policy.predict_action_batch = recording  # type: ignore[method-assign]
    obs = {"states": torch.zeros(2, 4)}
    for _ in range(3):
        worker.predict(0, 0, StageObs(obs, torch.zeros(0, dtype=torch.long), obs))
    assert checked == [True, False, False]


# ---------------------------------------------------------------- the window's samples

STEPS, WINDOWS, GAMMA, LAM = 7, 3, 0.98, 0.8


def greedy(policy: BasePolicy) -> BasePolicy:
    """``policy`` acting deterministically whatever mode it is asked for."""
    act = type(policy).predict_action_batch

    def predict(obs: Any, mode: str = "train", compute_values: bool = True) -> Any:
        return act(policy, obs, mode="eval", compute_values=compute_values)

    policy.predict_action_batch = predict  # type: ignore[method-assign]
    return policy


def collocated_windows(config: Config, policy: BasePolicy, env_workers: int) -> list[Samples]:
    """Each stage of each env worker rolled out on its own with `collect_rollout`, the
    stages' envs then laid side by side as the pipeline lays them: [steps, envs] per window."""
    stages = config.rollout.pipeline_stage_num
    per_stage = config.env.num_envs // env_workers // stages
    columns: list[list[Samples]] = []
    for env_rank in range(env_workers):
        for stage in range(stages):
            seed = stage_seed(config, env_rank, stage)
            stepper = EnvStepper.from_config(evolve(config.env, num_envs=per_stage), seed)
            obs, buffer, windows = stepper.reset(seed), TrajectoryBuffer(per_stage), []
            for _ in range(WINDOWS):
                obs = collect_rollout(
                    policy,
                    stepper,
                    buffer,
                    obs,
                    STEPS,
                    bootstrap_at_done=config.algorithm.bootstrap_at_done == "always",
                )
                windows.append(buffer.finish(GAMMA, LAM))
            columns.append(windows)
    return [
        _side_by_side([stage_windows[window] for stage_windows in columns])
        for window in range(WINDOWS)
    ]


def _side_by_side(parts: list[Samples]) -> Samples:
    def grid(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.reshape(STEPS, -1, *tensor.shape[1:])

    def joined(tensors: list[torch.Tensor]) -> torch.Tensor:
        whole = torch.cat([grid(t) for t in tensors], dim=1)
        return whole.reshape(-1, *whole.shape[2:])

    return Samples(
        forward_inputs={
            key: joined([p.forward_inputs[key] for p in parts]) for key in parts[0].forward_inputs
        },
        logprobs=joined([p.logprobs for p in parts]),
        values=joined([p.values for p in parts]),
        advantages=joined([p.advantages for p in parts]),
        returns=joined([p.returns for p in parts]),
    )


@pytest.mark.parametrize("bootstrap_at_done", ["truncated", "always"])
def test_a_pipelined_window_on_ray_equals_collocated_rollouts_of_the_same_envs(
    ray_cluster: Cluster, plan_component: PlanFactory, bootstrap_at_done: str
) -> None:
    """Two env workers × two stages served by one rollout worker, three windows: the same
    samples, env for env, as each stage's envs rolled out alone by the collocated code
    (``algorithm.bootstrap_at_done='always'``: terminations bootstrap like truncations)."""
    config = cartpole(
        f"cluster.component_placement={HYBRID}",
        "env.max_episode_steps=9",
        "rollout.pipeline_stage_num=2",
        f"algorithm.bootstrap_at_done={bootstrap_at_done}",
    )
    reference = build_rollout_model(config)
    assert isinstance(reference, BasePolicy)
    with torch.no_grad():  # weights of their own, so that set_weights must have reached it
        for param in reference.parameters():
            param.mul_(1.5)
    state = {name: t.clone() for name, t in reference.state_dict().items()}
    envs = EnvWorker.create_group(config).launch(ray_cluster, plan_component("env", 2))
    rollout = PipelineRolloutWorker.create_group(config, mode="eval").launch(
        ray_cluster, plan_component("rollout", 1)
    )
    try:
        policy = rollout.init_worker().wait()[0]
        envs.init_worker(policy).wait()
        rollout.set_weights(state).wait()
        pipeline = Pipeline(envs, rollout, steps=STEPS, stages=2)
        windows: list[tuple[list[RolloutWindow], list[EnvWindow]]] = []
        for _ in range(WINDOWS):
            submitted = pipeline.submit()
            parts = [submitted.wait(call)[0] for call in submitted.rollout_windows]
            windows.append((parts, submitted.wait(submitted.env_windows)))
    finally:
        envs.shutdown()
        rollout.shutdown()
    expected = collocated_windows(config, greedy(reference), env_workers=2)
    ends = {"terminated": 0, "truncated": 0}
    for (parts, env_parts), want in zip(windows, expected, strict=True):
        got = window_buffer(parts, env_parts).finish(GAMMA, LAM)
        assert torch.equal(got.forward_inputs["states"], want.forward_inputs["states"])
        assert torch.equal(got.forward_inputs["action"], want.forward_inputs["action"])
        for name in ("logprobs", "values", "advantages", "returns"):
            torch.testing.assert_close(getattr(got, name), getattr(want, name), msg=name)
        for key in ends:
            ends[key] += sum(int(getattr(part, key).sum()) for part in env_parts)
    # Both kinds of episode end happened (a truncation bootstraps, a termination does not,
    # unless bootstrap_at_done='always', which leaves none), and the stages' envs differ, so
    # stages swapped or mixed up would not match.
    assert (ends["terminated"] > 0) == (bootstrap_at_done == "truncated")
    assert ends["truncated"] > 0
    states = expected[0].forward_inputs["states"].reshape(STEPS, 8, -1)
    assert not torch.equal(states[:, :2], states[:, 2:4])


def test_a_failure_in_the_chain_is_reported_by_the_worker_that_failed(
    ray_cluster: Cluster, plan_component: PlanFactory
) -> None:
    """A rollout worker that cannot act on the envs' observations (Pendulum's 3 numbers for
    a 4-input policy): the env calls after it fail with its error, which names it."""
    config = cartpole(
        'cluster.component_placement={"actor": "0:0", "rollout": "0:0", "env": "0:0"}',
        "env.env_id=Pendulum-v1",
    )
    envs = EnvWorker.create_group(config).launch(ray_cluster, plan_component("env", 1))
    rollout = PipelineRolloutWorker.create_group(config).launch(
        ray_cluster, plan_component("rollout", 1)
    )
    try:
        rollout.init_worker().wait()
        envs.init_worker().wait()
        submitted = Pipeline(envs, rollout, steps=2, stages=1).submit()
        with pytest.raises(WorkerError) as failure:
            submitted.wait(submitted.env_windows)
    finally:
        envs.shutdown()
        rollout.shutdown()
    assert failure.value.component == rollout.name
    assert failure.value.method == "predict"


def _window_pair(truncated_at: int) -> tuple[RolloutWindow, EnvWindow]:
    steps, envs = 3, 2
    truncated = torch.zeros(steps, envs, dtype=torch.bool)
    truncated[truncated_at, 0] = True
    rollout = RolloutWindow(
        env_rank=0,
        forward_inputs={"states": torch.zeros(steps, envs, 4)},
        logprobs=torch.zeros(steps, envs),
        values=torch.arange(6.0).reshape(steps, envs),
        bootstrap=torch.where(truncated, 10.0, 0.0),
        truncated=truncated,
        last_values=torch.tensor([20.0, 30.0]),
        buffers={},
    )
    env = EnvWindow(
        env_rank=0,
        rewards=torch.ones(steps, envs),
        terminated=torch.zeros(steps, envs, dtype=torch.bool),
        truncated=truncated,
        metrics={},
    )
    return rollout, env


def test_window_buffer_bootstraps_truncated_steps_and_refuses_mixed_up_truncations() -> None:
    rollout, env = _window_pair(truncated_at=1)
    buffer = window_buffer([rollout], [env])
    next_values = torch.stack(buffer._columns["next_values"])
    # V(sₜ₊₁): the next step's value, the bootstrap where truncated, V after the window last.
    assert next_values.tolist() == [[2.0, 3.0], [10.0, 5.0], [20.0, 30.0]]
    other_rollout, _ = _window_pair(truncated_at=2)
    with pytest.raises(RuntimeError, match="mixed up steps or stages"):
        window_buffer([other_rollout], [env])


# ---------------------------------------------------------------- placements refused


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ['cluster.component_placement={"actor": "0:0", "rollout,env": "0:0"}'],
            "'rollout,env' groups two of them apart from 'actor'",
        ),
        (
            ['cluster.component_placement={"actor,rollout": "0:0", "env": "0:0"}'],
            "'actor,rollout' groups two of them apart from 'env'",
        ),
        (
            ["rollout.pipeline_stage_num=2"],
            "'actor,rollout,env' places env, rollout and actor in the same processes",
        ),
        (["rollout.pipeline_stage_num=0"], "rollout.pipeline_stage_num: expected an integer ≥ 1"),
    ],
)
def test_validation_refuses_placements_the_runner_cannot_run(
    overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        cartpole(*overrides, for_run=True)


def test_pipeline_stages_are_refused_outside_embodied_ppo() -> None:
    with pytest.raises(ConfigError, match="the reasoning runner does not use it"):
        load_config("configs/grpo.py", ["rollout.pipeline_stage_num=2"])
    with pytest.raises(ConfigError, match="SAC does not use it"):
        load_config("configs/sac_pendulum.py", ["rollout.pipeline_stage_num=2"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ['cluster.component_placement={"actor": "0:0", "rollout": "0:0-1", "env": "0:0"}'],
            "2 rollout workers for 1 env workers",
        ),
        (
            [f"cluster.component_placement={HYBRID}", "env.num_envs=6"],
            "rollout.pipeline_stage_num: an env worker's 3 envs do not split evenly into 2",
        ),
        (
            [
                'cluster.component_placement={"actor": "0:0-2", "rollout": "0:0", "env": "0:0"}',
                "rollout.pipeline_stage_num=1",
            ],
            "env.num_envs: 8 envs do not split evenly over the actor's 3 ranks",
        ),
        (
            [
                f"cluster.component_placement={HYBRID}",
                "algorithm.adv_type=grpo",
                "algorithm.group_size=2",
            ],
            "algorithm.adv_type: the hybrid placement trains PPO with GAE",
        ),
    ],
)
def test_the_hybrid_runner_refuses_sizes_it_cannot_split(
    overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        cartpole("rollout.pipeline_stage_num=2", *overrides)


# ---------------------------------------------------------------- a real run


@pytest.mark.slow
def test_a_hybrid_cartpole_run_in_two_stages_logs_overlap_metrics_and_resumes(
    tmp_path: Path,
) -> None:
    """One env worker in 2 stages, one rollout worker, one actor rank; then resumed (the
    Ray test above has several env workers; each process costs seconds to start here).

    The policy normalises its observations (``normalize_obs``), and the resume runs three
    steps in ``runner.mode='async'``: rollout worker 0 keeps the running statistics it
    moves on through the window submitted ahead (a sync after an update must not rewind
    them), so the checkpoint of step s holds s windows' observations, as the synchronous
    run's does.
    """
    from rlshell.export import load_policy

    env = cli_env(Path(tempfile.mkdtemp(prefix="rp", dir="/tmp")))
    out = tmp_path / "runs"
    short = [
        CARTPOLE,
        'cluster.component_placement={"actor": "0:0", "rollout": "0:0", "env": "0:0"}',
        "rollout.pipeline_stage_num=2",
        "runner.rollout_steps=16",
        "algorithm.ppo_epochs=4",
        "checkpoint.interval=2",
        "checkpoint.keep_last=null",
        "actor.model.model_kwargs.normalize_obs=true",
        f"runner.output_dir={out}",
    ]
    result = train(*short, "runner.max_steps=2", env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "in 2 stages, 1 rollout workers, 1 actor ranks; pipelined" in result.stdout
    run = out / "ppo_cartpole"
    records = read_metrics(run / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [1, 2]
    last = records[-1]
    for key in (
        "train/pg_loss",
        "train/value_loss",
        "train/lr",
        "time/rollout",
        "time/update",
        "time/step",
        "time/rollout_busy",
        "time/env_busy",
        "perf/env_steps_per_s",
        "env/episodes",
    ):
        assert key in last, key
    assert last["env/total_steps"] == 2 * 8 * 16
    assert 0 < last["time/env_busy"] < last["time/rollout"]
    assert records[1]["train/lr"] < records[0]["train/lr"]  # the update reached the actor
    assert (run / "checkpoints" / "global_step_2" / "actor").is_dir()
    again = train(
        *short,
        "runner.max_steps=5",
        "runner.mode=async",
        "checkpoint.resume=auto",
        env=env,
        timeout=300,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resumed from" in again.stdout
    records = read_metrics(run / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [1, 2, 3, 4, 5]
    assert records[-1]["env/total_steps"] == 5 * 8 * 16
    assert [r["async/staleness_max"] for r in records[2:]] == [0.0, 1.0, 1.0]

    def observed(step: int) -> float:
        policy = load_policy(run / "checkpoints" / f"global_step_{step}").model
        return float(policy.get_buffer("obs_count"))

    assert observed(5) == pytest.approx(observed(2) * 5 / 2)

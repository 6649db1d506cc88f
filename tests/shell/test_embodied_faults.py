"""Embodied runs that fail: each failure is named where it happened, and resume continues.

In one process: a policy whose actions have the wrong shape, or whose
``forward_inputs`` lack what ``default_forward`` reads, is named with the
env and the shapes or the key; an env that raises or returns NaN is named
with the env step. On Ray: an env that raises in its step (the driver shows
its traceback and the env id, and ``checkpoint.resume=auto`` finishes the
run), a NaN observation (env id, env index, env step and the worker's rank),
an env that ends its process (the env id, with no traceback to show) and
ManiSkill on a machine without a Vulkan driver. The Ray faults come from
`tests/shell/embodied_fault_ext.py`, loaded through ``RLSHELL_EXT_MODULE`` in
the driver and every worker.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import gymnasium
import pytest
import torch
from torch import Tensor

from rlshell.api import run_dir_of
from rlshell.cluster.errors import WorkerDiedError, WorkerError, WorkerTimeoutError
from rlshell.cluster.ray_cluster import Cluster
from rlshell.config import EnvConfig
from rlshell.config.loading import ConfigError
from rlshell.envs.stepper import EnvRestarted, EnvStepError, EnvStepper
from rlshell.envs.vulkan import DIR_ENV_VAR
from rlshell.metrics import read_metrics
from rlshell.models.base import ActionInfo, MissingInputError
from rlshell.models.mlp_policy import MLPPolicy, MLPPolicySpec
from rlshell.rollout.replay import ReplayBuffer
from rlshell.rollout.trajectory import TrajectoryBuffer
from rlshell.runners import run as run_trainer
from rlshell.runners.spec import resolve_spec
from rlshell.runners.validation import load_config, plan_for
from rlshell.workers.embodied_grpo import collect_group_episodes
from rlshell.workers.embodied_update import (
    PPOSettings,
    collect_rollout,
    policy_values,
    ppo_update,
)
from rlshell.workers.sac_update import collect_sac_steps
from tests.shell import embodied_fault_ext
from tests.shell.test_envs import TINY_ID, tiny_stepper
from tests.shell.test_run import ROOT, cli_env, train

HERE = Path(__file__).resolve().parent
FAULTY = [
    "configs/ppo_cartpole.py",
    "env.env_type=faulty_gymnasium",
    "runner.max_steps=4",
    "runner.rollout_steps=8",
    "algorithm.ppo_epochs=2",
    "checkpoint.interval=1",
]
# With 8 steps per rollout, an env's 17th step is the first of runner step 3.
FAULT_AT = 17
CARTPOLE = MLPPolicySpec.from_kwargs({"obs_dim": 4, "action_dim": 2, "action_type": "discrete"})


# --- in one process ------------------------------------------------------------------------


class WrongShapePolicy(MLPPolicy):
    """Hands CartPole actions of shape [N, 1] instead of [N]."""

    def predict_action_batch(
        self,
        env_obs: dict[str, Any],
        mode: Literal["train", "eval"] = "train",
        compute_values: bool = True,
    ) -> tuple[Tensor, ActionInfo]:
        actions, info = super().predict_action_batch(env_obs, mode, compute_values)
        return actions[:, None], info


class ForgetfulPolicy(MLPPolicy):
    """Caches only the states: MLPPolicy's default_forward also needs the action."""

    def predict_action_batch(
        self,
        env_obs: dict[str, Any],
        mode: Literal["train", "eval"] = "train",
        compute_values: bool = True,
    ) -> tuple[Tensor, ActionInfo]:
        actions, info = super().predict_action_batch(env_obs, mode, compute_values)
        info["forward_inputs"] = {"states": info["forward_inputs"]["states"]}
        return actions, info


class IndexingPolicy(ForgetfulPolicy):
    """Reads forward_inputs["action"] directly, without `require_input`."""

    def default_forward(
        self,
        forward_inputs: dict[str, Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = True,
        compute_values: bool = True,
    ) -> dict[str, Tensor]:
        forward_inputs["action"]
        raise AssertionError("not reached")


class ValuelessPolicy(MLPPolicy):
    """Its default_forward leaves out the values PPO's update needs."""

    def default_forward(
        self,
        forward_inputs: dict[str, Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = True,
        compute_values: bool = True,
    ) -> dict[str, Tensor]:
        out = super().default_forward(forward_inputs, compute_logprobs, compute_entropy)
        del out["values"]
        return out


def _cartpole(num_envs: int = 4) -> EnvStepper:
    cfg = EnvConfig(env_type="gymnasium", env_id="CartPole-v1", num_envs=num_envs)
    return EnvStepper.from_config(cfg, seed=0)


def _update(policy: MLPPolicy) -> dict[str, float]:
    stepper, buffer = _cartpole(), TrajectoryBuffer(4)
    collect_rollout(policy, stepper, buffer, stepper.reset(seed=0), steps=4)
    samples = buffer.finish(gamma=0.99, lam=0.95)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    settings = PPOSettings(ppo_epochs=1, num_minibatches=1)
    return ppo_update(policy, optimizer, samples, settings, torch.Generator().manual_seed(0))


def test_actions_of_the_wrong_shape_name_the_policy_the_env_and_both_shapes() -> None:
    stepper = _cartpole()
    with pytest.raises(ValueError, match="WrongShapePolicy") as caught:
        collect_rollout(
            WrongShapePolicy(CARTPOLE), stepper, TrajectoryBuffer(4), stepper.reset(0), 2
        )
    assert str(caught.value) == (
        "env CartPole-v1: WrongShapePolicy.predict_action_batch returned actions of shape "
        "(4, 1), expected (4,) (num_envs, *single_action_space.shape)"
    )


@pytest.mark.parametrize("policy_cls", [ForgetfulPolicy, IndexingPolicy])
def test_forward_inputs_without_a_key_default_forward_reads_name_the_key_and_the_policy(
    policy_cls: type[MLPPolicy],
) -> None:
    with pytest.raises(MissingInputError) as caught:
        _update(policy_cls(CARTPOLE))
    assert str(caught.value) == (
        f"{policy_cls.__name__} needs forward_inputs['action'], but it holds only 'states'"
    )


def test_a_default_forward_without_values_is_named() -> None:
    with pytest.raises(
        ValueError,
        match=r"ValuelessPolicy\.default_forward returned \['entropy', "
        r"'logprobs'\], without 'values'; PPO's update needs 'logprobs', "
        r"'entropy', 'values'",
    ):
        _update(ValuelessPolicy(CARTPOLE))


@pytest.mark.parametrize("nan_in", ["obs", "reward"])
def test_non_finite_values_name_the_env_index_and_the_env_step(nan_in: str) -> None:
    stepper = tiny_stepper({}, {}, {"nan_at": 2, "nan_in": nan_in})
    stepper.reset(seed=0)
    stepper.step(torch.zeros(3, dtype=torch.int64))
    what = "observation (states)" if nan_in == "obs" else "reward"
    with pytest.raises(
        FloatingPointError,
        match=rf"^env {TINY_ID}: {re.escape(what)} of env index 2 is not finite at env step 2 ",
    ):
        stepper.step(torch.zeros(3, dtype=torch.int64))


class RaisingEnv(gymnasium.Env[Any, Any]):
    """CartPole's spaces; raises on its third step."""

    def __init__(self) -> None:
        cartpole = gymnasium.make("CartPole-v1")
        self.observation_space, self.action_space = (
            cartpole.observation_space,
            cartpole.action_space,
        )
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        if self.t == 3:
            raise OSError("simulator lost")
        return self.observation_space.sample(), 1.0, False, False, {}


def test_an_env_that_raises_in_step_is_named_with_the_env_step_and_chained() -> None:
    vector = gymnasium.vector.SyncVectorEnv(
        [RaisingEnv, RaisingEnv], autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP
    )
    stepper = EnvStepper(vector, "Raising-v0")
    stepper.reset(seed=0)
    for _ in range(2):
        stepper.step(torch.zeros(2, dtype=torch.int64))
    with pytest.raises(EnvStepError) as caught:
        stepper.step(torch.zeros(2, dtype=torch.int64))
    assert str(caught.value) == (
        "env Raising-v0: the env raised at env step 3: OSError: simulator lost"
    )
    assert isinstance(caught.value.__cause__, OSError)


# --- env.on_failure='reset': the envs rebuilt, the failed step dropped -----------------------


@pytest.fixture
def faulty(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., EnvStepper]:
    """``faulty(fault, at, env_id=..., num_envs=..., isolated=..., repeat=..., **env_keys)``:
    a stepper over `embodied_fault_ext`'s env, built by ``EnvStepper.from_config``."""
    embodied_fault_ext.register()

    def make(
        fault: str,
        at: int,
        env_id: str = "CartPole-v1",
        num_envs: int = 2,
        isolated: bool = False,
        repeat: bool = False,
        **env_keys: Any,
    ) -> EnvStepper:
        monkeypatch.setenv("RLSHELL_TEST_ENV_FAULT", fault)
        monkeypatch.setenv("RLSHELL_TEST_ENV_FAULT_AT", str(at))
        monkeypatch.setenv("RLSHELL_TEST_ENV_FAULT_MARKER", str(tmp_path / "marker"))
        monkeypatch.setenv("RLSHELL_TEST_ENV_ASYNC", "1" if isolated else "0")
        monkeypatch.setenv("RLSHELL_TEST_ENV_FAULT_REPEAT", "1" if repeat else "0")
        cfg = EnvConfig(env_type="faulty_gymnasium", env_id=env_id, num_envs=num_envs, **env_keys)
        return EnvStepper.from_config(cfg, seed=0)

    return make


def _zeros(stepper: EnvStepper) -> Tensor:
    return torch.zeros(stepper.action_shape, dtype=torch.int64)


@pytest.mark.parametrize(
    ("fault", "isolated", "cause"),
    [
        ("raise", False, "the env raised at env step 3: RuntimeError: injected env fault"),
        ("nan", False, "observation (states) of env index 0 is not finite at env step 3"),
        ("hang", False, "the env did not return at env step 3 within env.step_timeout_s=1 s"),
        ("hang", True, "the env did not return at env step 3 within env.step_timeout_s=1 s"),
        ("exit", True, "the env raised at env step 3: "),
        ("segv", True, "the env raised at env step 3: "),
        ("oom", False, "the env raised at env step 3: MemoryError: Unable to allocate 4.00 TiB"),
    ],
    ids=["raise", "nan", "hang", "hang-in-its-process", "process-exits", "segfault", "oom"],
)
def test_reset_rebuilds_the_envs_after_each_kind_of_failure_and_counts_it(
    faulty: Callable[..., EnvStepper], tmp_path: Path, fault: str, isolated: bool, cause: str
) -> None:
    """A raise, a NaN, a step past ``step_timeout_s`` (in the worker's process or in the
    env's own), an env process that exits or segfaults, and an allocation past the
    machine's memory: each gives `EnvRestarted` with the rebuilt envs' first observation,
    the next steps run, and ``env/failures`` counts one."""
    # A timer only where the fault is a hang: a process that segfaults can take longer than
    # a second to be seen dead on a loaded machine (its fault handler writes tracebacks).
    timeout = 1.0 if fault == "hang" else None
    stepper = faulty(fault, 3, isolated=isolated, on_failure="reset", step_timeout_s=timeout)
    failed_env = stepper.env
    stepper.reset(seed=0)
    for _ in range(2):
        stepper.step(_zeros(stepper))
    started = time.monotonic()
    with pytest.raises(EnvRestarted) as caught:
        stepper.step(_zeros(stepper))
    assert time.monotonic() - started < 20
    message = str(caught.value)
    assert message.startswith(f"env CartPole-v1: {cause}"), message
    assert message.endswith("the envs were rebuilt and reset (env.on_failure='reset')")
    assert (tmp_path / "marker").read_text() == f"{fault} at step 3\n"
    assert stepper.env is not failed_env
    assert caught.value.obs["states"].shape == (2, 4)
    assert torch.isfinite(caught.value.obs["states"]).all()
    for _ in range(3):
        result = stepper.step(_zeros(stepper))
    assert torch.isfinite(result.obs["states"]).all()
    metrics = stepper.pop_metrics()
    assert metrics["env/failures"] == 1.0
    assert metrics["env/episodes"] == 0.0  # the cut episodes are not counted as finished
    assert stepper.pop_metrics()["env/failures"] == 0.0
    stepper.close()


def test_a_step_past_step_timeout_s_stops_with_stop_naming_the_limit(
    faulty: Callable[..., EnvStepper],
) -> None:
    stepper = faulty("hang", 2, step_timeout_s=0.5)
    stepper.reset(seed=0)
    stepper.step(_zeros(stepper))
    with pytest.raises(EnvStepError) as caught:
        stepper.step(_zeros(stepper))
    assert not isinstance(caught.value, EnvRestarted)
    assert str(caught.value) == (
        "env CartPole-v1: the env did not return at env step 2 within env.step_timeout_s=0.5 s"
    )
    assert "env/failures" not in stepper.pop_metrics()


def test_reset_stops_after_max_consecutive_failures_steps_in_a_row(
    faulty: Callable[..., EnvStepper],
) -> None:
    """An env that fails at every step is rebuilt ``max_consecutive_failures`` times, then
    the next failure stops, naming the count and the setting."""
    stepper = faulty("raise", 1, repeat=True, on_failure="reset", max_consecutive_failures=2)
    stepper.reset(seed=0)
    for _ in range(2):
        with pytest.raises(EnvRestarted):
            stepper.step(_zeros(stepper))
    with pytest.raises(EnvStepError) as caught:
        stepper.step(_zeros(stepper))
    assert not isinstance(caught.value, EnvRestarted)
    assert str(caught.value) == (
        "env CartPole-v1: the env raised at env step 1: RuntimeError: injected env fault at "
        "step 1 — 3 env steps in a row failed, more than env.max_consecutive_failures=2; "
        "stopping"
    )


class _Recording:
    """Wraps a stepper's ``step``: the observation each step was taken from, and the
    observation each `EnvRestarted` handed over."""

    def __init__(self, stepper: EnvStepper) -> None:
        self.taken_from: list[Tensor] = []
        self.restarted: list[Tensor] = []
        self.current = stepper.reset(seed=0)["states"]
        step = stepper.step

        def recorded(actions: Tensor, policy: str | None = None, chunk: int = 1) -> Any:
            self.taken_from.append(self.current)
            try:
                result = step(actions, policy=policy, chunk=chunk)
            except EnvRestarted as restart:
                self.restarted.append(restart.obs["states"])
                self.current = restart.obs["states"]
                raise
            self.current = result.obs["states"]
            return result

        stepper.step = recorded  # type: ignore[method-assign]


def test_a_failed_step_is_dropped_and_the_step_before_it_truncated_there(
    faulty: Callable[..., EnvStepper],
) -> None:
    """PPO's window keeps its length; the failed step's action is not in it; the step
    before it bootstraps from V(the observation the failed step acted on); the window goes
    on from the rebuilt envs' first observation."""
    torch.manual_seed(0)
    policy = MLPPolicy(CARTPOLE)
    stepper = faulty("raise", 3, on_failure="reset")
    recording = _Recording(stepper)
    buffer = TrajectoryBuffer(2)
    collect_rollout(policy, stepper, buffer, {"states": recording.current}, steps=5)
    columns = buffer._columns
    assert len(columns["values"]) == 5
    assert len(recording.taken_from) == 6
    failed_from = recording.taken_from[2]
    (restarted,) = recording.restarted
    # Recorded steps 0, 1 before the failure; 2, 3, 4 from the rebuilt envs.
    assert torch.equal(columns["truncated"][1], torch.ones(2, dtype=torch.bool))
    assert not columns["terminated"][1].any()
    with torch.no_grad():
        expected = policy_values(policy, {"states": failed_from})
    torch.testing.assert_close(columns["next_values"][1], expected)
    assert not columns["truncated"][0].any()
    with torch.no_grad():
        torch.testing.assert_close(
            columns["values"][2], policy_values(policy, {"states": restarted})
        )
    samples = buffer.finish(gamma=0.99, lam=0.95)
    assert samples.size == 10
    assert stepper.pop_metrics()["env/failures"] == 1.0


def test_sac_stores_no_transition_of_a_failed_step(faulty: Callable[..., EnvStepper]) -> None:
    torch.manual_seed(0)
    stepper = faulty("raise", 3, env_id="Pendulum-v1", on_failure="reset")
    recording = _Recording(stepper)
    replay = ReplayBuffer(10, 3, 1)
    collect_sac_steps(
        MLPPolicy(
            MLPPolicySpec.from_kwargs(
                {"obs_dim": 3, "action_dim": 1, "action_type": "tanh_gaussian"}
            )
        ),
        stepper,
        replay,
        {"states": recording.current},
        steps=5,
        generator=torch.Generator().manual_seed(0),
        random_actions=True,
    )
    batch = replay.contents()
    assert batch.size == 10  # 5 steps of 2 envs, the failed one not among them
    (restarted,) = recording.restarted
    # Steps 0 and 1 as they happened, step 2 taken from the rebuilt envs.
    torch.testing.assert_close(batch.states[4:6], restarted)
    torch.testing.assert_close(batch.next_states[2:4], recording.taken_from[2])
    assert not batch.terminated.any()


def test_embodied_grpo_collects_a_cut_window_again_from_the_same_seeds(
    faulty: Callable[..., EnvStepper],
) -> None:
    torch.manual_seed(0)
    policy = MLPPolicy(CARTPOLE)
    stepper = faulty("raise", 3, on_failure="reset")
    first_obs: list[Tensor] = []
    reset = stepper.reset

    def recorded_reset(seed: int, group_size: int = 1) -> Any:
        obs = reset(seed, group_size)
        first_obs.append(obs["states"])
        return obs

    stepper.reset = recorded_reset  # type: ignore[method-assign]
    window, _ = collect_group_episodes(policy, stepper, seed=5, group_size=2, max_steps=500)
    # The window's reset, the rebuilt envs' reset, the window's reset again.
    assert len(first_obs) == 3
    torch.testing.assert_close(first_obs[0], first_obs[2])
    assert torch.equal(first_obs[2][0], first_obs[2][1])  # one group: one start
    assert bool(window.valid[0].all())
    assert window.rewards.shape[0] > 3
    assert stepper.pop_metrics()["env/failures"] == 1.0


def test_reset_is_refused_by_the_pipelined_placement_and_its_bound_by_stop() -> None:
    pipelined = 'cluster.component_placement={"actor": "0:0", "rollout": "0:0", "env": "0:0"}'
    with pytest.raises(ConfigError) as caught:
        load_config(ROOT / "configs/ppo_cartpole.py", [pipelined, "env.on_failure=reset"])
    assert "env.on_failure: 'reset' drops a failed env step and takes it again, and the " in (
        str(caught.value)
    )
    with pytest.raises(ConfigError) as caught:
        load_config(ROOT / "configs/ppo_cartpole.py", ["env.max_consecutive_failures=5"])
    assert (
        "env.max_consecutive_failures: bounds how many failed env steps in a row "
        "env.on_failure='reset' rebuilds the envs after; env.on_failure is 'stop'"
    ) in str(caught.value)


# --- on Ray, through the CLI ----------------------------------------------------------------


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    """A short temp dir for the CLI's Ray (socket paths stay under 107 characters)."""
    path = Path(tempfile.mkdtemp(prefix="rf", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _fault_vars(fault: str, marker: Path) -> dict[str, str]:
    return {
        "RLSHELL_EXT_MODULE": "embodied_fault_ext",
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "RLSHELL_TEST_ENV_FAULT": fault,
        "RLSHELL_TEST_ENV_FAULT_AT": str(FAULT_AT),
        "RLSHELL_TEST_ENV_FAULT_MARKER": str(marker),
    }


@pytest.mark.slow
def test_an_env_that_raises_is_named_with_its_traceback_and_resume_auto_finishes(
    tmp_path: Path, ray_tmp: Path
) -> None:
    # The extension for the driver and workers; the fault for the workers, which read it,
    # through cluster.worker_env_vars (as a user gives them a variable).
    fault = _fault_vars("raise", tmp_path / "raised")
    env = cli_env(
        ray_tmp, **{name: fault.pop(name) for name in ("RLSHELL_EXT_MODULE", "PYTHONPATH")}
    )
    faulty = [
        *FAULTY,
        *(f"cluster.worker_env_vars.{name}={value}" for name, value in fault.items()),
    ]
    out = tmp_path / "runs"
    failed = train(*faulty, f"runner.output_dir={out}", env=env, timeout=300)
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    error = failed.stderr
    assert "component 'actor' rank 0" in error
    assert "raised in train_step(): EnvStepError: env CartPole-v1: the env raised at env " in error
    assert f"step {FAULT_AT}: RuntimeError: injected env fault at step {FAULT_AT}" in error
    # The worker's traceback, down to the env's own frame.
    assert "Traceback (most recent call last)" in error
    assert 'embodied_fault_ext.py", line' in error
    assert 'raise RuntimeError(f"injected env fault at step {self.steps}")' in error
    run = out / "ppo_cartpole"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "global_step_1",
        "global_step_2",
    ]

    resumed = train(
        *faulty, f"runner.output_dir={out}", "checkpoint.resume=auto", env=env, timeout=300
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "global_step_2 (step 2)" in resumed.stdout
    assert [int(r["step"]) for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3, 4]
    assert (run / "checkpoints" / "global_step_4").is_dir()


# --- in this process, on the session's Ray cluster -----------------------------------------


RunFn = Callable[..., None]


@pytest.fixture
def run_embodied(ray_cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> RunFn:
    """``run_embodied(*overrides, fault=..., marker=...)``: the embodied runner, here."""
    embodied_fault_ext.register()  # the driver validates the config against its registry

    def run(*overrides: str, fault: str = "", marker: Path | None = None) -> None:
        worker_vars = _fault_vars(fault, marker or tmp_path / "marker")
        for name, value in worker_vars.items():
            monkeypatch.setitem(ray_cluster.runtime_env_vars, name, value)
        config = load_config(
            ROOT / FAULTY[0], [*FAULTY[1:], *overrides, f"runner.output_dir={tmp_path}"]
        )
        plan = plan_for(config, ray_cluster.spec())
        run_trainer(resolve_spec(config), ray_cluster, plan, run_dir_of(config))

    return run


@pytest.mark.slow
def test_a_nan_observation_stops_naming_env_index_step_and_rank(run_embodied: RunFn) -> None:
    with pytest.raises(FloatingPointError) as caught:
        run_embodied(fault="nan")
    error = caught.value
    assert isinstance(error, WorkerError)
    assert error.rank == 0
    assert str(error).startswith("component 'actor' rank 0 (node ")
    # "final observation" when the episode happened to end at that step.
    assert re.search(
        r"raised in train_step\(\): FloatingPointError: env CartPole-v1: (final )?observation "
        rf"\(states\) of env index 0 is not finite at env step {FAULT_AT} "
        r"\(\[nan, nan, nan, nan\]\); bad env indices: \[0\]\n",
        str(error),
    ), str(error)


@pytest.mark.slow
def test_an_env_that_hangs_stops_the_run_at_the_call_time_limit_naming_the_worker(
    run_embodied: RunFn, tmp_path: Path
) -> None:
    """An env step that never returns: ``cluster.call_timeout_s`` bounds the worker's call,
    and the run stops naming the component, the rank and the call; the stuck worker is
    killed with the run."""
    started = time.monotonic()
    with pytest.raises(WorkerTimeoutError) as caught:
        run_embodied("cluster.call_timeout_s=10", fault="hang", marker=tmp_path / "hung")
    message = str(caught.value)
    assert "train_step() on component 'actor' did not finish within 10 s" in message
    assert "still running on rank(s) [0]" in message
    assert (tmp_path / "hung").read_text().startswith("hang at step")
    assert time.monotonic() - started < 120


@pytest.mark.slow
def test_an_env_that_ends_its_process_is_named_at_the_driver(
    run_embodied: RunFn, tmp_path: Path
) -> None:
    with pytest.raises(WorkerDiedError) as caught:
        run_embodied(fault="exit", marker=tmp_path / "exited")
    message = str(caught.value)
    assert message.startswith("component 'actor' rank 0 (node ")
    assert "died while running train_step()" in message
    assert message.endswith(
        "It was stepping env CartPole-v1 (an env that crashes its process ends this way); "
        "checkpoint.resume=auto continues from the last checkpoint."
    )
    assert (tmp_path / "exited").read_text() == f"exit at step {FAULT_AT}\n"
    names = sorted(p.name for p in (tmp_path / "ppo_cartpole" / "checkpoints").iterdir())
    assert names == ["global_step_1", "global_step_2"]


@pytest.mark.slow
def test_maniskill_without_a_vulkan_driver_fails_in_the_worker_in_one_sentence(
    run_embodied: RunFn, ray_cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The workers find no driver (none installed where they look, none named): one sentence."""
    pytest.importorskip("mani_skill", reason="without mani-skill validation refuses the run")
    monkeypatch.setitem(ray_cluster.runtime_env_vars, DIR_ENV_VAR, str(tmp_path / "no_driver"))
    monkeypatch.setitem(ray_cluster.runtime_env_vars, "VK_ICD_FILENAMES", "")
    with pytest.raises(WorkerError) as caught:
        run_embodied("env.env_type=maniskill", "env.env_id=PushCube-v1")
    first_line = str(caught.value).splitlines()[0]
    assert "raised in init_worker(): ManiSkillUnavailableError: env type 'maniskill' " in (
        first_line
    )
    assert first_line.endswith(
        "(PushCube-v1, CPU simulation) cannot run on this machine: no Vulkan GPU driver and no "
        "software Vulkan driver (run `make install`, or `python -m rlshell.envs.vulkan install`, "
        "to fetch Mesa's lavapipe)"
    )


@pytest.mark.slow
def test_with_reset_an_env_that_hangs_in_a_worker_is_rebuilt_and_the_run_finishes(
    run_embodied: RunFn, tmp_path: Path
) -> None:
    """``env.step_timeout_s`` interrupts the step in the Ray worker; the envs are rebuilt,
    the run trains every step, and the metrics count the failure once."""
    run_embodied(
        "env.on_failure=reset",
        "env.step_timeout_s=2",
        fault="hang",
        marker=tmp_path / "hung",
    )
    assert (tmp_path / "hung").read_text() == f"hang at step {FAULT_AT}\n"
    records = read_metrics(tmp_path / "ppo_cartpole" / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [1, 2, 3, 4]
    assert [r["env/failures"] for r in records] == [0.0, 0.0, 1.0, 0.0]
    assert all(r["env/steps"] == records[0]["env/steps"] for r in records)

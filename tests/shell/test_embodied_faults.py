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
from rlshell.envs.stepper import EnvStepError, EnvStepper
from rlshell.envs.vulkan import DIR_ENV_VAR
from rlshell.metrics import read_metrics
from rlshell.models.base import ActionInfo, MissingInputError
from rlshell.models.mlp_policy import MLPPolicy, MLPPolicySpec
from rlshell.rollout.trajectory import TrajectoryBuffer
from rlshell.runners import run as run_trainer
from rlshell.runners.spec import resolve_spec
from rlshell.runners.validation import load_config, plan_for
from rlshell.workers.embodied_update import PPOSettings, collect_rollout, ppo_update
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
    env = cli_env(
        ray_tmp,
        **_fault_vars("raise", tmp_path / "raised"),
    )
    out = tmp_path / "runs"
    failed = train(*FAULTY, f"runner.output_dir={out}", env=env, timeout=300)
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
        *FAULTY, f"runner.output_dir={out}", "checkpoint.resume=auto", env=env, timeout=300
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

"""rlshell.api: Python objects as rewards, envs and models, in the driver and in every worker.

The quick tests check what is refused before anything starts and that a
call leaves no registration or environment variable behind; one checks that
what `encode_registrations` writes registers a function of this module in a
fresh interpreter that cannot import this module. The slow ones train for
real on Ray: GRPO scored by a reward defined here (then by a lambda under
the same name, in the same process), and PPO on an env and a policy passed
as objects.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import torch

from rlshell.api import evaluate, export, load_config, load_policy, train
from rlshell.checkpoint import CheckpointError
from rlshell.config import ConfigError
from rlshell.envs import ENVS
from rlshell.extensions import OBJECTS_ENV_VAR, ExtensionError, encode_registrations
from rlshell.metrics import read_metrics
from rlshell.models import MODELS
from rlshell.models.base import BasePolicy
from rlshell.rewards import REWARDS

ROOT = Path(__file__).resolve().parents[2]
POINT_REACH = ROOT / "examples" / "custom_policy"
MARKER = 0.625

# configs/grpo.py made tiny: one actor rank that also generates, one reward process.
TINY_GRPO = [
    "runner.max_steps=2",
    "runner.prompts_per_step=4",
    "algorithm.group_size=4",
    "runner.eval_interval=2",
    "data.num_val=8",
    "checkpoint.interval=2",
    'cluster.component_placement={"actor,rollout": "0:0", "reward": "0"}',
    "actor.fsdp_config.wrap_policy.min_num_params=0",
    "reward.num_processes=1",
]


def marker_reward(response: str, answer: str) -> float:
    """The same score for every sample: seen in the metrics, it proves this function ran."""
    return MARKER


@pytest.fixture
def ray_tmpdir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # Ray's socket paths must stay under 107 characters: a short temp dir of its own.
    path = Path(tempfile.mkdtemp(prefix="api", dir="/tmp"))
    monkeypatch.setenv("RAY_TMPDIR", str(path))
    monkeypatch.delenv("RLSHELL_EXT_MODULE", raising=False)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def assert_nothing_left(*names: str) -> None:
    assert OBJECTS_ENV_VAR not in os.environ
    for name in names:
        assert name not in REWARDS
        assert name not in ENVS
        assert name not in MODELS


# --- refused before anything starts ----------------------------------------------------------


def test_a_config_naming_an_unregistered_reward_is_refused_before_anything_starts(
    tmp_path: Path, ray_never_starts: None
) -> None:
    unknown = r"reward\.reward_type: unknown reward type 'marker_rewrd'"
    with pytest.raises(ConfigError, match=unknown):
        train(
            "configs/grpo.py",
            [*TINY_GRPO, "reward.reward_type=marker_rewrd", f"runner.output_dir={tmp_path}"],
            rewards={"marker_reward": marker_reward},
        )
    assert list(tmp_path.iterdir()) == []
    assert_nothing_left("marker_reward")


def test_a_reward_the_config_does_not_name_is_refused_not_ignored() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config("configs/grpo.py", rewards=marker_reward)
    assert caught.value.problems == [
        "reward.reward_type: 'math', while rewards= passes 'marker_reward', which this run "
        "would never call; set reward.reward_type='marker_reward' (or, to combine several "
        "rewards, name each with its weight in reward.weights)"
    ]
    weighted = ['reward.weights={"math": 1.0, "format": 0.5}']
    with pytest.raises(ConfigError) as caught:
        load_config("configs/grpo.py", weighted, rewards=marker_reward)
    assert caught.value.problems == [
        "reward.weights: ['math', 'format'], while rewards= passes 'marker_reward', which this "
        "run would never call; give it a weight in reward.weights"
    ]
    assert_nothing_left("marker_reward")


def test_a_reward_passed_as_an_object_can_be_one_of_several_weighted_rewards() -> None:
    overrides = ['reward.weights={"math": 1.0, "marker_reward": 0.5}']
    config = load_config("configs/grpo.py", overrides, rewards=marker_reward)
    assert config.reward.weights == {"math": 1.0, "marker_reward": 0.5}
    assert_nothing_left("marker_reward")


def test_a_reward_passed_to_load_config_is_known_only_during_the_call() -> None:
    config = load_config(
        "configs/grpo.py", ["reward.reward_type=marker_reward"], rewards=marker_reward
    )
    assert config.reward.reward_type == "marker_reward"
    assert_nothing_left("marker_reward")
    # The same name may now stand for another function.
    config = load_config(
        "configs/grpo.py",
        ["reward.reward_type=marker_reward"],
        rewards={"marker_reward": lambda response, answer: 0.0},
    )
    assert_nothing_left("marker_reward")


def test_an_object_that_cannot_be_pickled_is_named() -> None:
    lock = threading.Lock()

    def locked(response: str, answer: str) -> float:
        return float(lock.locked())

    with pytest.raises(ExtensionError) as caught:
        load_config("configs/grpo.py", ["reward.reward_type=locked"], rewards=locked)
    message = str(caught.value)
    assert message.startswith(
        "rewards['locked'] (tests.shell.test_api.test_an_object_that_cannot_be_pickled_is_named"
        ".<locals>.locked) cannot be sent to the Ray workers: pickling it failed with TypeError: "
        "cannot pickle '_thread.lock' object"
    )
    assert_nothing_left("locked")


def test_objects_too_large_for_an_environment_variable_are_refused() -> None:
    table = os.urandom(200_000)  # random bytes do not compress

    def lookup(response: str, answer: str) -> float:
        return float(table[len(response) % len(table)])

    with pytest.raises(ExtensionError, match=r"over the 100,000 an environment variable can carry"):
        load_config("configs/grpo.py", ["reward.reward_type=lookup"], rewards=lookup)
    assert_nothing_left("lookup")


@pytest.mark.parametrize(
    ("rewards", "error", "message"),
    [
        (lambda response, answer: 1.0, ValueError, "has no name to register it under"),
        ("math", TypeError, "expected a function fn(response, answer) -> float or a mapping"),
        ({"math": marker_reward}, ValueError, "reward type 'math' is already registered"),
        ({"": marker_reward}, ValueError, "names must be non-empty strings"),
        ({"five": 5}, TypeError, "rewards['five']: expected a callable, got int"),
    ],
)
def test_rewards_given_in_a_shape_that_cannot_work_are_refused(
    rewards: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as caught:
        load_config("configs/grpo.py", rewards=rewards)  # type: ignore[arg-type]
    assert message in str(caught.value)
    assert_nothing_left("five")
    assert REWARDS.get("math").__name__ == "math_reward"


def test_the_registrations_reach_an_interpreter_that_cannot_import_their_module(
    tmp_path: Path,
) -> None:
    """What a Ray worker or a reward process does with RLSHELL_EXT_OBJECTS, without Ray: this
    test module is pickled by value, so the child, started outside the repository, never
    imports `tests`."""
    from functools import partial

    from rlshell.rewards import register_reward

    payload = encode_registrations(
        {
            "marker": partial(register_reward, "marker_reward", marker_reward),
            "lambda": partial(register_reward, "quarter", lambda response, answer: 0.25),
        }
    )
    code = (
        "import sys\n"
        "from rlshell.extensions import load_extensions\n"
        "from rlshell.rewards import get_reward\n"
        "load_extensions(where='child')\n"
        "print(get_reward('marker_reward')('a', 'b'), get_reward('quarter')('a', 'b'),\n"
        "      'tests' in sys.modules)\n"
    )
    env = {**os.environ, OBJECTS_ENV_VAR: payload, "PYTHONPATH": ""}
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(MARKER), "0.25", "False"]


def test_ray_workers_get_the_objects_only_while_a_call_ships_them() -> None:
    from functools import partial

    from rlshell.cluster.placement import ComponentPlan, WorkerPlacement
    from rlshell.cluster.ray_cluster import Cluster
    from rlshell.extensions import shipping
    from rlshell.rewards import register_reward

    component = ComponentPlan(
        name="reward",
        placement="0",
        node_group="all",
        workers=[WorkerPlacement(0, 0, 0, 1, cpus=1.0, gpus=(), resources=(0,))],
    )
    cluster = Cluster.__new__(Cluster)  # worker_env reads only the cluster's env vars
    cluster.runtime_env_vars = {}
    payload = encode_registrations({"m": partial(register_reward, "marker_reward", marker_reward)})
    worker = component.workers[0]
    nested = r"one train\(\) or evaluate\(\) call at a time"
    with shipping(payload):
        assert cluster.worker_env(component, worker, gpu_node=False)[OBJECTS_ENV_VAR] == payload
        with pytest.raises(ExtensionError, match=nested), shipping(payload):
            pass
    assert OBJECTS_ENV_VAR not in cluster.worker_env(component, worker, gpu_node=False)
    assert_nothing_left("marker_reward")  # shipping sends; registering here is the caller's


def test_extension_modules_still_load_for_the_api() -> None:
    """In a fresh interpreter: the extension's names stay out of this test process."""
    code = (
        "from rlshell.api import load_config\n"
        "config = load_config('configs/grpo.py', ['reward.reward_type=contains_answer'])\n"
        "print(config.reward.reward_type)\n"
    )
    env = {
        **os.environ,
        "RLSHELL_EXT_MODULE": "rlshell_example_ext",
        "PYTHONPATH": str(ROOT / "examples" / "extension"),
    }
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "contains_answer"


def test_reward_processes_started_from_a_script_without_a_main_guard_do_not_rerun_it(
    tmp_path: Path,
) -> None:
    """Spawn would run the script again in each reward process; a notebook-style script that
    evaluates (or trains) at its top level would then do it again there."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from rlshell.rewards.pool import RewardPool\n"
        "print('top level ran')\n"
        "with RewardPool('exact_match', timeout_s=10.0, num_processes=1) as pool:\n"
        "    print(pool.score(['4', '5'], ['4', '4']).scores)\n"
    )
    result = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["top level ran", "(1.0, 0.0)"]


# --- real runs on Ray ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_reward_defined_here_scores_in_the_reward_workers_and_a_second_run_uses_its_own(
    tmp_path: Path, ray_tmpdir: Path
) -> None:
    # Ray as the run found it: down, or this test process's session cluster (another test's
    # `ray_cluster` fixture), which the run uses and leaves running.
    ray_was_up = ray.is_initialized()
    first = train(
        "configs/grpo.py",
        [*TINY_GRPO, "reward.reward_type=marker_reward", f"runner.output_dir={tmp_path / 'a'}"],
        rewards=marker_reward,
    )
    assert first.final_step == 2
    assert first.metrics["reward/mean"] == MARKER
    assert first.metrics["eval/accuracy"] == MARKER  # the held-out split, scored by it too
    assert first.metrics["reward/errors"] == 0.0
    assert first.checkpoint == tmp_path / "a" / "grpo" / "checkpoints" / "global_step_2"
    assert_nothing_left("marker_reward")
    assert ray.is_initialized() == ray_was_up

    # Same process, same name, another function (a lambda): the workers see the new one.
    second = train(
        "configs/grpo.py",
        [*TINY_GRPO, "reward.reward_type=marker_reward", f"runner.output_dir={tmp_path / 'b'}"],
        rewards={"marker_reward": lambda response, answer: 0.25},
    )
    records = read_metrics(second.run_dir / "metrics.jsonl")
    assert [r["reward/mean"] for r in records if "reward/mean" in r] == [0.25, 0.25]
    assert_nothing_left("marker_reward")

    # Evaluation scores in reward processes this process starts: they get the function too.
    report = evaluate(first, limit=4, rewards=marker_reward)
    assert report["eval/accuracy"] == MARKER
    assert report["eval/examples"] == 4.0
    with pytest.raises(ValueError, match="episodes: not an option of the evaluation of reasoning"):
        evaluate(first, episodes=3, rewards=marker_reward)
    with pytest.raises(CheckpointError, match=r"AutoModelForCausalLM\.from_pretrained"):
        load_policy(first)
    assert_nothing_left("marker_reward")


@pytest.mark.slow
def test_an_env_and_a_policy_passed_as_objects_train_evaluate_export_and_deploy(
    tmp_path: Path, ray_tmpdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/custom_policy's env and policy, imported here and never named by
    RLSHELL_EXT_MODULE: the Ray worker gets them as objects."""
    monkeypatch.syspath_prepend(str(POINT_REACH))
    from rlshell_point_reach import build_linear_gaussian_policy, make_point_reach_env

    envs = {"point_reach": make_point_reach_env}
    models = {"linear_gaussian": build_linear_gaussian_policy}
    result = train(
        "examples/custom_policy/config.py",
        ["runner.max_steps=2", "checkpoint.interval=2", f"runner.output_dir={tmp_path}"],
        envs=envs,
        models=models,
    )
    assert result.final_step == 2
    assert result.metrics["env/episodes"] > 0
    assert result.exported == tmp_path / "point_reach" / "policy"
    assert_nothing_left("point_reach", "linear_gaussian")

    report = evaluate(result, episodes=4, gif=False, envs=envs, models=models)
    assert report["eval/episodes"] == 4
    assert report["eval/episode_length"] == 20.0  # env.max_episode_steps

    out = export(result, tmp_path / "exported", models=models)
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "rlshell_model.json"]
    with pytest.raises(Exception, match="unknown model type 'linear_gaussian'"):
        load_policy(out)  # not registered outside the call that was given it

    states = torch.randn(5, 4)
    for source in (out, result, result.checkpoint):
        assert source is not None
        policy = load_policy(source, models=models)
        assert isinstance(policy, BasePolicy)
        assert type(policy).__name__ == "LinearGaussianPolicy"
        assert not policy.training
        with torch.no_grad():
            actions, _ = policy.predict_action_batch(
                {"states": states}, mode="eval", compute_values=False
            )
        assert actions.shape == (5, 2)
        if source is out:
            expected = actions
        torch.testing.assert_close(actions, expected)  # the same weights, however loaded
    assert_nothing_left("point_reach", "linear_gaussian")

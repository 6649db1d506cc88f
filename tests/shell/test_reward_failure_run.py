"""A reasoning run whose reward fails, for real: `python -m rlshell.train` on Ray.

The rewards come from `reward_ext_chaos` (an extension module beside this
file, loaded by the driver and every worker through ``RLSHELL_EXT_MODULE``):
``always_fails`` raises on every call, ``every_other`` on every other call of
its process. One reward process, so every other call is exactly half of
every step's four samples. The second run weighs ``every_other`` with
``format`` and the length penalty: the failing reward's term is lost on half
the samples, the others score on, and the run goes on.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlshell.metrics import read_metrics
from tests import launcher
from tests.shell.test_run import (
    ONE_ACTOR_RANK,
    cli_env,
    train,
    wait_for_no_ray_processes,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("reward_failure_run")]

HERE = Path(__file__).resolve().parent
TINY = [
    "configs/grpo.py",
    *ONE_ACTOR_RANK,
    "runner.max_steps=4",
    "runner.prompts_per_step=2",
    "algorithm.group_size=2",
    "rollout.max_new_tokens=4",
    "runner.eval_interval=0",
    "reward.num_processes=1",
    "checkpoint.interval=1",
    "checkpoint.export_hf=false",
]


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    """A short temp dir for the CLI's Ray (socket paths stay under 107 characters)."""
    path = Path(tempfile.mkdtemp(prefix="rw", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def chaos_env(ray_tmp: Path) -> dict[str, str]:
    return cli_env(
        ray_tmp,
        RLSHELL_EXT_MODULE="reward_ext_chaos",
        PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    )


def test_a_reward_that_always_raises_stops_the_run_naming_it_with_its_traceback_once(
    tmp_path: Path, ray_tmp: Path
) -> None:
    result = train(
        *TINY,
        "reward.reward_type=always_fails",
        "reward.max_failed_steps=2",
        f"runner.output_dir={tmp_path}",
        env=chaos_env(ray_tmp),
        timeout=300,
        shared_ray=False,  # its Ray's processes are checked gone at the end
    )
    output = result.stdout[-3000:] + result.stderr[-5000:]
    assert result.returncode == 1, output
    err = result.stderr
    # Step 1: the traceback, once, naming the reward, its function and the sample.
    assert err.count("Traceback (most recent call last)") == 1, output
    assert err.count('raise RuntimeError(f"no scorer for {answer!r}")') == 1, output
    assert (
        "reward 'always_fails' (reward_ext_chaos.always_fails) failed at step 1 on 4 of 4 "
        "samples, 4 of them: RuntimeError at reward_ext_chaos.py:"
    ) in err
    assert "  sample 0: response '" in err
    # Step 2: the run stops before its update, and says why.
    (line,) = [line for line in err.splitlines() if line.startswith("error: ")]
    assert line.startswith(
        "error: reward 'always_fails' (reward_ext_chaos.always_fails) failed on every sample "
        "of steps 1-2 (reward.max_failed_steps=2); stopping before step 2's update. Step 2: "
        "4 × RuntimeError at reward_ext_chaos.py:"
    ), line
    assert line.endswith("(its traceback is printed above, at step 1)"), line
    assert "RuntimeError: no scorer for '" in line
    run = tmp_path / "grpo"
    assert [int(r["step"]) for r in read_metrics(run / "metrics.jsonl")] == [1]
    (record,) = read_metrics(run / "metrics.jsonl")
    assert (record["reward/errors"], record["reward/failed_frac"]) == (4.0, 1.0)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["global_step_1"]
    assert wait_for_no_ray_processes(ray_tmp) == []

    # Evaluating the checkpoint with the run's reward: the failure shown, its share reported.
    evaluated = launcher.run(
        [
            sys.executable,
            "-m",
            "rlshell.evaluate",
            str(run / "checkpoints" / "global_step_1"),
            "--limit=4",
        ],
        env=chaos_env(ray_tmp),
        timeout=300,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert (report["reward/failed_frac"], report["eval/accuracy"]) == (1.0, 0.0)
    assert evaluated.stderr.count("Traceback (most recent call last)") == 1, evaluated.stderr
    assert (
        "reward 'always_fails' (reward_ext_chaos.always_fails) failed at the evaluation on "
        "4 of 4 samples, 4 of them: RuntimeError at reward_ext_chaos.py:"
    ) in evaluated.stderr


def test_one_of_several_rewards_failing_half_the_time_trains_on_and_shows_its_failure_rate(
    tmp_path: Path, ray_tmp: Path
) -> None:
    result = train(
        *TINY,
        "reward.reward_type=every_other",
        'reward.weights={"every_other": 1.0, "format": 0.5, "length_penalty": 0.1}',
        "runner.eval_interval=4",
        "data.num_val=4",
        "checkpoint.interval=0",
        "checkpoint.export_hf=true",  # back to its default: no checkpoint, nothing to export
        f"runner.output_dir={tmp_path}",
        env=chaos_env(ray_tmp),
        timeout=300,
    )
    output = result.stdout[-3000:] + result.stderr[-5000:]
    assert result.returncode == 0, output
    err = result.stderr
    assert err.count("Traceback (most recent call last)") == 1, output
    # Shown at the evaluation before step 1, and not again: one run, one watch.
    assert (
        "reward 'every_other' (reward_ext_chaos.every_other) failed at the evaluation at "
        "step 0 on 2 of 4 samples, 2 of them: KeyError at reward_ext_chaos.py:"
    ) in err
    assert "KeyError: 'odd call 1'" in err
    # Half of every_other's calls failed: a quarter of the step's calls of two rewards.
    last_bar = [line for line in err.splitlines() if "4/4" in line][-1]
    assert "fail=25%" in last_bar, last_bar
    records = read_metrics(tmp_path / "grpo" / "metrics.jsonl")
    assert [r.get("reward/failed_frac") for r in records] == [None, 0.25, 0.25, 0.25, 0.25]
    assert [r.get("reward/every_other/failed_frac") for r in records[1:]] == [0.5] * 4
    assert [r.get("reward/format/failed_frac") for r in records[1:]] == [0.0] * 4
    # The evaluation scores the correctness reward, reward.reward_type, alone.
    assert [r.get("eval/reward_failed_frac") for r in records] == [0.5, None, None, None, 0.5]
    for record in records[1:]:
        total = record["reward/every_other/mean"] + 0.5 * record["reward/format/mean"]
        total += 0.1 * record["reward/length_penalty/mean"]
        assert record["reward/mean"] == pytest.approx(total)
        assert abs(record["reward/length_penalty/mean"]) <= 0.5

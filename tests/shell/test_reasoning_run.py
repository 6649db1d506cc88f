"""`python -m rlshell.train` with the reasoning runner, for real: short GRPO runs on Ray.

One uninterrupted run is shared (module fixture); the other tests interrupt,
resume, export and break runs and compare with it.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlshell.metrics import read_metrics
from tests import launcher
from tests.shell.test_run import ROOT, cli_env, train

# One xdist worker runs the whole module, so the shared run happens once (--dist loadgroup).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("reasoning_run")]

SHORT = [
    "configs/grpo.py",
    "runner.max_steps=6",
    "runner.prompts_per_step=4",
    "algorithm.group_size=4",
    "rollout.max_new_tokens=4",
    "runner.eval_interval=3",
    "data.num_val=16",
    "checkpoint.interval=2",
    "checkpoint.keep_last=null",
    # A gradient at every step, whatever the rewards: runs diverge if anything is lost.
    "algorithm.entropy_coef=0.01",
    # A rate that does not depend on max_steps: the interrupted run is set to go on for long.
    "actor.optim.lr_scheduler=constant",
]
# Wall-clock figures differ between runs; everything else must not.
CLOCK_KEYS = (
    "time/",
    "perf/",
    "reward/seconds",
    "rollout/sync_seconds",
    "rollout/sync_engine_reload_seconds",
)


def _deterministic(records: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in record.items() if not k.startswith(CLOCK_KEYS)} for record in records]


@pytest.fixture(scope="module")
def ray_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix="rr", dir="/tmp"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, ray_tmp: Path) -> Path:
    out = tmp_path_factory.mktemp("runs")
    result = train(*SHORT, f"runner.output_dir={out}", env=cli_env(ray_tmp), timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out / "grpo"


def test_a_short_run_leaves_metrics_checkpoints_a_curve_and_a_hugging_face_model(
    uninterrupted: Path,
) -> None:
    records = read_metrics(uninterrupted / "metrics.jsonl")
    steps = [int(r["step"]) for r in records]
    assert steps == [0, 1, 2, 3, 4, 5, 6]
    assert [int(r["step"]) for r in records if "eval/accuracy" in r] == [0, 3, 6]
    for key in ("reward/mean", "train/pg_loss", "train/entropy", "perf/tokens_per_s"):
        assert key in records[-1], key
    for key in ("time/rollout", "time/reward", "time/update", "time/sync", "time/step"):
        assert records[-1][key] >= 0, key
    assert sorted(p.name for p in (uninterrupted / "checkpoints").iterdir()) == [
        "global_step_2",
        "global_step_4",
        "global_step_6",
    ]
    assert list((uninterrupted / "tensorboard").glob("events.out.tfevents.*"))
    assert (uninterrupted / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (uninterrupted / "hf_model" / "config.json").is_file()


def test_the_end_of_run_export_is_the_last_checkpoints_policy(uninterrupted: Path) -> None:
    """checkpoint.export_hf; tests/shell/test_export.py covers the export itself."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlshell.export import load_policy

    final = AutoModelForCausalLM.from_pretrained(uninterrupted / "hf_model", local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(uninterrupted / "hf_model", local_files_only=True)
    last = load_policy(uninterrupted / "checkpoints" / "global_step_6").model
    ids = tokenizer(["12+30="], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(final(ids).logits, last(ids).logits)


def test_ctrl_c_then_resume_auto_reproduces_the_uninterrupted_run_exactly(
    uninterrupted: Path, tmp_path: Path, ray_tmp: Path
) -> None:
    # The interrupted run is set to go on for long (the constant learning rate does
    # not depend on max_steps), so Ctrl-C always finds it running.
    args = [
        sys.executable,
        "-m",
        "rlshell.train",
        *SHORT,
        "runner.max_steps=1000",
        f"runner.output_dir={tmp_path}",
    ]
    run_dir = tmp_path / "grpo"
    process = launcher.popen(args, env=cli_env(ray_tmp), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / "global_step_2").is_dir():
        assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
        assert time.monotonic() < deadline, "no checkpoint of step 2 in 300 s"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    output = process.communicate(timeout=180)[0].decode()
    assert process.returncode == 130, output[-3000:]
    # The first Ctrl-C lets the step under way finish (3; 2 if it came as 2's save ended)
    # and saves it.
    stopped = re.search(r"interrupted after step (\d+): saved (\S+);", output)
    assert stopped is not None, output[-3000:]
    step = int(stopped[1])
    assert step in (2, 3)
    assert Path(stopped[2]) == run_dir / "checkpoints" / f"global_step_{step}"
    names = [p.name for p in (run_dir / "checkpoints").iterdir() if not p.name.startswith(".")]
    assert sorted(names) == sorted({"global_step_2", f"global_step_{step}"})
    assert [int(r["step"]) for r in read_metrics(run_dir / "metrics.jsonl")] == list(
        range(step + 1)
    )
    command = next(line for line in output.splitlines() if line.startswith("resume with: "))
    resume = shlex.split(command.removeprefix("resume with: "))
    assert resume == [
        *("python", "-m", "rlshell.train", "--config", str(run_dir / "config.json")),
        "checkpoint.resume=auto",
    ]

    # The printed command, to the shared run's length (the interrupted one was set to 1000).
    resumed = train(*resume[3:], "runner.max_steps=6", env=cli_env(ray_tmp), timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.endswith(".partial")]
    expected = _deterministic(read_metrics(uninterrupted / "metrics.jsonl"))
    got = _deterministic(read_metrics(run_dir / "metrics.jsonl"))
    assert got == expected


def _fault_env(ray_tmp: Path) -> dict[str, str]:
    return cli_env(
        ray_tmp,
        RLSHELL_EXT_MODULE="fault_ext",
        PYTHONPATH=os.pathsep.join(
            [str(ROOT / "tests" / "shell"), os.environ.get("PYTHONPATH", "")]
        ),
    )


def _faulty(fault: str, at: int, marker: Path) -> list[str]:
    """The run's arguments with its fault (tests/shell/fault_ext.py), given to the workers
    that read it through ``cluster.worker_env_vars``, as a user adds a worker variable."""
    return [
        *SHORT[:1],
        "actor.model.model_type=faulty_lm",
        *SHORT[1:],
        "checkpoint.interval=1",
        f"cluster.worker_env_vars.RLSHELL_TEST_FAULT={fault}",
        f"cluster.worker_env_vars.RLSHELL_TEST_FAULT_AT={at}",
        f"cluster.worker_env_vars.RLSHELL_TEST_FAULT_MARKER={marker}",
    ]


def test_a_nan_loss_stops_the_run_naming_the_step_and_keeps_the_last_checkpoint(
    tmp_path: Path, ray_tmp: Path
) -> None:
    result = train(
        *_faulty("nan", at=3, marker=tmp_path / "marker"),
        f"runner.output_dir={tmp_path}",
        env=_fault_env(ray_tmp),
        timeout=400,
    )
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "step 3: the loss is nan" in result.stderr
    names = sorted(p.name for p in (tmp_path / "grpo" / "checkpoints").iterdir())
    assert names == ["global_step_1", "global_step_2"]
    # Each rank keeps its offending micro-batch (both ranks' losses are NaN here; the rank
    # whose error comes second may be stopped before or while it writes, which leaves its
    # hidden ``.partial`` and never a half file under the final name), and the error says
    # where the one it reports is.
    expected = {"step_3_rank_0_micro_0.pt", "step_3_rank_1_micro_0.pt"}
    entries = {p.name for p in (tmp_path / "grpo" / "nonfinite").iterdir()}
    unfinished = {name for name in entries if name.endswith(".partial")}
    assert {name[1 : -len(".partial")] for name in unfinished} <= expected, entries
    assert entries - unfinished <= expected, entries
    dumps = sorted(tmp_path / "grpo" / "nonfinite" / name for name in entries - unfinished)
    named = [d for d in dumps if f"Its batch is in {d}" in result.stderr]
    assert named, result.stderr[-2000:]
    record = torch.load(named[0], weights_only=False)
    assert (record["step"], math.isnan(record["loss"])) == (3, True)
    assert record["batch"]["prompt_ids"].ndim == 2
    assert record["advantages"].shape[0] == record["batch"]["prompt_ids"].shape[0]


def test_a_worker_killed_mid_step_is_named_and_resume_auto_continues(
    tmp_path: Path, ray_tmp: Path
) -> None:
    env, faulty = _fault_env(ray_tmp), _faulty("kill", at=3, marker=tmp_path / "killed")
    result = train(*faulty, f"runner.output_dir={tmp_path}", env=env, timeout=400)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert (tmp_path / "killed").is_file()
    assert "component 'actor' rank 1" in result.stderr
    assert "died while running run_training()" in result.stderr
    resumed = train(
        *faulty, f"runner.output_dir={tmp_path}", "checkpoint.resume=auto", env=env, timeout=400
    )
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout
    steps = [int(r["step"]) for r in read_metrics(tmp_path / "grpo" / "metrics.jsonl")]
    assert steps == [0, 1, 2, 3, 4, 5, 6]


def test_bad_inputs_stop_before_training_with_the_key_named(tmp_path: Path, ray_tmp: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "solution": "2"}) + "\n")
    missing_column = train(
        "configs/grpo.py", "data.task=file", f"data.train_path={data}", env=cli_env(ray_tmp)
    )
    assert missing_column.returncode == 2
    assert "data.train_path" in missing_column.stderr
    assert "answer" in missing_column.stderr

    no_checkpoint = train(
        "configs/grpo.py", f"checkpoint.resume={tmp_path / 'nope'}", env=cli_env(ray_tmp)
    )
    assert no_checkpoint.returncode == 2
    assert "checkpoint.resume" in no_checkpoint.stderr

    too_small = train(
        "configs/grpo.py",
        "actor.model.model_kwargs.vocab_size=8",
        f"runner.output_dir={tmp_path}",
        env=cli_env(ray_tmp),
        timeout=300,
    )
    assert too_small.returncode == 2, too_small.stderr[-2000:]
    assert "actor.model.model_kwargs.vocab_size: 8 is smaller than the tokenizer's" in (
        too_small.stderr
    )


def test_evaluate_scores_a_checkpoint_and_the_export_as_the_run_did(uninterrupted: Path) -> None:
    logged = [r for r in read_metrics(uninterrupted / "metrics.jsonl") if r["step"] == 6]
    accuracy = next(r["eval/accuracy"] for r in logged if "eval/accuracy" in r)
    for target, extra in (
        (uninterrupted / "checkpoints" / "global_step_6", []),
        (uninterrupted / "hf_model", ["--config", str(uninterrupted / "config.json")]),
    ):
        result = launcher.run(
            [sys.executable, "-m", "rlshell.evaluate", str(target), *extra],
            env=dict(os.environ),
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert report["eval/examples"] == 16
        # Greedy decoding of the same weights; batches are padded differently, so allow
        # one example's worth of difference for a tie broken the other way.
        assert abs(report["eval/accuracy"] - accuracy) <= 1 / 16 + 1e-9

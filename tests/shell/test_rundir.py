"""Run directories (`rlshell.rundir`): what holds a run, claiming one, and its lock.

The lock is tested against real second processes: one that holds it and
sleeps, and one killed while holding it (its lock left stale).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlshell.rundir import (
    LOCK_FILE,
    RunDirError,
    RunLock,
    claim_run_dir,
    clear_run,
    read_contents,
)
from tests.shell.conftest import TrainHere

ROOT = Path(__file__).resolve().parents[2]


def a_run(run_dir: Path, checkpoints: tuple[int, ...] = (20, 40), metrics_to: int = 43) -> Path:
    """A run directory as a run leaves it: checkpoints, metrics, TensorBoard events, an export."""
    run_dir.mkdir(parents=True)
    for step in checkpoints:
        checkpoint = run_dir / "checkpoints" / f"global_step_{step}"
        checkpoint.mkdir(parents=True)
        (checkpoint / "trainer_state.json").write_text("{}")
    lines = [json.dumps({"step": step, "reward/mean": 0.5}) for step in range(metrics_to + 1)]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "tensorboard").mkdir()
    (run_dir / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"\0")
    (run_dir / "hf_model").mkdir()
    (run_dir / "hf_model" / "config.json").write_text("{}")
    (run_dir / "config.json").write_text("{}")
    (run_dir / "placement.json").write_text("{}")
    return run_dir


def test_a_run_is_described_by_its_checkpoints_metrics_and_other_results(tmp_path: Path) -> None:
    contents = read_contents(a_run(tmp_path / "run"))
    assert contents.holds_run
    assert (
        contents.describe()
        == "checkpoints up to step 40, metrics to step 43, tensorboard/, hf_model/"
    )
    one = read_contents(a_run(tmp_path / "one", checkpoints=(2,), metrics_to=3))
    assert one.describe().startswith("a checkpoint of step 2, metrics to step 3")


def test_plan_files_a_lock_and_a_dry_run_are_not_a_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "dry_run").mkdir(parents=True)
    for name in ("config.json", "placement.json", LOCK_FILE, "dry_run/config.json"):
        (run_dir / name).write_text("{}")
    (run_dir / "checkpoints").mkdir()  # made, nothing saved yet
    assert not read_contents(run_dir).holds_run
    assert not read_contents(tmp_path / "missing").holds_run
    claim_run_dir(run_dir, resume=None, overwrite=False)  # no refusal


def test_a_run_is_refused_unless_resumed_or_overwritten(tmp_path: Path) -> None:
    run_dir = a_run(tmp_path / "run")
    with pytest.raises(RunDirError, match=r"already holds a run \(checkpoints up to step 40"):
        claim_run_dir(run_dir, resume=None, overwrite=False)
    assert claim_run_dir(run_dir, resume="auto", overwrite=False).checkpoint_steps == (20, 40)
    other = a_run(tmp_path / "other", checkpoints=(5,), metrics_to=5)
    given = str(other / "checkpoints" / "global_step_5")
    claim_run_dir(run_dir, resume=given, overwrite=False)  # a checkpoint named: continue from it
    assert len(list(run_dir.iterdir())) == 6, "claiming must not change anything"


def test_resume_auto_starts_fresh_only_where_there_is_nothing_to_lose(tmp_path: Path) -> None:
    claim_run_dir(tmp_path / "missing", resume="auto", overwrite=False)
    (tmp_path / "empty").mkdir()
    claim_run_dir(tmp_path / "empty", resume="auto", overwrite=False)
    no_checkpoint = a_run(tmp_path / "run", checkpoints=(), metrics_to=7)
    with pytest.raises(RunDirError) as refused:
        claim_run_dir(no_checkpoint, resume="auto", overwrite=False)
    message = str(refused.value)
    assert message.startswith(
        f"{no_checkpoint} holds a run (no complete checkpoint, metrics to step 7, tensorboard/, "
        "hf_model/) but no complete checkpoint for checkpoint.resume=auto to continue from"
    )
    assert "--overwrite" in message


def test_overwrite_clears_the_runs_outputs_and_leaves_other_files(tmp_path: Path) -> None:
    run_dir = a_run(tmp_path / "run")
    (run_dir / ".metrics.jsonl.123.partial").write_text("")
    (run_dir / ".hf_model.partial").mkdir()
    (run_dir / "checkpoints" / ".global_step_41.partial").mkdir()
    (run_dir / "notes.txt").write_text("mine")
    # A fresh run after --overwrite must not find the old run's W&B id and continue it.
    (run_dir / "wandb_run.json").write_text('{"id": "old", "step": 43}\n')
    before = claim_run_dir(run_dir, resume=None, overwrite=True)
    assert before.checkpoint_steps == (20, 40)
    assert sorted(p.name for p in run_dir.iterdir()) == ["notes.txt"]
    assert clear_run(tmp_path / "missing") == []


def test_overwrite_with_resume_into_the_same_run_is_refused(tmp_path: Path) -> None:
    run_dir = a_run(tmp_path / "run")
    with pytest.raises(RunDirError, match=r"checkpoint\.resume=auto continues the run in"):
        claim_run_dir(run_dir, resume="auto", overwrite=True)
    own = str(run_dir / "checkpoints" / "global_step_40")
    with pytest.raises(RunDirError, match="which --overwrite would delete first"):
        claim_run_dir(run_dir, resume=own, overwrite=True)
    assert read_contents(run_dir).checkpoint_steps == (20, 40)


# ---------------------------------------------------------------------------
# The lock


HOLD = """
import sys, time
from pathlib import Path
from rlshell.rundir import RunLock
with RunLock(Path(sys.argv[1])):
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A second process that holds ``tmp_path/run``'s lock until killed."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "run"), "300"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "locked\n"
        yield process
    finally:
        process.kill()
        process.wait()


def test_a_live_owner_is_refused_naming_its_host_and_pid(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    run_dir = tmp_path / "run"
    owner = json.loads((run_dir / LOCK_FILE).read_text())
    assert owner["pid"] == holder.pid
    assert owner["host"] == socket.gethostname()
    assert "-c" in owner["command"]
    with pytest.raises(RunDirError) as refused, RunLock(run_dir):
        pass
    assert str(refused.value).startswith(
        f"{run_dir} is in use by a run that is still running (pid {holder.pid} on host "
        f"{socket.gethostname()}, started "
    )
    assert (run_dir / LOCK_FILE).is_file(), "the refused process must leave the owner's lock"


def test_the_command_line_refuses_a_live_owner_before_ray_starts(
    tmp_path: Path, holder: subprocess.Popen[str], train_here: TrainHere
) -> None:
    result = train_here(
        "configs/grpo.py",
        "runner.runner_type=probe",
        f"runner.output_dir={tmp_path}",
        "runner.experiment_name=run",
    )
    assert result.returncode == 2, result.stderr
    assert f"is in use by a run that is still running (pid {holder.pid} on host" in result.stderr
    assert "Started a local Ray instance" not in result.stdout + result.stderr


def test_a_stale_lock_is_reported_and_taken_over(
    tmp_path: Path, holder: subprocess.Popen[str], capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    holder.send_signal(signal.SIGKILL)  # dies holding the lock: nothing removes it
    holder.wait()
    stale = json.loads((run_dir / LOCK_FILE).read_text())
    assert stale["pid"] == holder.pid
    with RunLock(run_dir):
        assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert capsys.readouterr().err.splitlines() == [
        f"taking over the stale lock of {run_dir}: pid {holder.pid} (started "
        f"{stale['started']}) is no longer running"
    ]
    assert not (run_dir / LOCK_FILE).exists()


def write_lock(run_dir: Path, **owner: object) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    fields = {"host": socket.gethostname(), "pid": os.getpid(), "started": "then", "command": "x"}
    (run_dir / LOCK_FILE).write_text(json.dumps({**fields, **owner}))


def test_a_lock_from_another_host_is_refused_with_how_to_remove_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    write_lock(run_dir, host="gpu-node-7", pid=4242)
    with pytest.raises(RunDirError) as refused, RunLock(run_dir):
        pass
    assert str(refused.value) == (
        f"{run_dir} is locked by a run on another host (pid 4242 on host gpu-node-7, started "
        "then: x); it cannot be checked from here. If that run is no longer running, remove "
        f"the lock (rm {run_dir / LOCK_FILE}) and start again"
    )


def test_a_recycled_pid_does_not_keep_a_stale_lock_alive(tmp_path: Path) -> None:
    # This process's pid, but another start time: the owner is gone and its pid reused.
    write_lock(tmp_path / "run", process_start=1)
    with RunLock(tmp_path / "run") as lock:
        assert lock.owner.pid == os.getpid()
    write_lock(tmp_path / "alive")  # this very process (no start time recorded): alive
    with pytest.raises(RunDirError, match="still running"), RunLock(tmp_path / "alive"):
        pass


def test_the_lock_is_released_on_an_error_and_left_when_no_longer_ours(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt), RunLock(run_dir):
        raise KeyboardInterrupt
    assert not (run_dir / LOCK_FILE).exists()
    with RunLock(run_dir):
        write_lock(run_dir, host="elsewhere")  # someone removed ours and took the directory
    assert json.loads((run_dir / LOCK_FILE).read_text())["host"] == "elsewhere"


def test_an_unreadable_lock_is_refused_with_how_to_remove_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK_FILE).write_text("")
    with pytest.raises(RunDirError, match=r"names no owner \(host, pid\): if no run is"):
        RunLock(run_dir).__enter__()


def test_a_run_directory_that_cannot_be_made_names_runner_output_dir(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(RunDirError) as refused, RunLock(tmp_path / "file" / "run"):
        pass
    assert str(refused.value) == (
        f"runner.output_dir: cannot make the run directory {tmp_path / 'file' / 'run'} "
        "(Not a directory)"
    )

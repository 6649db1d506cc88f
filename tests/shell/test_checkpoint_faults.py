"""Checkpoints that cannot be half-written: the manifest, the driver killed mid-save, a full disk,
truncated and corrupted files, and ``resume=auto`` skipping what does not verify.

The saves here are `rlshell.runners.loop.save_checkpoint`'s own, with a trainer whose
``save`` writes files as workers do (several shards of known bytes, one per "rank"), so
every file's expected content is known and any half-written one is caught. The processes
killed are forks of the test's own (no start-up cost, so many kills fit in seconds).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rlshell.checkpoint import (
    MANIFEST,
    QUEUE_FILE,
    TRAINER_STATE,
    CheckpointError,
    TrainerState,
    clean_partials,
    list_checkpoints,
    resolve_resume,
    verify_checkpoint,
)
from rlshell.runners.loop import save_checkpoint
from rlshell.runners.validation import load_config, validate

RANKS, SHARD = 3, 96 * 1024


def _shard(step: int, rank: int) -> bytes:
    seed = hashlib.sha256(f"{step}/{rank}".encode()).digest()
    return (seed * (SHARD // len(seed) + 1))[:SHARD]


class ShardTrainer:
    """Writes RANKS shards of bytes that depend on the step only, in small flushed writes (a
    kill lands inside a file as often as between files), as the workers write theirs."""

    def save(self, directory: Path, step: int) -> TrainerState:
        (directory / "actor").mkdir()
        for rank in range(RANKS):
            with (directory / "actor" / f"shard_{rank}.bin").open("wb") as file:
                data = _shard(step, rank)
                for start in range(0, len(data), 8192):
                    file.write(data[start : start + 8192])
                    file.flush()
        return TrainerState(step=step, experiment_name="shards")


def _save(run_dir: Path, step: int, keep_last: int | None = None) -> Path:
    return save_checkpoint(ShardTrainer(), run_dir, step, keep_last)  # type: ignore[arg-type]


def _in_child(body: Callable[[], None]) -> int:
    """Run ``body`` in a forked child (this process's imports, no start-up cost); its pid.
    The child leaves with os._exit: 0 when ``body`` returned, 1 when it raised."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            body()
            code = 0
        finally:
            os._exit(code)
    return pid


def _assert_exactly_step(checkpoint: Path, step: int) -> None:
    verify_checkpoint(checkpoint)
    state = json.loads((checkpoint / TRAINER_STATE).read_text())
    assert state["step"] == step
    for rank in range(3):
        assert (checkpoint / "actor" / f"shard_{rank}.bin").read_bytes() == _shard(step, rank)


def test_a_saved_checkpoint_verifies_and_each_kind_of_damage_is_named(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    path = _save(run_dir, 1)
    _assert_exactly_step(path, 1)
    manifest = json.loads((path / MANIFEST).read_text())["files"]
    assert sorted(manifest) == [f"actor/shard_{r}.bin" for r in range(3)] + [TRAINER_STATE]
    shard = path / "actor" / "shard_1.bin"
    original = shard.read_bytes()

    shard.write_bytes(original[:1000])
    with pytest.raises(CheckpointError, match=r"shard_1.bin has 1000 bytes, the manifest says"):
        verify_checkpoint(path)
    shard.write_bytes(original[:500] + bytes([original[500] ^ 1]) + original[501:])
    with pytest.raises(CheckpointError, match=r"shard_1.bin does not match its SHA-256"):
        verify_checkpoint(path)
    shard.unlink()
    with pytest.raises(CheckpointError, match=r"shard_1.bin is missing"):
        verify_checkpoint(path)
    shard.write_bytes(original)
    (path / "actor" / "stray.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"holds actor/stray.bin, which its manifest does"):
        verify_checkpoint(path)
    (path / "actor" / "stray.bin").unlink()
    verify_checkpoint(path)
    (path / MANIFEST).write_text("{not json")
    with pytest.raises(CheckpointError, match=r"manifest.json is unreadable"):
        verify_checkpoint(path)
    (path / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match=r"has no manifest.json"):
        verify_checkpoint(path)


def test_resume_auto_skips_damaged_checkpoints_newest_first_and_names_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    for step in (1, 2, 3):
        _save(run_dir, step)
    three = run_dir / "checkpoints" / "global_step_3"
    two = run_dir / "checkpoints" / "global_step_2"
    with (three / "actor" / "shard_2.bin").open("r+b") as file:
        file.truncate(10)
    (two / TRAINER_STATE).write_text('{"step": "oops"')
    assert resolve_resume("auto", run_dir) == run_dir / "checkpoints" / "global_step_1"
    err = capsys.readouterr().err
    assert "skipped global_step_3, which is damaged: " in err
    assert "shard_2.bin has 10 bytes" in err
    assert "skipped global_step_2, which is damaged: " in err
    # A named checkpoint that does not verify is refused, not loaded.
    with pytest.raises(CheckpointError, match=r"checkpoint.resume: .*shard_2.bin has 10 bytes"):
        resolve_resume(str(three), run_dir)
    (run_dir / "checkpoints" / "global_step_1" / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match=r"no checkpoint of the run verifies") as raised:
        resolve_resume("auto", run_dir)
    assert str(raised.value).count("\n  global_step_") == 3


@pytest.mark.slow
def test_the_driver_killed_at_random_points_of_its_saves_never_leaves_a_partial_checkpoint(
    tmp_path: Path,
) -> None:
    """100 kills, at seeded random moments of a process that saves step after step
    (keep_last=2, so the kills land in writes, manifests, renames and prunes): after each,
    the newest checkpoint verifies and holds exactly its step's bytes, and the next process
    saves on from it."""
    rng = random.Random(20261128)
    run_dir = tmp_path / "run"
    newest, count = 0, 0
    leftovers: set[str] = set()
    for _ in range(100):
        first = newest + 1

        def saving(first: int = first) -> None:
            for step in range(first, first + 10_000):
                _save(run_dir, step, keep_last=2)

        saver = _in_child(saving)
        time.sleep(rng.uniform(0.0, 0.05))
        os.kill(saver, signal.SIGKILL)
        _, status = os.waitpid(saver, 0)
        assert os.WIFSIGNALED(status), "the saver stopped before it was killed"
        root = run_dir / "checkpoints"
        if root.is_dir():
            leftovers.update(p.name.rsplit(".", 1)[-1] for p in root.iterdir() if p.name[0] == ".")
        clean_partials(run_dir)
        checkpoints = list_checkpoints(run_dir)
        if not checkpoints:
            continue  # killed before its first save finished
        resumed = resolve_resume("auto", run_dir)
        assert resumed == checkpoints[-1][1], "the newest complete checkpoint verifies"
        step = checkpoints[-1][0]
        assert step >= newest
        _assert_exactly_step(resumed, step)
        # keep_last=2, and one more for each kill in a row that came between a commit and
        # its prune (the next prune that runs takes them all).
        assert len(checkpoints) <= max(2, count) + 1
        newest, count = step, len(checkpoints)
    assert newest > 10
    # Kills landed mid-save (a staging directory left) and mid-prune (one set aside).
    assert {"partial", "deleting"} <= leftovers


def test_a_full_disk_stops_the_save_names_it_and_keeps_the_last_checkpoint(
    tmp_path: Path,
) -> None:
    """A file-size limit (RLIMIT_FSIZE) makes the second save's shards fail as a full disk
    does: CheckpointError naming the step and the error, nothing of it left, step 1 intact."""
    run_dir = tmp_path / "run"
    _save(run_dir, 1)
    read, write = os.pipe()

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, as ENOSPC: an OSError
        resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))
        try:
            _save(run_dir, 2)
        except CheckpointError as error:
            os.write(write, str(error).encode())

    child = _in_child(limited)
    os.close(write)
    with os.fdopen(read) as pipe:
        message = pipe.read()
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status)
    assert os.WEXITSTATUS(status) == 0
    assert message.startswith("the checkpoint of step 2 could not be written (OSError: ")
    assert "File too large" in message
    assert f"the last complete checkpoint, {run_dir / 'checkpoints' / 'global_step_1'}" in message
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["global_step_1"]
    _assert_exactly_step(run_dir / "checkpoints" / "global_step_1", 1)


def test_a_checkpoint_saved_again_replaces_the_old_one_without_a_moment_without_it(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    _save(run_dir, 4)
    (run_dir / "checkpoints" / "global_step_4" / "actor" / "old.bin").write_bytes(b"old")
    path = _save(run_dir, 4)
    _assert_exactly_step(path, 4)
    assert not (path / "actor" / "old.bin").exists()
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["global_step_4"]


class QueueingTrainer(ShardTrainer):
    """Saves as an async run does at the steps of ``queued``: the rollouts generated ahead of
    the step (`QUEUE_FILE`) beside its shards, listed in the manifest like them."""

    def __init__(self, queued: set[int]) -> None:
        self.queued = queued

    def save(self, directory: Path, step: int) -> TrainerState:
        state = super().save(directory, step)
        if step in self.queued:
            (directory / QUEUE_FILE).write_bytes(b"rollouts generated ahead of step %d" % step)
        return state


def test_a_synchronous_resume_is_refused_for_the_checkpoint_auto_takes_not_a_damaged_newer_one(
    tmp_path: Path,
) -> None:
    """Validation refuses resuming an async run's checkpoint synchronously (its queued
    rollouts would be skipped), judging the checkpoint resume=auto takes: a newer one that
    does not verify (truncated, or of the right size with a changed byte) is skipped, as the
    run skips it, and is never the reason a run is refused."""
    run_dir = tmp_path / "runs" / "grpo"
    for step in (1, 2):
        save_checkpoint(QueueingTrainer({2}), run_dir, step, None)  # type: ignore[arg-type]
    config = load_config(
        "configs/grpo.py", [f"runner.output_dir={tmp_path / 'runs'}", "checkpoint.resume=auto"]
    )
    assert config.runner.mode == "sync"
    newest = run_dir / "checkpoints" / "global_step_2"
    refusal = f"checkpoint.resume: {newest} holds rollouts generated ahead"
    assert any(p.startswith(refusal) for p in validate(config, for_run=True))
    async_config = load_config(
        "configs/grpo_async.py",
        [
            f"runner.output_dir={tmp_path / 'runs'}",
            "runner.experiment_name=grpo",
            "checkpoint.resume=auto",
        ],
    )
    assert not [p for p in validate(async_config, for_run=True) if "holds rollouts" in p]

    shard = newest / "actor" / "shard_0.bin"
    original = shard.read_bytes()
    shard.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))  # same size: only SHA-256 tells
    assert resolve_resume("auto", run_dir) == run_dir / "checkpoints" / "global_step_1"
    assert not [p for p in validate(config, for_run=True) if "holds rollouts" in p]
    shard.write_bytes(original[:100])  # truncated: the quick check tells
    assert not [p for p in validate(config, for_run=True) if "holds rollouts" in p]
    shard.write_bytes(original)
    assert any(p.startswith(refusal) for p in validate(config, for_run=True))

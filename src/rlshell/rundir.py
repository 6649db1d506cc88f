"""Run directories: what one holds, who may write into it, and its lock.

A run writes everything into ``runner.output_dir / runner.experiment_name``:

- ``config.json``, ``placement.json``: the resolved config and the plan,
  written as the run starts;
- ``metrics.jsonl``, ``tensorboard/``, ``wandb/``, ``learning_curve.png``:
  what it measured (`rlshell.metrics`);
- ``checkpoints/global_step_N/`` (`rlshell.checkpoint`), ``hf_model/`` or
  ``policy/`` (`rlshell.export`), ``tokenizer/``, ``eval/``;
- ``probe.json``: the cluster health check's report (``runner_type=probe``);
- ``nonfinite/``: the batch of a step whose loss was NaN or infinite
  (`write_nonfinite`), for the user to inspect;
- ``run.lock``: which process writes into it now (`RunLock`).

A directory *holds a run* once any of its results is there (metrics,
checkpoints, TensorBoard events, an export, ...); the plan files and a
probe's report alone do not count, so a run that failed before its first
step, or a health check, is simply started again. `claim_run_dir` refuses a
directory that holds a run unless the new run continues it
(``checkpoint.resume``) or clears it first (``overwrite``), and `RunLock`
refuses a second live run into one directory. Both are checked before Ray
starts, so a refusal costs nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from attrs import frozen

from rlshell.checkpoint import list_checkpoints
from rlshell.config import Config, ConfigError
from rlshell.metrics import METRICS_FILE, WANDB_RUN_FILE, read_metrics

__all__ = [
    "DRY_RUN_DIR",
    "LOCK_FILE",
    "PLAN_FILES",
    "RESULTS",
    "LockOwner",
    "RunContents",
    "RunDirError",
    "RunLock",
    "claim_run_dir",
    "claimed_run_dir",
    "clear_run",
    "read_contents",
    "run_dir_of",
    "write_nonfinite",
]

LOCK_FILE = "run.lock"
DRY_RUN_DIR = "dry_run"
# What a run leaves that makes its directory "hold a run" (dropped only with overwrite).
RESULTS = (
    METRICS_FILE,
    "checkpoints",
    "tensorboard",
    "wandb",
    WANDB_RUN_FILE,
    "learning_curve.png",
    "hf_model",
    "policy",
    "eval",
    "nonfinite",
)
# Written at every start (the probe's report at every probe): replaced freely, removed with the
# results on overwrite.
PLAN_FILES = ("config.json", "placement.json", "tokenizer", "probe.json", DRY_RUN_DIR)


def run_dir_of(config: Config) -> Path:
    """Where a run writes: ``runner.output_dir / runner.experiment_name``."""
    return Path(config.runner.output_dir) / config.runner.experiment_name


def write_nonfinite(run_dir: Path, name: str, record: dict[str, Any]) -> str:
    """Save ``record`` (a NaN or infinite loss's batch: tensors on the CPU) as
    ``<run_dir>/nonfinite/<name>.pt``; the sentence an error message adds about it."""
    import torch

    path = run_dir.resolve() / "nonfinite" / f"{name}.pt"
    partial = path.with_name(f".{path.name}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(record, partial)
        os.replace(partial, path)  # a process stopped mid-write leaves no half file named .pt
    except OSError as error:
        return f"Its batch could not be written to {path}: {error}"
    return f"Its batch is in {path} (torch.load(path, weights_only=False))"


class RunDirError(ConfigError):
    """A run directory this run may not write into; found before anything starts."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        self.problems = [message]


@frozen
class RunContents:
    """What a run directory holds: checkpoint steps, the last metrics step, other results."""

    checkpoint_steps: tuple[int, ...]
    metrics_step: int | None
    others: tuple[str, ...]
    partial_checkpoints: bool = False  # ``checkpoints/`` holds only what no save completed

    @property
    def holds_run(self) -> bool:
        return bool(
            self.checkpoint_steps
            or self.partial_checkpoints
            or self.metrics_step is not None
            or self.others
        )

    def describe(self) -> str:
        """``"checkpoints up to step 40, metrics to step 43, tensorboard/"``."""
        parts = []
        if self.checkpoint_steps:
            steps = self.checkpoint_steps
            parts.append(
                f"a checkpoint of step {steps[0]}"
                if len(steps) == 1
                else f"checkpoints up to step {steps[-1]}"
            )
        else:
            parts.append("no complete checkpoint")
        if self.metrics_step is not None:
            parts.append(f"metrics to step {self.metrics_step}")
        parts += self.others
        return ", ".join(parts)


def read_contents(run_dir: Path) -> RunContents:
    """What ``run_dir`` holds (nothing when it does not exist)."""
    steps = tuple(step for step, _ in list_checkpoints(run_dir))
    metrics_step: int | None = None
    metrics = run_dir / METRICS_FILE
    if metrics.is_file():
        try:
            records = read_metrics(metrics)
        except ValueError:
            records = [{"step": -1}]  # unreadable, but metrics all the same
        if records:
            metrics_step = int(max(record["step"] for record in records))
    others = []
    for name in RESULTS:
        if name in (METRICS_FILE, "checkpoints"):
            continue
        path = run_dir / name
        if path.is_file() or (path.is_dir() and any(path.iterdir())):
            others.append(f"{name}/" if path.is_dir() else name)
    checkpoints = run_dir / "checkpoints"
    partial = not steps and checkpoints.is_dir() and any(checkpoints.iterdir())
    if metrics_step is None and metrics.is_file() and metrics.stat().st_size:
        others.insert(0, METRICS_FILE)
    return RunContents(
        checkpoint_steps=steps,
        metrics_step=metrics_step,
        others=tuple(others),
        partial_checkpoints=partial,
    )


def claim_run_dir(run_dir: Path, *, resume: str | None, overwrite: bool) -> RunContents:
    """Check that a new run may write into ``run_dir``, clearing it first when ``overwrite``.

    A directory that holds a run (`RunContents.holds_run`) is refused unless
    the run continues it (``resume``, the value of ``checkpoint.resume``) or
    ``overwrite`` clears it. ``resume="auto"`` into a directory holding a run
    without a complete checkpoint is refused too: starting afresh would
    silently replace its metrics. Returns what the directory held.
    Raises `RunDirError`.
    """
    contents = read_contents(run_dir)
    ways = (
        "continue it with checkpoint.resume=auto, start over with --overwrite "
        "(overwrite=True in rlshell.api.train), or choose another runner.experiment_name"
    )
    if overwrite:
        if resume == "auto" or (resume is not None and _inside(Path(resume), run_dir)):
            raise RunDirError(
                f"checkpoint.resume={resume} continues the run in {run_dir}, which --overwrite "
                "would delete first; choose one"
            )
        clear_run(run_dir)
        return contents
    if not contents.holds_run or (resume is not None and resume != "auto"):
        return contents
    if resume is None:
        raise RunDirError(f"{run_dir} already holds a run ({contents.describe()}): {ways}")
    if not contents.checkpoint_steps:
        raise RunDirError(
            f"{run_dir} holds a run ({contents.describe()}) but no complete checkpoint for "
            "checkpoint.resume=auto to continue from; starting afresh would replace its "
            "metrics: start over with --overwrite (overwrite=True in rlshell.api.train), or "
            "choose another runner.experiment_name"
        )
    return contents


def clear_run(run_dir: Path) -> list[Path]:
    """Remove a run's results and plan files from ``run_dir`` (with the half-written copies
    its writers stage beside them); anything else there is left. Returns what was removed."""
    if not run_dir.is_dir():
        return []
    names = (*RESULTS, *PLAN_FILES)
    removed = []
    for path in sorted(run_dir.iterdir()):
        staged = path.name.startswith(".") and any(
            path.name[1:].startswith(name + ".") for name in names
        )
        if path.name in names or staged:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path)
    return removed


def _inside(path: Path, directory: Path) -> bool:
    return path.resolve().is_relative_to(directory.resolve())


# ---------------------------------------------------------------------------
# The lock


@frozen
class LockOwner:
    """Who holds a run directory's lock: written into ``run.lock`` as JSON.

    ``process_start``: the kernel's start time of ``pid`` (clock ticks since
    boot, from /proc), so that a recycled pid is not taken for the owner;
    None where /proc is not there.
    """

    host: str
    pid: int
    started: str
    command: str
    process_start: int | None = None

    @classmethod
    def this_process(cls) -> LockOwner:
        return cls(
            host=socket.gethostname(),
            pid=os.getpid(),
            started=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            command=shlex.join(getattr(sys, "orig_argv", sys.argv)),
            process_start=_process_start(os.getpid()),
        )

    def is_alive(self) -> bool:
        """Whether the owner still runs (only answerable on its own host)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # alive, another user's
        start = _process_start(self.pid)
        return self.process_start is None or start is None or start == self.process_start

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, started {self.started}: {self.command}"


class RunLock:
    """``run.lock`` in a run directory, held for the run's whole life.

    Taken atomically (``O_CREAT | O_EXCL``) when the block starts and removed
    when it ends, also on error and Ctrl-C. A live owner on this host, or any
    owner on another host (whose process cannot be checked from here), is
    refused with a `RunDirError` naming it; a lock whose process on this host
    is gone is reported in one line and taken over.

        with RunLock(run_dir):
            ...  # this process alone writes into run_dir
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.owner = LockOwner.this_process()

    def __enter__(self) -> Self:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # a file in the way, no permission, a read-only disk
            raise RunDirError(
                f"runner.output_dir: cannot make the run directory {self.path.parent} "
                f"({error.strerror or error})"
            ) from None
        for _ in range(3):
            if self._create():
                return self
            other = self._read_other()
            if other is None:
                continue  # removed meanwhile: try again
            self._refuse_or_take_over(other)
        raise RunDirError(
            f"{self.path}: another process keeps taking this run directory's lock; "
            "is a second run starting into it?"
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if _read_owner(self.path) == self.owner:
            self.path.unlink(missing_ok=True)

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(json.dumps(_as_json(self.owner), indent=2) + "\n")
            file.flush()
            os.fsync(file.fileno())
        return True

    def _read_other(self) -> LockOwner | None:
        """The owner the lock names; a moment's patience for one being written."""
        for _ in range(20):
            if not self.path.exists():
                return None
            owner = _read_owner(self.path)
            if owner is not None:
                return owner
            time.sleep(0.05)
        raise RunDirError(
            f"{self.path} exists but names no owner (host, pid): if no run is writing into "
            f"{self.path.parent}, remove it (rm {shlex.quote(str(self.path))}) and start again"
        )

    def _refuse_or_take_over(self, other: LockOwner) -> None:
        run_dir = self.path.parent
        if other.host != self.owner.host:
            raise RunDirError(
                f"{run_dir} is locked by a run on another host ({other.describe()}); "
                f"it cannot be checked from here. If that run is no longer running, remove "
                f"the lock (rm {shlex.quote(str(self.path))}) and start again"
            )
        if other.is_alive():
            raise RunDirError(
                f"{run_dir} is in use by a run that is still running ({other.describe()}); "
                "wait for it to finish, stop it, or choose another runner.experiment_name"
            )
        # Move the stale lock aside under a name of our own, then check that it is the one
        # we judged stale: another process may have taken it over in between.
        aside = self.path.with_name(f".{LOCK_FILE}.{self.owner.pid}.stale")
        try:
            os.replace(self.path, aside)
        except FileNotFoundError:
            return
        if _read_owner(aside) != other:
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.path)  # put the newer owner's lock back
            aside.unlink(missing_ok=True)
            return
        aside.unlink(missing_ok=True)
        print(
            f"taking over the stale lock of {run_dir}: pid {other.pid} (started "
            f"{other.started}) is no longer running",
            file=sys.stderr,
            flush=True,
        )


def _as_json(owner: LockOwner) -> dict[str, object]:
    return {
        "host": owner.host,
        "pid": owner.pid,
        "started": owner.started,
        "command": owner.command,
        "process_start": owner.process_start,
    }


def _read_owner(path: Path) -> LockOwner | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return LockOwner(
            host=str(data["host"]),
            pid=int(data["pid"]),
            started=str(data["started"]),
            command=str(data["command"]),
            process_start=data.get("process_start"),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _process_start(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


@contextmanager
def claimed_run_dir(run_dir: Path, *, resume: str | None, overwrite: bool) -> Iterator[Path]:
    """``run_dir`` locked (`RunLock`) and claimed (`claim_run_dir`) for the block.

    Says in one line what ``overwrite`` removed.
    """
    with RunLock(run_dir):
        before = claim_run_dir(run_dir, resume=resume, overwrite=overwrite)
        if overwrite and before.holds_run:
            print(f"--overwrite: removed the run in {run_dir} ({before.describe()})", flush=True)
        yield run_dir

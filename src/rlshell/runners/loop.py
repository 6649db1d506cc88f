"""The run loop: one for every trainer.

Run directory, resume, metric logger, evaluation and checkpoint cadence,
the learning curve and the final export happen here, once; the trainer the
run spec names (`rlshell.runners.spec`) does the steps:

    python -m rlshell.train configs/grpo.py          # ReasoningTrainer
    python -m rlshell.train configs/ppo_cartpole.py  # CollocatedPPOTrainer

Before each step the loop tells every worker group of the run which step it is
(``set_global_step``, RLinf's call), without waiting: a worker knows the step it
works on and names it in its log lines (`rlshell.cluster.worker.Worker.log_info`).

Ctrl-C (SIGINT) during the steps lets the step under way finish, saves a
checkpoint (``checkpoint.save_on_interrupt``) and raises `Interrupted`; a
second Ctrl-C raises KeyboardInterrupt at once. (During the last step it only
lets the run finish.)
"""

from __future__ import annotations

import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType

from attrs import frozen

from rlshell.checkpoint import (
    CheckpointError,
    clean_partials,
    commit,
    list_checkpoints,
    prune,
    queue_problem,
    read_trainer_state,
    resolve_resume,
    staging_dir,
    write_manifest,
    write_trainer_state,
)
from rlshell.cluster.errors import WorkerError
from rlshell.cluster.group import GroupCall, WorkerGroup
from rlshell.cluster.placement import PlacementPlan
from rlshell.cluster.ray_cluster import Cluster
from rlshell.cluster.worker import Worker, show_every_worker_line
from rlshell.config import Config
from rlshell.export import export_final_policy
from rlshell.metrics import logger_for_run, plot_run
from rlshell.runners.spec import RunSpec
from rlshell.runners.trainer import Cadence, Reporting, Salvaging, Trainer

__all__ = ["Interrupted", "TrainResult", "announce_step", "run", "save_checkpoint", "timed"]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped the run after ``step``, which finished and was logged.

    ``checkpoint``: the checkpoint of that step (None when none was written,
    ``why_not`` saying why: ``checkpoint.interval`` 0 or
    ``checkpoint.save_on_interrupt`` false).
    """

    def __init__(self, step: int, checkpoint: Path | None, why_not: str = "") -> None:
        super().__init__(f"interrupted after step {step}")
        self.step = step
        self.checkpoint = checkpoint
        self.why_not = why_not


@frozen
class TrainResult:
    """What a finished run leaves: where it wrote, how far it went, what it measured.

    ``metrics``: every metric logged at ``final_step`` (training and, when an
    evaluation was due then, ``eval/``); ``checkpoint``: the newest complete
    checkpoint (None when the run saves none); ``exported``: the exported final
    policy (``checkpoint.export_hf``), else None.
    """

    run_dir: Path
    final_step: int
    metrics: dict[str, float]
    checkpoint: Path | None
    exported: Path | None


def run(spec: RunSpec, cluster: Cluster, plan: PlacementPlan, run_dir: Path) -> TrainResult:
    """Train with ``spec.trainer`` until ``runner.max_steps``, resuming first when asked."""
    config = spec.config
    trainer_cls = spec.trainer
    if trainer_cls is None:
        raise ValueError(f"runner.runner_type: the {config.runner.runner_type} run has no trainer")
    run_dir.mkdir(parents=True, exist_ok=True)
    clean_partials(run_dir)
    resume_from = resolve_resume(config.checkpoint.resume, run_dir)
    if resume_from is not None and (problem := queue_problem(resume_from, config.runner.mode)):
        raise CheckpointError(problem)
    cadence = Cadence.of(config)
    # Read now, as every key a run reads: a run that saves no checkpoint does not read it.
    save_on_interrupt = bool(cadence.checkpoint_interval) and config.checkpoint.save_on_interrupt
    show_every_worker_line()  # the workers' log lines, each as written (not folded by Ray)
    trainer = trainer_cls.launch(spec, cluster, plan, run_dir)
    final: dict[str, float] = {}
    try:
        start_step = 0
        if resume_from is not None:
            start_step = trainer.load(resume_from, read_trainer_state(resume_from))
            print(f"resumed from {resume_from} (step {start_step})", flush=True)
        with logger_for_run(config, run_dir, start_step) as logger:
            if isinstance(trainer, Reporting):
                trainer.report_to(logger.print)
            if start_step == 0 and cadence.evaluates:
                logger.log(0, trainer.evaluate(0))
            saved: dict[str, float] = {}
            with _first_ctrl_c_finishes_the_step() as stop:
                began = time.perf_counter()
                announced: list[GroupCall] = []
                for step in range(start_step + 1, cadence.max_steps + 1):
                    announced = announce_step(cluster, step, announced)
                    try:
                        metrics = trainer.step(step)
                    except Exception as error:
                        _salvage(trainer, error, run_dir, step - 1, start_step, cadence, config)
                        raise
                    if cadence.eval_due(step):
                        metrics.update(trainer.evaluate(step))
                    # Wall time since this process's first step began (evaluations included).
                    metrics["time/elapsed"] = time.perf_counter() - began
                    # Logged before the checkpoint: a checkpoint of step N implies its metrics
                    # are on disk. The time a save took is reported with the step after it.
                    final = {**metrics, **saved}
                    logger.log(step, final)
                    saved = {}
                    checkpoint = None
                    if cadence.checkpoint_due(step):
                        with timed(saved, "time/checkpoint"):
                            checkpoint = save_checkpoint(
                                trainer, run_dir, step, config.checkpoint.keep_last
                            )
                    if stop.is_set() and step < cadence.max_steps:  # (the last: done)
                        raise _interrupted(
                            trainer, run_dir, step, checkpoint, config, save_on_interrupt
                        )
    finally:
        trainer.close()
    plot_run(run_dir, trainer_cls.curves)
    exported = export_final_policy(config, run_dir)
    if exported is not None:
        print(f"exported the final policy to {exported}", flush=True)
    checkpoints = list_checkpoints(run_dir)
    return TrainResult(
        run_dir=run_dir,
        final_step=cadence.max_steps,
        metrics=final,
        checkpoint=checkpoints[-1][1] if checkpoints else None,
        exported=exported,
    )


def announce_step(cluster: Cluster, step: int, pending: list[GroupCall]) -> list[GroupCall]:
    """``set_global_step(step)`` submitted to every worker group ``cluster`` runs; the calls
    still running. Never waits: a worker busy with work submitted ahead (an asynchronous
    run's next window) takes it after that work. ``pending``: the last step's calls, whose
    failures are read and dropped here (a dead worker is reported by the trainer's own
    calls, with the method it was running)."""
    running = []
    for call in pending:
        if not call.done():
            running.append(call)
            continue
        with suppress(WorkerError):
            call.wait(timeout=0)
    # The cluster's own record of what it runs (the trainer keeps its groups to itself); a
    # stand-in for a cluster (a test's trainer without Ray) runs none.
    launched = cluster.launched() if isinstance(cluster, Cluster) else []
    for group in launched:
        if (
            isinstance(group, WorkerGroup)
            and issubclass(group.worker_cls, Worker)
            and not group.dead_ranks
        ):
            with suppress(WorkerError):
                running.append(group.set_global_step(step))
    return running


def _salvage(
    trainer: Trainer,
    error: Exception,
    run_dir: Path,
    last: int,
    start_step: int,
    cadence: Cadence,
    config: Config,
) -> None:
    """Save a checkpoint of ``last``, the last completed step, before ``error`` stops the run,
    where the trainer says its state survived (`Salvaging`) and no checkpoint holds it yet."""
    if not cadence.checkpoint_interval or last <= start_step or cadence.checkpoint_due(last):
        return
    if not isinstance(trainer, Salvaging) or not trainer.salvage(error):
        return
    path = save_checkpoint(trainer, run_dir, last, config.checkpoint.keep_last)
    note = (
        f" Before stopping, the run saved a checkpoint of step {last}, its last complete "
        f"step ({path}); checkpoint.resume=auto continues from it."
    )
    if isinstance(error, WorkerError):
        error.extend_message(note)
    else:
        error.add_note(note.strip())


def save_checkpoint(trainer: Trainer, run_dir: Path, step: int, keep_last: int | None) -> Path:
    """``trainer.save`` into a staging directory, its trainer state, then the manifest of
    every file (sizes and SHA-256, each file flushed to disk) written last, then renamed
    into place (`rlshell.checkpoint.commit`) and old checkpoints pruned."""
    staging = staging_dir(run_dir, step)
    try:
        write_trainer_state(staging, trainer.save(staging, step))
        write_manifest(staging)
    except Exception as error:
        # A full disk, a dead rank: what was written goes (it frees the space), and the
        # checkpoints before it stay as they were.
        shutil.rmtree(staging, ignore_errors=True)
        if not isinstance(error, OSError):
            raise
        checkpoints = list_checkpoints(run_dir)
        kept = (
            f"the last complete checkpoint, {checkpoints[-1][1]}, is intact"
            if checkpoints
            else "the run has no complete checkpoint"
        )
        raise CheckpointError(
            f"the checkpoint of step {step} could not be written ({type(error).__name__}: "
            f"{error}); its partial files were removed and {kept}"
        ) from error
    final = commit(staging, run_dir, step)
    prune(run_dir, keep_last)
    return final


def _interrupted(
    trainer: Trainer,
    run_dir: Path,
    step: int,
    checkpoint: Path | None,
    config: Config,
    save_on_interrupt: bool,
) -> Interrupted:
    """What stopping after ``step`` leaves: its checkpoint, saved now unless the config says
    not to (``checkpoint.interval`` 0 saves none, ``checkpoint.save_on_interrupt`` false)."""
    if checkpoint is not None:
        return Interrupted(step, checkpoint)
    if not config.checkpoint.interval:
        return Interrupted(step, None, "checkpoint.interval is 0: the run saves no checkpoint")
    if not save_on_interrupt:
        return Interrupted(step, None, "checkpoint.save_on_interrupt is false")
    print(f"Ctrl-C: saving a checkpoint of step {step}", file=sys.stderr, flush=True)
    return Interrupted(step, save_checkpoint(trainer, run_dir, step, config.checkpoint.keep_last))


@contextmanager
def _first_ctrl_c_finishes_the_step() -> Iterator[threading.Event]:
    """An event set by the first SIGINT of the block, which then raises nothing; the second
    raises KeyboardInterrupt as usual. Outside the main thread (where Python delivers no
    signals) the event is never set and Ctrl-C behaves as usual."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def first(signum: int, frame: FrameType | None) -> None:
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print(
            "\nCtrl-C: stopping after this step (Ctrl-C again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    previous = signal.signal(signal.SIGINT, first)
    try:
        yield stop
    finally:
        # None: the previous handler was not installed from Python; Python's own stands in.
        restored = previous if previous is not None else signal.default_int_handler
        signal.signal(signal.SIGINT, restored)


@contextmanager
def timed(metrics: dict[str, float], key: str) -> Iterator[None]:
    """``metrics[key]``: the seconds the block took."""
    start = time.perf_counter()
    yield
    metrics[key] = time.perf_counter() - start

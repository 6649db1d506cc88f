"""Ctrl-C in the run loop (`rlshell.runners.loop.run`), with a stand-in trainer and no Ray.

The trainer sends this process a real SIGINT from inside a step, as a
terminal's Ctrl-C reaches the driver; tests/shell/test_reasoning_run.py does
the same to a real run from outside and resumes it.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Self

import attrs
import pytest

from rlshell.checkpoint import TrainerState, list_checkpoints
from rlshell.config import Config
from rlshell.metrics import read_metrics
from rlshell.runners.loop import Interrupted, run
from rlshell.runners.validation import load_config


@attrs.frozen
class StandInSpec:
    config: Config
    trainer: type[Any]


class CtrlCTrainer:
    """Steps that take no time; SIGINT sent to this process during the steps in ``ctrl_c_at``."""

    curves: ClassVar[tuple[str, ...]] = ("train/loss",)
    registered_names: ClassVar[tuple[str, ...]] = ()
    ctrl_c_at: ClassVar[tuple[int, ...]] = ()
    saved: ClassVar[list[int]] = []

    @classmethod
    def problems(cls, config: Config, plan: Any) -> list[str]:
        return []

    @classmethod
    def unread(cls, config: Config) -> dict[str, str]:
        return {}

    @classmethod
    def launch(cls, spec: Any, cluster: Any, plan: Any, run_dir: Path) -> Self:
        return cls()

    def load(self, checkpoint: Path, state: TrainerState) -> int:
        return state.step

    def step(self, step: int) -> dict[str, float]:
        for _ in range(self.ctrl_c_at.count(step)):
            os.kill(os.getpid(), signal.SIGINT)
        return {"train/loss": float(step)}

    def evaluate(self, step: int) -> dict[str, float]:
        return {}

    def save(self, directory: Path, step: int) -> TrainerState:
        self.saved.append(step)
        (directory / "weights").write_text(str(step))
        return TrainerState(step=step, experiment_name="ctrl_c")

    def close(self) -> None:
        pass


def run_with_ctrl_c(tmp_path: Path, at: tuple[int, ...], *overrides: str) -> Path:
    config = load_config(
        "configs/ppo_cartpole.py",
        [
            "runner.max_steps=6",
            "checkpoint.interval=4",
            'logger.backends=["jsonl"]',
            f"runner.output_dir={tmp_path}",
            # No export: the stand-in's checkpoints hold no policy.
            *([] if "checkpoint.interval=0" in overrides else ["checkpoint.export_hf=false"]),
            *overrides,
        ],
    )
    trainer = type("Trainer", (CtrlCTrainer,), {"ctrl_c_at": at, "saved": []})
    run_dir = tmp_path / config.runner.experiment_name
    # The loop reads a spec's config and trainer class; the stand-in needs no cluster or plan.
    run(StandInSpec(config, trainer), None, None, run_dir)  # type: ignore[arg-type]
    return run_dir


def steps_logged(run_dir: Path) -> list[int]:
    return [int(record["step"]) for record in read_metrics(run_dir / "metrics.jsonl")]


@pytest.fixture
def python_ctrl_c() -> Iterator[None]:
    """SIGINT handled by Python's own handler during the test, whatever the worker process had
    (a pytest-xdist worker may inherit it ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("python_ctrl_c")
def test_the_first_ctrl_c_finishes_the_step_and_saves_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(Interrupted) as stopped:
        run_with_ctrl_c(tmp_path, (2,))
    run_dir = tmp_path / "ppo_cartpole"
    assert (stopped.value.step, stopped.value.checkpoint) == (
        2,
        run_dir / "checkpoints" / "global_step_2",
    )
    assert steps_logged(run_dir) == [1, 2]
    assert [step for step, _ in list_checkpoints(run_dir)] == [2]
    state = json.loads(
        (run_dir / "checkpoints" / "global_step_2" / "trainer_state.json").read_text()
    )
    assert state["step"] == 2
    assert capsys.readouterr().err.splitlines()[-2:] == [
        "Ctrl-C: stopping after this step (Ctrl-C again to stop at once)",
        "Ctrl-C: saving a checkpoint of step 2",
    ]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "handler restored"

    # checkpoint.resume=auto continues after it, each step logged once.
    run_with_ctrl_c(tmp_path, (), "checkpoint.resume=auto")
    assert steps_logged(run_dir) == [1, 2, 3, 4, 5, 6]
    assert [step for step, _ in list_checkpoints(run_dir)] == [4, 6]  # checkpoint.keep_last 2


def test_a_checkpoint_due_at_that_step_is_not_saved_twice(tmp_path: Path) -> None:
    with pytest.raises(Interrupted) as stopped:
        run_with_ctrl_c(tmp_path, (4,))
    assert stopped.value.checkpoint == tmp_path / "ppo_cartpole" / "checkpoints" / "global_step_4"
    assert [step for step, _ in list_checkpoints(tmp_path / "ppo_cartpole")] == [4]


def test_a_second_ctrl_c_stops_at_once_without_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt) as stopped:
        run_with_ctrl_c(tmp_path, (3, 3))
    assert not isinstance(stopped.value, Interrupted)
    run_dir = tmp_path / "ppo_cartpole"
    assert steps_logged(run_dir) == [1, 2], "step 3 was cut short"
    assert list_checkpoints(run_dir) == []


@pytest.mark.parametrize(
    ("overrides", "why_not"),
    [
        (["checkpoint.save_on_interrupt=false"], "checkpoint.save_on_interrupt is false"),
        (["checkpoint.interval=0"], "checkpoint.interval is 0: the run saves no checkpoint"),
    ],
)
def test_no_checkpoint_where_the_config_says_so(
    tmp_path: Path, overrides: list[str], why_not: str
) -> None:
    with pytest.raises(Interrupted) as stopped:
        run_with_ctrl_c(tmp_path, (3,), *overrides)
    assert (stopped.value.step, stopped.value.checkpoint, stopped.value.why_not) == (
        3,
        None,
        why_not,
    )
    assert steps_logged(tmp_path / "ppo_cartpole") == [1, 2, 3]
    assert list_checkpoints(tmp_path / "ppo_cartpole") == []


def test_ctrl_c_in_the_last_step_lets_the_run_finish(tmp_path: Path) -> None:
    run_dir = run_with_ctrl_c(tmp_path, (6,))
    assert steps_logged(run_dir) == [1, 2, 3, 4, 5, 6]
    assert [step for step, _ in list_checkpoints(run_dir)] == [4, 6]

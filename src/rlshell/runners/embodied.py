"""What the three embodied trainers share: one group holds the checkpointed state, env
steps are counted the same way, and none evaluates during training.

`EmbodiedTrainer` is their base: `CollocatedPPOTrainer`
(`rlshell.runners.embodied_ppo`), `PipelinedPPOTrainer`
(`rlshell.runners.embodied_pipeline`) and `SACTrainer` (`rlshell.runners.sac`)
start their groups under one ExitStack, name the group whose
``save_checkpoint``/``load_checkpoint`` hold the run's state, and pass each
step's metrics through `EmbodiedTrainer.counted`.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, ClassVar

from rlshell.checkpoint import TrainerState
from rlshell.cluster.group import WorkerGroup
from rlshell.config import Config

__all__ = ["EmbodiedTrainer"]


class EmbodiedTrainer:
    """The shared half of an embodied `rlshell.runners.trainer.Trainer`."""

    curves: ClassVar[tuple[str, ...]] = ("env/episode_return", "env/success")

    def __init__(self, config: Config, checkpointed: WorkerGroup[Any], stack: ExitStack) -> None:
        self.config = config
        self.checkpointed = checkpointed
        self._stack = stack
        self.env_steps = 0  # env steps since the run began

    def load(self, checkpoint: Path, state: TrainerState) -> int:
        step = int(self.checkpointed.load_checkpoint(str(checkpoint)).wait()[0])
        counted = state.extra.get("env_steps")
        if isinstance(counted, int):
            self.env_steps = counted
        else:
            # A checkpoint from before the count was saved: every window of these runners
            # steps each env runner.rollout_steps times with one action per step (embodied
            # GRPO's stop early; the count is then an upper bound).
            self.env_steps = step * self.config.env.num_envs * self.config.runner.rollout_steps
        return step

    def counted(self, metrics: dict[str, float], started: float) -> dict[str, float]:
        """``metrics`` with ``time/step`` (since ``started``), ``env/total_steps`` and
        ``perf/env_steps_per_s``."""
        metrics["time/step"] = time.perf_counter() - started
        self.env_steps += int(metrics["env/steps"])
        metrics["env/total_steps"] = float(self.env_steps)
        metrics["perf/env_steps_per_s"] = metrics["env/steps"] / metrics["time/step"]
        return metrics

    def evaluate(self, step: int) -> dict[str, float]:
        raise RuntimeError(
            "runner.eval_interval: the embodied runners do not evaluate during training; "
            "evaluate a checkpoint with python -m rlshell.evaluate"
        )

    def save(self, directory: Path, step: int) -> TrainerState:
        self.checkpointed.save_checkpoint(str(directory), step).wait()
        return TrainerState(
            step=step,
            experiment_name=self.config.runner.experiment_name,
            extra={"env_steps": self.env_steps},
        )

    def close(self) -> None:
        self._stack.close()

"""The embodied ``sft`` trainer: behaviour cloning from demonstrations, the stage before RL.

RLinf's usual recipe for a VLA: supervised fine-tuning on demonstrations, then RL
from the result. An ``sft`` run whose ``actor.model.category`` is ``embodied``
reads recorded episodes (``data.task='demonstrations'``, ``data.train_path`` and
``data.val_path`` files of `rlshell.demonstrations`) and trains the policy on
them through its ``sft_forward``. One step, as `EmbodiedSFTTrainer.step` reads:
the sampler's next ``runner.prompts_per_step`` demonstration steps → their
observations and the expert's actions (chunks of the policy's
``action_chunk``, `rlshell.demonstrations.Demonstrations.sft_batch`) → one
optimizer step on the actor ranks (`rlshell.workers.embodied_sft`). Evaluation
measures the held-out episodes' loss and action error. A checkpoint of the run
starts an RL run of the same model: ``actor.model.checkpoint=<run
dir>/checkpoints/global_step_N`` (`rlshell.models.get_model`).

    python -m rlshell.train configs/sft_flow_metaworld_reach.py
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import ClassVar, Self

import torch

from rlshell.checkpoint import TrainerState
from rlshell.cluster.group import WorkerGroup
from rlshell.cluster.placement import PlacementPlan
from rlshell.cluster.ray_cluster import Cluster
from rlshell.config import Config
from rlshell.data import Sampler, SamplerState
from rlshell.demonstrations import DemonstrationError, Demonstrations, load_demonstrations
from rlshell.runners.rules.sft import EmbodiedSFTRules
from rlshell.runners.spec import RunSpec
from rlshell.runners.trainer import launched_together
from rlshell.workers.embodied_sft import EmbodiedSFTActor

__all__ = ["EmbodiedSFTTrainer"]


class EmbodiedSFTTrainer(EmbodiedSFTRules):
    """The actor group of an embodied sft run, its demonstrations and its supervised step."""

    curves: ClassVar[tuple[str, ...]] = ("train/loss", "eval/action_mse")

    def __init__(
        self,
        config: Config,
        group: WorkerGroup[EmbodiedSFTActor],
        stack: ExitStack,
        demonstrations: tuple[Demonstrations, Demonstrations | None],
        chunk: int,
    ) -> None:
        self.config = config
        self.group = group
        self._stack = stack
        self.train_set, self.val_set = demonstrations
        self.chunk = chunk
        self.sampler = Sampler(
            list(range(len(self.train_set))), config.runner.prompts_per_step, config.runner.seed
        )

    @classmethod
    def launch(cls, spec: RunSpec, cluster: Cluster, plan: PlacementPlan, run_dir: Path) -> Self:
        config = spec.config
        data = config.data
        assert data.train_path is not None  # the rules refuse a run without it
        train = load_demonstrations(data.train_path)
        val = None
        if config.runner.eval_interval:
            assert data.val_path is not None
            val = load_demonstrations(data.val_path)
            _same_fields(train, val, str(data.train_path), str(data.val_path))
        stack = ExitStack()
        try:
            (group,) = launched_together(
                stack,
                cluster,
                config.cluster.call_timeout_s,
                (EmbodiedSFTActor.create_group(config), plan.component("actor")),
            )
            started = time.perf_counter()
            chunk = int(group.init_worker().wait()[0])
            trainer = cls(config, group, stack, (train, val), chunk)
            trainer._check_fits(str(data.train_path))
        except BaseException:
            stack.close()
            raise
        print(
            f"workers up in {time.perf_counter() - started:.1f} s ({len(train)} demonstration "
            f"steps of {train.episodes} episodes of {train.env_id} by {train.expert}; "
            f"{0 if val is None else val.episodes} held out; action chunk {chunk})",
            flush=True,
        )
        return trainer

    def _check_fits(self, where: str) -> None:
        """The policy's loss on the first two demonstration steps, before training: a file
        recorded for another model or env fails here, naming the file and its fields."""
        obs, actions = self.train_set.sft_batch(
            torch.arange(min(2, len(self.train_set))), self.chunk
        )
        try:
            self.group.check_fits(obs, actions).wait()
        except Exception as error:  # the policy's own error, whatever its type
            fields = ", ".join(f"{k} {list(v.shape[1:])}" for k, v in obs.items())
            raise DemonstrationError(
                f"demonstrations {where} (observations {fields}; actions "
                f"{list(actions.shape[1:])}) do not fit {self.config.actor.model.model_type}: "
                f"{error}"
            ) from error

    def step(self, step: int) -> dict[str, float]:
        """One supervised step on the sampler's next ``runner.prompts_per_step`` rows."""
        started = time.perf_counter()
        rows = torch.as_tensor(self.sampler.next(), dtype=torch.int64)
        obs, actions = self.train_set.sft_batch(rows, self.chunk)
        metrics: dict[str, float] = self.group.run_sft(obs, actions).wait()[0]
        metrics["time/step"] = time.perf_counter() - started
        metrics["train/samples"] = float(len(rows))
        return metrics

    def evaluate(self, step: int) -> dict[str, float]:
        """``eval/loss`` and ``eval/action_mse`` over every held-out demonstration step."""
        if self.val_set is None:
            raise RuntimeError("runner.eval_interval is 0: there are no held-out episodes")
        started = time.perf_counter()
        obs, actions = self.val_set.sft_batch(torch.arange(len(self.val_set)), self.chunk)
        metrics: dict[str, float] = self.group.evaluate_sft(obs, actions).wait()[0]
        metrics["time/eval"] = time.perf_counter() - started
        return metrics

    def save(self, directory: Path, step: int) -> TrainerState:
        self.group.save_checkpoint(str(directory), step).wait()
        sampler = self.sampler.state()
        return TrainerState(
            step=step,
            experiment_name=self.config.runner.experiment_name,
            sampler_epoch=sampler.epoch,
            sampler_position=sampler.position,
        )

    def load(self, checkpoint: Path, state: TrainerState) -> int:
        step = int(self.group.load_checkpoint(str(checkpoint)).wait()[0])
        self.sampler.load_state(SamplerState(state.sampler_epoch, state.sampler_position))
        return step

    def close(self) -> None:
        self._stack.close()


def _same_fields(train: Demonstrations, val: Demonstrations, train_at: str, val_at: str) -> None:
    def fields(demos: Demonstrations) -> dict[str, list[int]]:
        shapes = {f"obs.{k}": list(v.shape[1:]) for k, v in demos.obs.items()}
        return {**shapes, "actions": list(demos.actions.shape[1:])}

    if fields(train) != fields(val):
        raise DemonstrationError(
            f"data.val_path: {val_at} holds {fields(val)}, but the training demonstrations "
            f"{train_at} hold {fields(train)}"
        )

"""The embodied sft run's actor ranks: behaviour cloning through the policy's ``sft_forward``.

`EmbodiedSFTActor` is one rank (FSDP2 or the registered training backend) of an
embodied policy and its optimizer. Each `EmbodiedSFTActor.run_sft` call takes the
step's demonstration rows (observations and the expert's actions, or action chunks),
trains on its data-parallel share with the loss the policy's ``sft_forward`` returns
(``flow_policy``: flow matching; ``tiny_vla``: the action tokens' negative
log-likelihood) and makes one optimizer step. `EmbodiedSFTActor.evaluate_sft`
measures held-out rows: the same loss, and the mean squared error of the policy's
deterministic (``mode="eval"``) actions against the expert's.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from rlshell.cluster.worker import Worker
from rlshell.config import Config
from rlshell.engines.training import TrainingBackend, make_training_backend
from rlshell.envs.stepper import EnvObs
from rlshell.models import as_policy
from rlshell.models.base import BasePolicy, ForwardType
from rlshell.workers.common import worker_device
from rlshell.workers.schedule import all_reduce_metrics, data_parallel_rows

__all__ = ["EmbodiedSFTActor", "sft_loss_of"]


def sft_loss_of(policy: BasePolicy, obs: EnvObs, actions: Tensor) -> Tensor:
    """The scalar loss ``policy``'s ``sft_forward`` gives for the expert's ``actions``."""
    out = policy(ForwardType.SFT, actions=actions, **obs)  # the observation by keyword
    loss = out["loss"] if isinstance(out, dict) else out
    if not isinstance(loss, Tensor) or loss.dim() != 0:
        raise TypeError(
            f"{type(policy).__name__}.sft_forward must return a scalar loss tensor (or "
            f'{{"loss": ...}}), got {type(loss).__name__}'
        )
    return loss


class EmbodiedSFTActor(Worker):
    """One rank of the embodied sft run's policy and optimizer."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.manager: TrainingBackend | None = None
        self.policy: BasePolicy | None = None

    def init_worker(self) -> int:
        """Join the process group, build the policy (``actor.model``, from
        ``actor.model.checkpoint`` if set) and its optimizer; its action chunk."""
        config = self.config
        device = worker_device()
        self.init_process_group("nccl" if device.type == "cuda" else "gloo")
        torch.manual_seed(config.runner.seed + self.rank)
        manager = make_training_backend(
            config.actor, total_steps=config.runner.max_steps, device=device
        )
        manager.setup_model_and_optimizer()
        self.manager = manager
        self.policy = as_policy(manager.module, config.actor.model)
        return self.policy.action_chunk

    def check_fits(self, obs: EnvObs, actions: Tensor) -> None:
        """The loss and the eval-mode actions on a few demonstration rows, without training:
        raises the policy's own error where their fields do not fit it."""
        _, policy = self._ready()
        device = next(policy.parameters()).device
        here = _rows(obs, list(range(actions.shape[0])), device)
        policy.eval()  # nothing learned from these rows: running statistics stay as they are
        with torch.no_grad():
            sft_loss_of(policy, here, actions.to(device))
            acted, _ = policy.predict_action_batch(here, mode="eval", compute_values=False)
        if acted.numel() != actions.numel():
            raise ValueError(
                f"the policy acts {list(acted.shape[1:])} per row, the expert "
                f"{list(actions.shape[1:])}"
            )

    def run_sft(self, obs: EnvObs, actions: Tensor) -> dict[str, float]:
        """One optimizer step on this rank's share of the rows: ``train/loss`` (the mean over
        the ranks), ``train/grad_norm`` and ``train/lr``. Collective."""
        manager, policy = self._ready()
        mine = self._share(actions.shape[0])
        policy.train()
        device = next(policy.parameters()).device
        loss = sft_loss_of(policy, _rows(obs, mine, device), actions[mine].to(device))
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FloatingPointError(f"rank {self.rank}: the sft loss is {value}")
        manager.backward(loss)  # FSDP averages the ranks' gradients: each share is as large
        grad_norm, lrs = manager.optimizer_step()
        metrics = all_reduce_metrics({"train/loss": value}, dist.ReduceOp.SUM)
        metrics["train/loss"] /= self.world_size
        return {**metrics, "train/grad_norm": grad_norm, "train/lr": lrs[0]}

    def evaluate_sft(self, obs: EnvObs, actions: Tensor) -> dict[str, float]:
        """``eval/loss`` and ``eval/action_mse`` (the eval-mode actions' squared error against
        the expert's, per action number) over every rank's share. Collective."""
        _, policy = self._ready()
        mine = self._share(actions.shape[0])
        device = next(policy.parameters()).device
        here, expert = _rows(obs, mine, device), actions[mine].to(device)
        policy.eval()
        with torch.no_grad():
            loss = float(sft_loss_of(policy, here, expert))
            acted, _ = policy.predict_action_batch(here, mode="eval", compute_values=False)
            error = float(((acted.float() - expert.reshape(acted.shape)) ** 2).mean())
        totals = all_reduce_metrics(
            {"loss": loss * len(mine), "mse": error * len(mine), "rows": float(len(mine))},
            dist.ReduceOp.SUM,
        )
        return {
            "eval/loss": totals["loss"] / totals["rows"],
            "eval/action_mse": totals["mse"] / totals["rows"],
        }

    def save_checkpoint(self, path: str, step: int) -> None:
        manager, _ = self._ready()
        manager.save_checkpoint(Path(path) / "actor", step)

    def load_checkpoint(self, path: str) -> int:
        manager, _ = self._ready()
        return manager.load_checkpoint(Path(path) / "actor")

    def shutdown_distributed(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def _share(self, rows: int) -> list[int]:
        manager, _ = self._ready()
        return data_parallel_rows(manager, list(range(rows)))

    def _ready(self) -> tuple[TrainingBackend, BasePolicy]:
        if self.manager is None or self.policy is None:
            raise RuntimeError("init_worker() has not run")
        return self.manager, self.policy


def _rows(obs: EnvObs, rows: list[int], device: torch.device) -> EnvObs:
    index = torch.as_tensor(rows, dtype=torch.int64)
    return {key: value[index].to(device) for key, value in obs.items()}

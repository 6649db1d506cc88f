"""Training backends: one rank's share of the policy, its optimizer, schedule and checkpoints.

One protocol, `TrainingBackend` (RLinf's ``FSDPModelManager`` API), and the
backends that implement it, one module each (``actor.backend`` names one;
`make_training_backend` builds it, once, in the actor worker):

- ``fsdp``: `rlshell.engines.training.fsdp.FSDPModelManager`, FSDP2 on gloo
  (CPU) or NCCL (GPU);
- ``megatron``: `rlshell.engines.training.megatron.manager.MegatronModelManager`,
  Megatron-core tensor, pipeline and data parallelism (``actor.megatron``),
  on gloo through its CPU shim or on NCCL.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist
from torch import nn

if TYPE_CHECKING:
    from rlshell.config import ActorConfig

__all__ = ["TRAINING_BACKENDS", "TrainingBackend", "make_training_backend"]

TRAINING_BACKENDS = ("fsdp", "megatron")
"""The ``actor.backend`` values this installation has a backend for."""


class TrainingBackend(Protocol):
    """One rank of the trained policy, driven by an actor worker:

        backend.setup_model_and_optimizer()
        for i, micro in enumerate(micro_batches):
            backend.before_micro_batch(backend.module, is_last=i == len(micro_batches) - 1)
            loss(backend.module, micro).backward()
        grad_norm, lrs = backend.optimizer_step()
        with backend.unsharded() as model: ...             # full weights, for sync or rollout
        backend.save_checkpoint(path, step); step = backend.load_checkpoint(path)

    Between phases on a device another component shares, the offload pairs
    move parameters (and gradients) and optimizer state to host memory and back.
    """

    optimizer: torch.optim.Optimizer | None
    lr_scheduler: torch.optim.lr_scheduler.LambdaLR | None

    @property
    def module(self) -> nn.Module: ...

    @property
    def data_parallel_rank(self) -> int:
        """Which share of a batch's rows this rank trains on."""
        ...

    @property
    def data_parallel_size(self) -> int:
        """How many shares a batch's rows are split into (ranks in a share see the same rows)."""
        ...

    @property
    def data_parallel_group(self) -> dist.ProcessGroup | None:
        """The ranks holding one share each (None: every rank, the default group)."""
        ...

    @property
    def pipeline_stages(self) -> int:
        """1: `module` is a whole causal LM; more: a pipeline stage Megatron's schedule drives."""
        ...

    def setup_model_and_optimizer(self) -> None: ...

    def unsharded(self) -> AbstractContextManager[nn.Module]: ...

    def before_micro_batch(self, model: nn.Module, is_last: bool) -> None: ...

    def optimizer_step(self) -> tuple[float, list[float]]:
        """Clip, step, schedule and clear; (gradient norm before clipping, learning rates)."""
        ...

    def get_model_state_dict(
        self, cpu_offload: bool = True, full_state_dict: bool = True
    ) -> dict[str, torch.Tensor]: ...

    def save_checkpoint(self, path: str | Path, step: int) -> None: ...

    def load_checkpoint(self, path: str | Path) -> int: ...

    def offload_param_and_grad(self, offload_grad: bool = False) -> None: ...

    def load_param_and_grad(self, device: torch.device | str, load_grad: bool = False) -> None: ...

    def offload_optimizer(self) -> None: ...

    def load_optimizer(self, device: torch.device | str) -> None: ...


def make_training_backend(
    config: ActorConfig, *, total_steps: int, device: torch.device
) -> TrainingBackend:
    """The backend ``config.backend`` names, for ``total_steps`` optimizer steps on ``device``."""
    if config.backend == "fsdp":
        from rlshell.engines.training.fsdp import FSDPModelManager

        return FSDPModelManager(config, total_steps=total_steps, device=device)
    if config.backend == "megatron":
        from rlshell.engines.training.megatron.manager import MegatronModelManager

        return MegatronModelManager(config, total_steps=total_steps, device=device)
    raise ValueError(
        f"actor.backend: no '{config.backend}' backend in this installation; backends: "
        f"{', '.join(TRAINING_BACKENDS)}"
    )

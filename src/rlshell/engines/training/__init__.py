"""Training backends: one rank's share of the policy, its optimizer, schedule and checkpoints.

One protocol, `TrainingBackend` (RLinf's ``FSDPModelManager`` API), and a registry of
the backends that implement it (``actor.backend`` names one;
`make_training_backend` builds it, once, in the actor worker). A backend is a
plug-in: `register_training_backend` takes its builder and what it says about
itself (`rlshell.engines.plugins`: packages, rules, the config sections it reads,
how many data-parallel shares and pipeline stages a number of ranks makes), and
validation asks the registered entry. Built in (`rlshell.engines.training.builtin`):

- ``fsdp``: `rlshell.engines.training.fsdp.FSDPModelManager`, FSDP2 on gloo
  (CPU) or NCCL (GPU);
- ``megatron``: `rlshell.engines.training.megatron.manager.MegatronModelManager`,
  Megatron-core tensor, pipeline and data parallelism (``actor.megatron``),
  on gloo through its CPU shim or on NCCL; its rules are
  `rlshell.engines.training.megatron.rules`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist
from attrs import frozen
from torch import nn

from rlcore.registry import Registry
from rlshell.config import ActorConfig
from rlshell.engines.plugins import (
    ConfigRule,
    EngineEntry,
    Package,
    UnreadRule,
    checked_reads,
    no_problems,
    nothing_unread,
)

__all__ = [
    "BACKEND_KEYS",
    "TRAINING_BACKENDS",
    "PipelinedBackend",
    "TrainingBackend",
    "TrainingBackendBuilder",
    "TrainingBackendEntry",
    "data_parallel_shares",
    "make_training_backend",
    "pipeline_stages",
    "pipelined",
    "register_training_backend",
]


class TrainingBackend(Protocol):
    """One rank of the trained policy, driven by an actor worker:

        backend.setup_model_and_optimizer()
        for i, micro in enumerate(micro_batches):
            backend.before_micro_batch(backend.module, is_last=i == len(micro_batches) - 1)
            backend.backward(loss(backend.module, micro))
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

    def full_tensors(self, model: nn.Module) -> Mapping[str, torch.Tensor]:
        """Inside ``unsharded()``, given the module it yields: every state-dict entry of the
        whole model by its Hugging Face name (a tied weight under each name), the tensors
        themselves, not copies; read them before the context ends."""
        ...

    def before_micro_batch(self, model: nn.Module, is_last: bool) -> None: ...

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate one micro-batch's ``loss`` into the parameters' gradients (scaled by
        the backend's loss scale where it has one: fp16; `optimizer_step` divides it out)."""
        ...

    @property
    def loss_scale(self) -> float | None:
        """The factor `backward` multiplies losses by now (fp16's gradient scaler), None when
        the backend keeps none. With one, a non-finite gradient norm is the scaler's overflow:
        `optimizer_step` skipped the step and lowered the scale, and training goes on."""
        ...

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


@runtime_checkable
class PipelinedBackend(TrainingBackend, Protocol):
    """A backend whose ``pipeline_stages`` can exceed 1: its `module` is one stage, and the
    forward and backward passes of a mini-batch go through its pipeline schedule."""

    def pipeline_passes(
        self,
        micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
        loss_of: Callable[[int, torch.Tensor], tuple[torch.Tensor, dict[str, float]]],
    ) -> list[dict[str, float]]:
        """Forward and backward of every micro-batch ``(input_ids, attention_mask)``;
        gradients accumulate in this stage's parameters. ``loss_of(index, logits)`` gives
        micro-batch ``index``'s loss (the gradient is that of the losses' sum) and metrics,
        on the last stage; every stage of the pipeline returns those metrics, in order."""
        ...


def pipelined(backend: TrainingBackend) -> PipelinedBackend:
    """``backend`` as a `PipelinedBackend`; a TypeError naming it when it has more than one
    stage but no pipeline schedule (a backend's registration bug, not a config error)."""
    if not isinstance(backend, PipelinedBackend):
        raise TypeError(
            f"{type(backend).__name__} reports {backend.pipeline_stages} pipeline stages but "
            "has no pipeline_passes(): a backend with stages implements PipelinedBackend"
        )
    return backend


TrainingBackendBuilder = Callable[..., TrainingBackend]
"""``build(config.actor, total_steps=..., device=...) -> TrainingBackend``."""

BACKEND_KEYS: dict[str, str] = {
    "actor.fsdp_config": "FSDP2's settings, read by the {engines} backend",
    "actor.megatron": "Megatron-core's parallel sizes, read by the {engines} backend",
}
"""The sections of ``actor`` that only some backends read: a backend's entry says which
(`TrainingBackendEntry.reads`); set for one that does not, they are refused."""


def one_share_per_rank(config: ActorConfig, ranks: int) -> int:
    """Data-parallel shares of a backend whose every rank trains on its own rows."""
    return ranks


def one_stage(config: ActorConfig) -> int:
    """Pipeline stages of a backend whose ranks each hold whole models (or shards of them)."""
    return 1


@frozen(kw_only=True)
class TrainingBackendEntry(EngineEntry):
    """A registered training backend (`register_training_backend` documents each field)."""

    build: TrainingBackendBuilder
    data_parallel_shares: Callable[[ActorConfig, int], int] = one_share_per_rank
    pipeline_stages: Callable[[ActorConfig], int] = one_stage
    packs_sequences: bool = True


TRAINING_BACKENDS: Registry[TrainingBackendEntry] = Registry(
    "training backend", builtins="rlshell.engines.training.builtin"
)
"""``actor.backend``'s values: the backends this installation has."""


def register_training_backend(
    name: str,
    build: TrainingBackendBuilder,
    *,
    packages: tuple[Package, ...] = (),
    reads: tuple[str, ...] = (),
    problems: ConfigRule = no_problems,
    unread: UnreadRule = nothing_unread,
    data_parallel_shares: Callable[[ActorConfig, int], int] = one_share_per_rank,
    pipeline_stages: Callable[[ActorConfig], int] = one_stage,
    packs_sequences: bool = True,
    force: bool = False,
) -> TrainingBackendBuilder:
    """Register a training backend as ``actor.backend=name``; ``force=True`` replaces one.

    ``build(config.actor, total_steps=..., device=...)`` makes one rank of it (in the
    actor worker; import heavy packages inside). ``packages``: what it imports.
    ``reads``: which of `BACKEND_KEYS` it reads (the others are refused when set).
    ``problems(config, plan)``: what it refuses before start; ``unread(config, plan)``:
    keys it does not read in some settings, with why. ``data_parallel_shares(actor,
    ranks)``: how many shares of a batch's rows ``ranks`` actor ranks train on;
    ``pipeline_stages(actor)``: how many pipeline stages one model is cut into.
    ``packs_sequences``: it trains on packed rows (``actor.pack_sequences``).
    """
    entry = TrainingBackendEntry(
        build=build,
        packages=tuple(packages),
        reads=checked_reads(f"training backend '{name}'", reads, BACKEND_KEYS),
        problems=problems,
        unread=unread,
        data_parallel_shares=data_parallel_shares,
        pipeline_stages=pipeline_stages,
        packs_sequences=packs_sequences,
    )
    TRAINING_BACKENDS.register(name, entry, force=force)
    return build


def data_parallel_shares(config: ActorConfig, ranks: int) -> int:
    """How many shares of a batch's rows ``ranks`` ranks of ``config.backend`` train on (one
    per rank for a name not registered, which validation refuses)."""
    if config.backend not in TRAINING_BACKENDS:
        return ranks
    return TRAINING_BACKENDS.get(config.backend).data_parallel_shares(config, ranks)


def pipeline_stages(config: ActorConfig) -> int:
    """How many pipeline stages ``config.backend`` cuts one model into (1 for a name not
    registered, which validation refuses)."""
    if config.backend not in TRAINING_BACKENDS:
        return 1
    return TRAINING_BACKENDS.get(config.backend).pipeline_stages(config)


def make_training_backend(
    config: ActorConfig, *, total_steps: int, device: torch.device
) -> TrainingBackend:
    """The backend ``config.backend`` names, for ``total_steps`` optimizer steps on ``device``."""
    return TRAINING_BACKENDS.get(config.backend).build(
        config, total_steps=total_steps, device=device
    )

"""The training backends this installation ships, registered as any plug-in is.

Imported by `rlshell.engines.training.TRAINING_BACKENDS` before it is first read;
each builder imports its backend's module (and its packages) only when a worker
builds it.
"""

from __future__ import annotations

import torch

from rlshell.config import ActorConfig
from rlshell.engines.plugins import Package
from rlshell.engines.training import TrainingBackend, register_training_backend
from rlshell.engines.training.megatron.rules import (
    MEGATRON_INSTALL,
    megatron_data_parallel_shares,
    megatron_pipeline_stages,
    megatron_problems,
)


def build_fsdp(config: ActorConfig, *, total_steps: int, device: torch.device) -> TrainingBackend:
    """FSDP2 (`rlshell.engines.training.fsdp.FSDPModelManager`)."""
    from rlshell.engines.training.fsdp import FSDPModelManager

    return FSDPModelManager(config, total_steps=total_steps, device=device)


def build_megatron(
    config: ActorConfig, *, total_steps: int, device: torch.device
) -> TrainingBackend:
    """Megatron-core (`rlshell.engines.training.megatron.manager.MegatronModelManager`)."""
    from rlshell.engines.training.megatron.manager import MegatronModelManager

    return MegatronModelManager(config, total_steps=total_steps, device=device)


register_training_backend("fsdp", build_fsdp, reads=("actor.fsdp_config",))
register_training_backend(
    "megatron",
    build_megatron,
    packages=(Package("megatron.core", "megatron-core", MEGATRON_INSTALL),),
    reads=("actor.megatron",),
    problems=megatron_problems,
    data_parallel_shares=megatron_data_parallel_shares,
    pipeline_stages=megatron_pipeline_stages,
    packs_sequences=False,
)

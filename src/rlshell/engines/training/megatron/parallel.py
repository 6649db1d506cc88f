"""Megatron's process groups over this job's ranks: tensor × pipeline × data parallel.

`init_model_parallel` is called once per actor process after the default
process group is up (gloo on CPU, NCCL on GPU): it applies the CPU shim where
CUDA is absent, asks Megatron for its groups (``world = tp·pp·dp``, tensor
ranks adjacent, then data, then pipeline: Megatron's default order) and seeds
its RNG tracker.
"""

from __future__ import annotations

import os

import attrs
import torch.distributed as dist

from rlshell.engines.training.megatron.cpu_shim import apply_cpu_shim, seed_model_parallel_rng

__all__ = ["MegatronRanks", "init_model_parallel"]


@attrs.frozen
class MegatronRanks:
    """This process's place in the tp × pp × dp grid."""

    tp_rank: int
    pp_rank: int
    dp_rank: int
    tp: int
    pp: int
    dp: int


def init_model_parallel(tp: int, pp: int, seed: int = 0) -> MegatronRanks:
    """Megatron's groups for ``tp`` × ``pp`` × (world / tp·pp); this rank's coordinates."""
    from megatron.core import parallel_state

    if not dist.is_initialized():
        raise RuntimeError("init_model_parallel needs the default process group up")
    world = dist.get_world_size()
    if world % (tp * pp):
        raise ValueError(
            f"{world} ranks do not split into tensor parallel {tp} × pipeline parallel {pp} "
            "× a whole number of data-parallel replicas"
        )
    # Megatron's advice for its asynchronous tensor-parallel all-reduce on GPUs (it warns on
    # every rank without it); nothing reads it on CPU.
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    apply_cpu_shim()
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
    )
    seed_model_parallel_rng(seed)
    return MegatronRanks(
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
        dp_rank=parallel_state.get_data_parallel_rank(),
        tp=tp,
        pp=pp,
        dp=world // (tp * pp),
    )

"""What Megatron-core needs to run without CUDA, in one place, applied only where CUDA is absent.

Megatron-core 0.16 is written for GPUs; on these CPU machines two things stand
in the way (measured; shared/ENVIRONMENT.md), and this module is the only code
in the project that knows about either:

1. ``torch.cuda.current_device()`` is called at ~175 sites to place new
   tensors (``device=torch.cuda.current_device()``) and no flag avoids it.
   `apply_cpu_shim` makes it answer ``"cpu"``, which is a valid ``device=``.
2. Megatron's RNG tracker forks CUDA generator states for tensor-parallel
   dropout. `seed_model_parallel_rng` sets it up in its inference mode, which
   tracks without CUDA; dropout is refused (`rlshell.engines.training.megatron.model`
   maps HF configs with no dropout only), so no random stream is needed.
3. ``torch.cuda.synchronize()`` follows the pipeline's exchange of tensor
   shapes (a guard for CUDA streams): on CPU there is nothing to wait for,
   and the shim makes it return.
4. The pipeline schedules create a few tensors with a literal ``device="cuda"``
   (the token counter of each schedule). `cpu_device_mode` is a
   ``TorchFunctionMode`` that places such factory calls on the CPU; the
   backend runs Megatron's schedules inside it on CPU only.

On a machine with CUDA none of these is applied and the RNG tracker is
Megatron's own (``model_parallel_cuda_manual_seed``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = [
    "apply_cpu_shim",
    "cpu_device_mode",
    "seed_model_parallel_rng",
]


def _cpu_current_device() -> str:
    return "cpu"


def apply_cpu_shim() -> bool:
    """Patch ``torch.cuda.current_device`` where CUDA is absent; True if the shim is in place."""
    if torch.cuda.is_available():
        return False
    torch.cuda.current_device = _cpu_current_device  # type: ignore[assignment]
    torch.cuda.synchronize = _nothing_to_wait_for
    return True


def _nothing_to_wait_for(device: object = None) -> None:
    """There is no CUDA stream to wait for (the pipeline schedule's p2p exchange calls this)."""


def seed_model_parallel_rng(seed: int) -> None:
    """Megatron's model-parallel RNG tracker, seeded; on CPU its CUDA-free (inference) mode."""
    from megatron.core import tensor_parallel

    torch.manual_seed(seed)
    if torch.cuda.is_available():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
    else:
        tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


def _on_cuda(device: object) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.split(":")[0] == "cuda"


class _CudaFactoriesOnCpu(TorchFunctionMode):
    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if _on_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


@contextmanager
def cpu_device_mode() -> Iterator[None]:
    """Inside: torch calls given ``device="cuda"`` run on the CPU (where CUDA is absent only)."""
    if torch.cuda.is_available():
        yield
        return
    with _CudaFactoriesOnCpu():
        yield

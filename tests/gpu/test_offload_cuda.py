"""`FSDPModelManager`'s offload on a GPU: the memory really leaves, training resumes exactly.

On one NCCL rank: train a step, move the optimizer state and the parameters
(with their gradients) to host memory and check that the CUDA memory they
held is handed back; move them back, train another step, and compare the
loss and weights with a manager that never offloaded. Both of FSDP's paths:
FSDP2-sharded (bf16 mixed precision: the one rank's fp32 model is cast, so
it is wrapped) and the unsharded model one rank in its own precision keeps.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from attrs import evolve
from torch.distributed.tensor import DTensor

from rlshell.config import ActorConfig, ModelConfig
from rlshell.engines.training.fsdp import FSDPModelManager

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU (one NVIDIA GPU with ~2 GB free, e.g. an H100): it measures the "
    "GPU memory FSDPModelManager's offload frees",
)

MODEL = ModelConfig(
    model_type="hf_causal_lm",
    model_kwargs={
        "config_class": "Qwen2Config",
        "vocab_size": 512,
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
    },
)


@pytest.fixture(scope="module")
def nccl_rank() -> Iterator[torch.device]:
    """A one-rank NCCL process group on GPU 0 (this test process is rank 0 of 1)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # The two managers compared must compute alike: deterministic kernels only.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    yield device
    dist.destroy_process_group()
    torch.use_deterministic_algorithms(False)
    torch.backends.cuda.enable_flash_sdp(True)
    torch.backends.cuda.enable_mem_efficient_sdp(True)


def _manager(device: torch.device, mixed_precision: str) -> FSDPModelManager:
    actor = ActorConfig(model=MODEL)
    actor = evolve(actor, fsdp_config=evolve(actor.fsdp_config, mixed_precision=mixed_precision))
    manager = FSDPModelManager(actor, total_steps=4, device=device)
    manager.setup_model_and_optimizer()
    return manager


def _step(manager: FSDPModelManager, device: torch.device, seed: int) -> float:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 512, (4, 32), generator=generator).to(device)
    model = manager.module
    logits = model(input_ids=ids, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
    )
    manager.before_micro_batch(model, is_last=True)
    loss.backward()
    manager.optimizer_step()
    return float(loss.detach())


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _state_bytes(manager: FSDPModelManager) -> int:
    assert manager.optimizer is not None
    params = sum(_local(p).numel() * _local(p).element_size() for p in manager.module.parameters())
    moments = sum(
        _local(value).numel() * _local(value).element_size()
        for state in manager.optimizer.state.values()
        for key, value in state.items()
        if isinstance(value, torch.Tensor) and key != "step"
    )
    return params + moments


@pytest.mark.parametrize("mixed_precision", ["bf16", "fp32"], ids=["fsdp2-sharded", "unsharded"])
def test_offload_frees_the_gpu_and_training_resumes_as_if_it_never_left(
    nccl_rank: torch.device, mixed_precision: str
) -> None:
    device = nccl_rank
    offloaded = _manager(device, mixed_precision)
    reference = _manager(device, mixed_precision)
    sharded = any(isinstance(p, DTensor) for p in offloaded.module.parameters())
    assert sharded == (mixed_precision == "bf16")
    torch.testing.assert_close(_step(offloaded, device, seed=1), _step(reference, device, seed=1))

    torch.cuda.synchronize(device)
    held = torch.cuda.memory_allocated(device)
    moved = _state_bytes(offloaded)
    offloaded.offload_optimizer()
    offloaded.offload_param_and_grad(offload_grad=True)
    freed = held - torch.cuda.memory_allocated(device)
    assert freed >= 0.9 * moved, f"freed {freed} bytes of the {moved} offloaded"
    assert all(_local(p).device.type == "cpu" for p in offloaded.module.parameters())
    assert offloaded.optimizer is not None
    for state in offloaded.optimizer.state.values():
        assert _local(state["exp_avg"]).device.type == "cpu"

    offloaded.load_param_and_grad(device, load_grad=True)
    offloaded.load_optimizer(device)
    assert torch.cuda.memory_allocated(device) >= held - 0.1 * moved
    assert all(_local(p).device == device for p in offloaded.module.parameters())
    # The same loss and weights as never offloading (to rounding: a lost or stale Adam moment
    # moves a weight by about the learning rate, 3e-4, far beyond these tolerances).
    loss, reference_loss = _step(offloaded, device, seed=2), _step(reference, device, seed=2)
    torch.testing.assert_close(loss, reference_loss, rtol=1e-5, atol=1e-6)
    for (name, mine), (_, theirs) in zip(
        offloaded.module.state_dict().items(), reference.module.state_dict().items(), strict=True
    ):
        torch.testing.assert_close(_local(mine), _local(theirs), rtol=1e-5, atol=1e-6, msg=name)

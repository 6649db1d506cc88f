"""What the language-model workers share: the device a worker computes on, the error of a
non-finite loss, and the policy as a rollout engine holds it."""

from __future__ import annotations

import torch
from attrs import evolve
from torch import nn

from rlshell.config import Config, Precision
from rlshell.models import get_model

__all__ = [
    "NonFiniteLossError",
    "build_rollout_model",
    "rollout_precision",
    "worker_device",
]


class NonFiniteLossError(FloatingPointError):
    """The loss (or gradient norm) of a step was NaN or infinite."""


def worker_device() -> torch.device:
    """The device a worker computes on: its (first visible) GPU, else the CPU."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def rollout_precision(config: Config) -> Precision:
    """The rollout engine's precision: ``rollout.precision``, else the actor model's."""
    return config.rollout.precision or config.actor.model.precision


def build_rollout_model(config: Config, *, merged_lora: bool = False) -> nn.Module:
    """The policy as the rollout engine holds it: the actor's initial model, in its precision.

    ``merged_lora``: a LoRA actor's (``actor.model.is_lora``) plain base model, without
    adapters, to which syncs send the actor's weights with the adapters merged in
    (`rlshell.models.lora.MergedLoRAWeights`); it starts equal to the actor (B = 0).
    """
    torch.manual_seed(config.actor.seed)
    model = config.actor.model
    model_cfg = evolve(
        model, precision=rollout_precision(config), is_lora=model.is_lora and not merged_lora
    )
    return get_model(model_cfg)
